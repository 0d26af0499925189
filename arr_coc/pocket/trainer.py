"""
pocket-qwen2-vl: a small stock Qwen2-VL trained here, from scratch, to read the fine-print suite (arr_coc.synth.fineprint).

It is the stock `Qwen2VLForConditionalGeneration` at a pocket size (ViT 6x256, LLM 4x256, ~10M parameters)
with its own byte-level BPE tokenizer (Qwen's special tokens and chat template, a vocabulary sized to the task),
trained as a normal VLM is: whole pages at mixed native sizes, laid out exactly as the stock image processor lays
them out (on the GPU; a test pins the two), in multi-turn conversations whose answers carry the loss; a share of
them opens with "Read the page." and the page's transcript, dense supervision of every glyph as OCR pre-training
gives. A share of conversations shows two images, the page's gestalt view (<= 256 tokens) and then the page, as
the real Qwen saw multi-image prompts in training; ARR's prompt has two image blocks. No sparse cells and no ARR:
ARR meets it as it meets the real Qwen.
Its answers are real on fine-print scenes and meaningless elsewhere.

Beside the answers, every visual token learns which characters its cell holds (arr_coc.pocket.reading, a training-only
head): without it the from-scratch ViT never learned glyphs at arbitrary sub-patch offsets. It also learns which
colour, shape, box and field its cell belongs to (arr_coc.pocket.binding), three of those in the LLM's own word
embeddings; a share of questions is asked the other way round (reversed_questions); and one attention head of
the LLM learns to look at each answer's target (arr_coc.pocket.pointing).
Training follows a curriculum (CURRICULUM) that moves on when the model reads each stage's own held-out pages:
large glyphs, few fields and small pages first; then smaller print and more clutter; then the suite as specified
(fineprint.SPEC) at 448-1792 px; a REVIEW share of batches comes from earlier stages. Pages are drawn by
many CPU workers (a DataLoader over an iterable of whole batches); batch i of a stage is a pure function of
(seed, stage, i), so a resumed run continues the same stream.
Held-out accuracy (new seeds, square 896 and 1792 px pages, per kind, native and gestalt views) is teacher-forced
exact match: every answer token is the argmax, which is exactly when greedy decoding produces the answer.

    torchrun --nproc-per-node 4 -m arr_coc.pocket.train --out runs/pocket --minutes 18 --resume   # 4 GPUs, resumable
    torchrun --nproc-per-node 4 -m arr_coc.pocket.train --out runs/deeper --resume --vit-depth 8   # a larger ViT
    torchrun --nproc-per-node 4 -m arr_coc.pocket.train --out runs/wider --resume --llm-width 384  # a wider LLM
    python -m arr_coc.pocket.train --out runs/pocket --minutes 8 --resume      # one GPU
    python -m arr_coc.pocket.train --out runs/pocket --minutes 2 --resume --profile 5   # where a step's time goes
    python -m arr_coc.pocket.train --out runs/abl --resume --init OLD --stage 5 --steps N --pointing-weight 0  # ablation
    python -m arr_coc.pocket.train --out runs/pocket --export models/pocket-qwen2-vl --steps 0 --resume  # export
    python -m arr_coc.pocket.train --tokenizer-only --export models/pocket-qwen2-vl                        # tokenizer

The exported folder loads with stock transformers alone: AutoTokenizer (with its chat template),
AutoImageProcessor and Qwen2VLForConditionalGeneration.from_pretrained(folder).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from arr_coc.runtime import distributed
from arr_coc.checkpoints import POCKET_FOLDER
from arr_coc.flags import bounded_float, bounded_int, device_flag, flag, int_list, seed_flag
from arr_coc.eval.intervals import interval_text
from arr_coc.pocket.binding import BindingHead, aligned_count, aligned_ids, aligned_loss
from arr_coc.pocket.data import CURRICULUM, IGNORE, MAX_PAGES, PASS_MARK, PageStream, model_inputs
from arr_coc.pocket.heldout import evaluate_heldout, exact_match, heldout
from arr_coc.pocket.model import (LLM_HEAD_DIM, PocketConfig, grow_language, grow_vision, image_processor,
                                  model_config, use_same_size_pages_attention)
from arr_coc.pocket.pointing import Pointing, use_pointing_attention
from arr_coc.pocket.reading import MergerOutputHook, ReadingHead
from arr_coc.synth.fineprint import LAYOUTS, PAGE_KINDS


def llm_width(text: str) -> int:
    """--llm-width: a width the LLM can grow to (grow_language adds whole groups of heads), or an argparse error."""
    width, step = bounded_int(1, 4096)(text), LLM_HEAD_DIM * (PocketConfig.heads // PocketConfig.kv_heads)
    if width % step:
        raise argparse.ArgumentTypeError(f"{width} is not a multiple of {step} (whole groups of "
                                         f"{PocketConfig.heads // PocketConfig.kv_heads} heads of {LLM_HEAD_DIM})")
    return width


def exported_folder(path: str) -> str:
    """--init: a folder that `--export` wrote (its config and training state), or an argparse error."""
    if not all((Path(path) / name).is_file() for name in ("config.json", "training_state.json")):
        raise argparse.ArgumentTypeError(f"{path} is not an exported pocket folder (config.json, training_state.json)")
    return path


@dataclass
class PocketTrainConfig:
    """One training run (resumable); each field with help is a flag of `python -m arr_coc.pocket.train`, in --help's
    order: the run, the recipe, profiling and export."""
    out: str = flag("runs/pocket", "run folder (weights, optimizer, state.json)")
    resume: bool = flag(False, "continue the run in --out, else from the shipped models/pocket-qwen2-vl, else start "
                               "fresh")
    minutes: float = flag(8.0, "stop after this many minutes (or at --steps, whichever comes first)",
                          bounded_float(0, above=True))
    steps: int = flag(10**9, "stop at this total step count (0 with --export: export the run in --out)",
                      bounded_int(0, 10**9))
    lr: float = flag(1e-3, "peak learning rate (AdamW)", bounded_float(0, 1, above=True))
    warmup: int = flag(300, "linear warm-up steps from this run's start (few when resuming the optimizer's state)",
                       bounded_int(1, 10**6))
    cooldown: float = flag(0.0, "decay the lr to 5% over the run's last this many minutes (before an export)",
                           bounded_float(0))
    weight_decay: float = 0.05  # AdamW weight decay (matrices only); not a flag
    image_tokens: int = flag(8192, "image tokens per batch: B = image tokens // tokens per page (bucketed sizes), at "
                                   "most --max-pages", bounded_int(64, 2**20))
    workers: int = flag(14, "page-drawing worker processes (per training process)", bounded_int(0, 256))
    eval_every: int = flag(300, "stage check interval (steps)", bounded_int(1, 10**9))
    max_pages: int = flag(MAX_PAGES, "at most this many pages a batch", bounded_int(1, 4096))
    eval_pages: int = flag(32, "held-out pages per kind and size (stage checks and the suite at the end of a run)",
                           bounded_int(1, 10**5))
    eval_sizes: tuple[int, ...] = flag((896, 1792), "held-out square page sides, comma-separated",
                                       int_list(112, 4096))
    eval_layouts: bool = flag(False, "the end-of-run check also scores pages in the layouts training never draws")
    seed: int = seed_flag(0, "the training data stream")
    device: str | None = device_flag(torchrun=True)
    stage: int | None = flag(None, f"start at this curriculum stage, 0 to {len(CURRICULUM) - 1} (default: where the "
                                   "resumed run stands)", bounded_int(0, len(CURRICULUM) - 1))
    init: str = flag(str(POCKET_FOLDER), "with --resume and no run in --out yet: continue from this exported folder",
                     exported_folder, shown="`models/pocket-qwen2-vl`")
    read_ink_weight: float = flag(1.0, "weight of a drawn character's slot in the merged tokens' reading loss (empty "
                                       "slots: 1)", bounded_float(0, above=True))
    read_token_patches: float = flag(0.0, "weight of the merged tokens naming their 2 x 2 patches' characters, the "
                                          "patch head's targets, in the reading loss (0: off)", bounded_float(0))
    binding_weight: float = flag(1.0, "weight of the binding head's losses (0: a run without them, pointing kept: the "
                                      "head's same-run ablation)", bounded_float(0))
    pointing_weight: float = flag(1.0, "weight of the pointing loss (0: a run without it, the binding head kept: its "
                                       "same-run ablation)", bounded_float(0))
    point_digits: float = flag(0.0, "weight of the pointing head's loss at each fine_print digit: its attention on the "
                                    "cell that holds the digit being written (0: off)", bounded_float(0))
    pages_by_area: bool = flag(False, "draw page widths in proportion to their square, so that every page size gets "
                                      "about as many pages (default: widths uniform, small pages most)")
    vit_depth: int | None = flag(None, "grow the ViT to this many blocks before training (new ones start as the "
                                       "identity)", bounded_int(1, 64))
    vit_mlp_ratio: int | None = flag(None, "grow the ViT blocks' MLPs to this many times the width (new units start "
                                           "silent)", bounded_int(1, 32))
    llm_width: int | None = flag(None, "grow the LLM and the visual tokens to this width before training: whole groups "
                                       "of 2 heads of 64, so a multiple of 128 (new heads and units start silent)",
                                 llm_width)
    profile: int = flag(0, "profile this many steps of a stage after --profile-after (rank 0 prints the table)",
                        bounded_int(0, 1000))
    profile_after: int = flag(20, "with --profile: the steps of a stage before the profiled ones (start-up, "
                                  "autotuning)", bounded_int(0, 10**9))
    export: str | None = flag(None, "after training, write the hub folder here")
    tokenizer_only: bool = flag(False, "only build the tokenizer into --export")


# -----------------------------------------------------------------------------
# training


HEAD_FILE = "reading_head.safetensors"  # the training-only ReadingHead, beside the run's weights
BINDING_FILE = "binding_head.safetensors"  # the training-only BindingHead, beside it
SHARD = "15MB"  # every saved file stays under 16 MiB (the device tool brings back no larger file)
STOP_EVERY = 10  # under torchrun the processes agree on the clock every this many steps (one sync across them)


def lr_at(step: int, resumed_at: int, cfg: PocketTrainConfig, seconds_left: float = math.inf) -> float:
    """Linear warm-up from each (re)start, then a constant rate (the run length is not known in advance), then,
    with a cool-down, a linear decay to 5% over the run's last cfg.cooldown minutes: the weights to export settle."""
    cooldown = max(0.05, min(1.0, seconds_left / (cfg.cooldown * 60))) if cfg.cooldown else 1.0
    return cfg.lr * min(1.0, (step - resumed_at + 1) / cfg.warmup) * cooldown


