"""
pocket-qwen2-vl: the shipped folder loads with stock transformers alone and answers in the task's formats; the
training batches equal the stock processor's; the fast engine matches stock generate on its non-trivial answers;
the training script runs, saves and resumes.
"""

import json
import re
from pathlib import Path

import numpy as np

import pytest
import torch
from conftest import answers_by_engine

from arr_coc.synth.fineprint import BOX_WORDS, COLOURS, make_page
from arr_coc.checkpoints import POCKET_FOLDER
from arr_coc.pocket.data import IGNORE, READ_PAGE, collate, encode, model_inputs
from arr_coc.pocket.model import image_processor
from arr_coc.pocket.trainer import PocketTrainConfig, train

FORMATS = {"fine_print": r"\d{4}", "box_word": "|".join(BOX_WORDS), "shape_colour": "|".join(COLOURS)}


@pytest.fixture(scope="module")
def stock():
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLForConditionalGeneration

    folder = str(POCKET_FOLDER)
    model = Qwen2VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(folder), AutoImageProcessor.from_pretrained(folder)


@pytest.fixture(scope="module")
def pocket():
    from arr_coc.model import ARRCOCQwen

    return ARRCOCQwen.from_pretrained("pocket", device="cpu", dtype=torch.float32)


def test_the_special_ids_come_from_the_pocket_tokenizer_and_config(stock):
    model, tokenizer, _ = stock
    config = model.config
    assert tokenizer.convert_tokens_to_ids("<|image_pad|>") == config.image_token_id != 151655  # not Qwen's ids
    assert tokenizer.convert_tokens_to_ids("<|vision_start|>") == config.vision_start_token_id
    assert len(tokenizer) <= config.text_config.vocab_size < 2000  # a vocabulary sized to the task
    size = sum(f.stat().st_size for f in POCKET_FOLDER.iterdir())
    assert size < 25e6 and all(f.stat().st_size < 16 * 2**20 for f in POCKET_FOLDER.iterdir())


