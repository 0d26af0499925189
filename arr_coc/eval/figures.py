"""
python -m arr_coc.eval.figures keeps working: the figures command lives in arr_coc/commands/figures.py, and this
module is that one (`from arr_coc.eval import figures` gives arr_coc.commands.figures itself). A shim that imports
a command: tests/test_imports.py's LAYERS places this one module at layer 7, beside the commands; nothing imports it.
"""

import sys

from arr_coc.commands import figures

if __name__ == "__main__":
    figures.main()
sys.modules[__name__] = figures