class Trainee(nn.Module):
    """The VLM and its training-only heads as one module: what DistributedDataParallel wraps, so that one
    backward all-reduces every trained gradient."""

    def __init__(self, model, reading: ReadingHead, binding: BindingHead, aligned: dict[str, torch.Tensor],
                 binding_weight: float = 1.0, pointing_weight: float = 1.0, point_digits: float = 0.0):
        super().__init__()
        self.model, self.reading, self.binding = model, reading, binding
        self.aligned = aligned  # aligned_ids(tokenizer): the binding channels also taught in the word embeddings
        self.binding_weight, self.pointing_weight = binding_weight, pointing_weight  # PocketTrainConfig's
        self.point_digits = point_digits  # PocketTrainConfig's

    def forward(self, inputs: dict, reading: torch.Tensor, binding: torch.Tensor,
                counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(answer, reading, binding) losses, each a sum over this process's batch divided by `counts` [6]: the
        global batch's label counts over the world size, so that DDP's mean of the processes' gradients is the
        gradient of the global batch's mean loss (exactly one process's over the same batch). The binding loss
        holds the binding head's, the aligned names' and the answers' pointing, at their targets and at each digit
        (arr_coc.pocket.pointing)."""
        forward_inputs = {k: v for k, v in inputs.items() if not k.startswith("point_")}  # the model's own
        none, nothing = torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, 0, dtype=torch.bool)
        targets = inputs.get("point_targets", nothing)  # [P, L]
        digits = inputs.get("point_digit_targets", nothing) if self.point_digits else nothing  # [D, L]; none at 0
        queries = torch.cat([inputs.get(key, none)[:rows].to(inputs["input_ids"].device)  # [P + D, 2]
                             for key, rows in (("point_queries", len(targets)), ("point_digit_queries", len(digits)))])
        with MergerOutputHook(self.model) as visual, Pointing(self.model, queries) as pointing:
            answer = self.model(**forward_inputs, num_items_in_batch=counts[0]).loss
        reading_loss = self.reading(visual.value, reading, reduction="sum", patches=visual.patches) / counts[1]
        embeddings = self.model.get_input_embeddings().weight.detach()  # [V, H] fixed: the visual tokens move
        pointing_loss = (self.pointing_weight * pointing.loss(targets, slice(0, len(targets))) / counts[4]
                         + self.point_digits * pointing.loss(digits, slice(len(targets), None)) / counts[5])
        binding_loss = (self.binding_weight * (self.binding(visual.value, binding, reduction="sum") / counts[2]
                                               + aligned_loss(visual.value, binding, embeddings, self.aligned) / counts[3])
                        + pointing_loss)
        return answer, reading_loss, binding_loss


def data_parallel(trainee: Trainee, process: distributed.Process) -> nn.Module:
    """Under torchrun, the Trainee in DistributedDataParallel, its gradients views of the all-reduce buckets (no copy
    between the two a step); alone, the Trainee itself."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(trainee, gradient_as_bucket_view=True) if process.distributed else trainee


