"""
Tests for arr_coc/eval/data.py: synthetic scenes (determinism, boxes that really cover the asked content)
and the JSONL dataset format (round trip, clear errors).

Run:
    python -m pytest tests/eval/test_data.py -q
"""

import json

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from arr_coc.eval.data import (
    DISTRACTOR_COLOURS,
    SCENE_KINDS,
    STYLE,
    Sample,
    load_jsonl,
    main,
    make_dataset,
    make_scene,
    save_jsonl,
)
from arr_coc.errors import InputError

SIZE = 224  # small images keep the suite fast


def pixels(sample_or_image) -> np.ndarray:
    image = getattr(sample_or_image, "image", sample_or_image)
    return np.asarray(image, dtype=np.int16)


def saturated(arr: np.ndarray) -> np.ndarray:
    """Mask of strongly coloured pixels (max - min channel > 100)."""
    return (arr.max(-1) - arr.min(-1)) > 100


def box_mask(box, size) -> np.ndarray:
    mask = np.zeros((size, size), bool)
    x0, y0, x1, y1 = box
    mask[y0:y1, x0:x1] = True
    return mask


def render_like(text, px, fg, bg, box):
    """Render `text` the way the generator does, with its ink box at the origin of a box-sized canvas."""
    w, h = box[2] - box[0], box[3] - box[1]
    canvas = Image.new("RGB", (w, h), bg)
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default(size=px)
    l, t, _, _ = draw.textbbox((0, 0), text, font=font)
    draw.text((-l, -t), text, font=font, fill=fg)
    return pixels(canvas)


# -----------------------------------------------------------------------------
# scenes


@pytest.mark.parametrize("kind", SCENE_KINDS)
def test_scene_is_deterministic_rgb_and_box_inside(kind):
    a, b = make_scene(kind, 7, SIZE), make_scene(kind, 7, SIZE)
    assert isinstance(a, Sample) and a.kind == kind
    assert a.image.mode == "RGB" and a.image.size == (SIZE, SIZE)
    assert np.array_equal(pixels(a), pixels(b))
    assert (a.question, a.answer, a.box) == (b.question, b.answer, b.box)
    assert a.question.endswith("?") and a.answer
    if a.box is not None:
        x0, y0, x1, y1 = a.box
        assert all(isinstance(v, int) for v in a.box)
        assert 0 <= x0 < x1 <= SIZE and 0 <= y0 < y1 <= SIZE


@pytest.mark.parametrize("kind", SCENE_KINDS)
def test_different_seeds_differ(kind):
    scenes = [make_scene(kind, seed, SIZE) for seed in range(4)]
    for i in range(len(scenes)):
        for j in range(i + 1, len(scenes)):
            assert not np.array_equal(pixels(scenes[i]), pixels(scenes[j]))
    if kind != "noise":
        assert len({(s.answer, s.box) for s in scenes}) == len(scenes)


def test_unknown_kind_and_tiny_size_raise():
    with pytest.raises(ValueError, match="unknown scene kind"):
        make_scene("cats", 0, SIZE)
    with pytest.raises(ValueError, match="at least 64"):
        make_scene("noise", 0, 16)


