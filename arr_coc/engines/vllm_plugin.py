"""
vLLM's plugin for ARR-COC: `register` (the `vllm.general_plugins` entry point in pyproject.toml, which vLLM calls in
every process it starts) names the architecture ArrCocQwen2VLForConditionalGeneration; arr_coc/engines/vllm_model.py
is its code, imported by vLLM only where the architecture is chosen:

    .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --model models/pocket-qwen2-vl --dtype float32 \\
        --enforce-eager --hf-overrides '{"architectures": ["ArrCocQwen2VLForConditionalGeneration"], "arr_budget": 273}'

The server's ARR settings (ServerSettings) come from --hf-overrides keys arr_checkpoint, arr_budget, arr_strategy,
arr_max_cells, else from $ARR_COC_CHECKPOINT, $ARR_COC_BUDGET, $ARR_COC_STRATEGY, $ARR_COC_MAX_CELLS, else the
checkpoint's own (the default rule of every command: arr_coc.relevance.layer.choose_checkpoint). A request may ask
for a smaller budget or another strategy through mm_processor_kwargs {"arr_budget": 64, "arr_strategy": "grid"}.
$ARR_COC_VLLM_LOG names a file that gets one JSON line per image looked at (its question, grids and cells).

This module imports neither torch nor vLLM: vLLM loads it in its front-end process too.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

from arr_coc.relevance.config import STRATEGIES  # torch-free

ARCHITECTURE = "ArrCocQwen2VLForConditionalGeneration"  # the name --hf-overrides' architectures chooses
MODEL_CLASS = "arr_coc.engines.vllm_model:ArrCocQwen2VL"  # imported by vLLM when chosen (lazily, by this string)


@dataclass(frozen=True)
class ServerSettings:
    """One server's ARR settings: from --hf-overrides (arr_<field>), else $ARR_COC_<FIELD>, else these defaults."""
    checkpoint: str | None = None  # an ARR checkpoint (name under checkpoints/, folder, "prior"); None: the default
    budget: int | None = None  # saccades per image (fixed: vLLM sizes an image's tokens before encoding it); None:
    # the checkpoint's budget
    strategy: str | None = None  # the allocator (STRATEGIES); None: the checkpoint's
    max_cells: int = 4096  # cap on the candidate grid (PipelineConfig.max_cells)


def register() -> None:
    """vllm.general_plugins: name the ARR-COC architecture (its module is imported only when a server chooses it)."""
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)


def server_settings(hf_config) -> ServerSettings:
    """The server's settings from its HF config (--hf-overrides put arr_* keys there) or the environment."""
    values = {}
    for f in fields(ServerSettings):
        value = getattr(hf_config, f"arr_{f.name}", None)
        value = os.environ.get(f"ARR_COC_{f.name.upper()}") if value is None else value
        if value is not None:
            values[f.name] = int(value) if f.name in ("budget", "max_cells") else str(value)
    settings = ServerSettings(**values)
    check_strategy(settings.strategy)
    if settings.budget is not None and settings.budget < 1:
        raise ValueError(f"arr_budget must be at least 1, got {settings.budget}")
    return settings


def check_strategy(strategy: str | None) -> None:
    if strategy is not None and strategy not in STRATEGIES:
        raise ValueError(f"arr_strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")


def checkpoint_folder(settings: ServerSettings, family: str, hidden_size: int) -> str | None:
    """The ARR checkpoint the server loads (None: the untrained prior), by the commands' one rule."""
    from arr_coc.relevance.layer import choose_checkpoint

    return choose_checkpoint(settings.checkpoint, family, hidden_size)


def default_budget(settings: ServerSettings, folder: str | None) -> int:
    """The server's budget: its own, else its checkpoint's config.json budget, else ARRCOCConfig's (273)."""
    if settings.budget is not None:
        return settings.budget
    config = Path(folder or "") / "config.json"
    if folder and config.is_file():
        return int(json.loads(config.read_text()).get("budget", 273))
    return 273


def log_look(record: dict) -> None:
    """One JSON line to $ARR_COC_VLLM_LOG, if set: what ARR looked at for one image and question."""
    path = os.environ.get("ARR_COC_VLLM_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