def label_counts(inputs: dict, reading: torch.Tensor, binding: torch.Tensor,
                 process: distributed.Process) -> torch.Tensor:
    """The global batch's answer tokens, reading slots, binding labels, aligned binding labels (aligned_count),
    pointing answers and pointing digits, over the world size: float [6]."""
    pointers = [torch.tensor(len(inputs.get(key, ())), device=binding.device)
                for key in ("point_queries", "point_digit_queries")]
    local = torch.stack([(inputs["labels"][:, 1:] != IGNORE).sum(), (reading != IGNORE).sum(),
                         (binding != IGNORE).sum(), aligned_count(binding), *pointers]).double()  # [6]
    return (process.sum(local) / process.world_size).clamp(min=1).float()


def trained_parameters(model, head=None, binding=None) -> dict:
    """Every trained parameter by name: the VLM's, and the heads' (if any) under "reading_head." / "binding_head."."""
    named = dict(model.named_parameters())
    for prefix, module in (("reading_head", head), ("binding_head", binding)):
        if module is not None:
            named |= {f"{prefix}.{n}": p for n, p in module.named_parameters()}
    return named


def save_shards(tensors: dict[str, torch.Tensor], folder: Path, name: str, limit: int = 15 * 2**20):
    """`tensors` as name-00001.safetensors, ... each under `limit` bytes (the device tool's file limit)."""
    from safetensors.torch import save_file

    for old in folder.glob(f"{name}-*.safetensors"):
        old.unlink()
    shards, size = [{}], 0
    for key, t in tensors.items():
        if size and size + t.nbytes > limit:
            shards, size = shards + [{}], 0
        shards[-1][key], size = t.contiguous(), size + t.nbytes
    for i, shard in enumerate(shards):
        save_file(shard, folder / f"{name}-{i + 1:05d}.safetensors")


