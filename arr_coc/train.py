"""
Train the ARR relevance layer with the VLM frozen.

Three losses, each reaching every ARR parameter:
- self-distillation (--distill DIR, weighted by --distill-weight; issue #52): the relevance map, as a softmax over
  cells, should put its mass where the frozen VLM itself looked when it read the whole image and answered: the KL
  divergence to the teacher's map of each item (python -m arr_coc.commands.teacher caches them, keyed by the --data
  set's item ids; arr_coc/distill/student.py). No boxes are needed: any VQA set through `datasets` (DocVQA, TextVQA,
  ChartQA, a local parquet) or a JSONL folder;
- relevance (--box-weight, 1 by default, 0 with --distill; 0 switches it off): the relevance map, as a softmax over
  cells, should put its mass on the target box (a listwise cross-entropy against the box's cell coverage), on the
  items that have a box;
- answer (--lm-weight > 0): the frozen VLM's loss on the expected answer, given the gestalt and the
  selected saccades; the hard top-k selection passes gradient through the straight-through product
  tokens * (1 + (s - s.detach())) * gates on the selected scores (ARRCOCOutput.token_weights; docs/ARCHITECTURE.md
  §3), the gates carrying the three tensions' gradients (arr_coc.relevance.tensions: exactly 1 forward).

and, with --budget auto, a token cost (--token-cost) on the adaptive budget: token_cost * K_soft / --max-budget,
K_soft the unrounded K (the relaxation is explained in arr_coc.relevance.tensions). The held-out log reports the
mean K per scene kind (budget/KIND).

At the end (unless --no-compare) the trained layer's held-out box recall per scene kind is set beside the untrained
prior's (the layer --checkpoint prior loads), on the same held-out items and selection, each with a 95% bootstrap
interval over the items: the final log entry's "compare", printed after training and in the model card; "better"
or "worse" only where the two intervals are apart.

The frozen VLM's part of every sample (gestalt tokens, attention prior, texture) is computed once.

Under torchrun it is data-parallel (DistributedDataParallel): every process holds the frozen VLM, observes
only the samples it will score and scores its slice of each global batch of --batch-size; only the ARR
layer's gradients are all-reduced, so a step equals the one-process step over the same global batch. Rank 0
logs, writes the checkpoint and pushes it.

    python -m arr_coc.train --model tiny --steps 300                  # writes a fresh runs/arr-YYYYmmdd-HHMMSS
    python -m arr_coc.train --model tiny --steps 300 --out checkpoints/tiny-text-vs-distractor --overwrite
    python -m arr_coc.train --model Qwen/Qwen2-VL-2B-Instruct --data data/mine --lm-weight 0.1 --out checkpoints/mine
    torchrun --nproc-per-node 2 -m arr_coc.train --model Qwen/Qwen2-VL-2B-Instruct --data data/mine --out checkpoints/mine
    python -m arr_coc.train --model tiny --out runs/tiny --push-to-hub you/arr-coc-tiny    # then uploads runs/tiny
    python -m arr_coc.train --model tiny --budget auto --token-cost 0.5 --lm-weight 0.1 --out runs/tiny-auto
    python -m arr_coc.commands.teacher --model pocket --out runs/teacher --data data/pages      # the targets, then:
    python -m arr_coc.train --model pocket --data data/pages --distill runs/teacher --out runs/distilled
    python -m arr_coc.train --model Qwen/Qwen2-VL-2B-Instruct --data lmms-lab/DocVQA --data-config DocVQA \
        --split validation --limit 10000 --distill runs/docvqa-teacher --lm-weight 0.1 --out runs/docvqa-distilled

--out is checked at parse time (a file, a folder that cannot be written, a non-empty folder without --overwrite
are refused before anything loads). A checkpoint is saved atomically: written whole into a temporary folder beside
--out, which then takes its place, so an interrupted save (or --overwrite) leaves the old checkpoint as it was.
--save-every N saves a resumable checkpoint every N steps (its training_state.pt holds the step, the log and
the optimizer's state; the final save leaves it out); --resume continues such a run, the schedule from the
seed as before, so the result is the uninterrupted run's.

    python -m arr_coc.train --model tiny --steps 300 --save-every 50 --out runs/tiny        # Ctrl-C at step 170
    python -m arr_coc.train --model tiny --steps 300 --save-every 50 --out runs/tiny --resume   # on from step 150

Exit codes: 0 on success; 130 when stopped by Ctrl-C; 2 on bad input (a bad flag, a model, dataset or --init
checkpoint that cannot be loaded, a --resume that does not match, a failed upload or save), with one line on
stderr.
"""

from __future__ import annotations  # type hints name torch and the model without importing them

import json
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from arr_coc.commands import cli
from arr_coc.runtime import distributed
from arr_coc.relevance.config import AUTO, SACCADE_ORDERS, scorer_names
from arr_coc.errors import InputError, OutOfMemory
from arr_coc.eval.data import SCENE_KINDS, Sample, check_at, make_dataset
from arr_coc.eval.metrics import box_recall_precision
from arr_coc.flags import check_fresh_folder, config_parser, device_flag, flag, parse_config, seed_flag
from arr_coc.eval.intervals import bootstrap_mean

