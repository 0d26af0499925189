"""
A pipeline declares itself: one record (Pipeline) says what the registry, the commands' flags, the app's choices and
the generated docs need to know of it, torch-free, so the commands check their flags before torch loads. Each
pipeline's record is its declaration module's PIPELINE (arr_coc/pipelines/declared/<name>.py, found there by
arr_coc.pipelines); its answer lives in `module`, imported on first use. A pipeline's own settings are its Options
dataclass: a Request carries them (Request.options, what every pipeline shares in its own fields), the pipeline reads
its own (options_of), ARRCOCQwen.answer takes them by name (with_settings). A reducer's Options' fields are flags
(arr_coc.flags.flag: its help, default and parse-time check): run and evaluate take them as flags of their own
(flags.with_flags_of). ARR's (arr_coc.pipelines.arr_options: its strategy, ablation, second look, look, ...) are
plain fields: the commands name them in flags of their own (run's --strategy, evaluate's --strategies, a row each;
arr_coc.commands.cli), and cli.request puts the flags a command has into them.

    @dataclass(frozen=True)
    class Options:
        fastv_layer: int = flag(2, "the fastv baseline's K: ...", bounded_int(1, 1000))
    PIPELINE = Pipeline("fastv", "arr_coc.pipelines.fastv", "FastV: ...", kind="reducer", order=70,
                        engines=("fast",), options=Options)
"""

import importlib
from dataclasses import dataclass, fields
from types import ModuleType
from typing import Callable

from arr_coc.settings import ENGINES

KINDS = ("arr", "stock", "reducer")  # ARR itself; a stock baseline (the model on one view); a published token reducer


@dataclass(frozen=True)
class Pipeline:
    """One pipeline as the registry knows it."""
    name: str  # its name in --pipelines, --baselines, the app's dropdowns and ARRCOCQwen.answer
    module: str  # the module of its answer function, imported only when it answers (torch loads there)
    what: str  # what it reads, one line (the flags' help: arr_coc.pipelines.describe)
    kind: str  # one of KINDS: "arr", "stock" or "reducer" (a reducer names its kept cells: Answer.kept)
    order: int  # its place in the registry's order (the flags', the tables'), lowest first
    engines: tuple[str, ...] = ENGINES  # the engines it runs on (FastV: the fast one only, its layers read two lengths)
    budget_free: bool = False  # no budget changes it: a budget sweep runs it once
    from_embeds: bool = False  # its LLM reads our own embeddings (vlm.prompt) under either engine: stock generate()
    # cannot take Qwen3-VL's (it would drop their DeepStack features), so under its hf engine it has no row
    options: type | None = None  # its own settings, a frozen dataclass (None: it has none): fields that are flags
    # (a reducer's), or plain fields the commands' own flags fill (ARR's, arr_options)
    answer: str = "answer"  # the name in `module` of its answer(parts, views, question, request): a generator of its
    # tokens, then its Answer (arr_coc.pipelines.steps); the stock views share stock.py, the PixelPrunes pixelprune.py

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"pipeline {self.name}: kind must be one of {KINDS}, got {self.kind!r}")
        unknown = [e for e in self.engines if e not in ENGINES]
        if not self.engines or unknown:
            raise ValueError(f"pipeline {self.name}: engines must be some of {ENGINES}, got {self.engines}")

    @property
    def baseline(self) -> bool:
        """Whether it is a baseline beside ARR (stock or a published reducer)."""
        return self.kind != "arr"

    def load(self) -> ModuleType:
        """The module of its answer (imported on first use)."""
        return importlib.import_module(self.module)

    def answer_function(self) -> Callable:
        """Its answer(parts, views, question, request) (its module imported on first use)."""
        return getattr(self.load(), self.answer)


def option_names(options: type | None) -> tuple[str, ...]:
    """The setting names of an Options dataclass (none for None)."""
    return () if options is None else tuple(f.name for f in fields(options))