def load_shards(folder: Path, name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for path in sorted(folder.glob(f"{name}-*.safetensors")) for k, v in load_file(path).items()}


def save_heads(head, binding, folder: Path):
    from safetensors.torch import save_file

    save_file(head.state_dict(), folder / HEAD_FILE)
    save_file(binding.state_dict(), folder / BINDING_FILE)


def save_state(model, head, binding, optimizer, folder: Path, state: dict):
    """Weights (fp32), heads, optimizer moments and state.json, every file under 16 MiB: the resume point."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder / "weights", max_shard_size=SHARD)
    save_heads(head, binding, folder)
    moments = {}
    names = {p: n for n, p in trained_parameters(model, head, binding).items()}
    for p, s in optimizer.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            moments[f"{names[p]}.{key}"] = s[key]
        moments[f"{names[p]}.step"] = torch.as_tensor(s["step"], dtype=torch.float32).reshape(1)
    save_shards(moments, folder, "optimizer")
    write_state(folder, state)


def write_state(folder: Path, state: dict):
    """The run's state.json: its step, stage, curve, held-out checks and runs."""
    (folder / "state.json").write_text(json.dumps(state, indent=1))


def load_state(model, head, binding, optimizer, folder: Path) -> dict:
    moments = load_shards(folder, "optimizer")
    for n, p in trained_parameters(model, head, binding).items():
        if f"{n}.exp_avg" in moments and moments[f"{n}.exp_avg"].shape == p.shape:  # a grown one starts afresh
            optimizer.state[p] = dict(exp_avg=moments[f"{n}.exp_avg"].to(p.device),
                                      exp_avg_sq=moments[f"{n}.exp_avg_sq"].to(p.device),
                                      step=moments[f"{n}.step"].reshape(()).to(p.device))
    return json.loads((folder / "state.json").read_text())


