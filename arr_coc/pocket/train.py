"""
python -m arr_coc.pocket.train (and torchrun -m arr_coc.pocket.train) keeps working: the trainer is
arr_coc/pocket/trainer.py, its command-line entry point arr_coc/commands/pocket_train.py, and this module is that
one. A shim that imports a command: tests/test_imports.py's LAYERS places this one module at layer 7; nothing
imports it.
"""

import sys

from arr_coc.commands import pocket_train

if __name__ == "__main__":
    pocket_train.main()
sys.modules[__name__] = pocket_train