if TYPE_CHECKING:  # torch and the model load inside the functions, after the flags are checked
    import torch

    from arr_coc.runtime.distributed import Process
    from arr_coc.model import ARRCOCQwen, Observation
    from arr_coc.relevance.layer import ARRCOCLayer, ScoreMaps

    # a sample, the frozen VLM's view of it, its box's coverage [GH, GW] (None: no box) and its teacher's map on the
    # candidate grid [GH, GW] (None: no --distill)
    Observed = tuple[Sample, Observation, torch.Tensor | None, torch.Tensor | None]

DISTILL_LOSSES = ("kl", "bce")  # --distill-loss: arr_coc.distill.student.LOSSES' names
TEACHER_TOP = 64  # the held-out log's teacher_top64: the teacher's mass inside ARR's 64 most relevant cells


@dataclass
class TaughtSample(Sample):
    """A sample of a --data set, with its teacher's map when distilling."""
    target: torch.Tensor | None = None  # [gh, gw] the teacher's map on the native grid, sums to 1 (--distill)


@dataclass
class TrainConfig:
    model: str = cli.model_flag("tiny", use="the VLM to train against, frozen", then="Default: tiny")
    data: str | None = flag(None, "the training set: a JSONL folder (arr_coc.eval.data format), a parquet file or "
                                  "folder, or a hub id (DocVQA, TextVQA, ChartQA through datasets), split 80/20 into "
                                  "training and held-out items; default: synthetic scenes")
    split: str = flag("validation", "the --data set's split (a hub set or parquet)")
    data_config: str | None = flag(None, "the --data set's config, e.g. DocVQA for lmms-lab/DocVQA")
    limit: int | None = flag(None, "read at most this many --data items", cli.bounded_int(1, 10**9))
    distill: str | None = flag(None, "train toward the teacher's maps cached in this folder (python -m "
                                     "arr_coc.commands.teacher --data the same set): needs --data; items it has no "
                                     "map for are left out")
    distill_weight: float = flag(1.0, "weight of the self-distillation loss with --distill", cli.bounded_float(0.0))
    distill_loss: str = flag("kl", "the self-distillation loss: 'kl' (KL divergence from the teacher's map to the "
                                   "relevance map's softmax) or 'bce' (SD-RPN's: the cells holding half its mass "
                                   "against those below the uniform level)", cli.one_of(DISTILL_LOSSES))
    kinds: str = flag("text_vs_distractor,distractor_query", "synthetic scene kinds, comma-separated",
                      cli.comma_list(SCENE_KINDS))
    n_train: int = flag(48, "number of synthetic training samples", cli.bounded_int(1, 1_000_000))
    n_eval: int = flag(16, "number of synthetic held-out samples", cli.bounded_int(1, 1_000_000))
    scene_size: int = flag(448, "synthetic scene side in px (views are resized to the model's grids anyway)",
                           cli.bounded_int(64, 8192))
    steps: int = flag(300, "optimisation steps", cli.bounded_int(1, 10_000_000))
    batch_size: int = flag(8, "samples per step, over all processes (under torchrun a multiple of their number)",
                           cli.bounded_int(1, 4096))
    lr: float = flag(3e-3, "AdamW learning rate", cli.bounded_float(0.0, 10.0, above=True))
    weight_decay: float = flag(1e-4, "AdamW weight decay", cli.bounded_float(0.0, 10.0))
    temperature: float = flag(0.5, "softmax temperature of the relevance loss", cli.bounded_float(0.0, above=True))
    box_weight: float | None = flag(None, "weight of the relevance (box) loss on the items with a box; 0 trains on "
                                          "the other losses alone, as data without boxes would; default: 1, or 0 with "
                                          "--distill", cli.bounded_float(0.0))
    lm_weight: float = flag(0.0, "weight of the answer loss through the frozen VLM (straight-through estimator)",
                            cli.bounded_float(0.0))
    budget: int | str = cli.budget_flag()  # the answer loss's saccades; auto: trained by --token-cost
    min_budget: int = cli.min_budget_flag()
    max_budget: int = cli.max_budget_flag()
    token_cost: float = flag(0.0, "with --budget auto: the price of the budget, token_cost * K_soft / --max-budget "
                                  "added to the loss (0: none)", cli.bounded_float(0.0))
    saccade_order: str | None = flag(None, "feed the saccades to the LLM in this order, in training and wherever the "
                                           "checkpoint is used: 'relevance' (most relevant first) or 'raster' (row by "
                                           "row); default: the --init checkpoint's, else raster",
                                     cli.one_of(SACCADE_ORDERS))
    trained_scorer: str | None = flag(None, "train this scorer alone (e.g. participatory: its query<->texture "
                                            "coupling and its states' residual), the balancer and the other scorers "
                                            "held at their priors; default: every part of the layer",
                                      cli.one_of(scorer_names()))
    init: str | None = flag(None, "start from this checkpoint (a name under checkpoints/, a folder or a hub id) "
                                  "instead of the untrained prior")
    eval_every: int = flag(50, "steps between held-out evaluations", cli.bounded_int(1, 10_000_000))
    seed: int = seed_flag(0, "data order and synthetic scenes")
    device: str | None = device_flag(torchrun=True)
    out: str | None = flag(None, "checkpoint folder to write (default: a fresh runs/arr-YYYYmmdd-HHMMSS), checked "
                                 "writable before anything loads; an existing non-empty folder needs --overwrite",
                           cli.output_folder)
    overwrite: bool = flag(False, "write into --out even if it already holds files (e.g. a shipped checkpoint); the "
                                  "old checkpoint is replaced only once the new one is written whole")
    save_every: int | None = flag(None, "also save a resumable checkpoint into --out every N steps (the layer, the "
                                        "log and the optimizer's state; default: only at the end)",
                                  cli.bounded_int(1, 10_000_000))
    resume: bool = flag(False, "continue the run whose --save-every checkpoint is in --out, from its last saved step, "
                               "with the same flags (--steps may grow)")
    push_to_hub: str | None = flag(None, "after saving, upload the checkpoint folder (weights, config, model card, "
                                         "training log) to this hub model repo, e.g. you/arr-coc-mine (needs a login)")
    no_compare: bool = flag(False, "leave out the end-of-run comparison, which runs by default: the trained layer's "
                                   "held-out box recall per scene kind beside the untrained prior's (--checkpoint "
                                   "prior) on the same held-out items, with 95% bootstrap intervals")


