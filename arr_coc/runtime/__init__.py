"""
How the code runs on its machine, beneath everything else: CUDA-graph capture and replay (graphs), ZeroGPU's lent
GPU (zerogpu), a CUDA-synchronised stopwatch and peak memory (timing), torchrun's processes (distributed).
Utilities: they import nothing of the project but each other (graphs asks zerogpu whether it may capture).

    from arr_coc.runtime.graphs import CUDAGraphed
    from arr_coc.runtime.timing import Stopwatch
"""
