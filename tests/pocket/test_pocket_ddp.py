"""
Pocket training under torchrun: the data-parallel step's gradients equal one process's over the same global batch
(2 CPU processes, gloo), though the two halves hold different numbers of answer tokens; each process draws its own
batches of the stream; and the curriculum moves on when a stage's step budget is spent, passed or not.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

# One training step's backward, alone (all four pages) or as rank r of 2 (pages r and r + 2); rank 0 saves the
# gradients. A small fresh pocket architecture: the arithmetic, not the weights, is under test.
STEP = '''
import sys, torch
from transformers import AutoTokenizer, Qwen2VLForConditionalGeneration
from arr_coc.runtime import distributed
from arr_coc.pocket.binding import BindingHead, aligned_ids, binding_targets
from arr_coc.pocket.pointing import POINT_LAYER, use_pointing_attention
from arr_coc.pocket.reading import ReadingHead, reading_targets
from arr_coc.checkpoints import POCKET_FOLDER
from arr_coc.pocket.data import collate, model_inputs
from arr_coc.pocket.model import PocketConfig, image_processor, model_config, use_same_size_pages_attention
from arr_coc.pocket.trainer import Trainee, backward, data_parallel
from arr_coc.synth.fineprint import make_page

torch.set_num_threads(1)
process = distributed.start("cpu")
tokenizer = AutoTokenizer.from_pretrained(POCKET_FOLDER)
torch.manual_seed(0)
arch = PocketConfig(vision_depth=1, vision_dim=32, vision_heads=2, hidden_size=32, layers=POINT_LAYER + 1, heads=2,
                    kv_heads=1, intermediate=64)  # deep enough for the pointing head's layer
model = Qwen2VLForConditionalGeneration._from_config(model_config(tokenizer, arch), dtype=torch.float32)
model.config._attn_implementation = "sdpa"
use_pointing_attention(use_same_size_pages_attention(model)).train()
reading, binding = ReadingHead(32), BindingHead(32)
trainee = data_parallel(Trainee(model, reading, binding, aligned_ids(tokenizer)), process)
pages = [make_page(kind, 7, 112) for kind in ("fine_print", "box_word", "shape_colour", "box_word")]
turns = [1, 3, 1, 2]  # the halves (pages 0, 2 and 1, 3) hold 2 and 5 answers: unequal token counts
chats = [[(q.question, q.answer) for q in (p.questions * 3)[:n]] for p, n in zip(pages, turns)]
mine = process.shard(range(4))
batch = collate(tokenizer, [pages[i].image for i in mine], [chats[i] for i in mine],
                [reading_targets(pages[i].glyphs, 112, 112) for i in mine], False,
                [binding_targets(pages[i].marks, 112, 112) for i in mine])
inputs = model_inputs(batch, image_processor(), model.config.image_token_id, "cpu")
backward(trainee, inputs, batch["reading"], batch["binding"], process)
if process.is_main:
    module = trainee.module if process.distributed else trainee
    torch.save({n: p.grad for n, p in module.named_parameters() if p.grad is not None}, sys.argv[1])
distributed.finish(process)
'''


def _gradients(tmp_path, processes: int) -> dict:
    script, out = tmp_path / "step.py", tmp_path / f"grads{processes}.pt"
    script.write_text(STEP)
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"] if processes > 1 else []
    subprocess.run([sys.executable, *launcher, str(script), str(out)], cwd=ROOT, check=True, timeout=300,
                   env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    return torch.load(out)


def test_the_ddp_step_equals_one_process_over_the_same_global_batch(tmp_path):
    alone, split = _gradients(tmp_path, 1), _gradients(tmp_path, 2)
    assert set(alone) == set(split) and any(k.startswith("binding.") for k in alone)
    for name in alone:
        torch.testing.assert_close(split[name], alone[name], atol=1e-6, rtol=1e-4, msg=name)


def test_each_process_draws_its_own_batches_of_one_stream():
    """Process r of N takes the stream's batches r, r + N, ...: for N = 2 they interleave to the one-process stream."""
    from arr_coc.pocket.data import PageStream

    class Seen(PageStream):  # the stream's batch indices, not the pages
        def __iter__(self):
            step = self.start
            while True:
                yield step * self.world + self.rank
                step += 1

    def first(stream, n=4):
        it = iter(stream)
        return [next(it) for _ in range(n)]

    assert first(Seen("", 0, 0, 10, 64, 2)) == [10, 11, 12, 13]
    assert first(Seen("", 0, 0, 10, 64, 2, rank=0, world=2)) == [20, 22, 24, 26]
    assert first(Seen("", 0, 0, 10, 64, 2, rank=1, world=2)) == [21, 23, 25, 27]