STATE_FILE = "training_state.pt"  # beside a checkpoint saved mid-run: what --resume continues from
RESUME_FREE = ("steps", "eval_every", "save_every", "resume", "overwrite", "out", "device", "push_to_hub")  # may change


@dataclass
class TrainingState:
    """What --resume needs beyond the layer's weights: the steps done, the log so far, the optimizer's state, and the
    config the run was started with (a resumed run must match it but for RESUME_FREE)."""
    step: int
    log: list[dict]
    optimizer: dict
    config: dict


def read_state(cfg: TrainConfig) -> TrainingState:
    """The training state in --out, checked against cfg; InputError naming what differs, or that all steps are done."""
    import torch

    try:
        state = TrainingState(**torch.load(Path(cfg.out) / STATE_FILE, weights_only=True))
    except Exception as e:  # cut short, not ours, from another torch: whatever the cause, it cannot be resumed
        raise InputError(f"cannot read {Path(cfg.out) / STATE_FILE} ({type(e).__name__}: {str(e)[:200]})") from None
    now = asdict(cfg)
    changed = [f"{k}: {v!r} there, {now.get(k)!r} now" for k, v in state.config.items()
               if k not in RESUME_FREE and now.get(k) != v]
    if changed:
        raise InputError(f"{cfg.out} was trained with other flags ({'; '.join(changed)}); resume with the same ones")
    if state.step >= cfg.steps:
        raise InputError(f"{cfg.out} is at step {state.step} already; raise --steps to train on")
    return state


def with_defaults(cfg: TrainConfig) -> TrainConfig:
    """cfg with the defaults that depend on other flags set: --box-weight 1, or 0 with --distill."""
    if cfg.box_weight is None:
        cfg.box_weight = 0.0 if cfg.distill else 1.0
    return cfg


def fresh_out() -> str:
    """A new run folder: training never writes into a shipped checkpoint unless told to."""
    return f"runs/arr-{time.strftime('%Y%m%d-%H%M%S')}"


def relevance_loss(relevance: torch.Tensor, coverage: torch.Tensor, temperature: float) -> torch.Tensor:
    """Listwise cross-entropy: the softmax of the map over cells against the box's normalised coverage."""
    import torch.nn.functional as F

    target = coverage.flatten() / coverage.sum()
    return -(target * F.log_softmax(relevance.flatten() / temperature, dim=0)).sum()


def answer_loss(model: ARRCOCQwen, observation: Observation, out, answer: str) -> torch.Tensor:
    """
    The frozen VLM's cross-entropy on the answer (minus its mean log-likelihood per token, by the scorer
    faithfulness uses too), with gradient to the selected scores (straight-through).
    """
    import torch

    from arr_coc.pipelines.arr_layout import arr_prompt, encode_saccades

    vlm = model.vlm
    with torch.no_grad():
        saccades = encode_saccades(vlm, observation, out.positions[0])  # [K, D], frozen
    if saccades is not None:
        saccades = saccades.scaled(out.token_weights()[0].unsqueeze(-1))  # [K, 1]: forward 1; d/ds = the tokens
    prompt = arr_prompt(vlm, observation, saccades, answer)  # the answer teacher-forced at the end
    return -vlm.answer_logprobs([prompt])[0]