def make_optimizer(model, cfg: PocketTrainConfig, head=None, binding=None):
    params = list(trained_parameters(model, head, binding).values())
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    return torch.optim.AdamW([dict(params=decay, weight_decay=cfg.weight_decay), dict(params=rest, weight_decay=0.0)],
                             lr=cfg.lr, betas=(0.9, 0.95), fused=params[0].is_cuda)


def resumed_from(folder: Path, resume: bool, init: Path = POCKET_FOLDER) -> Path | None:
    """The folder whose weights a run starts from: with --resume the run's own in `folder` (its state.json), else
    the exported folder `init` (its config.json: by default the shipped model); None: fresh weights."""
    if resume and (folder / "state.json").is_file():
        return folder
    if resume and (init / "config.json").is_file():
        return init
    return None


def resume_line(folder: Path, resume: bool, init: Path = POCKET_FOLDER) -> str | None:
    """What --resume into a folder with no run yet starts from, in one line (None: a run to resume, or no --resume)."""
    start = resumed_from(folder, resume, init)
    if not resume or start == folder:
        return None
    if start is None:
        return f"pocket: --resume, and {folder} holds no run (state.json) yet, nor {init} a model: starting fresh"
    step = json.loads((init / "training_state.json").read_text()).get("step", 0)
    return (f"pocket: --resume, and {folder} holds no run (state.json) yet: starting from {init} (--init), at its step "
            f"{step}")


