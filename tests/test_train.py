"""
Training the ARR layer against the frozen tiny VLM makes selection query-aware; under torchrun a step
equals the one-process step.

    .venv/bin/python -m pytest tests/test_train.py -q
"""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import huggingface_hub
import pytest
import torch
from safetensors.torch import load_file

from arr_coc.eval.data import make_dataset
from arr_coc.errors import InputError
from arr_coc.model import ARRCOCQwen
from arr_coc.pipelines import arr_scene
from arr_coc.pipelines.arr_layout import arr_prompt, encode_saccades
from arr_coc.pipelines.arr_scene import score, select
from arr_coc.relevance.layer import ARRCOCLayer
from arr_coc.runtime.timing import Stopwatch
from arr_coc.eval.intervals import bootstrap_mean
from arr_coc.train import PriorComparison, TrainConfig, answer_loss, batches, comparison, comparison_lines, load_samples, main, parse_args, relevance_loss, save, train
from arr_coc.train import select as select_for_training

ROOT = Path(__file__).resolve().parents[1]
ONE_STEP = ["--model", "tiny", "--device", "cpu", "--steps", "1", "--batch-size", "2", "--n-train", "2", "--n-eval", "1"]


def saccades_on(answer, box) -> int:
    touched = answer.views.box_coverage(box).flatten() > 0
    return int(touched[answer.arr.indices[0].cpu()].sum())


def test_box_coverage_and_relevance_loss():
    from arr_coc.vlm.views import make_views
    from PIL import Image

    views = make_views(Image.new("RGB", (448, 448)))  # 32x32 cells of 14 px
    cover = views.box_coverage((14, 0, 35, 14))
    assert cover[0, 1] == 1 and abs(float(cover[0, 2]) - 0.5) < 1e-6 and cover.sum() == 1.5
    peak = torch.zeros(32, 32)
    peak[0, 1] = 10
    assert relevance_loss(peak, cover, 0.5) < relevance_loss(torch.zeros(32, 32), cover, 0.5)


def test_trained_scorer_looks_where_the_question_points(tmp_path):
    model = ARRCOCQwen.from_pretrained("tiny")
    frozen = {k: v.clone() for k, v in model.vlm.model.state_dict().items()}
    cfg = TrainConfig(n_train=32, n_eval=4, steps=80, eval_every=80, out=str(tmp_path / "ck"))
    model, log = train(cfg, model)
    assert log[-1]["loss"] < log[0]["loss"]
    assert all(torch.equal(v, model.vlm.model.state_dict()[k]) for k, v in frozen.items())  # VLM untouched

    held_out = make_dataset(8, ("text_vs_distractor", "distractor_query"), seed=50_000, size=448)
    text_wins = shape_wins = 0
    for text_q, shape_q in zip(held_out[::2], held_out[1::2]):  # same image, two questions
        # upsample: the 448 px scenes of training hold 256 native cells, which ARR would read whole as full does
        on_text = model.answer(text_q.image, text_q.question, "arr", max_new_tokens=1, budget=40, upsample=True)
        on_shape = model.answer(shape_q.image, shape_q.question, "arr", max_new_tokens=1, budget=40, upsample=True)
        text_wins += saccades_on(on_text, text_q.box) > saccades_on(on_text, shape_q.box)
        shape_wins += saccades_on(on_shape, shape_q.box) > saccades_on(on_shape, text_q.box)
    assert text_wins == 4 and shape_wins == 4

    folder = save(model, cfg, log)
    reloaded = ARRCOCLayer.from_pretrained(folder, expect_hidden_size=64)
    assert (folder / "README.md").read_text().count("hits/") >= 2
    for a, b in zip(reloaded.state_dict().values(), model.layer.state_dict().values()):
        assert torch.equal(a, b.cpu())


