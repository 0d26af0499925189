"""
lmms-eval's model `arr_coc`: any of the project's pipelines, run through the project's own façade (ARRCOCQwen), as
`python -m arr_coc.evaluate` runs it, on any lmms-eval task that generates (generate_until).

    python -m lmms_eval eval --model arr_coc --model_args pretrained=pocket,pipeline=arr,budget=273 \\
        --tasks arr_coc_pocket --include_path lmms_tasks --device cpu

It runs in its own venv (requirements-lmms.txt: lmms-eval 0.7.3 and the project, installed with `-e .`), where
pyproject.toml's `lmms_eval.models` entry point announces it with a ModelManifest (`manifest` below): lmms-eval 0.7.3
reads that group when `lmms_eval.models` is first imported (ModelRegistryV2.load_entrypoint_manifests);
`@register_model` alone never reaches the command line. Nothing in the package imports this module.

--model_args are evaluate's flags, by the same names with `_` for `-` (and read by evaluate's own parser, so the
defaults and the refusals are evaluate's):

    pretrained       the VLM, evaluate's --model: a Qwen-VL hub id or folder, pocket, tiny, ... (default: its default)
    pipeline         one of evaluate's rows: arr (arr:topk), arr:logpolar, full, gestalt, budget, divprune,
                     visionzip, fastv, arr-no-gestalt:topk (an ablation), arr+refix:topk (with refixate=TAU),
                     arr+two_scale:topk (ARR's two-scale look)
    budget, checkpoint, max_cells, min_budget, max_budget, refixate, refixate_budget, refixate_guide, crop_tokens,
    seed, and each pipeline's own settings (its Options' fields, evaluate's flags: fastv_layer, pixelprune_tau)
    max_new_tokens   used where the task's generation_kwargs give none (then evaluate's default for a JSONL set, 16)

Each request is answered alone (lmms-eval's batch_size is accepted and does not batch): one image (the doc's first
visual) and the task's prompt as the question, greedy, cut at the task's `until` strings as lmms-eval's own
Qwen2-VL model cuts. Sampling (temperature > 0, do_sample, num_beams > 1) is refused: the project decodes greedily.
loglikelihood and multi-round tasks are refused with a line saying so.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from lmms_eval.api.model import lmms
from tqdm import tqdm

from arr_coc import evaluate
from arr_coc.commands import cli
from arr_coc.pipelines import BASELINES
from arr_coc.eval.rows import row_look, split_row
from arr_coc.eval.sets import SCHEMAS
from arr_coc.settings import LOOKS

MODEL_ID = "arr_coc"  # the name lmms-eval's --model takes
DEFAULT_MAX_NEW_TOKENS = SCHEMAS["jsonl"].max_new_tokens  # evaluate's for a JSONL set: where the task gives none
LMMS_KWARGS = ("batch_size", "max_batch_size")  # what lmms-eval passes every model besides --model_args (and device)


def manifest():
    """The `lmms_eval.models` entry point's payload: the ModelManifest naming this module's ARRCOC as `arr_coc`."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return ModelManifest(model_id=MODEL_ID, simple_class_path=f"{__name__}.ARRCOC")


def row_of(pipeline: str, strategy: str | None) -> str:
    """evaluate's row name of `pipeline=`: "arr" -> "arr:topk" (or the strategy given); others as written."""
    name, row_strategy, _, _ = split_row(pipeline)
    if name == "arr" and row_strategy is None:
        return f"{pipeline}:{strategy or evaluate.ABLATION_STRATEGY}"
    return pipeline


def flags_of(row: str, settings: dict) -> list[str]:
    """evaluate's argv for one row and the other --model_args: pretrained -> --model, the row -> --baselines or
    --strategies (and --ablations), every other key k -> --k with `_` as `-`."""
    name, strategy, ablation, _ = split_row(row)
    if name in BASELINES and strategy is None and ablation is None:
        argv = ["--baselines", name, "--strategies", ""]
    else:
        argv = ["--baselines", "", "--strategies", strategy or ""] + (["--ablations", ablation] if ablation else [])
    if row_look(row) != LOOKS[0]:  # arr+two_scale:topk: ARR's two-scale look
        argv += ["--looks", row_look(row)]
    if settings.get("pretrained") is not None:
        argv += ["--model", str(settings.pop("pretrained"))]
    for key, value in settings.items():
        if value is not None:
            argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