def load_or_init(folder: Path, resume: bool, device, stage: int | None = None, init: Path = POCKET_FOLDER,
                 vit_depth: int | None = None, vit_mlp_ratio: int | None = None, llm_width: int | None = None):
    """(model, reading head, tokenizer, state, binding head): the run's if resuming, else the exported folder `init`
    (with the heads it carries; by default the shipped model), else all fresh; its ViT grown to vit_depth blocks
    and vit_mlp_ratio-wide MLPs, its LLM to llm_width, where given and larger (grow_vision, grow_language: every
    output kept; the heads keep what they had)."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, Qwen2VLForConditionalGeneration

    tok_folder = folder / "weights" if (folder / "weights" / "tokenizer.json").is_file() else init
    tokenizer = AutoTokenizer.from_pretrained(tok_folder)
    heads, start = None, resumed_from(folder, resume, init)
    if start == folder:
        model = Qwen2VLForConditionalGeneration.from_pretrained(folder / "weights", dtype=torch.float32)
        state, heads = json.loads((folder / "state.json").read_text()), folder
    elif start == init:  # a new machine: continue from an exported folder
        model = Qwen2VLForConditionalGeneration.from_pretrained(init, dtype=torch.float32)
        state, heads = json.loads((init / "training_state.json").read_text()), init
    else:
        torch.manual_seed(0)
        model = Qwen2VLForConditionalGeneration._from_config(model_config(tokenizer), dtype=torch.float32)
        state = dict(step=0, stage=0, gpu_seconds=0.0, samples=0, curve=[], runs=[])
    model.config._attn_implementation = "sdpa"
    torch.manual_seed(1)  # the heads and any grown weights start alike on every process
    grow_vision(model, vit_depth, vit_mlp_ratio)
    model = grow_language(model, llm_width)
    vision = model.config.vision_config
    head, binding = ReadingHead(vision.hidden_size, vision.embed_dim), BindingHead(vision.hidden_size)
    for module, name in ((head, HEAD_FILE), (binding, BINDING_FILE)):
        saved = load_file(heads / name) if heads is not None and (heads / name).is_file() else {}
        kept = in_corner(saved, module.state_dict())
        if saved and kept is not None:
            fresh = module.load_state_dict(kept, strict=False).missing_keys  # a head that grew keeps what it had
            if fresh:
                print(f"pocket: {name} had no {', '.join(fresh)}: starting those afresh", flush=True)
        elif saved:  # a head of another shape (its targets changed): this one starts fresh
            print(f"pocket: {name} was saved for other targets; starting it afresh", flush=True)
    state.setdefault("stage", 0)
    state.setdefault("stage_start", state["step"])  # a state from before the step budgets: its stage starts now
    if stage is not None and stage != state["stage"]:  # --stage: start (or go back) at this curriculum stage
        state["stage"], state["stage_start"] = stage, state["step"]
    model = use_pointing_attention(use_same_size_pages_attention(model))
    return model.to(device).train(), head.to(device), tokenizer, state, binding.to(device)


def in_corner(saved: dict[str, torch.Tensor], own: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """A saved head's tensors in the module's own (as it starts): the same head, or one whose input grew with the
    LLM's width (a weight's first input columns are the saved ones; the new ones read dimensions that start at zero).
    None if a saved tensor is missing from the module or differs in any other size (a head saved for other
    targets)."""
    def fits(v: torch.Tensor, o: torch.Tensor) -> bool:
        return v.shape == o.shape or (v.dim() == o.dim() and v.shape[:-1] == o.shape[:-1] and v.shape[-1] < o.shape[-1])

    if not all(k in own and fits(v, own[k]) for k, v in saved.items()):
        return None
    kept = {k: own[k].clone() for k in saved}
    for k, v in saved.items():
        kept[k][..., :v.shape[-1]] = v
    return kept


def train(cfg: PocketTrainConfig, resume: bool, process: distributed.Process | None = None) -> dict:
    """Train until cfg.minutes or cfg.steps; under torchrun data-parallel (each process its own batches and
    page workers, gradients all-reduced), with rank 0 writing the run folder."""
    process = process or distributed.start(cfg.device)
    device = torch.device(process.device)
    if device.type == "cuda":  # cuDNN's attention plans every new shape (~28 ms of host time a layer's forward and
        torch.backends.cuda.enable_cudnn_sdp(False)  # backward), and page sizes change every batch: flash runs instead
    folder = Path(cfg.out)
    model, head, tokenizer, state, binding = load_or_init(folder, resume, device, cfg.stage, Path(cfg.init),
                                                          cfg.vit_depth, cfg.vit_mlp_ratio, cfg.llm_width)
    head.ink_weight, head.token_patch_weight = cfg.read_ink_weight, cfg.read_token_patches
    optimizer = make_optimizer(model, cfg, head, binding)
    if resume and (folder / "state.json").is_file():
        load_state(model, head, binding, optimizer, folder)
    trainee = Trainee(model, head, binding, aligned_ids(tokenizer), cfg.binding_weight, cfg.pointing_weight,
                      cfg.point_digits)
    trainee = data_parallel(trainee, process)
    if process.is_main:
        folder.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(folder / "weights")
    process.barrier()  # the page workers read the tokenizer from the run folder
    processor = image_processor()
    run = dict(start=state["step"], t0=time.time(), seen=0, tokens=0)  # pages and page image tokens seen
    process.log(f"pocket: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, step {state['step']}, "
                f"stage {state['stage']}, {state['gpu_seconds'] / 60:.1f} GPU-minutes so far, "
                f"{process.world_size} process(es)")
    while _train_stage(trainee, model, optimizer, tokenizer, processor, cfg, state, run, process):
        pass  # the stage ended: the next one draws its own pages
    elapsed = time.time() - run["t0"]
    seen = int(process.sum(torch.tensor(run["seen"])).item())
    if device.type == "cuda":  # a CPU run (a test, a smoke run) is no GPU time
        state["gpu_seconds"] += elapsed * process.world_size
    state["samples"] += seen
    state["runs"].append(dict(steps=state["step"] - run["start"], seconds=round(elapsed, 1), gpus=process.world_size,
                              pages_per_second=round(seen / elapsed, 1),
                              device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"))
    if process.is_main:  # the resume point, before the held-out check: a run cut off there keeps its steps
        save_state(model, head, binding, optimizer, folder, state)
    process.barrier()
    _evaluate(model, tokenizer, processor, device, cfg, state, process)
    if process.is_main:  # the check's numbers beside the weights they measured (unchanged since the save)
        write_state(folder, state)
    process.barrier()
    return state


def _train_stage(trainee, model, optimizer, tokenizer, processor, cfg: PocketTrainConfig, state: dict, run: dict,
                 process: distributed.Process) -> bool:
    """Train on the current stage's pages until time or steps run out (False) or the stage ends (True)."""
    device = torch.device(process.device)
    stream = PageStream(str(Path(cfg.out) / "weights"), cfg.seed, state["stage"], state["step"], cfg.image_tokens,
                        cfg.max_pages, process.rank, process.world_size, cfg.pages_by_area)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=cfg.workers,
                                         prefetch_factor=4 if cfg.workers else None, pin_memory=device.type == "cuda")
    losses, waited, last = [], 0.0, time.time()
    window = (time.time(), run["seen"], run["tokens"], 0.0)  # the last 100 steps' rates and wait: without start-up
    with _profiler(cfg, device, process) as profiler:
        for batch in loader:
            waited += time.time() - last  # the GPU idles while the page workers catch up
            if state["step"] >= cfg.steps or _out_of_time(cfg, state, run, process):
                return False
            lr = lr_at(state["step"], run["start"], cfg, cfg.minutes * 60 - (time.time() - run["t0"]))
            inputs = model_inputs(batch, processor, model.config.image_token_id, device)
            loss = _train_step(trainee, optimizer, inputs, lr, batch["reading"].to(device, non_blocking=True),
                               batch["binding"].to(device, non_blocking=True), process)
            if loss is None:  # a bf16 blow-up: the step was skipped, the weights kept
                state["skipped"] = state.get("skipped", 0) + 1
            else:
                losses.append(loss)
            run["seen"] += batch["input_ids"].shape[0]
            run["tokens"] += batch["pages"][..., 0].numel() // 28**2  # [B, H, W, 3]: the pages' tokens (no gestalt)
            state["step"] += 1
            if state["step"] % 100 == 0 and process.is_main:
                answer, reading, bound = np.mean(losses, axis=0) if losses else (float("nan"),) * 3
                seconds = time.time() - window[0]
                rate, token_rate = (run["seen"] - window[1]) / seconds, (run["tokens"] - window[2]) / seconds
                wait = (waited - window[3]) / seconds
                window = (time.time(), run["seen"], run["tokens"], waited)
                process.log(f"step {state['step']} loss {answer:.4f} reading {reading:.4f} binding {bound:.4f} "
                            f"lr {lr:.2e} stage {state['stage']} {rate * process.world_size:.0f} pages/s "
                            f"{token_rate * process.world_size / 1000:.0f}k image tokens/s, "
                            f"waiting for pages {wait:.0%} of the time (last 100 steps)")
                state["curve"].append(dict(step=state["step"], loss=round(answer, 4), reading=round(reading, 4),
                                           binding=round(bound, 4)))
                losses = []
            if _stage_ends(model, tokenizer, processor, cfg, state, process):
                return True
            last = time.time()
            if profiler is not None:
                profiler.step()
    return False


