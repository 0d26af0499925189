"""Shared fixtures and helpers: the offline tiny ARRCOCQwen, one fixture over every family's tiny model, the stock
model's inputs and logits, both engines' answers, the relevance tests' maps and layer runs, local parquet copies of
the hub sets, the side venvs' command runner and install lock, and `python app.py --model tiny` served once per
session. Test modules import these as `from conftest import ...` (pytest puts this folder first on sys.path), never
from one another through `tests.`: an installed top-level `tests` package would shadow it (tests/test_collection.py)."""

import fcntl
import hashlib
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
STARTUP_S = 180
if importlib.util.find_spec("gradio") is None:  # the GPU machines have no gradio: `pytest -m gpu tests/` runs there
    # the modules that import it (tests/app/ all of them): none holds a `gpu` test
    collect_ignore = ["test_app.py", "test_request_path.py", "eval/test_metrics.py"]
    collect_ignore_glob = ["app/*"]
# Dynamo compiles the decode step's code once per model it meets (family, dtype, fused or not) and, past its
# recompile limit (8), gives up: on a GPU the suite loads ~12 models in one process (the app loads one), and the
# later ones would be captured uncompiled, with a warning, instead of testing the compiled step.
torch._dynamo.config.recompile_limit = 64


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


FAMILIES = ("tiny", "tiny-qwen2.5-vl", "tiny-qwen3-vl")  # one tiny model per family: Qwen2-VL, Qwen2.5-VL, Qwen3-VL
_LOADED = {}  # the session's models by name: each family's tiny model is loaded once


def tiny_arr_model(name: str):
    """ARRCOCQwen on a tiny model, fp32, on the GPU when there is one (loaded once per session)."""
    from arr_coc.model import ARRCOCQwen

    if name not in _LOADED:
        _LOADED[name] = ARRCOCQwen.from_pretrained(name, dtype=torch.float32)
    return _LOADED[name]


@pytest.fixture(scope="session")
def arr_model():
    """ARRCOCQwen on the tiny Qwen2-VL, fp32 CPU (or the GPU when there is one)."""
    return tiny_arr_model("tiny")


@pytest.fixture(params=FAMILIES)
def family(request):
    """ARRCOCQwen on each family's tiny model in turn: a test written once runs on Qwen2-VL, Qwen2.5-VL and Qwen3-VL."""
    return tiny_arr_model(request.param)


@pytest.fixture
def tiny_loaded_once(arr_model, monkeypatch):
    """
    The commands' loads of "tiny" on arr_model's device (cli.load_vlm) served by the session's arr_model, so a
    command's test skips the load; the command still sets the layer its flags ask for, and arr_model's own
    layer is put back after. Other models load as ever.
    """
    from arr_coc.commands import cli

    load, layer = cli.load_vlm, arr_model.layer

    def load_once(name: str, device: str, fallback: str | None = None):
        return arr_model if (name, device) == ("tiny", str(arr_model.vlm.device)) else load(name, device, fallback)

    monkeypatch.setattr(cli, "load_vlm", load_once)
    yield arr_model
    arr_model.layer = layer


def overflowing_fp16_model(device: str):
    """
    The tiny model in fp16, edited so that its residual stream overflows at every text token in layer 0:
    embeddings of magnitude 4e4, plus an attention output of exactly 3e4 (values all 1, o_proj constant).
    Its tied LM head makes fp16 logits overflow as well.
    """
    from arr_coc.model import ARRCOCQwen

    model = ARRCOCQwen.from_pretrained("tiny", device=device, dtype=torch.float16)
    lm = model.vlm.language_model
    with torch.no_grad():
        lm.embed_tokens.weight.copy_(torch.sign(torch.randn_like(lm.embed_tokens.weight.float())) * 4e4)
        attn = lm.layers[0].self_attn
        attn.v_proj.weight.zero_()
        attn.v_proj.bias.fill_(1.0)
        attn.o_proj.weight.fill_(3e4 / attn.o_proj.in_features)
    return model


QUESTION = "What does the gray text say?"  # the scenes' question in the model and pipeline tests