def load_samples(cfg: TrainConfig) -> tuple[list[Sample], list[Sample]]:
    """(training, held-out) samples that have what the losses need (a box for the box loss alone, a teacher's map
    with --distill): a --data set split 80/20, or fresh synthetic scenes."""
    if cfg.data:
        samples = data_samples(cfg)
        random.Random(cfg.seed).shuffle(samples)
        n_eval = max(1, len(samples) // 5)
        return samples[n_eval:], samples[:n_eval]
    kinds = tuple(cli.names(cfg.kinds))
    boxed = lambda samples: [s for s in samples if s.box is not None]  # noise scenes have no target
    return (boxed(make_dataset(cfg.n_train, kinds, seed=cfg.seed, size=cfg.scene_size)),
            boxed(make_dataset(cfg.n_eval, kinds, seed=cfg.seed + 10_000, size=cfg.scene_size)))


def data_samples(cfg: TrainConfig) -> list[TaughtSample]:
    """The --data set's items (eval.sets.open_source: hub, parquet or JSONL; asked as evaluate asks them) as samples:
    with --distill those the teacher's cache has a map for (the answer: the set's first, else the teacher's own),
    else with the box loss alone those with a box. InputError when none is left."""
    from arr_coc.eval.sets import open_source

    cache = None
    if cfg.distill:
        from arr_coc.distill.cache import TargetCache

        cache = TargetCache(cfg.distill)
    source = open_source(cfg.data, cfg.split, cfg.data_config, limit=cfg.limit)
    samples = []
    for item in source.items:
        target = cache[item.id] if cache is not None and item.id in cache else None
        if (cache is not None and target is None) or (cache is None and cfg.lm_weight == 0 and item.box is None):
            continue
        answer = item.answers[0] if item.answers else target.answer if target is not None else ""
        samples.append(TaughtSample(item.open(), source.prompt(item), answer, item.box, item.kind or source.schema,
                                    where=item.where, target=None if target is None else target.map))
    if not samples:
        need = f"a teacher's map in {cfg.distill}" if cache is not None else "a target box"
        raise InputError(f"no item of {cfg.data} has {need}")
    return samples


def batches(cfg: TrainConfig, n_train: int, world_size: int) -> list[list[int]]:
    """
    Every step's global batch, as training-sample indices, drawn up front from the seed: every process knows
    them all, and they are the batches one process alone draws.
    """
    size = min(cfg.batch_size, n_train)
    if size % world_size:
        raise InputError(f"only {n_train} training samples: a global batch of {size} does not split evenly over "
                         f"{world_size} processes")
    order = random.Random(cfg.seed)
    return [order.sample(range(n_train), size) for _ in range(cfg.steps)]


def observe_all(model: ARRCOCQwen, samples: list[Sample], show: bool = True) -> list[Observed]:
    """The frozen VLM's view of each sample, and its target box as cell coverage: computed once."""
    from tqdm.auto import tqdm

    from arr_coc.pipelines import arr_scene

    from arr_coc.distill.student import on_grid

    observed, device = [], model.vlm.device
    for sample in tqdm(samples, desc="observe", unit="sample", disable=not show):
        question = check_at(sample.where, model.check_question, sample.question)  # its tokens: refused naming its line
        observation = arr_scene.observe(model.parts, model.views(sample.image), question)
        views, target = observation.views, getattr(sample, "target", None)
        observed.append((sample, observation, None if sample.box is None else views.box_coverage(sample.box).to(device),
                         None if target is None else on_grid(target, views.candidate_grid).to(device)))
    return observed


def observe_shares(model: ARRCOCQwen, train_samples: list[Sample], eval_samples: list[Sample],
                   schedule: list[list[int]], process: Process) -> tuple[dict[int, Observed], list[Observed]]:
    """
    This process's share of the frozen-VLM work: the training samples its slices of the schedule use (by
    index), and its shard of the held-out samples.
    """
    mine = sorted({i for batch in schedule for i in process.shard(batch)})
    train_data = dict(zip(mine, observe_all(model, [train_samples[i] for i in mine], process.is_main)))
    return train_data, observe_all(model, process.shard(eval_samples), process.is_main)


def batch_loss(model: ARRCOCQwen, scorer: Callable[..., ScoreMaps], batch: list[Observed],
               cfg: TrainConfig) -> torch.Tensor:
    """
    The mean loss over a batch (this process's slice of the global batch). `scorer` is the layer, or its
    DDP wrapper: scoring through the wrapper's forward is what makes backward all-reduce the gradients.
    """
    import torch

    from arr_coc.pipelines import arr_scene

    from arr_coc.distill.student import LOSSES

    distill_loss = LOSSES[cfg.distill_loss]
    loss = torch.zeros((), device=model.vlm.device)
    for sample, observation, coverage, target in batch:
        maps = arr_scene.score(observation, scorer)
        if cfg.box_weight > 0 and coverage is not None:
            loss = loss + cfg.box_weight * relevance_loss(maps.relevance[0], coverage, cfg.temperature) / len(batch)
        if cfg.distill_weight > 0 and target is not None:
            loss = loss + cfg.distill_weight * distill_loss(maps.relevance[0], target, cfg.temperature) / len(batch)
        if cfg.lm_weight > 0 or cfg.token_cost > 0:
            out = select(model, maps, observation, cfg)
        if cfg.lm_weight > 0:
            loss = loss + cfg.lm_weight * answer_loss(model, observation, out, sample.answer) / len(batch)
        if cfg.token_cost > 0:
            loss = loss + cfg.token_cost * budget_cost(model, out, cfg) / len(batch)
    return loss


def select(model: ARRCOCQwen, maps: ScoreMaps, observation: Observation, cfg: TrainConfig,
           layer: ARRCOCLayer | None = None):
    """The saccades training reads: at --budget (fixed, or adaptive within --min-budget and --max-budget), chosen by
    `layer` (default: model.layer)."""
    from arr_coc.relevance.config import TensionSettings

    settings = TensionSettings(min_budget=cfg.min_budget, max_budget=cfg.max_budget)
    return (layer or model.layer).select(maps, observation.views.candidate_grid, cfg.budget, settings=settings)


def budget_cost(model: ARRCOCQwen, out, cfg: TrainConfig) -> torch.Tensor:
    """The token cost's unweighted term: K_soft / the ceiling (arr_coc.relevance.tensions.token_cost)."""
    from arr_coc.relevance.config import TensionSettings
    from arr_coc.relevance.tensions import soft_budget, token_cost

    bounds = model.layer.budget_bounds(out.grid, TensionSettings(min_budget=cfg.min_budget, max_budget=cfg.max_budget))
    return token_cost(soft_budget(out.particularize, bounds), bounds[1])


def evaluate(model: ARRCOCQwen, data: list[Observed], kinds: list[str], cfg: TrainConfig, process: Process) -> dict:
    """
    Over all processes' shards of the held-out samples (each process scores its own; the sums are all-reduced): the
    budget K, and on the samples with a box the mean relevance loss and the fraction of saccades on it, and on those
    with a teacher's map the KL to it and its mass inside ARR's TEACHER_TOP most relevant cells (overall and per kind).
    """
    import torch

    from arr_coc.distill.student import LOSSES, top_mass
    from arr_coc.pipelines import arr_scene

    # [kinds, (samples, K, boxed samples, relevance loss, box precision, taught samples, KL, teacher's top mass)]
    sums = torch.zeros(len(kinds), 8, dtype=torch.float64)
    with torch.no_grad():
        for sample, observation, coverage, target in data:
            maps = arr_scene.score(observation, model.layer.graphed_score)
            out = select(model, maps, observation, cfg)
            row = [1.0, out.budgets[0], 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
            if coverage is not None:
                row[2:5] = [1.0, float(relevance_loss(maps.relevance[0], coverage, cfg.temperature)),
                            box_recall_precision(coverage, out.indices[0])[1]]
            if target is not None:
                row[5:8] = [1.0, float(LOSSES[cfg.distill_loss](maps.relevance[0], target, cfg.temperature)),
                            top_mass(maps.relevance[0], target, TEACHER_TOP)]
            sums[kinds.index(sample.kind)] += torch.tensor(row, dtype=torch.float64)
    count, budget, boxed, loss, precision, taught, kl, mass = process.sum(sums).unbind(1)  # [kinds] each
    log = dict(budget=float(budget.sum() / count.sum()),
               **{f"budget/{kind}": float(k / n) for kind, k, n in zip(kinds, budget, count)})
    if boxed.sum() > 0:
        log.update(loss=float(loss.sum() / boxed.sum()),
                   **{f"hits/{kind}": float(p / n) for kind, p, n in zip(kinds, precision, boxed) if n > 0})
    if taught.sum() > 0:
        log.update(distill=float(kl.sum() / taught.sum()), teacher_top64=float(mass.sum() / taught.sum()),
                   **{f"teacher_top64/{kind}": float(m / n) for kind, m, n in zip(kinds, mass, taught) if n > 0})
    return log


@dataclass
class PriorComparison:
    """
    One scene kind's held-out box recall (the share of the target box's cells that got a saccade, selected as
    training selects: at --budget) of the trained layer and of the untrained prior (--checkpoint prior), on the same
    held-out items, each with its 95% percentile bootstrap interval over the items (intervals.bootstrap_mean); the
    verdict is 'better' or 'worse' only where the two intervals are apart, else 'tie'.
    """
    n: int  # held-out items of the kind that have a box
    trained: float  # the trained layer's mean box recall over them
    trained_low: float
    trained_high: float
    prior: float  # the untrained prior's
    prior_low: float
    prior_high: float
    verdict: str  # the trained layer against the prior: 'better', 'worse' or 'tie'


def comparison(trained: list[float], prior: list[float]) -> PriorComparison:
    """The comparison of two layers' per-item box recalls on the same items (trained[i] and prior[i]: item i's)."""
    from arr_coc.eval.report import against  # the intervals' rule evaluate's tables and the default rule use

    (trained_low, trained_high), (prior_low, prior_high) = bootstrap_mean(trained), bootstrap_mean(prior)
    verdict = {"above": "better", "below": "worse", "tie": "tie"}[against((trained_low, trained_high),
                                                                        (prior_low, prior_high))]
    return PriorComparison(len(trained), sum(trained) / len(trained), trained_low, trained_high,
                           sum(prior) / len(prior), prior_low, prior_high, verdict)


def held_out_recalls(model: ARRCOCQwen, layers: list[ARRCOCLayer], eval_samples: list[Sample],
                     eval_data: list[Observed], cfg: TrainConfig, process: Process) -> list[tuple[str, list[float]]]:
    """
    Every held-out item that has a box, over all processes, in eval_samples' order: (its kind, its box recall under
    each of `layers`, selected as training selects). Each process scores its shard (eval_data, the every
    world_size-th item from its rank) into its items' rows of one table, and the tables are summed: an all-gather.
    """
    import torch

    from arr_coc.pipelines import arr_scene

    rows = torch.zeros(len(eval_samples), 1 + len(layers), dtype=torch.float64)  # [items, (has a box, per layer)]
    with torch.no_grad():
        for i, (sample, observation, coverage, target) in enumerate(eval_data):
            if coverage is None:
                continue
            selected = [select(model, arr_scene.score(observation, layer.graphed_score), observation, cfg, layer)
                        for layer in layers]
            recalls = [box_recall_precision(coverage, out.indices[0])[0] for out in selected]
            rows[process.rank + i * process.world_size] = torch.tensor([1.0, *recalls], dtype=torch.float64)
    rows = process.sum(rows)
    return [(sample.kind, row[1:].tolist()) for sample, row in zip(eval_samples, rows) if row[0] > 0]


def compare_with_prior(model: ARRCOCQwen, eval_samples: list[Sample], eval_data: list[Observed], kinds: list[str],
                       cfg: TrainConfig, process: Process) -> dict[str, dict]:
    """The final log's "compare": per scene kind with a boxed held-out item, asdict(PriorComparison) of model.layer
    against the untrained prior (model.prior_layer(), the layer --checkpoint prior loads) on the same items."""
    import torch

    with torch.random.fork_rng(devices=[]):  # the prior's random (at first unused) weights leave the caller's RNG as
        prior = model.prior_layer()  # it was: a layer made after this one draws what it would have drawn without it
    recalls = held_out_recalls(model, [model.layer, prior], eval_samples, eval_data, cfg, process)
    by_kind = {kind: [r for k, r in recalls if k == kind] for kind in kinds}
    return {kind: asdict(comparison([r[0] for r in rs], [r[1] for r in rs])) for kind, rs in by_kind.items() if rs}


def comparison_lines(compare: dict[str, dict], budget: int | str) -> list[str]:
    """What train prints after training, and the model card says, of its final log's "compare": a header, then a
    line a kind; none for none."""
    if not compare:
        return []
    at = "the adaptive budget (each layer its own K)" if budget == AUTO else f"{budget} saccades"
    lines = [f"held-out box recall (the share of the box's cells that got a saccade, at {at}; 95% bootstrap "
             "intervals over the items), trained layer vs the untrained prior on the same items:"]
    for kind, record in compare.items():
        c = PriorComparison(**record)
        verdict = "tie (intervals overlap)" if c.verdict == "tie" else f"trained {c.verdict} (intervals apart)"
        lines.append(f"held-out box recall, {kind} (n={c.n}): trained {c.trained:.2f} [{c.trained_low:.2f}, "
                     f"{c.trained_high:.2f}] · untrained prior {c.prior:.2f} [{c.prior_low:.2f}, {c.prior_high:.2f}]"
                     f" — {verdict}")
    return lines


def train(cfg: TrainConfig, model: ARRCOCQwen | None = None,
          process: Process | None = None) -> tuple[ARRCOCQwen, list[dict]]:
    """
    Train model.layer in place (the VLM never changes) and return the model and the log, the same on every
    process. `process` is this torchrun rank (default: distributed.start(), alone without torchrun). With
    cfg.save_every, rank 0 saves a resumable checkpoint into cfg.out every so many steps; with cfg.resume,
    training continues from the one there (its layer, optimizer and log), on the rest of the same schedule.
    """
    import torch
    from tqdm.auto import tqdm

    from arr_coc.runtime.timing import Stopwatch

    process = process or distributed.start(cfg.device)
    with_defaults(cfg)
    torch.manual_seed(cfg.seed)
    model, state = load_trainee(cfg, model, process)
    done = state.step if state else 0
    cfg.out = cfg.out or (fresh_out() if cfg.save_every else None)  # every save of the run goes to one folder
    vlm_state = {k: v.clone() for k, v in list(model.vlm.model.state_dict().items())[:3]}  # spot-check frozen
    train_samples, eval_samples = load_samples(cfg)
    schedule = batches(cfg, len(train_samples), process.world_size)  # [steps][global batch]
    watch = Stopwatch(model.vlm.device)
    with watch.section("observe"):
        train_data, eval_data = observe_shares(model, train_samples, eval_samples, schedule[done:], process)
        process.barrier()  # observation lasts until the slowest process is done
    if process.is_main:
        process.log(f"observed {len(train_data)} training and {len(eval_data)} held-out samples in "
                    f"{watch.ms['observe'] / 1000:.1f}s")

    layer, scorer = trainable(model, cfg, process)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    kinds = list(dict.fromkeys(s.kind for s in eval_samples))  # every process reports every kind, in this order
    if state is not None:
        optimizer.load_state_dict(state.optimizer)
        log = state.log
        if process.is_main:
            process.log(f"resuming {cfg.out} at step {done} of {cfg.steps}")
    else:
        log = [dict(step=0, observe_s=watch.ms["observe"] / 1000, **evaluate(model, eval_data, kinds, cfg, process))]
        if process.is_main:
            tqdm.write(json.dumps(log[-1]))
    steps = tqdm(schedule[done:], desc="train", unit="step", disable=not process.is_main, initial=done, total=cfg.steps)
    for step, batch in enumerate(steps, start=done + 1):
        with watch.section("train"):  # the optimisation alone, for the throughput: no observation, no evaluation
            loss = train_step(model, scorer, layer, optimizer, [train_data[i] for i in process.shard(batch)], cfg)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            train_loss = float(process.sum(loss.detach())) / process.world_size
            samples_per_s = (step - done) * len(batch) / (watch.ms["train"] / 1000)
            log.append(dict(step=step, train_loss=train_loss, samples_per_s=samples_per_s,
                            **evaluate(model, eval_data, kinds, cfg, process)))
            if process.is_main:
                tqdm.write(json.dumps(log[-1]))
        if cfg.save_every and step % cfg.save_every == 0 and step < cfg.steps and process.is_main:
            save(model, cfg, log, TrainingState(step, log, optimizer.state_dict(), asdict(cfg)))
    layer.eval().requires_grad_(True)
    assert all(torch.equal(v, model.vlm.model.state_dict()[k]) for k, v in vlm_state.items()), "the VLM changed"
    if not cfg.no_compare:  # the untrained prior's held-out box recall beside the trained layer's, on the same items
        log[-1]["compare"] = compare_with_prior(model, eval_samples, eval_data, kinds, cfg, process)
    return model, log


def load_trainee(cfg: TrainConfig, model: ARRCOCQwen | None,
                 process: Process) -> tuple[ARRCOCQwen, TrainingState | None]:
    """The model to train (`model`, else --model with --init's layer) and, with --resume, the state to continue
    from, its layer loaded; None for a fresh run."""
    state = read_state(cfg) if cfg.resume else None
    if model is None:
        model, _ = cli.load_model(cfg.model, cfg.init or "prior", process.device, quiet=not process.is_main)
    if state is not None:  # the layer as saved at state.step
        model.layer = model.load_layer(cfg.out)
    return model, state


def trainable(model: ARRCOCQwen, cfg: TrainConfig, process: Process) -> tuple[ARRCOCLayer, Callable[..., ScoreMaps]]:
    """model.layer in training mode, with the parts that get gradients; and the scorer the steps call: the layer,
    wrapped in DistributedDataParallel under torchrun."""
    from torch.nn.parallel import DistributedDataParallel

    layer = model.layer.train()
    if cfg.saccade_order:  # part of the checkpoint's config: the order it was trained in is the order it is used in
        layer.config.saccade_order = cfg.saccade_order
    # only the answer loss and the token cost reach the tension head; DDP wants a gradient for every trained parameter
    layer.balancer.tension_head.requires_grad_(cfg.lm_weight > 0 or cfg.token_cost > 0)
    if cfg.trained_scorer:  # one scorer learns; the balancer (its weights a constant, the prior's) and the rest do not
        layer.requires_grad_(False)
        layer.scorer_modules[cfg.trained_scorer].requires_grad_(True)
    scorer = DistributedDataParallel(layer) if process.distributed else layer
    return layer, scorer


def train_step(model: ARRCOCQwen, scorer: Callable[..., ScoreMaps], layer: ARRCOCLayer,
               optimizer: torch.optim.Optimizer, batch: list[Observed], cfg: TrainConfig) -> torch.Tensor:
    """One optimizer step on this process's share of a global batch -> its loss."""
    import torch

    loss = batch_loss(model, scorer, batch, cfg)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # under DDP the gradients arrive averaged over processes: the global batch's mean
    torch.nn.utils.clip_grad_norm_(layer.parameters(), 1.0)  # after the all-reduce, so alike everywhere
    optimizer.step()
    return loss


def save(model: ARRCOCQwen, cfg: TrainConfig, log: list[dict], state: TrainingState | None = None) -> Path:
    """
    Write the checkpoint folder (config.json + model.safetensors + model card), the training log and, mid-run,
    the state --resume continues from. Atomic: all is written into a temporary folder beside --out, which then
    takes --out's place (replace_folder), so an interruption leaves the old folder whole.
    """
    import torch

    out = Path(cfg.out or fresh_out())
    staging = out.with_name(f".{out.name}.saving")
    shutil.rmtree(staging, ignore_errors=True)  # left by a save that was cut short
    card = (f"ARR-COC layer trained for `{model.vlm.name}` ({model.vlm.family}, hidden size {model.vlm.hidden_size}) "
            f"with `python -m arr_coc.train`.\n\nTraining config:\n```json\n{json.dumps(asdict(cfg), indent=2)}\n```\n\n"
            f"Held-out evaluation (hits: the fraction of saccades on the target box; teacher_top64: the teacher's "
            f"mass inside the {TEACHER_TOP} most relevant cells; per scene kind):\n```json\n"
            f"{json.dumps(log[0], indent=2)}\n->\n{json.dumps(log[-1], indent=2)}\n```\n")
    compared = comparison_lines(log[-1].get("compare", {}), cfg.budget)  # the last entry's "compare", in words
    card += "".join(f"\n{line[0].upper()}{line[1:]}\n" if i == 0 else f"- {line}\n" for i, line in enumerate(compared))
    model.layer.save_pretrained(staging)  # config.json + model.safetensors; the card below replaces the generic one
    (staging / "README.md").write_text(f"---\nlibrary_name: arr-coc\ntags: [arr-coc, qwen2-vl]\n---\n\n# {out.name}\n\n{card}")
    (staging / "train_log.json").write_text(json.dumps(log, indent=2))
    if state is not None:
        torch.save(asdict(state), staging / STATE_FILE)
    replace_folder(staging, out)
    return out


def replace_folder(new: Path, old: Path) -> None:
    """
    Put the folder `new` in the place of `old` by renames. Files of old's that new lacks (a user's own, not a stale
    training state) move into new first; then old is renamed aside, new renamed in, and only then is the old one
    deleted. Until those two renames `old` is whole; between them (microseconds) both exist, beside each other.
    """
    if not old.is_dir():
        new.rename(old)
        return
    for entry in old.iterdir():
        if entry.name != STATE_FILE and not (new / entry.name).exists():
            entry.rename(new / entry.name)
    aside = old.with_name(f".{old.name}.replaced")
    shutil.rmtree(aside, ignore_errors=True)
    old.rename(aside)
    new.rename(old)
    shutil.rmtree(aside)


def push(folder: Path, repo_id: str) -> str:
    """Upload the checkpoint folder, model card and training log included, to a hub model repo; returns its URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    url = api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message="ARR-COC layer trained with arr_coc.train")
    return str(url)


def parse_args(argv=None) -> TrainConfig:
    """
    The flags are TrainConfig's fields, with their help and type; --batch-size and --out are checked before
    anything loads. Under torchrun every process checks --out before any writes: rank 0 writes only after
    training, which every process joins first.
    """
    p = config_parser(TrainConfig, __doc__)
    cfg = parse_config(TrainConfig, argv, p)
    if cfg.resume and not cfg.out:
        p.error("argument --resume: needs --out, the folder of the run to continue")
    cfg.out = cfg.out or cli.default_folder(p, "--out", fresh_out())
    out = Path(cfg.out)
    if cfg.resume and not (out / STATE_FILE).is_file():
        p.error(f"argument --resume: {cfg.out} holds no training state to resume (--save-every N saves one)")
    if out.resolve() in (Path.cwd(), *Path.cwd().parents):
        p.error(f"argument --out: {cfg.out} holds the working folder; give the checkpoint a folder of its own")
    check_fresh_folder(p, cfg.out, cfg.overwrite or cfg.resume)  # --resume writes into its own run's folder
    with_defaults(cfg)
    if cfg.distill and not cfg.data:
        p.error("argument --distill: needs --data, the set whose item ids the teacher's maps are cached by")
    if cfg.distill and not (Path(cfg.distill) / "index.json").is_file():
        p.error(f"argument --distill: {cfg.distill} holds no teacher's maps (no index.json; python -m "
                "arr_coc.commands.teacher --out it --data the set caches them)")
    if cfg.box_weight == 0 and cfg.lm_weight == 0 and not (cfg.distill and cfg.distill_weight > 0):
        p.error("argument --box-weight: with --lm-weight 0 too, nothing would be trained (no --distill, or "
                "--distill-weight 0)")
    if cfg.token_cost > 0 and cfg.budget != AUTO:
        p.error("argument --token-cost: prices the adaptive budget; it needs --budget auto")
    cli.check_budget(p, cfg)
    if cfg.batch_size % distributed.world_size():
        p.error(f"argument --batch-size: {cfg.batch_size} does not split evenly over the {distributed.world_size()} "
                "processes torchrun started; choose a multiple of their number")
    return cfg


def main(argv=None) -> int:
    cfg = parse_args(argv)
    from arr_coc.relevance.layer import CheckpointError  # after parsing: --help answers without torch

    process = distributed.start(cfg.device)
    try:
        model, log = train(cfg, process=process)
    except (InputError, CheckpointError, OutOfMemory) as e:  # a bad --model, --data or --init: one line, exit 2
        process.log(f"error: {e}")
        return 2
    except KeyboardInterrupt:
        saved = (Path(cfg.out) / STATE_FILE).is_file()
        process.log("stopped; " + ("rerun the same command with --resume to continue from the last checkpoint in "
                                   f"{cfg.out}" if saved else "nothing was saved (--save-every N saves every N steps)"))
        return 130
    distributed.finish(process)
    if not process.is_main:  # rank 0 writes and pushes the checkpoint
        return 0
    cli.log(f"trained at {log[-1]['samples_per_s']:.1f} samples/s over {process.world_size} process(es); "
            f"observation took {log[0]['observe_s']:.1f} s before the first step: the frozen VLM's one pass over "
            "the training and held-out samples (gestalt, attention prior, texture), reused by every step")
    for line in comparison_lines(log[-1].get("compare", {}), cfg.budget):  # none with --no-compare
        print(line)
    try:
        folder = save(model, cfg, log)
    except OSError as e:  # the folder went away or filled up since it was checked: one line, not a traceback
        print(f"error: cannot write the checkpoint to {cfg.out} ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    print(f"wrote {folder}")
    if cfg.push_to_hub:
        try:
            print(f"pushed {folder} to {push(folder, cfg.push_to_hub)}")
        except Exception as e:  # offline, no login, no network, a bad repo id...: the checkpoint is safe on disk
            reason = " ".join(f"{type(e).__name__}: {e}".split())[:300]  # one line
            print(f"error: the checkpoint is saved locally at {folder}, but uploading it to {cfg.push_to_hub} "
                  f"failed ({reason})", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
