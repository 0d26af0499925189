"""fastv: FastV, in-LLM attention pruning from layer K on (arr_coc/pipelines/fastv.py), and its one setting, K."""

from dataclasses import dataclass

from arr_coc.flags import bounded_int, flag
from arr_coc.pipelines.pipeline import Pipeline
from arr_coc.settings import PipelineConfig


@dataclass(frozen=True)
class Options:
    """FastV's settings (--fastv-layer for run and evaluate); a request without them: the PipelineConfig's."""
    fastv_layer: int = flag(PipelineConfig.fastv_layer, "the fastv baseline's K: LLM layers below it read every image "
                                                        "token, layers from it on only the top ones by the last prompt "
                                                        "token's attention at layer K-1 (FastV's 2)",
                            bounded_int(1, 1000))


PIPELINE = Pipeline("fastv", "arr_coc.pipelines.fastv", "FastV: the native view, only the image tokens layer K-1 "
                    "attends to most (ARR's token count) read from layer K on", kind="reducer", order=70,
                    engines=("fast",), options=Options)