def scene_image(w=448, h=448):
    """A gray scene with a noisy lower-left quadrant: something to look at, the same every time."""
    rng = np.random.default_rng(0)
    a = np.full((h, w, 3), 128, np.uint8)
    a[h // 2:, : w // 2] = rng.integers(0, 255, (h - h // 2, w // 2, 3))
    return Image.fromarray(a)


def stock_inputs(vlm, view, question: str = "What is here?"):
    """The stock model's inputs for one view and a question: prompt ids, pixel patches, grid_thw, mm_token_type_ids."""
    s = vlm.stock_inputs(question, view)
    return s.input_ids, s.pixel_values, s.image_grid_thw, s.mm_token_type_ids


def gestalt_logits(vlm, views, question: str = "What is here?"):
    """Logits of the stock forward (pixels in) and of ours (the gestalt encoded by the adapter, its prompt, the
    Decoder's training forward, DeepStack included) over the same prompt of one gestalt view: with zero
    saccades ARR must reproduce the stock model."""
    ids, pixels, grid, mm = stock_inputs(vlm, views.gestalt, question)
    with torch.no_grad():
        stock = vlm.model(input_ids=ids, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=mm).logits
        prompt = vlm.prompt(question, [vlm.encode_view(views.gestalt)])
        assert torch.equal(prompt.ids, ids)
        ours = vlm.decoder.forward(prompt.embeds, prompt.position_ids, prompt.deepstack)
    return stock, ours


def answers_by_engine(model, image, question: str, pipeline: str, max_new_tokens: int = 8) -> dict:
    """{"hf": stock generate()'s Answer, "fast": the fast engine's} to one request; the model is left on "fast"."""
    answers = {}
    try:
        for engine in ("hf", "fast"):
            model.vlm.engine = engine
            answers[engine] = model.answer(image, question, pipeline, max_new_tokens=max_new_tokens)
    finally:
        model.vlm.engine = "fast"
    return answers


@pytest.fixture
def upload_folder(tmp_path, monkeypatch) -> Path:
    """gradio's cache folder moved to tmp_path ($GRADIO_TEMP_DIR): a file written there is one the app's uploads may
    read (arr_coc.app.ui.cached_file), as gradio's own uploads are."""
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    return tmp_path


D = 64  # the hidden size of the relevance tests' layers (tests/relevance: test_layer, test_tensions)


def peaked_map(gh=32, gw=32, centre=(16, 16), seed=0):
    """[1, gh, gw] a relevance map with one smooth bump at `centre`, a little noise beside it (seeded)."""
    torch.manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    bump = torch.exp(-((yy - centre[0]) ** 2 + (xx - centre[1]) ** 2).float() / 50)
    return (bump + 0.01 * torch.rand(gh, gw)).unsqueeze(0)


def structured_images(n=2):
    """[n, 3, 448, 448]: faint noise with two bright blocks (pure noise is a busy image: it falls back to grid)."""
    images = 0.05 * torch.rand(n, 3, 448, 448)
    images[:, :, 60:160, 80:260] = 1.0
    images[:, 0, 300:380, 250:400] = 0.8
    return images


def select_saccades(layer, seed=0, budget=None, strategy=None, settings=None, n=2, **kw):
    """A layer's ARRCOCOutput on n structured_images (their texture channels on a 32 x 32 grid) with random question
    and gestalt embeddings of size D, seeded; kw go to the layer's forward."""
    from arr_coc.relevance.texture import generate_texture_array

    torch.manual_seed(seed)
    textures = generate_texture_array(structured_images(n), (32, 32))  # [n, 13, 32, 32]
    maps = layer(textures, torch.randn(n, 5, D), gestalt_embeds=torch.randn(n, 16, D), **kw)
    return layer.select(maps, (32, 32), budget, strategy, settings)


def run_checked(command: list, cwd: Path, timeout: int, **env: str) -> subprocess.CompletedProcess:
    """A command that must succeed (the side venvs' installs and runs); its output shown when it does not."""
    done = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})
    assert done.returncode == 0, \
        f"{command[:4]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


