"""
Train the ARR relevance layer with the VLM frozen.

Two losses, both reaching every ARR parameter:
- relevance: the relevance map, as a softmax over cells, should put its mass on the target box
  (a listwise cross-entropy against the box's cell coverage);
- answer (--lm-weight > 0): the frozen VLM's loss on the expected answer, given the gestalt and the
  selected saccades; the hard top-k selection passes gradient through the straight-through product
  tokens * (1 + s - s.detach()) on the selected scores (docs/ARCHITECTURE.md §3).

The frozen VLM's part of every sample (gestalt tokens, attention prior, texture) is computed once.

    python -m arr_coc.train --model tiny --steps 300                  # writes a fresh runs/arr-YYYYmmdd-HHMMSS
    python -m arr_coc.train --model tiny --steps 300 --out checkpoints/tiny-text-vs-distractor --overwrite
    python -m arr_coc.train --model Qwen/Qwen2-VL-2B-Instruct --data data/mine --lm-weight 0.1 --out checkpoints/mine
"""

from __future__ import annotations  # type hints name torch and the model without importing them

import argparse
import json
import random
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from arr_coc import cli
from arr_coc.data import SCENE_KINDS, Sample, load_jsonl, make_dataset
from arr_coc.metrics import box_recall_precision

if TYPE_CHECKING:  # torch and the model load inside the functions, after the flags are checked
    import torch

    from arr_coc.model import ARRCOCQwen, Observation


def flag(default, help: str, type=None):
    """A TrainConfig field that is also a command-line flag: its help text and its argparse type."""
    return field(default=default, metadata=dict(help=help, type=type))


@dataclass
class TrainConfig:
    model: str = flag("tiny", "VLM to train against (Qwen-VL hub id or folder, or a tiny model such as 'tiny' or "
                           "'tiny-qwen2.5-vl'); it stays frozen")
    data: str | None = flag(None, "JSONL dataset folder (arr_coc.data format); default: synthetic scenes")
    kinds: str = flag("text_vs_distractor,distractor_query", "synthetic scene kinds, comma-separated",
                      cli.comma_list(SCENE_KINDS))
    n_train: int = flag(48, "number of synthetic training samples", cli.bounded_int(1, 1_000_000))
    n_eval: int = flag(16, "number of synthetic held-out samples", cli.bounded_int(1, 1_000_000))
    scene_size: int = flag(448, "synthetic scene side in px (views are resized to the model's grids anyway)",
                           cli.bounded_int(64, 8192))
    steps: int = flag(300, "optimisation steps", cli.bounded_int(1, 10_000_000))
    batch_size: int = flag(8, "samples per step", cli.bounded_int(1, 4096))
    lr: float = flag(3e-3, "AdamW learning rate", cli.bounded_float(0.0, 10.0, above=True))
    weight_decay: float = flag(1e-4, "AdamW weight decay", cli.bounded_float(0.0, 10.0))
    temperature: float = flag(0.5, "softmax temperature of the relevance loss", cli.bounded_float(0.0, above=True))
    lm_weight: float = flag(0.0, "weight of the answer loss through the frozen VLM (straight-through estimator)",
                            cli.bounded_float(0.0))
    init: str | None = flag(None, "start from this checkpoint (a name under checkpoints/, a folder or a hub id) "
                                  "instead of the untrained prior")
    eval_every: int = flag(50, "steps between held-out evaluations", cli.bounded_int(1, 10_000_000))
    seed: int = flag(0, "seed of data order and synthetic scenes", int)
    device: str | None = flag(None, "cuda / cpu (default: cuda when available)")
    out: str | None = flag(None, "checkpoint folder to write (default: a fresh runs/arr-YYYYmmdd-HHMMSS); "
                                 "an existing non-empty folder needs --overwrite")
    overwrite: bool = flag(False, "write into --out even if it already holds files (e.g. a shipped checkpoint)")


def fresh_out() -> str:
    """A new run folder: training never writes into a shipped checkpoint unless told to."""
    return f"runs/arr-{time.strftime('%Y%m%d-%H%M%S')}"