def test_a_trained_scorer_learns_alone_and_the_balancer_keeps_the_priors_weights(capsys):
    """--trained-scorer participatory (issue 61: the query<->texture coupling learned with the balancer held at its
    prior): every parameter outside the participatory scorer stays the untrained layer's, bit for bit, so the
    balancer weighs any maps 0.2, 0.2, 0.6; the scorer itself moves. A scorer that does not exist is refused."""
    model = ARRCOCQwen.from_pretrained("tiny")
    before = {k: v.clone() for k, v in model.layer.state_dict().items()}
    cfg = TrainConfig(n_train=16, n_eval=4, steps=6, eval_every=6, trained_scorer="participatory")
    model, _ = train(cfg, model)
    after = {k: v.cpu() for k, v in model.layer.state_dict().items()}
    moved = sorted(k for k in before if not torch.equal(before[k], after[k]))
    assert moved and all(k.startswith("participatory.") for k in moved), moved
    assert "participatory.gain" in moved  # the query<->texture coupling's scale, zero in the untrained layer
    maps, query = torch.randn(2, 3, 5, 7), torch.randn(2, 4, model.layer.config.hidden_size)
    _, weights, _ = model.layer.balancer.cpu()(maps, query)
    assert torch.allclose(weights, torch.tensor([[0.2, 0.2, 0.6]] * 2), atol=1e-6)
    with pytest.raises(SystemExit):
        parse_args([*ONE_STEP, "--trained-scorer", "balancer"])
    assert "--trained-scorer" in capsys.readouterr().err


def hand_recalls(layer, observed, budget) -> list[float]:
    """Each (observation, box)'s box recall under `layer` at `budget` saccades: the box's cells that got one / its cells."""
    recalls = []
    with torch.no_grad():
        for observation, box in observed:
            touched = observation.views.box_coverage(box).flatten() > 0  # [cells]
            chosen = layer.select(score(observation, layer), observation.views.candidate_grid, budget).indices[0]
            recalls.append(int(touched[chosen.cpu()].sum()) / int(touched.sum()))
    return recalls


def test_the_final_log_sets_the_trained_layer_beside_the_untrained_prior_on_the_same_held_out_items(tmp_path):
    """log[-1]["compare"]: per kind, the held-out items with a box (8 held-out scenes: 4 of each kind), and each
    layer's mean box recall on them at 273 saccades, as measured here by hand: the trained layer's, and that of the
    layer --checkpoint prior loads, each with its bootstrap interval over the items. The model card says it too."""
    from arr_coc.commands import cli

    cfg = TrainConfig(n_train=16, n_eval=8, steps=20, eval_every=20, batch_size=4, out=str(tmp_path / "ck"))
    model, log = train(cfg, ARRCOCQwen.from_pretrained("tiny"))
    compare = log[-1]["compare"]
    assert [entry["step"] for entry in log] == [0, 20] and "compare" not in log[0]
    assert {kind: c["n"] for kind, c in compare.items()} == {"text_vs_distractor": 4, "distractor_query": 4}

    prior, name = cli.load_model("tiny", "prior", "cpu", quiet=True)
    assert name == "prior (untrained)"
    held_out = load_samples(cfg)[1]
    for kind in ("text_vs_distractor", "distractor_query"):
        observed = [(arr_scene.observe(model.parts, model.views(s.image), s.question), s.box) for s in held_out if s.kind == kind]
        for side, layer in (("trained", model.layer), ("prior", prior.layer)):
            recalls = hand_recalls(layer, observed, 273)
            assert compare[kind][side] == pytest.approx(sum(recalls) / 4, abs=1e-9), (kind, side)
            assert (compare[kind][f"{side}_low"], compare[kind][f"{side}_high"]) == bootstrap_mean(recalls)
            assert 0 <= compare[kind][f"{side}_low"] <= compare[kind][side] <= compare[kind][f"{side}_high"] <= 1
    card = save(model, cfg, log).joinpath("README.md").read_text()
    assert "- held-out box recall, distractor_query (n=4): trained " in card and "· untrained prior " in card
    assert "Held-out box recall (the share of the box's cells that got a saccade, at 273 saccades; " in card