@contextmanager
def one_install_at_a_time():
    """A lock on this work tree's side venvs (.venv-lmms, .venv-vllm): two test runs in one tree (or two people)
    never install into them at once."""
    name = f"arr-coc-side-venvs-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:16]}.lock"
    with open(Path(tempfile.gettempdir()) / name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_app(log: Path, *args: str, env: dict[str, str] | None = None):
    """Run `python app.py --model tiny` on a free port until the context exits (SIGTERM, as a service manager
    stops it); yields its URL. `env`: more environment variables (GRADIO_TEMP_DIR, say)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", **(env or {})}
    with open(log, "w") as out:  # a file, not a pipe: a pipe nobody reads would fill up and stall the app
        app = subprocess.Popen([sys.executable, "app.py", "--model", "tiny", "--port", str(port), *args],
                               cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + STARTUP_S
        while url not in log.read_text():
            if app.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the app did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        app.terminate()
        app.wait(30)


@pytest.fixture(scope="session")
def app_server(tmp_path_factory) -> tuple[str, Path]:
    """One app server for the API and browser tests: its URL and its console log."""
    log = tmp_path_factory.mktemp("app") / "app.log"
    with serve_app(log) as url:
        yield url, log


@pytest.fixture(scope="session")
def app_url(app_server) -> str:
    return app_server[0]


@pytest.fixture(scope="session")
def app_log(app_server) -> Path:
    return app_server[1]


# Rows of the hub sets' schemas (lmms-lab/DocVQA, lmms-lab/textvqa, HuggingFaceM4/ChartQA): column -> value of item i
SET_COLUMNS = {
    "docvqa": lambda i: dict(questionId=f"q{i}", question=f"What is the total of invoice {i}?", answers=[f"{i}00", f"${i}00"]),
    "textvqa": lambda i: dict(question_id=i, question="What does the sign say?", answers=["stop"] * 7 + ["halt"] * 3),
    "chartqa": lambda i: dict(query=f"What is the value of bar {i}?", label=[str(10 * i)], human_or_machine=0),
}


def write_parquet_set(folder: Path, schema: str, n: int, split: str = "validation", corrupt: tuple[int, ...] = (),
                      drop: str | None = None, size: tuple[int, int] = (120, 90)) -> Path:
    """A local copy of a hub set's schema: folder/data/<split>-00000-of-00001.parquet with n rows of small
    images (an Image feature: item i (width + 10 i) x height px, `size` = (width, height)); items in `corrupt` get
    bytes that are no image; `drop` leaves a column out."""
    import io

    import datasets
    from PIL import Image

    rows = []
    for i in range(n):
        buffer = io.BytesIO()
        Image.new("RGB", (size[0] + 10 * i, size[1]), (40 * i % 255, 120, 200)).save(buffer, format="PNG")
        image = {"bytes": b"not an image" if i in corrupt else buffer.getvalue(), "path": None}
        rows.append({**SET_COLUMNS[schema](i), "image": image})
    columns = {key: [row[key] for row in rows] for key in rows[0] if key != drop}
    features = datasets.Dataset.from_dict({k: v for k, v in columns.items() if k != "image"}).features
    if "image" in columns:
        features["image"] = datasets.Image()
    path = folder / "data" / f"{split}-00000-of-00001.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict(columns, features=features).to_parquet(path)
    return folder


def png_chunk(kind: bytes, body: bytes) -> bytes:
    """One PNG chunk: its length, type, body and CRC."""
    import struct
    import zlib

    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def giant_png(path: Path, width: int = 20000, height: int = 20000) -> Path:
    """A PNG whose header says width x height (grey, 8 bits) over an empty image stream: what a reader sees of a
    giant image before it decodes anything, in 57 bytes."""
    import struct

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", b"")
                     + png_chunk(b"IEND", b""))
    return path


def text_bomb_png(path: Path, inflated: int = 500 << 20, before_pixels: bool = True) -> Path:
    """A 32x32 PNG with a zTXt chunk (compressed text) that inflates to `inflated` bytes, before or after its
    pixels (IDAT): read at open or at decode."""
    import io
    import zlib

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (10, 20, 30)).save(buffer, format="PNG")
    png, deflate = buffer.getvalue(), zlib.compressobj(9)
    body = b"Comment\0\0" + b"".join(deflate.compress(bytes(1 << 20)) for _ in range(inflated >> 20)) + deflate.flush()
    chunk = png_chunk(b"zTXt", body)
    at = png.index(b"IDAT" if before_pixels else b"IEND") - 4  # a chunk starts with its length
    path.write_bytes(png[:at] + chunk + png[at:])
    return path


# ----------------------------------------------------------------------------- the real browser (tests/test_browser.py,
# tests/app/test_page.py)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
BROWSER = [pytest.mark.browser,  # a module's pytestmark: skipped without Debian's Chromium
           pytest.mark.skipif(not CHROMIUM.exists(), reason=f"needs {CHROMIUM} (apt-get install chromium)")]


@contextmanager
def chromium_page(url: str):
    """A 1400 x 1000 page of headless Chromium (Playwright) at `url`; closed after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        try:
            yield page
        finally:
            browser.close()