def relevance_loss(relevance: torch.Tensor, coverage: torch.Tensor, temperature: float) -> torch.Tensor:
    """Listwise cross-entropy: the softmax of the map over cells against the box's normalised coverage."""
    import torch.nn.functional as F

    target = coverage.flatten() / coverage.sum()
    return -(target * F.log_softmax(relevance.flatten() / temperature, dim=0)).sum()


def answer_loss(model: ARRCOCQwen, observation: Observation, out, answer: str) -> torch.Tensor:
    """The frozen VLM's cross-entropy on the answer, with gradient to the selected scores (straight-through)."""
    import torch
    import torch.nn.functional as F

    from arr_coc.vlm.positions import ImageBlock, raster_block

    vlm, views = model.vlm, observation.views
    with torch.no_grad():
        pixels, _ = vlm.image_inputs(observation.highres)
        saccades = vlm.encode_cells(pixels, views.candidate_grid, out.positions[0])  # [K, D], frozen
    s = out.selected_scores[0].unsqueeze(-1).to(saccades.dtype)  # [K, 1]
    scaled = saccades * (1 + s - s.detach())  # forward: unchanged tokens; backward: d/ds = tokens
    if hasattr(saccades, "deepstack"):  # Qwen3-VL: the cells' DeepStack features ride along, unchanged
        scaled.deepstack = saccades.deepstack
    saccades = scaled
    images = [(observation.gestalt, raster_block(views.gestalt_grid)),
              (saccades, ImageBlock(views.candidate_grid, out.positions[0].cpu()))]
    prompt = vlm.prompt(observation.question, images, answer=answer)  # the answer teacher-forced after the question
    labels = torch.full_like(prompt.ids, -100)  # [1, L]
    labels[:, prompt.answer_start:] = prompt.ids[:, prompt.answer_start:]
    logits = vlm.decoder.forward(prompt.embeds, prompt.position_ids, vlm.deepstack(prompt.embeds))  # [1, L, V]
    return F.cross_entropy(logits[0, :-1].float(), labels[0, 1:])


