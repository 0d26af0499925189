"""
python -m arr_coc.bench keeps working: the command lives in arr_coc/commands/bench.py, and this module is that one
(`from arr_coc import bench` gives arr_coc.commands.bench itself, so patching either patches both).
"""

import sys

from arr_coc.commands import bench

if __name__ == "__main__":
    bench.main()
sys.modules[__name__] = bench