def _out_of_time(cfg: PocketTrainConfig, state: dict, run: dict, process: distributed.Process) -> bool:
    """Whether this run's minutes are spent. Every process stops at the same step: rank 0's clock decides, read
    every STOP_EVERY steps under torchrun (each reading waits for every process's GPU), every step alone."""
    if process.distributed and state["step"] % STOP_EVERY:
        return False
    late = time.time() - run["t0"] > cfg.minutes * 60 and process.is_main
    return process.sum(torch.tensor(float(late))).item() > 0


def _profiler(cfg: PocketTrainConfig, device: torch.device, process: distributed.Process):
    """With cfg.profile, on rank 0: torch.profiler over that many steps after cfg.profile_after and two to warm it up,
    then its table of operators by their own time, printed; otherwise no profiler at all (the context gives None)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    if not (cfg.profile and process.is_main):
        return contextlib.nullcontext()

    def report(prof):
        key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(f"profile of {cfg.profile} steps (rank 0):\n" + prof.key_averages().table(sort_by=key, row_limit=30),
              flush=True)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return profile(activities=activities, on_trace_ready=report,
                   schedule=schedule(wait=cfg.profile_after, warmup=2, active=cfg.profile, repeat=1))


def _stage_ends(model, tokenizer, processor, cfg: PocketTrainConfig, state: dict, process: distributed.Process) -> bool:
    """The stage ends on its step budget, or when a check (every cfg.eval_every steps: held-out exact match on its
    own pages, square, its middle size) reaches PASS_MARK on its gate kinds. The last stage never ends."""
    stage = state["stage"]
    if stage == len(CURRICULUM) - 1:
        return False
    if state["step"] - state["stage_start"] >= CURRICULUM[stage].budget:
        ended, why = True, f"its budget of {CURRICULUM[stage].budget} steps"
    elif state["step"] % cfg.eval_every == 0:
        side = sum(CURRICULUM[stage].sides) // 2 // 28 * 28
        device = torch.device(process.device)
        model.eval()
        accuracy = {kind: exact_match(model, tokenizer, processor, heldout(kind, side, cfg.eval_pages, stage), device,
                                      process=process) for kind in PAGE_KINDS}
        model.train()
        ended, why = min(accuracy[k] for k in CURRICULUM[stage].gate) >= PASS_MARK, f"its check at {PASS_MARK}"
        state.setdefault("stage_checks", []).append(dict(step=state["step"], stage=stage, side=side,
                                                         accuracy=accuracy))
        if process.is_main:
            process.log(f"stage {stage} check at step {state['step']} ({side} px): {json.dumps(accuracy)}")
    else:
        return False
    if ended:
        state.setdefault("stage_ends", []).append(dict(stage=stage, step=state["step"], why=why))
        if process.is_main:
            process.log(f"stage {stage} ends at step {state['step']} ({why}) -> stage {stage + 1}")
        state["stage"], state["stage_start"] = stage + 1, state["step"]
    return ended


def backward(trainee, inputs: dict, reading: torch.Tensor, binding: torch.Tensor,
             process: distributed.Process) -> tuple[torch.Tensor, ...]:
    """The losses of this process's batch, normalised by the global batch's label counts, and their backward:
    under DDP the gradients arrive averaged over processes, i.e. the global batch's. (answer, reading, binding)."""
    counts = label_counts(inputs, reading, binding, process)  # [6]
    with torch.autocast(inputs["input_ids"].device.type, dtype=torch.bfloat16, enabled=inputs["input_ids"].is_cuda):
        losses = trainee(inputs, reading, binding, counts)
    sum(losses).backward()
    return losses