@pytest.mark.parametrize("seed", range(12))
def test_text_vs_distractor_box_covers_faint_text_and_bright_shape_is_elsewhere(seed):
    text = make_scene("text_vs_distractor", seed, SIZE)
    shape = make_scene("distractor_query", seed, SIZE)
    # the two kinds with one seed are one image with two questions
    assert np.array_equal(pixels(text), pixels(shape))
    assert text.box != shape.box and text.answer != shape.answer

    arr, bg = pixels(text), STYLE.background_gray
    in_text, in_shape = box_mask(text.box, SIZE), box_mask(shape.box, SIZE)
    assert not (in_text & in_shape).any(), "text and distractor overlap"

    # the text is drawn inside its box, gray and low-contrast
    diff = np.abs(arr - bg).max(-1)
    assert diff[in_text].mean() > 1.0
    gray = (arr[..., 0] == arr[..., 1]) & (arr[..., 1] == arr[..., 2])
    assert gray[in_text].all()
    assert diff[in_text].max() <= bg - STYLE.text_gray  # never darker than the text gray: low contrast
    # and the box holds exactly the answer, rendered the generator's way
    px = max(STYLE.min_font_px, round(STYLE.text_font * SIZE))
    x0, y0, x1, y1 = text.box
    expected = render_like(text.answer, px, (STYLE.text_gray,) * 3, (bg,) * 3, text.box)
    assert np.array_equal(arr[y0:y1, x0:x1], expected)

    # the distractor is bright and saturated, in its own box, of the colour the answer names
    sat = saturated(arr)
    assert sat.sum() > 0.5 * in_shape.sum()
    assert not (sat & in_text).any()
    assert not (sat & ~in_shape).any()
    mean_colour = arr[sat].mean(0)
    assert np.abs(mean_colour - DISTRACTOR_COLOURS[shape.answer]).max() < 2
    assert arr[sat].max(-1).min() >= 200  # bright: some channel near full scale

    # everything else is the flat background
    assert (diff[~in_text & ~in_shape] == 0).all()


def test_text_scene_at_full_size_has_readable_text():
    sample = make_scene("text_vs_distractor", 1, 896)
    x0, y0, x1, y1 = sample.box
    assert y1 - y0 >= 15  # about 28 px glyphs: a 28 px ARR cell holds one line
    assert len(sample.answer.split()) >= 1 and x1 - x0 > 40


def test_noise_is_a_semantic_void():
    sample = make_scene("noise", 3, SIZE)
    arr = pixels(sample)
    assert sample.box is None and sample.answer == "noise"
    assert arr.std() > 60  # uniform on 0..255 has std ~74
    assert abs(arr.mean() - 127.5) < 3
    # no structure: neighbouring pixels are uncorrelated
    a, b = arr[:, :-1].ravel().astype(float), arr[:, 1:].ravel().astype(float)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.05


@pytest.mark.parametrize("seed", range(3))
def test_chart_box_is_the_asked_bar_and_its_height_matches_the_answer(seed):
    sample = make_scene("chart", seed, SIZE)
    arr = pixels(sample)
    value = int(sample.answer)
    assert 5 <= value <= 95 and sample.question.startswith("What is the value of the ")
    x0, y0, x1, y1 = sample.box
    cx = (x0 + x1) // 2
    colour = arr[y1 - 3, cx]
    assert (colour.max() - colour.min()) > 20 or colour.max() < 200, "bar body is not a colour"
    # the bar's filled column, inside the box, has the height the value implies
    column = np.abs(arr[y0:y1, cx] - colour).max(-1) <= 2
    bar_px = column.sum()
    px_per_unit = 0.8 * SIZE / 110  # axes span 80% of the height (subplots_adjust) for y in 0..110
    assert abs(bar_px - value * px_per_unit) <= 2.5
    # the value label sits in the box above the bar: some dark pixels there
    assert (arr[y0:y1 - bar_px, x0:x1].max(-1) < 100).any()
    # the bar's colour is not spread over the whole chart
    elsewhere = np.abs(arr - colour).max(-1) <= 2
    elsewhere[y0:y1, x0:x1] = False
    assert elsewhere.sum() < 0.1 * column.sum() * (x1 - x0)


@pytest.mark.parametrize("seed", range(3))
def test_document_box_holds_the_invoice_total_line(seed):
    sample = make_scene("document", seed, SIZE)
    arr = pixels(sample)
    assert sample.answer.isdigit() and len(sample.answer) == 4
    x0, y0, x1, y1 = sample.box
    px = max(STYLE.min_font_px, round(STYLE.doc_font * SIZE))
    assert y1 - y0 <= 2 * px < x1 - x0  # one line
    expected = render_like(f"Invoice total: {sample.answer}", px, (0, 0, 0), (255, 255, 255), sample.box)
    assert np.array_equal(arr[y0:y1, x0:x1], expected)
    # a dense page: many rows carry ink, and the page is mostly white
    ink_rows = (arr.min(-1) < 128).any(1).sum()
    assert ink_rows > 0.3 * SIZE
    assert arr.mean() > 200