def load_samples(cfg: TrainConfig) -> tuple[list[Sample], list[Sample]]:
    """(training, held-out) samples that have a target box: a JSONL split 80/20, or fresh synthetic scenes."""
    if cfg.data:
        samples = [s for s in load_jsonl(cfg.data) if s.box is not None]
        random.Random(cfg.seed).shuffle(samples)
        n_eval = max(1, len(samples) // 5)
        return samples[n_eval:], samples[:n_eval]
    kinds = tuple(cli.names(cfg.kinds))
    boxed = lambda samples: [s for s in samples if s.box is not None]  # noise scenes have no target
    return (boxed(make_dataset(cfg.n_train, kinds, seed=cfg.seed, size=cfg.scene_size)),
            boxed(make_dataset(cfg.n_eval, kinds, seed=cfg.seed + 10_000, size=cfg.scene_size)))


def evaluate(model: ARRCOCQwen, data: list[tuple[Sample, Observation, torch.Tensor]], cfg: TrainConfig) -> dict:
    """Mean relevance loss and the fraction of saccades on the target box, per scene kind."""
    import torch

    hits: dict[str, list[float]] = {}
    losses = []
    with torch.no_grad():
        for sample, observation, coverage in data:
            maps = model.score(observation)
            losses.append(float(relevance_loss(maps["relevance"][0], coverage, cfg.temperature)))
            out = model.layer.select(maps, observation.views.candidate_grid)
            hits.setdefault(sample.kind, []).append(box_recall_precision(coverage, out.indices[0])[1])  # precision
    return dict(loss=sum(losses) / len(losses), **{f"hits/{k}": sum(v) / len(v) for k, v in hits.items()})


def observe_all(model: ARRCOCQwen, samples: list[Sample]) -> list[tuple[Sample, Observation, torch.Tensor]]:
    """The frozen VLM's view of each sample, and its target box as cell coverage: computed once."""
    from tqdm.auto import tqdm

    observed = []
    for sample in tqdm(samples, desc="observe", unit="sample"):
        observation = model.observe(sample.image, sample.question)
        observed.append((sample, observation, observation.views.box_coverage(sample.box).to(model.vlm.device)))
    return observed


def train(cfg: TrainConfig, model: ARRCOCQwen | None = None) -> tuple[ARRCOCQwen, list[dict]]:
    """Train model.layer in place (the VLM never changes) and return the model and the log."""
    import torch
    from tqdm.auto import tqdm

    torch.manual_seed(cfg.seed)
    if model is None:
        model, _ = cli.load_model(cfg.model, cfg.init or "prior", cfg.device)
    vlm_state = {k: v.clone() for k, v in list(model.vlm.model.state_dict().items())[:3]}  # spot-check frozen
    train_samples, eval_samples = load_samples(cfg)
    t0 = time.time()
    train_data, eval_data = observe_all(model, train_samples), observe_all(model, eval_samples)
    cli.log(f"observed {len(train_data)} training and {len(eval_data)} held-out samples in {time.time() - t0:.1f}s")

    layer = model.layer.train()
    optimizer = torch.optim.AdamW(layer.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    order = random.Random(cfg.seed)
    log = [dict(step=0, **evaluate(model, eval_data, cfg))]
    tqdm.write(json.dumps(log[-1]))
    for step in tqdm(range(1, cfg.steps + 1), desc="train", unit="step"):
        batch = order.sample(train_data, min(cfg.batch_size, len(train_data)))
        loss = torch.zeros((), device=model.vlm.device)
        for sample, observation, coverage in batch:
            maps = model.score(observation)
            loss = loss + relevance_loss(maps["relevance"][0], coverage, cfg.temperature) / len(batch)
            if cfg.lm_weight > 0:
                out = layer.select(maps, observation.views.candidate_grid)
                loss = loss + cfg.lm_weight * answer_loss(model, observation, out, sample.answer) / len(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(layer.parameters(), 1.0)
        optimizer.step()
        if step % cfg.eval_every == 0 or step == cfg.steps:
            log.append(dict(step=step, train_loss=loss.item(), **evaluate(model, eval_data, cfg)))
            tqdm.write(json.dumps(log[-1]))
    layer.eval()
    assert all(torch.equal(v, model.vlm.model.state_dict()[k]) for k, v in vlm_state.items()), "the VLM changed"
    return model, log


def save(model: ARRCOCQwen, cfg: TrainConfig, log: list[dict]) -> Path:
    """Write the checkpoint folder (config.json + model.safetensors + model card) and the training log."""
    out = Path(cfg.out or fresh_out())
    card = (f"ARR-COC layer trained for `{model.vlm.name}` ({model.vlm.family}, hidden size {model.vlm.hidden_size}) "
            f"with `python -m arr_coc.train`.\n\nTraining config:\n```json\n{json.dumps(asdict(cfg), indent=2)}\n```\n\n"
            f"Held-out evaluation (fraction of saccades on the target box, per scene kind):\n```json\n"
            f"{json.dumps(log[0], indent=2)}\n->\n{json.dumps(log[-1], indent=2)}\n```\n")
    model.layer.save_pretrained(out)  # config.json + model.safetensors; the card below replaces the generic one
    (out / "README.md").write_text(f"---\nlibrary_name: arr-coc\ntags: [arr-coc, qwen2-vl]\n---\n\n# {out.name}\n\n{card}")
    (out / "train_log.json").write_text(json.dumps(log, indent=2))
    return out


def parse_args(argv=None) -> TrainConfig:
    """The flags are TrainConfig's fields, with their help and type; --out is checked before anything loads."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in fields(TrainConfig):
        name = f"--{f.name.replace('_', '-')}"
        if f.default is False:
            p.add_argument(name, action="store_true", help=f.metadata["help"])
        else:
            p.add_argument(name, type=f.metadata["type"] or str, default=f.default, help=f.metadata["help"])
    cfg = TrainConfig(**vars(p.parse_args(argv)))
    cfg.out = cfg.out or fresh_out()
    if Path(cfg.out).is_file() or (Path(cfg.out).is_dir() and any(Path(cfg.out).iterdir()) and not cfg.overwrite):
        p.error(f"argument --out: {cfg.out} already exists and is not empty; pass --overwrite to write into it, "
                "or choose another folder")
    return cfg


def main(argv=None) -> int:
    cfg = parse_args(argv)
    model, log = train(cfg)
    print(f"wrote {save(model, cfg, log)}")
    return 0


if __name__ == "__main__":
    main()
