"""
ARR-COC inside other engines: adapters that let a third-party harness drive the project's own façade.

    lmms.py   lmms-eval's model `arr_coc` (python -m lmms_eval eval --model arr_coc ...), announced through the
              `lmms_eval.models` entry point in pyproject.toml; it runs only in the lmms-eval venv
              (requirements-lmms.txt), and nothing in the package imports it.
"""