def parse_settings(pipeline: str, settings: dict) -> argparse.Namespace:
    """--model_args read by evaluate's parser and its checks (a bad one: its one line on stderr and exit 2), for the
    one row `pipeline` names; args.row is that row."""
    settings = {key: value for key, value in settings.items() if key not in LMMS_KWARGS}
    row = row_of(pipeline, settings.pop("strategy", None))
    p = evaluate.build_parser()
    p.prog = f"--model {MODEL_ID} --model_args"  # its flags are key=value there
    if split_row(row)[0] not in (*BASELINES, "arr"):
        p.error(f"argument pipeline: {pipeline!r} is none of evaluate's rows: arr (arr:STRATEGY, "
                f"arr-ABLATION:STRATEGY, arr+refix:STRATEGY, arr+two_scale:STRATEGY) or a baseline ({', '.join(BASELINES)})")
    args = p.parse_args(flags_of(row, settings))
    cli.default_model(args)
    evaluate.check(p, args)
    if row not in evaluate.row_names(args):
        p.error(f"argument pipeline: {pipeline!r} is not one of evaluate's rows here ({evaluate.row_names(args)})")
    args.row = row
    return args


class ARRCOC(lmms):
    """lmms-eval's `arr_coc`: one row of evaluate (a pipeline at a budget) answering each request through the façade
    with evaluate's calls (cli.load_model, cli.request, cli.answer)."""

    def __init__(self, pipeline: str = "arr", **settings) -> None:
        super().__init__()
        self.args = parse_settings(pipeline, settings)
        self.model, self.checkpoint = cli.load_model(self.args.model, self.args.checkpoint, self.args.device,
                                                     fallback=self.args.fallback)
        self.model.warmup()  # as evaluate does before its first item (nothing to capture off CUDA)

    @property
    def device(self):
        """The device the model runs on."""
        return self.model.vlm.device

    def request(self, gen_kwargs: dict):
        """The Request of this row (evaluate_item's) with the task's answer length."""
        if (gen_kwargs.get("temperature") or 0) > 0 or gen_kwargs.get("do_sample") or \
                (gen_kwargs.get("num_beams") or 1) > 1:
            asked = {k: gen_kwargs.get(k) for k in ("temperature", "do_sample", "num_beams")}
            raise ValueError(f"arr_coc decodes greedily, as every pipeline of the project does; the task asks {asked}")
        length = gen_kwargs.get("max_new_tokens") or self.args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS
        _, strategy, ablation, refix = split_row(self.args.row)
        request = cli.request(self.args, strategy=strategy, budget=self.args.budget, ablation=ablation,
                              refixate=self.args.refixate if refix else None, look=row_look(self.args.row))
        return replace(request, max_new_tokens=int(length))

    def answer_one(self, instance) -> str:
        """One generate_until request: the doc's first visual, the context as the question; cut at `until`."""
        context, gen_kwargs, doc_to_visual, doc_id, task, split = instance.args
        gen_kwargs = dict(gen_kwargs or {})
        until = gen_kwargs.pop("until", None) or []
        visuals = doc_to_visual(self.task_dict[task][split][doc_id])
        visuals = [v for v in (visuals if isinstance(visuals, list) else [visuals]) if v is not None]
        if not visuals:
            raise ValueError(f"arr_coc answers about one image; {task} doc {doc_id} has none")
        pipeline = split_row(self.args.row)[0]
        text = cli.answer(self.model, visuals[0], context, pipeline, self.request(gen_kwargs)).text
        for term in [until] if isinstance(until, str) else until:
            text = text.split(term)[0] if term else text
        self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return text

    def generate_until(self, requests) -> list[str]:
        """Each request's answer, in order, one at a time."""
        import torch

        with torch.no_grad():
            return [self.answer_one(r) for r in tqdm(requests, desc="arr_coc", disable=self.rank != 0)]

    def loglikelihood(self, requests):
        """Refused: the project's pipelines generate answers; they score no given continuation for lmms-eval."""
        raise NotImplementedError("arr_coc answers generate_until tasks only; this task asks for loglikelihood")

    def generate_until_multi_round(self, requests):
        """Refused: one question a request (the project's conversations are evaluate --conversation's)."""
        raise NotImplementedError("arr_coc answers generate_until tasks only; this task is multi-round")
