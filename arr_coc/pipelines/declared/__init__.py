"""
The pipelines' declarations, one module each, torch-free: each module's PIPELINE (arr_coc.pipelines.pipeline.Pipeline)
is one pipeline of the registry (arr_coc.pipelines reads every module of this package's path), its Options (if it has
settings of its own) beside it. A new pipeline is its declaration here and the module of its answer.
"""