@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_stock_generate_answers_in_the_tasks_format(stock, kind):
    """Stock transformers end to end (chat template, image processor, generate): the answer has the task's form."""
    model, tokenizer, processor = stock
    page = make_page(kind, 10**9 + 7, 448)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": page.questions[0].question}]}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    vision = processor(images=[page.image], return_tensors="pt")
    text = text.replace("<|image_pad|>", "<|image_pad|>" * (int(vision["image_grid_thw"].prod()) // 4))
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    out = model.generate(input_ids=ids, pixel_values=vision["pixel_values"], image_grid_thw=vision["image_grid_thw"],
                         mm_token_type_ids=(ids == model.config.image_token_id).int(), max_new_tokens=8, do_sample=False)
    answer = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert re.fullmatch(FORMATS[kind], answer), answer


def test_the_shipped_tokenizer_is_what_build_tokenizer_makes(stock):
    """The recipe rebuilds the shipped tokenizer exactly: same vocabulary, same chat template."""
    from arr_coc.pocket.model import build_tokenizer

    _, shipped, _ = stock
    built = build_tokenizer()
    assert built.get_vocab() == shipped.get_vocab() and built.chat_template == shipped.chat_template


def test_a_training_batch_is_what_the_stock_processor_gives(stock):
    _, tokenizer, processor = stock
    pages = [make_page(kind, 5, 336, 280).image for kind in ("fine_print", "box_word")]
    batch = collate(tokenizer, pages, [[("What is the value of TAX?", "0427")], [(READ_PAGE, "red: tiger")]])
    inputs = model_inputs(batch, image_processor(), tokenizer.convert_tokens_to_ids("<|image_pad|>"), "cpu")
    reference = processor(images=pages, return_tensors="pt")
    assert torch.equal(inputs["image_grid_thw"], reference["image_grid_thw"])
    torch.testing.assert_close(inputs["pixel_values"], reference["pixel_values"], atol=1e-5, rtol=0)
    assert int((inputs["input_ids"] == tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum()) == 2 * 12 * 10
    answers = [tokenizer.decode([t for t in row if t != IGNORE]) for row in batch["labels"].tolist()]
    assert answers == ["0427<|im_end|>", "red: tiger<|im_end|>"]  # the loss is on the answers alone


def test_with_the_gestalt_first_each_conversation_shows_its_gestalt_view_then_its_page(stock):
    """The patches go gestalt 1, page 1, gestalt 2, page 2 ..., as the prompts' image blocks: the gestalt is ARR's
    own view of the page (views.resize to fit_grid(256)), the page the stock processor's."""
    from arr_coc.vlm.vision import image_patches
    from arr_coc.vlm.views import resize

    _, tokenizer, processor = stock
    pages = [make_page(kind, 5, 336, 280).image for kind in ("fine_print", "box_word")]
    batch = collate(tokenizer, pages, [[("What is the value of TAX?", "0427")], [(READ_PAGE, "red: tiger")]],
                    gestalt_first=True)
    inputs = model_inputs(batch, image_processor(), tokenizer.convert_tokens_to_ids("<|image_pad|>"), "cpu")
    expected = []
    for page in pages:
        pixels = torch.from_numpy(np.asarray(page)).permute(2, 0, 1)[None].float() / 255  # [1, 3, H, W]
        expected += [image_patches(resize(pixels, (15, 17)), processor)[0],  # 336x280 px: a 15x17 gestalt
                     processor(images=[page], return_tensors="pt")["pixel_values"]]
    torch.testing.assert_close(inputs["pixel_values"], torch.cat(expected), atol=1e-5, rtol=0)
    assert inputs["image_grid_thw"][:, 1:].tolist() == [[30, 34], [20, 24]] * 2
    pads = (inputs["input_ids"] == tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum(1)
    assert pads.tolist() == [15 * 17 + 10 * 12] * 2


@pytest.mark.parametrize("gestalt_first", [False, True])
def test_the_training_forward_is_the_stock_forward(stock, gestalt_first):
    """Training's shortcuts (one batched ViT attention per image size, M-RoPE ids drawn in the workers, the gestalt
    view resized on the GPU) give the logits of the stock forward (per-image attention loop, get_rope_index) on every
    real token, in fp32; with gestalt_first, of two images a conversation: the page's gestalt view, then the page."""
    import copy

    from arr_coc.pocket.model import use_same_size_pages_attention

    model, tokenizer, _ = stock
    pages = [make_page(kind, 9, 588, 476).image for kind in ("fine_print", "box_word", "shape_colour")]
    batch = collate(tokenizer, pages, [[("What is the value of TAX?", "0427"), ("What is the value of ROOM?", "12")],
                                       [(READ_PAGE, "red: tiger")], [("What colour is the circle?", "red")]],
                    gestalt_first=gestalt_first)
    inputs = model_inputs(batch, image_processor(), model.config.image_token_id, "cpu")
    real = inputs["attention_mask"].bool()  # [B, L]
    training = use_same_size_pages_attention(copy.deepcopy(model))
    with torch.no_grad():
        fast = training(**inputs).logits  # [B, L, V]
        reference = model(**{k: v for k, v in inputs.items() if k != "position_ids"}).logits
    assert training.config.vision_config._attn_implementation != model.config.vision_config._attn_implementation
    torch.testing.assert_close(fast[real], reference[real], atol=1e-4, rtol=1e-4)
    blocks = [(14, 17), (17, 21)] if gestalt_first else [(17, 21)]  # 588x476 px: 357 cells, its gestalt 238
    assert inputs["image_grid_thw"][:, 1:].tolist() == [[2 * r, 2 * c] for r, c in blocks] * 3


def test_labels_cover_every_answer_of_a_conversation(stock):
    _, tokenizer, _ = stock
    ids, labels = encode(tokenizer, [("What is the value of TAX?", "0427"), ("What is the value of RANK?", "9")], [4, 6])
    kept = [t for t in labels if t != IGNORE]
    assert tokenizer.decode(kept) == "0427<|im_end|>9<|im_end|>"
    text = tokenizer.decode(ids)
    assert text.count("<|vision_start|>" + "<|image_pad|>" * 4 + "<|vision_end|>") == 1  # two blocks, in order
    assert text.count("<|vision_start|>" + "<|image_pad|>" * 6 + "<|vision_end|>") == 1
    assert text.index("<|image_pad|>" * 4) < text.index("<|image_pad|>" * 6) < text.index("TAX")


@pytest.mark.parametrize("pipeline", ["full", "gestalt", "arr"])
def test_the_fast_engine_answers_as_stock_generate_on_non_trivial_answers(pocket, pipeline):
    for kind in sorted(FORMATS):
        page = make_page(kind, 10**9 + 11, 448)
        answers = answers_by_engine(pocket, page.image, page.questions[0].question, pipeline)
        assert answers["fast"].text == answers["hf"].text
        assert len(answers["fast"].text.strip()) >= 3, answers["fast"].text  # a word or digits, not "\n"


def test_the_shipped_model_reads_print_that_its_gestalt_cannot(stock):
    """Held-out pages (new seeds), teacher-forced exact match through the stock forward (measured on this CPU, step
    52777, 24 pages a kind): large print on small pages (the curriculum's first stage) 24 and 24 of 24; the suite
    at 896 px, native: fine_print 23, box_word 24, shape_colour 24; the gestalt: 0, 1 and 24. The bounds sit below
    the measurement, inside its 95% interval (fine_print 23/24: 0.80-0.99; 24/24: 0.86-1.00), and fail on a model
    that lost a kind: the step-46408 weights read 4 box words of 24."""
    from arr_coc.pocket.heldout import exact_match, gestalt_view, heldout

    model, tokenizer, _ = stock
    cpu = torch.device("cpu")

    def read(items) -> int:
        return round(exact_match(model, tokenizer, image_processor(), items, cpu) * len(items))

    for kind in ("fine_print", "box_word"):
        assert read(heldout(kind, 168, 24, 0)) >= 22, kind
    bounds = {"fine_print": (20, 0), "box_word": (21, 4), "shape_colour": (22, 22)}  # (native at least, gestalt)
    for kind, (native_at_least, gestalt_bound) in bounds.items():
        native = heldout(kind, 896, 24)
        gestalt = read([(gestalt_view(image), q, a) for image, q, a in native])
        assert read(native) >= native_at_least, kind
        assert gestalt >= gestalt_bound if kind == "shape_colour" else gestalt <= gestalt_bound, kind


@pytest.fixture(scope="module")
def served():
    """The pocket model as the app and the commands serve it: with its default checkpoint; -> (model, its name)."""
    from arr_coc.commands import cli

    return cli.load_model("pocket", None, "cpu", quiet=True)


def test_the_offline_app_answers_its_fine_print_examples(served):
    """The app's pocket examples (assets/examples.json), asked as the app asks them: the pocket model with its default
    layer (the untrained prior, raster order: no shipped layer's evidence passes the rule, issue 61) answers each
    right through full and through ARR."""
    from PIL import Image

    from arr_coc.checkpoints import PRIOR

    model, label = served
    assert label == PRIOR and model.layer.config.saccade_order == "raster"
    assets = Path(__file__).resolve().parents[2] / "assets"
    examples = [e for e in json.loads((assets / "examples.json").read_text()) if e["image"].startswith("pocket_")]
    assert len(examples) == 3
    for example in examples:
        image, expected = Image.open(assets / example["image"]), example["note"].split("Expected answer: ")[1][:-1]
        for pipeline in ("full", "arr"):
            assert model.answer(image, example["question"], pipeline, max_new_tokens=8).text.strip() == expected


def test_arr_reads_fine_print_best_with_its_saccades_in_reading_order(served):
    """The same 273 saccades of the pocket model's default layer (the prior since issue 61), fed row by row or most
    relevant first, on 12 held-out pages at 896 px: reading order reads at least as many (measured with
    pocket-fineprint, step 65329: 11 and 9; step 58266, trained before the layout families: 6 and 1, when the model
    read a key and its digits in reading order only)."""
    from arr_coc.pocket.heldout import heldout

    model, _ = served
    read = {"raster": 0, "relevance-order": 0}
    for image, question, answer in heldout("fine_print", 896, 12):
        for order in read:
            read[order] += model.answer(image, question, "arr", max_new_tokens=8, ablation=order).text.strip() == answer
    assert read["raster"] >= 9 and read["relevance-order"] <= read["raster"], read


def test_training_runs_saves_and_resumes(tmp_path):
    """Two steps, then a resume to the third: the state counts on, the weights move, held-out accuracy is logged."""
    cfg = PocketTrainConfig(out=str(tmp_path), steps=2, minutes=5, image_tokens=64, workers=0, eval_every=1000,
                      eval_pages=1, eval_sizes=(224,), device="cpu", warmup=1)
    first = train(cfg, resume=False)  # a fresh model
    before = {k: v.clone() for k, v in _weights(tmp_path).items()}
    second = train(PocketTrainConfig(**{**cfg.__dict__, "steps": 3, "eval_layouts": True}), resume=True)
    assert (first["step"], second["step"]) == (2, 3) and len(second["runs"]) == len(first["runs"]) + 1
    after = _weights(tmp_path)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert set(second["heldout"][-1]["accuracy"]["224"]["full"]) == set(FORMATS)
    assert "layouts" not in first["heldout"][-1]  # --eval-layouts: the unseen layouts scored too
    assert set(second["heldout"][-1]["layouts"]["224"]["gestalt"]) == set(FORMATS)
    assert json.loads((tmp_path / "state.json").read_text())["step"] == 3
    assert second["gpu_seconds"] == 0.0 and second["runs"][-1]["device"] == "cpu"  # a CPU run counts no GPU time


def test_a_profiled_run_prints_where_its_steps_time_went(tmp_path, capsys):
    """--profile N --profile-after A: after A steps (and two to warm up), N steps under torch.profiler, its table
    printed; a run that ends before them, or one without --profile, profiles nothing."""
    cfg = PocketTrainConfig(out=str(tmp_path / "a"), steps=5, minutes=5, image_tokens=64, workers=0, eval_every=1000,
                      eval_pages=1, eval_sizes=(112,), device="cpu", warmup=1, profile=2, profile_after=1)
    train(cfg, resume=False)  # steps 0-4: one waits, two warm up, two are profiled
    out = capsys.readouterr().out
    assert "profile of 2 steps (rank 0):" in out and "Self CPU" in out and "aten::" in out
    for name, change in (("b", dict(profile=0)), ("c", dict(profile_after=5))):  # none; all five steps wait
        train(PocketTrainConfig(**{**cfg.__dict__, "out": str(tmp_path / name), **change}), resume=False)
        assert "profile of" not in capsys.readouterr().out, name


def test_a_run_cut_off_in_its_held_out_check_keeps_its_steps(tmp_path, monkeypatch):
    """The state is saved before the held-out check (which can take minutes at 1792 px): a run killed there (a
    device call's time limit, say) resumes at its last step, not at its start."""
    from arr_coc.pocket import trainer as pocket

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pocket, "_evaluate", killed)
    cfg = PocketTrainConfig(out=str(tmp_path), steps=2, minutes=5, image_tokens=64, workers=0, eval_every=1000,
                      eval_pages=1, eval_sizes=(224,), device="cpu", warmup=1)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, resume=False)
    assert json.loads((tmp_path / "state.json").read_text())["step"] == 2


def test_the_curriculum_moves_on_only_when_the_stage_is_read(tmp_path, monkeypatch):
    """A stage check below PASS_MARK keeps the stage; one at it moves on, and the next batches are the next stage's."""
    from arr_coc.pocket import data, trainer as pocket

    stage0_checks = []  # exact_match on 168 px pages: the first check (3 kinds) fails, only the second passes

    def fake_exact_match(model, tokenizer, processor, items, device, batch=8, process=None):
        if items[0][0].width != 168:
            return 0.0
        stage0_checks.append(1)
        check = (len(stage0_checks) - 1) // len(pocket.PAGE_KINDS)  # 0, 1, 2 ...: which stage check this is
        return pocket.PASS_MARK if check == 1 else 0.5

    monkeypatch.setattr(pocket, "exact_match", fake_exact_match)
    drawn = []
    real_batch_pages = data.batch_pages
    monkeypatch.setattr(data, "batch_pages", lambda *a, **k: drawn.append(a[2]) or real_batch_pages(*a, **k))
    cfg = PocketTrainConfig(out=str(tmp_path), steps=3, minutes=5, image_tokens=64, workers=0, eval_every=1,
                      eval_pages=1, eval_sizes=(224,), device="cpu", warmup=1)
    state = train(cfg, resume=False)
    assert [c["stage"] for c in state["stage_checks"]] == [0, 0, 1]
    assert state["stage"] == 1 and drawn[:3] == [0, 0, 1]  # the third batch is drawn at stage 1
    w, h = data.batch_pages(0, 0, 1, 4096)[0][0].size
    assert all(data.CURRICULUM[1].sides[0] <= side <= data.CURRICULUM[1].sides[1] for side in (w, h))


def test_a_review_share_of_batches_comes_from_earlier_stages(monkeypatch):
    """At stage 2 about REVIEW of the batches are drawn in an earlier stage's style (whole batches: one page size);
    at stage 0 there is nothing to review."""
    from arr_coc.pocket import data as pocket

    styles = []
    real_make_page = pocket.make_page
    monkeypatch.setattr(pocket, "make_page", lambda *a, **k: styles.append(a[4]) or real_make_page(*a, **k))
    stage_of = {id(stage.style): i for i, stage in enumerate(pocket.CURRICULUM)}

    def stages(stage, batches=60):
        drawn = []
        for index in range(batches):
            styles.clear()
            pocket.batch_pages(index, 0, stage, image_tokens=64, max_pages=2)
            drawn.append({stage_of[id(style)] for style in styles})
        assert all(len(one) == 1 for one in drawn)  # a batch is of one stage
        return [one.pop() for one in drawn]

    assert set(stages(0, 10)) == {0}
    at_two = stages(2)
    assert set(at_two) == {0, 1, 2} and 0.05 <= 1 - at_two.count(2) / len(at_two) <= 0.4


def _weights(folder):
    from safetensors.torch import load_file

    shards = sorted((folder / "weights").glob("model*.safetensors"))
    assert shards and all(f.stat().st_size < 16 * 2**20 for f in shards)  # each file comes back from the device tool
    return {k: v for f in shards for k, v in load_file(f).items()}


def test_exact_match_scores_every_chunk(stock):
    """Teacher-forced exact match over several chunks: a right answer scores, a wrong one does not."""
    from arr_coc.pocket.heldout import exact_match

    model, tokenizer, _ = stock
    page = make_page("shape_colour", 10**9 + 7, 224)
    question = page.questions[0].question
    greedy = _greedy(model, tokenizer, page.image, question)
    wrong = next(c for c in sorted(COLOURS) if c != greedy)
    items = [(page.image, question, greedy), (page.image, question, wrong), (page.image, question, greedy)]
    assert exact_match(model, tokenizer, image_processor(), items, torch.device("cpu"), batch=1) == pytest.approx(2 / 3)


def _greedy(model, tokenizer, image, question) -> str:
    from arr_coc.pocket.data import collate

    batch = collate(tokenizer, [image], [[(question, "")]])
    inputs = model_inputs(batch, image_processor(), model.config.image_token_id, "cpu")
    cut = inputs["input_ids"].shape[1] - 2  # drop the empty answer's "<|im_end|>\n": the prompt ends at "assistant\n"
    out = model.generate(input_ids=inputs["input_ids"][:, :cut], attention_mask=inputs["attention_mask"][:, :cut],
                         pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"],
                         mm_token_type_ids=inputs["mm_token_type_ids"][:, :cut], max_new_tokens=4, do_sample=False)
    return tokenizer.decode(out[0, cut:], skip_special_tokens=True)


def test_a_non_finite_step_is_skipped_and_the_weights_kept(stock):
    from arr_coc.pocket.binding import BindingHead, aligned_ids, binding_targets
    from arr_coc.pocket.trainer import PocketTrainConfig, Trainee, _train_step, make_optimizer
    from arr_coc.pocket.reading import ReadingHead, reading_targets

    model, tokenizer, _ = stock
    page = make_page("fine_print", 1, 224)
    batch = collate(tokenizer, [page.image], [[(page.questions[0].question, page.questions[0].answer)]],
                    [reading_targets(page.glyphs, 224, 224)], False, [binding_targets(page.marks, 224, 224)])
    inputs = model_inputs(batch, image_processor(), model.config.image_token_id, "cpu")
    inputs["pixel_values"][0, 0] = float("nan")  # as a bf16 overflow would
    before = {k: v.clone() for k, v in model.state_dict().items()}
    heads = ReadingHead(256), BindingHead(256)
    try:
        assert _train_step(Trainee(model.train(), *heads, aligned_ids(tokenizer)), make_optimizer(model, PocketTrainConfig(device="cpu"), *heads),
                           inputs, 1e-3, batch["reading"], batch["binding"]) is None
    finally:
        model.eval().zero_grad(set_to_none=True)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_cool_down_decays_the_rate_to_five_percent_over_the_runs_last_minutes():
    from arr_coc.pocket.trainer import lr_at

    cfg = PocketTrainConfig(lr=1e-3, warmup=10, cooldown=2.0)
    assert lr_at(100, 0, cfg, seconds_left=600) == pytest.approx(1e-3)  # before the cool-down
    assert lr_at(100, 0, cfg, seconds_left=60) == pytest.approx(5e-4)  # half way through its 2 minutes
    assert lr_at(100, 0, cfg, seconds_left=0) == pytest.approx(5e-5)  # the floor
    assert lr_at(4, 0, cfg, seconds_left=600) == pytest.approx(5e-4)  # warming up after a (re)start
    assert lr_at(100, 0, PocketTrainConfig(lr=1e-3, warmup=10, cooldown=0.0), seconds_left=0) == pytest.approx(1e-3)  # off


def test_reversed_questions_ask_each_target_the_other_way_round():
    from arr_coc.synth.fineprint import Mark, Page
    from arr_coc.pocket.data import reversed_questions

    marks = [Mark("box", (0, 0, 90, 60), colour="orange", border=4, text="lemon"),
             Mark("shape", (100, 0, 160, 60), colour="cyan", shape="diamond"),
             Mark("field", (0, 100, 90, 112), key="LIMIT", text="0420"),
             Mark("field", (0, 120, 90, 132), key="RATE", text="7777"),
             Mark("field", (0, 140, 90, 152), key="DATE", text="7777")]  # a value twice: no key to name
    page = Page(None, "box_word", [], [], marks)
    assert reversed_questions(page) == [("What colour is the box around lemon?", "orange"),
                                        ("Which shape is cyan?", "diamond"),
                                        ("Which key has the value 0420?", "LIMIT")]


def test_a_run_continues_from_the_exported_folder_named_by_init(tmp_path):
    import json
    import shutil

    from arr_coc.checkpoints import POCKET_FOLDER
    from arr_coc.pocket.train import main
    from arr_coc.pocket.trainer import load_or_init

    exported = tmp_path / "exported"
    shutil.copytree(POCKET_FOLDER, exported)
    state = json.loads((exported / "training_state.json").read_text())
    (exported / "training_state.json").write_text(json.dumps(state | {"step": 123456}))
    assert load_or_init(tmp_path / "run", True, "cpu", init=exported)[3]["step"] == 123456
    with pytest.raises(SystemExit):  # a folder that --export did not write: refused at parse time
        main(["--init", str(tmp_path), "--steps", "0"])


@pytest.mark.parametrize("flag, value", [("--minutes", "0"), ("--lr", "-1"), ("--eval-sizes", "896,x"),
                                         ("--workers", "-2"), ("--device", "tpu"), ("--steps", "ten"),
                                         ("--read-ink-weight", "0"), ("--llm-width", "320")])
def test_a_bad_flag_is_refused_in_one_line_before_anything_loads(flag, value, capsys):
    from arr_coc.pocket.train import main

    with pytest.raises(SystemExit) as exit_:
        main([flag, value])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and f"argument {flag}:" in err, err


def test_exporting_a_folder_that_holds_no_run_is_refused(tmp_path, capsys):
    """`--steps 0 --export` on a run folder with no state.json would train nothing from --init and export that:
    refused before any model loads, with the folder named."""
    from arr_coc.pocket.train import main

    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(tmp_path / "none"), "--steps", "0", "--export", str(tmp_path / "export")])
    assert exit_.value.code == 2 and "holds no run" in capsys.readouterr().err
    assert not (tmp_path / "export").exists() and not (tmp_path / "none").exists()


def test_pages_by_area_give_every_page_width_about_as_many_pages():
    """Stage 5's widths are 16-64 cells. Uniform, 17 of the 49 widths (0.347) are 48 cells or more; drawn by area,
    sum(c^2, 48..64) / sum(c^2, 16..64) = 53720 / 88200 = 0.609 of the steps are, and then each width's share of
    pages (a batch holds image_tokens // its tokens) is about even."""
    import random

    from arr_coc.pocket.data import CURRICULUM, page_size

    sides = CURRICULUM[5].sides
    for by_area, expected in ((False, 0.347), (True, 0.609)):
        rng = random.Random(0)
        widths = [page_size(rng, sides, by_area)[0] // 28 for _ in range(4000)]
        assert sum(w >= 48 for w in widths) / len(widths) == pytest.approx(expected, abs=0.03)
    pages = {}
    for w in widths:  # by area: pages a width, in proportion to 1 / its area
        pages[w >= 40] = pages.get(w >= 40, 0) + 1 / w**2
    assert pages[True] / (pages[True] + pages[False]) == pytest.approx(25 / 49, abs=0.05)  # as widths 40-64 of 16-64
