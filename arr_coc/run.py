"""
python -m arr_coc.run keeps working: the command lives in arr_coc/commands/run.py, and this module is that one
(`from arr_coc import run` gives arr_coc.commands.run itself, so patching either patches both).
"""

import sys

from arr_coc.commands import run

if __name__ == "__main__":
    sys.exit(run.main())
sys.modules[__name__] = run
