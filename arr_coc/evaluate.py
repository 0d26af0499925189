"""
python -m arr_coc.evaluate keeps working: the command lives in arr_coc/commands/evaluate.py, and this module is that one
(`from arr_coc import evaluate` gives arr_coc.commands.evaluate itself, so patching either patches both).
"""

import sys

from arr_coc.commands import evaluate

if __name__ == "__main__":
    sys.exit(evaluate.main())
sys.modules[__name__] = evaluate