def test_the_comparison_says_better_or_worse_only_where_the_intervals_are_apart():
    assert comparison([1.0, 1.0], [0.0, 0.0]) == PriorComparison(2, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, "better")
    assert comparison([0.0, 0.0], [1.0, 1.0]).verdict == "worse"
    assert comparison([0.0, 1.0], [0.5, 0.5]).verdict == "tie"  # 0.5 [0, 1] against 0.5 [0.5, 0.5]
    tie = dict(n=16, trained=0.62, trained_low=0.48, trained_high=0.75, prior=0.55, prior_low=0.41, prior_high=0.69,
               verdict="tie")
    better = dict(n=8, trained=0.97, trained_low=0.92, trained_high=1.0, prior=0.355, prior_low=0.296,
                  prior_high=0.414, verdict="better")
    assert comparison_lines({"text_vs_distractor": tie, "distractor_query": better}, 64) == [
        "held-out box recall (the share of the box's cells that got a saccade, at 64 saccades; 95% bootstrap "
        "intervals over the items), trained layer vs the untrained prior on the same items:",
        "held-out box recall, text_vs_distractor (n=16): trained 0.62 [0.48, 0.75] · untrained prior 0.55 [0.41, 0.69]"
        " — tie (intervals overlap)",
        "held-out box recall, distractor_query (n=8): trained 0.97 [0.92, 1.00] · untrained prior 0.35 [0.30, 0.41]"
        " — trained better (intervals apart)",
    ]
    assert comparison_lines({"fine_print": {**tie, "verdict": "worse"}}, "auto") == [
        "held-out box recall (the share of the box's cells that got a saccade, at the adaptive budget (each layer its "
        "own K); 95% bootstrap intervals over the items), trained layer vs the untrained prior on the same items:",
        "held-out box recall, fine_print (n=16): trained 0.62 [0.48, 0.75] · untrained prior 0.55 [0.41, 0.69]"
        " — trained worse (intervals apart)",
    ]
    assert comparison_lines({}, 64) == []


def test_train_prints_the_comparison_and_says_what_observation_was(tmp_path, capsys):
    assert main([*ONE_STEP, "--out", str(tmp_path / "ck")]) == 0
    captured = capsys.readouterr()
    out = [line for line in captured.out.splitlines() if not line.startswith("{")]  # after the log's JSON lines
    assert out[0] == ("held-out box recall (the share of the box's cells that got a saccade, at 273 saccades; 95% "
                      "bootstrap intervals over the items), trained layer vs the untrained prior on the same items:")
    assert out[1].startswith("held-out box recall, text_vs_distractor (n=1): trained ") and len(out) == 3, out
    assert out[2] == f"wrote {tmp_path / 'ck'}"
    assert (" s before the first step: the frozen VLM's one pass over the training and held-out samples (gestalt, "
            "attention prior, texture), reused by every step") in captured.err
    assert main([*ONE_STEP, "--out", str(tmp_path / "bare"), "--no-compare"]) == 0
    assert [line for line in capsys.readouterr().out.splitlines() if not line.startswith("{")] == [
        f"wrote {tmp_path / 'bare'}"]
    assert "compare" not in json.loads((tmp_path / "bare" / "train_log.json").read_text())[-1]


def test_the_answer_loss_alone_reaches_the_layer_through_the_straight_through_product(family):
    """
    Without the relevance loss, the answer loss's gradient reaches the balancer and the participatory scorer only
    through tokens * (1 + (s - s.detach())) on the selected scores; its value is the scorer faithfulness reads.
    """
    vlm, layer = family.vlm, family.layer
    sample = make_dataset(1, ("text_vs_distractor",), seed=3, size=448)[0]
    observation = arr_scene.observe(family.parts, family.views(sample.image), sample.question)
    layer.zero_grad(set_to_none=True)
    try:
        with torch.enable_grad():
            maps = arr_scene.score(observation, layer)  # the layer's eager, differentiable forward
            out = layer.select(maps, observation.views.candidate_grid)
            loss = answer_loss(family, observation, out, sample.answer)
            loss.backward()
        grads = {name: p.grad for name, p in layer.named_parameters()}
        for name in ("balancer.head.1.weight", "participatory.gain"):
            assert grads[name] is not None and grads[name].abs().sum() > 0, name
    finally:
        layer.zero_grad(set_to_none=True)
    with torch.no_grad():  # minus the mean log-probability of the answer's tokens, as faithfulness scores it
        saccades = encode_saccades(vlm, observation, out.positions[0])
        score = vlm.answer_logprobs([arr_prompt(vlm, observation, saccades, sample.answer)])[0]
    assert float(loss.detach()) == pytest.approx(-float(score), abs=1e-5)


