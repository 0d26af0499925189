"""
python -m arr_coc.train keeps working: the command lives in arr_coc/commands/train.py, and this module is that one
(`from arr_coc import train` gives arr_coc.commands.train itself, so patching either patches both).
"""

import sys

from arr_coc.commands import train

if __name__ == "__main__":
    sys.exit(train.main())
sys.modules[__name__] = train