def test_page_workers_run_below_the_training_process(monkeypatch):
    """The DataLoader's page workers lower their priority by 10 (capped at 19), so the host-bound training process
    gets the CPU first; the process itself (workers=0) keeps its own."""
    import os

    from arr_coc.pocket import data

    monkeypatch.setattr(data, "batch_pages", lambda *a, **k: ())
    monkeypatch.setattr(data, "collate", lambda *a, **k: os.nice(0))  # each "batch": the niceness it was drawn at
    stream = data.PageStream(str(ROOT / "models" / "pocket-qwen2-vl"), 0, 5, 0, 64, 2)
    own = os.nice(0)
    worker = next(iter(torch.utils.data.DataLoader(stream, batch_size=None, num_workers=1)))
    assert worker == min(own + 10, 19)
    assert next(iter(torch.utils.data.DataLoader(stream, batch_size=None, num_workers=0))) == own


def test_the_curriculum_moves_on_at_its_step_budget_when_no_check_passes(tmp_path, monkeypatch):
    from dataclasses import replace

    from arr_coc.pocket import trainer as pocket
    from arr_coc.pocket.trainer import PocketTrainConfig, train

    monkeypatch.setattr(pocket, "exact_match", lambda *a, **k: 0.0)  # no check ever passes
    monkeypatch.setattr(pocket, "CURRICULUM", (replace(pocket.CURRICULUM[0], budget=2),) + pocket.CURRICULUM[1:])
    cfg = PocketTrainConfig(out=str(tmp_path), steps=3, minutes=5, image_tokens=64, workers=0, eval_every=1,
                      eval_pages=1, eval_sizes=(224,), device="cpu", warmup=1)
    state = train(cfg, resume=False)
    assert [c["stage"] for c in state["stage_checks"]] == [0, 1]  # step 1 checks and fails; step 2 spends the budget
    assert state["stage_ends"] == [dict(stage=0, step=2, why="its budget of 2 steps")]
    assert state["stage"] == 1 and state["stage_start"] == 2


def test_every_stage_but_the_last_has_a_step_budget():
    """No stage can stall the curriculum: each but the last (the suite, trained on for good) moves on after its
    budget whatever its check says."""
    from arr_coc.pocket.data import CURRICULUM

    assert [stage.budget for stage in CURRICULUM] == [20_000, 10_000, 300, 300, 400, 10**9]


@pytest.mark.parametrize("correct, n, low, high", [(0, 10, 0.0, 0.2775), (10, 20, 0.2993, 0.7007),
                                                   (81, 263, 0.2553, 0.3662)])
def test_the_wilson_interval_matches_textbook_values(correct, n, low, high):
    """Newcombe (1998), Statistics in Medicine 17:857, table I: 81/263 -> 0.2553-0.3662; the others are standard."""
    from arr_coc.eval.intervals import interval_text, wilson

    assert wilson(correct, n) == pytest.approx((low, high), abs=1e-4)
    assert interval_text(45, 96) == "0.47 [0.37, 0.57] (n=96)"


def test_the_batches_of_one_step_share_their_page_size_and_hold_their_own_pages():
    """Under N processes, step i's batches i*N .. i*N + N-1 are drawn at one page size (and stage), so no process
    waits on another's larger pages; the pages themselves differ. With N = 1 the size goes on changing every batch."""
    from arr_coc.pocket.data import batch_pages

    def drawn(index, world):
        images, _, _, gestalt_first, _, _ = batch_pages(index, 0, 5, image_tokens=4096, max_pages=2, world=world)
        return images[0].size, gestalt_first, images[0].tobytes()

    for step in range(3):
        (size_a, first_a, pixels_a), (size_b, first_b, pixels_b) = drawn(4 * step, 4), drawn(4 * step + 3, 4)
        assert size_a == size_b and first_a == first_b and pixels_a != pixels_b
    assert len({drawn(index, 1)[0] for index in range(4)}) > 1
