"""
The app's helpers: its event handlers (handlers), the tables, uploads, checkpoints and error messages it shows
(ui), and the drawings of ARR's maps and saccades (viz; `python -m arr_coc.run --save-dir` and evaluate's report
draw with it too). app.py, at the repo root, holds the layout and the wiring.
"""