def test_full_size_document_is_dense():
    sample = make_scene("document", 0, 896)
    ink = pixels(sample).min(-1) < 128
    rows = ink.any(1)
    line_starts = np.flatnonzero(rows[1:] & ~rows[:-1])
    assert len(line_starts) >= 25


# -----------------------------------------------------------------------------
# datasets and JSONL


def test_make_dataset_cycles_kinds_pairs_images_and_is_seeded():
    data = make_dataset(6, seed=5, size=128)
    assert [s.kind for s in data] == ["text_vs_distractor", "distractor_query"] * 3
    for a, b in zip(data[0::2], data[1::2]):
        assert np.array_equal(pixels(a), pixels(b)) and a.box != b.box
    again = make_dataset(6, seed=5, size=128)
    assert all(np.array_equal(pixels(a), pixels(b)) and a.answer == b.answer for a, b in zip(data, again))
    other = make_dataset(6, seed=6, size=128)
    assert not any(np.array_equal(pixels(a), pixels(b)) for a, b in zip(data, other))
    mixed = make_dataset(3, kinds=("noise", "document", "chart"), size=96)
    assert [s.kind for s in mixed] == ["noise", "document", "chart"]
    with pytest.raises(ValueError, match="unknown scene kind"):
        make_dataset(2, kinds=("text_vs_distractor", "nope"))


def test_jsonl_round_trip(tmp_path):
    samples = make_dataset(5, kinds=SCENE_KINDS, seed=1, size=96)
    path = save_jsonl(samples, tmp_path / "ds")
    assert path == tmp_path / "ds" / "data.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 5 and records[2]["box"] is None
    assert all(r["image"].startswith("images/") and (path.parent / r["image"]).is_file() for r in records)

    for loaded in (load_jsonl(path), load_jsonl(path.parent)):
        assert len(loaded) == len(samples)
        for a, b in zip(samples, loaded):
            assert (a.question, a.answer, a.box, a.kind) == (b.question, b.answer, b.box, b.kind)
            assert b.image.mode == "RGB" and np.array_equal(pixels(a), pixels(b))


def test_a_family_pages_row_records_its_family_and_every_row_its_ink_cells(tmp_path):
    """Rows name a layout family's page (and load it back); every row counts its inked 28 px cells."""
    from arr_coc.eval.data import main

    path = main(["--out", str(tmp_path / "fam"), "--n", "2", "--kinds", "box_word", "--families", "box_grid",
                 "--size", "448"])
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["family"] for r in records] == ["box_grid", "box_grid"]
    assert all(r["ink_cells"] > 0.3 * 240 for r in records)  # a dense family: > 30% of its ~240 cells inked
    assert [s.family for s in load_jsonl(path)] == ["box_grid", "box_grid"]
    blank = save_jsonl([Sample(Image.new("RGB", (56, 56), (255, 255, 255)), "q", "a", None, "noise")], tmp_path / "b")
    assert json.loads(blank.read_text())["ink_cells"] == 0 and "family" not in json.loads(blank.read_text())


def write_dataset(tmp_path, lines):
    Image.new("RGB", (32, 32), (9, 9, 9)).save(tmp_path / "ok.png")
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = json.dumps({"image": "ok.png", "question": "q?", "answer": "a", "box": [1, 2, 10, 12], "kind": "x"})


@pytest.mark.parametrize("bad, message", [
    ('{"image": "ok.png", "question": "q?"', "invalid JSON"),
    ('[1, 2, 3]', "expected a JSON object"),
    ('{"image": "ok.png", "question": "q?"}', "'answer'"),
    ('{"image": "ok.png", "question": "q?", "answer": "a", "box": [1, 2, 3]}', "'box'"),
    ('{"image": "ok.png", "question": "q?", "answer": "a", "box": [5, 2, 3, 9]}', "x0 < x1"),
    ('{"image": "ok.png", "question": "q?", "answer": "a", "box": [0, 0, 40, 9]}', "outside the 32x32"),
    ('{"image": "missing.png", "question": "q?", "answer": "a"}', "image file not found: .*missing.png"),
])
def test_malformed_jsonl_names_file_and_line(tmp_path, bad, message):
    path = write_dataset(tmp_path, [GOOD, "", bad])
    with pytest.raises(ValueError, match=rf"data\.jsonl:3: .*{message}"):
        load_jsonl(path)