def _train_step(trainee, optimizer, inputs: dict, lr: float, reading: torch.Tensor, binding: torch.Tensor,
                process: distributed.Process | None = None) -> tuple[float, float, float] | None:
    """One AdamW step on the answer loss plus the dense reading and binding losses of every visual token;
    (answer, reading, binding) losses of this process's batch, or None (and no update, on every process alike)
    if the gradient is not finite."""
    process = process or distributed.Process(0, 1, str(inputs["input_ids"].device))
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    losses = backward(trainee, inputs, reading, binding, process)
    norm = torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], 1.0)
    if not torch.isfinite(norm):  # the same on every process: the gradients were all-reduced
        return None
    optimizer.step()
    return tuple(float(loss.detach()) for loss in losses)


def _evaluate(model, tokenizer, processor, device, cfg, state, process: distributed.Process | None = None):
    """The suite as specified (held-out, every kind, native and gestalt views): the model card's curve; with
    cfg.eval_layouts the same on pages in the layouts training never draws."""
    entry = dict(step=state["step"], stage=state["stage"], pages=cfg.eval_pages)
    checks = [("accuracy", "", None)] + ([("layouts", " (unseen layouts)", LAYOUTS)] if cfg.eval_layouts else [])
    for name, label, style in checks:
        entry[name] = evaluate_heldout(model, tokenizer, processor, device, cfg.eval_pages, cfg.eval_sizes, process,
                                       style)
        for size, views in entry[name].items():
            for view, kinds in views.items():
                cells = [f"{kind} {interval_text(round(acc * cfg.eval_pages), cfg.eval_pages)}"
                         for kind, acc in kinds.items()]
                if process is None or process.is_main:
                    print(f"eval step {state['step']} {size} px {view}{label}: " + ", ".join(cells), flush=True)
    state.setdefault("heldout", []).append(entry)

# -----------------------------------------------------------------------------
# export


def export(run: Path, out: Path):
    """The run's weights as a hub folder: bf16 safetensors in <16 MB shards, tokenizer, processor, card."""
    from transformers import AutoTokenizer, GenerationConfig, Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(run / "weights", dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(run / "weights")
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.pad_token_id, pad_token_id=tokenizer.pad_token_id,
                                               eos_token_id=[tokenizer.eos_token_id, tokenizer.pad_token_id],
                                               do_sample=False)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, max_shard_size="15MB")
    tokenizer.save_pretrained(out)
    image_processor().save_pretrained(out)
    state = json.loads((run / "state.json").read_text())
    (out / "training_state.json").write_text(json.dumps(state, indent=1))
    for head in (HEAD_FILE, BINDING_FILE):  # training-only (stock loading never reads them): the next run resumes
        if (run / head).is_file():
            (out / head).write_bytes((run / head).read_bytes())
    return out
