"""
vLLM's plugin for ARR-COC: `register` (the `vllm.general_plugins` entry point in pyproject.toml, which vLLM calls in
every process it starts) names one architecture per family, ArrCocQwen2VLForConditionalGeneration,
ArrCocQwen2_5_VLForConditionalGeneration and ArrCocQwen3VLForConditionalGeneration (ARCHITECTURES: arr-coc-serve picks
the model's by its config's model_type); arr_coc/engines/vllm_model.py is their code, imported by vLLM only where one
is chosen:

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

import argparse
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

from arr_coc.commands.cli import checkpoint_flag, max_cells_flag
from arr_coc.flags import bounded_int, flag, one_of
from arr_coc.relevance.config import STRATEGIES  # torch-free: the allocators, a strategy passed by its index
from arr_coc.settings import MAX_CELLS

# A family's ARR-COC architecture (the name --hf-overrides' architectures chooses) by its config's model_type, and
# its class, imported by vLLM when chosen (lazily, by this string)
ARCHITECTURES = {
    "qwen2_vl": ("ArrCocQwen2VLForConditionalGeneration", "arr_coc.engines.vllm_model:ArrCocQwen2VL"),
    "qwen2_5_vl": ("ArrCocQwen2_5_VLForConditionalGeneration", "arr_coc.engines.vllm_model:ArrCocQwen2_5_VL"),
    "qwen3_vl": ("ArrCocQwen3VLForConditionalGeneration", "arr_coc.engines.vllm_model:ArrCocQwen3VL"),
}
ARCHITECTURE = ARCHITECTURES["qwen2_vl"][0]  # the pocket model's (Qwen2-VL)
REQUEST_KWARGS = ("arr_budget", "arr_strategy")  # what a request's mm_processor_kwargs may set of ARR


@dataclass(frozen=True)
class ServerSettings:
    """One server's ARR settings: from --hf-overrides (arr_<field>), else $ARR_COC_<FIELD>, else these defaults.
    Each field is also arr-coc-serve's flag (--budget ...), with its help and its check (server_settings reads the
    overrides and the environment through the same checks)."""
    checkpoint: str | None = checkpoint_flag()
    budget: int | None = flag(None, "saccades per image, fixed for the server (vLLM sizes an image's tokens before "
                                    "encoding it); a request may ask for fewer (mm_processor_kwargs arr_budget). "
                                    "Default: the checkpoint's budget (273)", bounded_int(1, MAX_CELLS))
    strategy: str | None = flag(None, "ARR's allocator (default: the checkpoint's)", one_of(STRATEGIES))
    max_cells: int = max_cells_flag()  # cap on the candidate grid (PipelineConfig.max_cells)


def register() -> None:
    """vllm.general_plugins: name each family's ARR-COC architecture (its module is imported only when a server
    chooses one)."""
    from vllm import ModelRegistry

    for architecture, model_class in ARCHITECTURES.values():
        if architecture not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(architecture, model_class)


def architecture(model_type: str) -> str:
    """The ARR-COC architecture of a config's model_type; ValueError in one line for a family it has none for."""
    if model_type not in ARCHITECTURES:
        raise ValueError(f"ARR-COC serves {', '.join(ARCHITECTURES)} models in vLLM; this one is {model_type!r}")
    return ARCHITECTURES[model_type][0]


def server_settings(hf_config) -> ServerSettings:
    """The server's settings from its HF config (--hf-overrides put arr_* keys there) or the environment, each checked
    as its arr-coc-serve flag is: ValueError in one line for an unknown arr_* key or a value out of range."""
    names = [f.name for f in fields(ServerSettings)]
    unknown = sorted(k for k in vars(hf_config) if k.startswith("arr_") and k[4:] not in names)
    if unknown:
        raise ValueError(f"unknown ARR-COC setting {', '.join(unknown)} in --hf-overrides; the settings are "
                         + ", ".join(f"arr_{name}" for name in names))
    values = {}
    for f in fields(ServerSettings):
        value, where = getattr(hf_config, f"arr_{f.name}", None), f"--hf-overrides arr_{f.name}"
        if value is None:
            value, where = os.environ.get(f"ARR_COC_{f.name.upper()}"), f"$ARR_COC_{f.name.upper()}"
        if value is not None:
            values[f.name] = checked(f.metadata["type"] or str, value, where)
    settings = ServerSettings(**values)
    if settings.budget is not None and settings.budget > settings.max_cells:
        raise ValueError(f"arr_budget {settings.budget} exceeds arr_max_cells {settings.max_cells}")
    return settings


def checked(parse, value, where: str):
    """`value` (a JSON value, or an environment string) read by a flag's argparse type -> the value; ValueError in
    one line naming `where` it came from (1.5 or true is no integer: their text is refused)."""
    try:
        return parse(value if isinstance(value, str) else json.dumps(value))
    except argparse.ArgumentTypeError as e:
        raise ValueError(f"{where}: {e}") from None


def request_settings(settings: ServerSettings, budget: int, kwargs) -> tuple[int, str | None]:
    """(budget, strategy) of one request: its mm_processor_kwargs arr_budget (1 to the server's budget) and
    arr_strategy over the server's; ValueError in one line for one out of range or an unknown arr_* key."""
    unknown = sorted(str(k) for k in kwargs if str(k).startswith("arr_") and k not in REQUEST_KWARGS + ("arr_question",))
    if unknown:
        raise ValueError(f"unknown mm_processor_kwargs {', '.join(unknown)}; ARR-COC takes {', '.join(REQUEST_KWARGS)}")
    asked, strategy = kwargs.get("arr_budget"), kwargs.get("arr_strategy")
    asked = budget if asked is None else checked(bounded_int(1, budget), asked, "mm_processor_kwargs arr_budget "
                                                 "(at most the server's budget)")
    strategy = settings.strategy if strategy is None else checked(one_of(STRATEGIES), strategy,
                                                                  "mm_processor_kwargs arr_strategy")
    return asked, strategy


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