@pytest.mark.parametrize("question, message", [
    ("", "the question is empty: type a question about the image"),
    (" \t ", "the question is empty: type a question about the image"),
    ("x" * 4001, "the question is 4001 characters long; the limit is 4000"),
])
def test_a_question_the_pipelines_refuse_is_refused_at_load_naming_file_and_line(tmp_path, question, message):
    """The pipelines' own check (request.check_question), at load: not at its item in the middle of a run, where a
    resumed run would meet it again."""
    bad = json.dumps({"image": "ok.png", "question": question, "answer": "a"})
    path = write_dataset(tmp_path, [GOOD, "", bad])
    with pytest.raises(InputError) as refused:
        load_jsonl(path)
    assert str(refused.value) == f"{path}:3: {message}"
    assert load_jsonl(write_dataset(tmp_path, [GOOD.replace('"q?"', json.dumps("x" * 4000))]))[0].where == f"{path}:1"


def test_minimal_records_and_blank_lines_load(tmp_path):
    path = write_dataset(tmp_path, [GOOD, "", '{"image": "ok.png", "question": "q?", "answer": "a"}'])
    first, second = load_jsonl(path)
    assert first.box == (1, 2, 10, 12) and first.kind == "x"
    assert second.box is None and second.kind == "unknown"
    with pytest.raises(InputError, match="no such dataset file"):
        load_jsonl(tmp_path / "nope.jsonl")


def test_loader_applies_the_exif_orientation(tmp_path):
    """As the app and `run` do (one open_image): a 300x200 JPEG with orientation 6 loads upright, 200x300."""
    (tmp_path / "images").mkdir()
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 to view
    Image.new("RGB", (300, 200), (30, 30, 200)).save(tmp_path / "images" / "photo.jpg", exif=exif)
    record = {"image": "images/photo.jpg", "question": "q", "answer": "a", "box": [0, 0, 200, 300]}
    (tmp_path / "data.jsonl").write_text(json.dumps(record) + "\n")
    (sample,) = load_jsonl(tmp_path)
    assert sample.image.size == (200, 300) and sample.box == (0, 0, 200, 300)  # the box is checked upright


def test_open_image_refuses_too_many_pixels_from_the_header_before_decoding(tmp_path, monkeypatch):
    """max_pixels is checked on the header: a sideways photo over it is neither decoded nor turned (the app's
    64-megapixel check came after gradio had decoded and turned a 13000x13000 JPEG, 0.5 GB a request)."""
    from PIL import ImageFile, ImageOps

    from arr_coc.vlm.images import open_image

    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 to view
    Image.new("L", (300, 200), 128).save(tmp_path / "sideways.jpg", exif=exif)
    decoded = []
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self, load=ImageFile.ImageFile.load: decoded.append(
        "load") or load(self))
    monkeypatch.setattr(ImageOps, "exif_transpose", lambda image, turn=ImageOps.exif_transpose, **kw: decoded.append(
        "turn") or turn(image, **kw))
    with pytest.raises(Image.DecompressionBombError, match=r"^300x200 pixels$"):
        open_image(tmp_path / "sideways.jpg", max_pixels=300 * 200 - 1)
    assert decoded == []
    assert open_image(tmp_path / "sideways.jpg", max_pixels=300 * 200).size == (200, 300) and decoded


@pytest.mark.parametrize("max_pixels", [None, 64_000_000])
def test_open_image_refuses_past_pils_own_limit_in_its_own_words(tmp_path, max_pixels):
    """A 400-megapixel header, which PIL refuses itself (over twice Image.MAX_IMAGE_PIXELS, 89478485) with its
    "could be decompression bomb DOS attack" text: the same error in the words of our own limit's."""
    from conftest import giant_png

    from arr_coc.vlm.images import open_image

    with pytest.raises(Image.DecompressionBombError, match=r"^over 178 megapixels$"):
        open_image(giant_png(tmp_path / "giant.png"), max_pixels)