def test_answer_loss_training_on_the_pocket_model_moves_its_selection_at_a_scarce_budget():
    """
    The answer loss alone (--box-weight 0) on the pocket model, a model that reads, at a scarce budget (32
    saccades): a few steps change the scorers' parameters and the cells held-out pages select, which only the
    straight-through product lets the answer loss do. Whether that raises the held-out answers' likelihood is not
    pinned: measured (pocket step 46408, 12 steps, 12 held-out pages), -1.472 -> -1.191 nats per token run alone
    and -1.472 -> -1.463 or -1.490 after other tests, the training loss equal to 3 digits: at 32 saccades the
    likelihood moves with which cells flip at the budget's edge (issue #26 measures it at scale).
    """
    model = ARRCOCQwen.from_pretrained("pocket", device="cpu")
    model.layer.config.saccade_order = "raster"  # the order the pocket model reads in (the README's Accuracy)
    cfg = TrainConfig(model="pocket", kinds="fine_print,box_word,shape_colour", scene_size=896, n_train=24, n_eval=12,
                      steps=12, batch_size=4, lr=1e-3, lm_weight=1.0, box_weight=0.0, eval_every=1000,
                      saccade_order="raster", budget=32)
    held_out = [arr_scene.observe(model.parts, model.views(s.image), s.question, Stopwatch(model.vlm.device)) for s in load_samples(cfg)[1]]

    def selections() -> list[set[int]]:
        with torch.no_grad():
            return [set(select_for_training(model, arr_scene.score(o, model.layer.graphed_score), o, cfg).indices[0].tolist()) for o in held_out]

    before, scorers = selections(), {k: v.clone() for k, v in model.layer.state_dict().items()}
    train(cfg, model)
    changed = [k for k, v in model.layer.state_dict().items() if not torch.equal(v, scorers[k])]
    assert any(k.startswith(("information.", "perspectival.", "participatory.")) for k in changed), changed
    moved = sum(len(a ^ b) // 2 for a, b in zip(before, selections()))  # cells swapped in or out, over the pages
    assert moved > 0  # measured: 10 cells over 12 pages; 0 without the straight-through product


def test_the_token_cost_lowers_the_adaptive_budget_on_held_out_scenes(arr_model):
    """Same data, same steps: with a price on each saccade, the held-out scenes get fewer (K is the adaptive budget)."""
    means, layer = {}, arr_model.layer
    try:
        for cost in (0.0, 2.0):
            arr_model.layer = arr_model.prior_layer()
            cfg = TrainConfig(n_train=4, n_eval=2, steps=4, batch_size=4, eval_every=4, budget="auto",
                              token_cost=cost, lr=3e-2)
            _, log = train(cfg, arr_model)
            assert all(cfg.min_budget <= log[-1][f"budget/{kind}"] <= cfg.max_budget
                       for kind in ("text_vs_distractor", "distractor_query"))
            means[cost] = (log[0]["budget"], log[-1]["budget"])
    finally:
        arr_model.layer = layer
    assert means[0.0][0] == means[2.0][0]  # the same prior before training
    assert means[2.0][1] < means[0.0][1] and means[2.0][1] < means[2.0][0], means
    assert parse_args([*ONE_STEP, "--budget", "auto", "--token-cost", "1"]).token_cost == 1.0


def test_the_token_cost_needs_the_adaptive_budget(capsys):
    with pytest.raises(SystemExit):
        parse_args([*ONE_STEP, "--token-cost", "1"])
    assert "--token-cost: prices the adaptive budget; it needs --budget auto" in capsys.readouterr().err


def test_switching_off_both_losses_is_refused(capsys):
    with pytest.raises(SystemExit):
        parse_args([*ONE_STEP, "--box-weight", "0"])  # --lm-weight is 0 by default
    assert "--box-weight: with --lm-weight 0 too, nothing would be trained" in capsys.readouterr().err
    assert parse_args([*ONE_STEP, "--box-weight", "0", "--lm-weight", "1"]).box_weight == 0


def test_the_saccade_order_is_trained_in_and_saved_with_the_checkpoint(tmp_path):
    """--saccade-order raster: the checkpoint's config carries it, so wherever it is loaded its saccades are fed
    row by row, as in training."""
    cfg = TrainConfig(n_train=2, n_eval=2, steps=1, eval_every=1, batch_size=2, saccade_order="raster",
                      out=str(tmp_path / "ck"))
    model, log = train(cfg, ARRCOCQwen.from_pretrained("tiny"))
    folder = save(model, cfg, log)
    reloaded = ARRCOCQwen.from_pretrained("tiny", checkpoint=str(folder))
    assert reloaded.layer.config.saccade_order == "raster"
    scene = make_dataset(1, ("text_vs_distractor",), seed=50_000, size=448)[0]
    observation = arr_scene.observe(reloaded.parts, reloaded.views(scene.image), scene.question, Stopwatch(reloaded.vlm.device))
    out = select(reloaded.layer, score(observation, reloaded.layer), observation.views.candidate_grid,
                 len(observation.gestalt))
    fed = out.indices[0].tolist()
    assert fed == sorted(fed) and len(fed) == 273  # row by row
    answer = reloaded.answer(scene.image, scene.question, "arr", max_new_tokens=1, upsample=True)  # as it trained
    assert answer.to_json()["tensions"]["saccade_order"] == "raster"  # what run, evaluate and the app record
    saccades = answer.saccades
    assert [s.rank for s in saccades] == list(range(1, 274))  # the app still numbers them most relevant first
    assert [s.score for s in saccades] == sorted((s.score for s in saccades), reverse=True)


def test_every_flag_has_help_and_maps_to_the_config(capsys, tmp_path):
    cfg = parse_args(["--steps", "7", "--lm-weight", "0.5", "--data", "some/folder", "--out", str(tmp_path / "o")])
    assert cfg.steps == 7 and cfg.lm_weight == 0.5 and cfg.data == "some/folder" and cfg.model == "tiny"
    assert cfg.out == str(tmp_path / "o")
    for f in fields(TrainConfig):  # every config field is a flag with a help text
        assert f.metadata.get("help", "").strip(), f.name
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    usage = " ".join(capsys.readouterr().out.split())
    for f in fields(TrainConfig):
        flag = f"--{f.name.replace('_', '-')}"
        assert flag in usage and " ".join(f.metadata["help"].split())[:40] in usage, flag


# ----------------------------------------------------------------------------- DistributedDataParallel

DDP_RUNS = {  # two steps of the relevance loss (a parameter without gradient would fail DDP's second step),
    # and one step with the answer loss, whose gradient reaches the layer through the straight-through product
    "relevance": ["--steps", "2", "--batch-size", "4", "--n-train", "6"],
    "answer": ["--steps", "1", "--batch-size", "2", "--n-train", "2", "--lm-weight", "0.5"],
}


@pytest.mark.parametrize("flags", DDP_RUNS.values(), ids=DDP_RUNS.keys())
def test_a_ddp_step_equals_the_one_process_step(flags, tmp_path):
    flags = ["--model", "tiny", "--device", "cpu", "--n-eval", "2", *flags]  # gloo on CPU, on any machine
    launchers = {"ddp": ["-m", "torch.distributed.run", "--nproc-per-node", "2"], "one": []}
    runs = {name: subprocess.Popen([sys.executable, *launcher, "-m", "arr_coc.train", *flags, "--out", str(tmp_path / name)],
                                   cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},  # one thread: the same sums
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for name, launcher in launchers.items()}
    outputs = {name: run.communicate(timeout=300)[0] for name, run in runs.items()}
    assert all(run.returncode == 0 for run in runs.values()), outputs
    output = outputs["ddp"]
    assert output.count("wrote ") == 1 and "[rank 1]" not in output  # rank 0 alone writes and talks

    compared = {run: json.loads((tmp_path / run / "train_log.json").read_text())[-1]["compare"] for run in runs}
    assert {kind: c["n"] for kind, c in compared["ddp"].items()} == {"text_vs_distractor": 1, "distractor_query": 1}
    for kind, c in compared["one"].items():  # each rank held one of the 2 held-out items: gathered for the intervals
        assert {k: compared["ddp"][kind][k] for k in ("n", "prior", "prior_low", "prior_high")} == \
            {k: c[k] for k in ("n", "prior", "prior_low", "prior_high")}, kind
        assert compared["ddp"][kind]["trained"] == pytest.approx(c["trained"], abs=1e-6), kind
    ddp, one = (load_file(tmp_path / run / "model.safetensors") for run in ("ddp", "one"))
    assert ddp.keys() == one.keys()
    for name in one:
        torch.testing.assert_close(ddp[name], one[name], msg=name)
    torch.manual_seed(0)  # where training started: --seed 0, then the model and its prior layer
    prior = ARRCOCQwen.from_pretrained("tiny").layer.state_dict()
    assert any(not torch.allclose(one[name], prior[name]) for name in one), "the step changed nothing"


def test_the_global_batch_must_split_evenly_over_the_processes(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun --nproc-per-node 2 sets it
    with pytest.raises(SystemExit) as exit:
        parse_args(["--batch-size", "3", "--out", str(tmp_path / "ck")])
    assert exit.value.code == 2
    reason = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --batch-size: 3 does not split evenly over the 2 processes" in reason, reason
    assert parse_args(["--batch-size", "4", "--out", str(tmp_path / "ck")]).batch_size == 4
    with pytest.raises(InputError, match="only 3 training samples"):  # the batch shrinks to the samples there are
        batches(TrainConfig(batch_size=4), n_train=3, world_size=2)



# ----------------------------------------------------------------------------- --push-to-hub


def test_push_to_hub_uploads_the_checkpoint_folder(tmp_path, monkeypatch):
    """Against a local folder: the fakes put what the hub would get under tmp_path/hub/<repo id>."""
    hub, repo_ids = tmp_path / "hub", []

    def create_repo(self, repo_id, exist_ok=False, **kwargs):
        repo_ids.append(repo_id)
        (hub / repo_id).mkdir(parents=True, exist_ok=exist_ok)
        return f"file://{hub / repo_id}"

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        repo_ids.append(repo_id)
        shutil.copytree(folder_path, hub / repo_id, dirs_exist_ok=True)

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    out = tmp_path / "ck"
    assert main([*ONE_STEP, "--out", str(out), "--push-to-hub", "someone/arr-test"]) == 0
    assert repo_ids == ["someone/arr-test"] * 2
    uploaded = hub / "someone" / "arr-test"
    for name in ("config.json", "model.safetensors", "README.md", "train_log.json"):
        assert (uploaded / name).read_bytes() == (out / name).read_bytes(), name


def test_push_to_hub_offline_keeps_the_checkpoint_and_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # what HF_HUB_OFFLINE=1 sets at import
    out = tmp_path / "ck"
    assert main([*ONE_STEP, "--out", str(out), "--push-to-hub", "someone/arr-test"]) == 2
    reason = capsys.readouterr().err.strip().splitlines()[-1]
    assert reason.startswith("error:") and f"saved locally at {out}" in reason and "OfflineModeIsEnabled" in reason
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()


# ----------------------------------------------------------------------------- --save-every, --resume, atomic saves

THREE_STEPS = ["--model", "tiny", "--device", "cpu", "--steps", "3", "--batch-size", "2", "--n-train", "4", "--n-eval", "1",
               "--eval-every", "1"]


def test_save_every_writes_a_resumable_checkpoint_and_resume_ends_where_an_uninterrupted_run_does(tmp_path, capsys,
                                                                                                  monkeypatch):
    import arr_coc.train as train_module

    assert main([*THREE_STEPS, "--out", str(tmp_path / "whole")]) == 0
    whole = load_file(tmp_path / "whole" / "model.safetensors")
    batch_loss, calls = train_module.batch_loss, []

    def stopped_at_step_3(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C during step 3, after step 2's checkpoint
        return batch_loss(*args)

    monkeypatch.setattr(train_module, "batch_loss", stopped_at_step_3)
    out = tmp_path / "cut"
    assert main([*THREE_STEPS, "--save-every", "1", "--out", str(out)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"stopped; rerun the same command with --resume to continue from the last checkpoint in {out}"
    assert torch.load(out / "training_state.pt", weights_only=True)["step"] == 2
    assert ARRCOCLayer.from_pretrained(out, expect_hidden_size=64) is not None  # a checkpoint as any other

    monkeypatch.setattr(train_module, "batch_loss", batch_loss)
    assert main([*THREE_STEPS, "--save-every", "1", "--out", str(out), "--resume"]) == 0
    assert f"resuming {out} at step 2 of 3" in capsys.readouterr().err
    resumed = load_file(out / "model.safetensors")
    for name in whole:
        torch.testing.assert_close(resumed[name], whole[name], msg=name)
    assert not (out / "training_state.pt").exists()  # the final checkpoint is a plain one
    log = json.loads((out / "train_log.json").read_text())
    assert [entry["step"] for entry in log] == [0, 1, 2, 3]
    with pytest.raises(SystemExit):  # nothing left to resume from
        parse_args([*THREE_STEPS, "--out", str(out), "--resume"])
    assert "holds no training state to resume (--save-every N saves one)" in capsys.readouterr().err


def test_resume_with_other_flags_is_refused_naming_them(tmp_path, capsys):
    out = tmp_path / "ck"
    assert main([*THREE_STEPS, "--steps", "1", "--save-every", "1", "--out", str(out)]) == 0
    config = vars(parse_args([*THREE_STEPS, "--out", str(out), "--overwrite"]))
    state = dict(step=1, log=[], optimizer={}, config=dict(config))
    torch.save(state, out / "training_state.pt")  # as if the run had been cut after step 1 of 3
    assert main([*THREE_STEPS, "--lr", "0.01", "--out", str(out), "--resume"]) == 2
    assert "was trained with other flags (lr: 0.003 there, 0.01 now); resume with the same ones" in capsys.readouterr().err


def test_an_interrupted_save_leaves_the_old_checkpoint_whole(tmp_path, monkeypatch):
    """--overwrite onto a checkpoint, cut off while the new one is written: the old one is still there, byte for byte;
    the next save goes through, and keeps a file of the user's in the folder."""
    out = tmp_path / "ck"
    cfg = TrainConfig(n_train=2, n_eval=1, steps=1, batch_size=2, out=str(out), overwrite=True)
    model, log = train(cfg, ARRCOCQwen.from_pretrained("tiny"))
    save(model, cfg, log)
    (out / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    save_pretrained = ARRCOCLayer.save_pretrained

    def cut_short(self, folder, **kwargs):
        save_pretrained(self, folder, **kwargs)
        Path(folder, "model.safetensors").write_bytes(b"half")  # the weights half written...
        raise KeyboardInterrupt  # ...when Ctrl-C comes

    monkeypatch.setattr(ARRCOCLayer, "save_pretrained", cut_short)
    with torch.no_grad():
        next(model.layer.parameters()).add_(1.0)  # a different layer, so overwriting would show
    with pytest.raises(KeyboardInterrupt):
        save(model, cfg, log)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    monkeypatch.setattr(ARRCOCLayer, "save_pretrained", save_pretrained)
    save(model, cfg, log)
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").read_bytes() != before["model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no temporary folder left beside it


@pytest.mark.usefixtures("tiny_loaded_once")
@pytest.mark.parametrize("question, message", [
    ("", "the question is empty: type a question about the image"),  # the pipelines' check, at load
    ("\N{GRINNING FACE}" * 3000, "the question is 3000 tokens long; the limit is 2048 tokens: shorten it"),  # tokens
])
def test_a_data_question_that_cannot_run_is_refused_naming_its_line(tmp_path, capsys, question, message):
    """train --data as evaluate: a question the pipelines refuse fails before training, in one line naming the
    JSONL line (the 3000 characters are 3000 of the tiny model's tokens, over MAX_QUESTION_TOKENS)."""
    from arr_coc.eval.data import save_jsonl

    samples = make_dataset(10, kinds=("text_vs_distractor",), size=224)
    samples[7].question = question
    path = save_jsonl(samples, tmp_path / "set")
    assert main([*ONE_STEP, "--data", str(tmp_path / "set"), "--out", str(tmp_path / "ck")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert errors == [f"error: {path}:8: {message}"]