@pytest.mark.parametrize("before_pixels", [True, False])
def test_open_image_says_a_png_text_bomb_is_one_in_an_oserror(tmp_path, before_pixels):
    """A zTXt chunk inflating to 64 MB, read at open (before IDAT) or at decode (after): an OSError saying what it
    is, which `run` and the app report in one line, never PIL's bare ValueError (a traceback in `run`)."""
    from conftest import text_bomb_png

    from arr_coc.vlm.images import open_image

    text_bomb_png(tmp_path / "bomb.png", 64 << 20, before_pixels)
    with pytest.raises(OSError, match=r"^a compressed metadata chunk inflates past the 1 MB PIL reads: a "
                                      r"decompression bomb$"):
        open_image(tmp_path / "bomb.png")


def test_cli_writes_a_loadable_dataset(tmp_path, capsys):
    out = tmp_path / "cli"
    main(["--out", str(out), "--n", "4", "--kinds", "noise,document", "--seed", "2", "--size", "96"])
    assert "wrote 4 samples" in capsys.readouterr().out
    loaded = load_jsonl(out / "data.jsonl")
    assert [s.kind for s in loaded] == ["noise", "document"] * 2
    assert np.array_equal(pixels(loaded[1]), pixels(make_scene("document", 2 * 1_000_003, 96)))
    with pytest.raises(SystemExit) as exit:
        main(["--out", str(out), "--kinds", "bogus"])
    assert exit.value.code == 2


def test_the_cli_refuses_an_existing_dataset_unless_overwrite_and_then_leaves_the_new_set_alone(tmp_path, capsys):
    """Onto a folder that holds files, refused in one line (exit 2) and nothing touched, as train refuses its --out
    (flags.check_fresh_folder); with --overwrite the folder holds the new set alone: the old set's extra images go."""
    out = tmp_path / "set"
    main(["--out", str(out), "--n", "6", "--kinds", "noise", "--size", "64"])
    before = {p.name: p.read_bytes() for p in (out / "images").iterdir()} | {"data.jsonl": (out / "data.jsonl").read_bytes()}
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit:
        main(["--out", str(out), "--n", "2", "--kinds", "document", "--size", "64"])
    assert exit.value.code == 2
    error = capsys.readouterr().err.splitlines()  # the command's name as pytest started it, then the reason
    assert len(error) == 1 and error[0].split(": error: ")[1].split(" (see ")[0] == (
        f"argument --out: {out} already exists and is not empty; pass --overwrite to write into it, or choose another "
        "folder")
    assert {p.name: p.read_bytes() for p in (out / "images").iterdir()} | {
        "data.jsonl": (out / "data.jsonl").read_bytes()} == before
    (out / "images" / "mine.png").write_bytes(b"not the dataset's")  # a file save_jsonl never names: kept
    main(["--out", str(out), "--n", "2", "--kinds", "document", "--size", "64", "--overwrite"])
    assert sorted(p.name for p in (out / "images").iterdir()) == ["000000_document.png", "000001_document.png", "mine.png"]
    assert [s.kind for s in load_jsonl(out)] == ["document", "document"]


# -----------------------------------------------------------------------------
# assets/examples.json (the app's examples) stays consistent with the files


def test_assets_examples_are_valid():
    from pathlib import Path

    assets = Path(__file__).resolve().parents[2] / "assets"
    examples = json.loads((assets / "examples.json").read_text())
    assert len({e["image"] for e in examples}) >= 8
    for e in examples:
        assert set(e) == {"image", "question", "box", "note"}
        assert e["question"].endswith("?") and e["note"]
        path = assets / e["image"]
        assert path.is_file() and path.stat().st_size <= 400_000, e["image"]
        with Image.open(path) as im:
            assert im.mode == "RGB"
            w, h = im.size
        if e["box"] is not None:
            x0, y0, x1, y1 = e["box"]
            assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h, e["image"]
    assert sum(p.stat().st_size for p in assets.iterdir()) < 3_000_000
