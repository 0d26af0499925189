"""
The app's helpers that are not layout: choosing and uploading ARR checkpoints, the tables and sentences
the app shows, and turning exceptions into messages for the user. app.py wires these to components.

    name, notice = install_default_layer(model, requested=None, root=Path("checkpoints"))
    rows = stats_rows(answer)            # [[metric, value], ...] for a gr.Dataframe
"""

import base64
import functools
import inspect
import io
import json
import logging
import math
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import gradio as gr
from gradio.data_classes import FileData
from gradio.exceptions import ComponentProcessingError, InvalidPathError
from gradio.utils import get_upload_folder
import pydantic
from PIL import Image, UnidentifiedImageError

from arr_coc import checkpoints
from arr_coc.viz import rank_correlation, saccade_overlap
from arr_coc.checkpoints import CONFIG_FILE, PRIOR, WEIGHTS_FILE  # PRIOR: the choice that means the untrained layer
from arr_coc.errors import InputError, OutOfMemory, Stopped
from arr_coc.vlm.images import open_image
from arr_coc.eval.faithfulness import FaithfulnessCurves
from arr_coc.eval.metrics import answers_agree
from arr_coc.model import ARRCOCQwen, Answer
from arr_coc.relevance.layer import (ARRCOCLayer, ARRCOCOutput, CheckpointError,
                                     choose_checkpoint, list_checkpoints, read_checkpoint_config)
from arr_coc.relevance.config import AUTO, MAX_EXPLORE, NO_SETTINGS, TensionSettings
from arr_coc.relevance.texture import CHANNELS
from arr_coc.settings import MAX_IMAGE_PIXELS  # the commands' limit too
from arr_coc.vlm.views import PIPELINE, to_rgb

log = logging.getLogger("arr_coc.app")

POCKET_EXAMPLE = "pocket_"  # an example image named so is a fine-print page the offline pocket model answers
# what every file path a client names outside gradio's cache gets (arr_coc.app.ui.cached_file): the same line
# whatever is there, so the app is no oracle for the server's files
NOT_UPLOADED = "that file was not uploaded through this page: upload the image (or checkpoint) itself"
MAX_UPLOAD_MB = 50  # the server refuses a larger upload (HTTP 413); a 64-megapixel JPEG or an ARR checkpoint is less
STATS_HEADERS = ["metric", "value"]
# The page's look. gradio's default font is Source Sans Pro at 400 and 600, but the 600 file it ships (5 KB) holds a
# few glyphs only: a heading then mixed fonts ("A" in one, "RR-COC microscope" in the fallback). 400 and 700 are
# whole files; a browser shows 600 text (headings, bold) with the 700 face.
THEME = gr.themes.Default(font=[gr.themes.LocalFont("Source Sans Pro", weights=(400, 700)), "ui-sans-serif",
                                "system-ui", "sans-serif"])
CSS = """
.status-line > [data-testid="status-tracker"] { display: none !important; }  /* its Error pill hid the text */
#chat-turns * { overflow-wrap: normal !important; word-break: normal !important; hyphens: none !important; }
/* a failed event's red "Error" pill on each of its outputs (panels that merely wait for an image, say): the status
   line and the toast say what went wrong, in one line */
[data-testid="status-tracker"]:has(> .error) { display: none !important; }
/* the examples beside the image box: small thumbnails, whole labels, a box of the image box's height that scrolls */
.examples .table-wrap { max-height: 330px; overflow-y: auto; }
.examples td { text-align: left !important; max-width: none !important; padding: 4px 8px !important; }
.examples td.image img { width: 56px !important; height: 56px !important; object-fit: cover; }
.examples td.image .container { width: 56px !important; height: 56px !important; }
.examples-note p { margin: 0 !important; font-size: 0.9em; }
"""
# Enter in a slider's number box ends the edit as leaving the box does: the slider's release event (the
# Microscope's budget re-selects on it), where gradio's number box only listens for leaving
HEAD = """<script>
document.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && e.target.matches && e.target.matches('input[type="number"][data-testid="number-input"]')) {
    e.target.blur();
  }
}, true);
</script>"""
# every number's column with its unit (issue 67): ms, tokens, cells
TURN_HEADERS = ["turn (#)", "question", "baseline answer", "ARR-COC answer", "TTFT ms: base",
                "TTFT ms: ARR", "prefilled tokens: base", "prefilled tokens: ARR", "context tokens: base",
                "context tokens: ARR", "ARR cells: new / kept / dropped"]
# the table is the page's width and its words are never split (CSS): each column fits its header's longest word
TURN_WIDTHS = ["5%", "15%", "12%", "12%", "7%", "7%", "8%", "8%", "7%", "7%", "12%"]
# rank 1 = most relevant; row, col: the cell on the candidate grid; score: its relevance (the balanced map's own
# units); fed: its place among the saccades in the LLM's input
SACCADE_HEADERS = ["rank (#)", "row (cell)", "col (cell)", "score (relevance)", "fed (#)"]
FALLBACK_NOTES = {
    "semantic_void": "semantic void: the relevance map is flat, so the saccades fall back to an even grid (under "
                     "busy_pages: grid, a busy image, with no cells that stand out, counts as flat too)",
    "non_finite": "non-finite relevance: the map has NaN or inf values, so the saccades fall back to an even grid",
    "busy": "busy image: no cells stand out in its content (noise, a dense texture or a dense page), but the "
            "saccades are the relevance map's own (busy_pages: keep)",
}
USER_ERRORS = (InputError, CheckpointError, OutOfMemory, Stopped)  # their messages are written for the user
# the Microscope's tension sliders: name -> (label, lowest, highest, step, the prior it starts at)
TENSION_SLIDERS = {
    "explore": ("exploit↔explore: e, the budget's share on coverage", 0.0, MAX_EXPLORE, 0.05, 0.0),
    "diversify": ("focus↔diversify: λ, topk's spacing penalty (standard units)", 0.0, 8.0, 0.25, 0.0),
    "particularize": ("compress↔particularize: f, where the adaptive K falls in its bounds", 0.0, 1.0, 0.05, 0.5),
}


# ----------------------------------------------------------------------------- errors


def user_error(message: str) -> gr.Error:
    """An error the user caused or can fix: one line in the console, no traceback (it is no bug)."""
    log.warning("user error: %s", message)
    return gr.Error(message, print_exception=False)


def as_user_error(error: Exception) -> gr.Error:
    """
    Known errors keep their message and log one line; anything else is a bug: its traceback goes to the log
    (once) and the user gets a short message.
    """
    if isinstance(error, gr.Error):
        return error
    if isinstance(error, USER_ERRORS):
        return user_error(str(error))
    log.error("unexpected error in an app event", exc_info=error)
    first_line = (str(error).splitlines() or [""])[0][:200]
    return gr.Error(f"Unexpected error ({type(error).__name__}: {first_line}). The app is still running; "
                    "the server log has the details.", print_exception=False)


def reports_errors(event):
    """Wrap an event function (plain or generator) so every exception reaches the user as a gr.Error."""
    if inspect.isgeneratorfunction(event):
        @functools.wraps(event)
        def streaming(*args, **kwargs):
            try:
                yield from event(*args, **kwargs)
            except Exception as e:
                raise as_user_error(e) from e
        return streaming

    @functools.wraps(event)
    def plain(*args, **kwargs):
        try:
            return event(*args, **kwargs)
        except Exception as e:
            raise as_user_error(e) from e
    return plain


def checked_numbers(blocks: gr.Blocks) -> None:
    """
    Every slider and number box of the page refuses, in one line naming it by its label, a value that is not a
    finite number in its range (number_preprocess). A raw client may post NaN or Infinity as JSON numbers (gradio's
    own client cannot; its queue API takes them), and gradio's range check lets NaN by (every comparison with it
    is false) and names no field: `int()` downstream then raised "unexpected error". Set on each instance, as
    image_input's preprocess is (no slider is re-created by an update of its props, which would drop it).
    """
    for block in blocks.blocks.values():
        if isinstance(block, (gr.Slider, gr.Number)):
            block.preprocess = functools.partial(number_preprocess, block, type(block).preprocess)


def one_line_refusals(blocks: gr.Blocks) -> None:
    """
    gradio's own refusals of an event's inputs, one line each, in the console (user_error: no traceback) and to the
    client: a value of the wrong shape for its component (pydantic's validation, several lines), a choice not in a
    dropdown's list, a value a component cannot preprocess (a path for an examples list's index), a FileData naming a file outside the cache (gradio's InvalidPathError: the app's NOT_UPLOADED,
    as cached_file says it). gradio printed each with a ~25-line traceback, for any client, on any event. Set on the
    page's instance: its preprocess_data is where gradio validates every input before the event runs.
    """
    preprocess_data = blocks.preprocess_data

    async def refusing(*args, **kwargs):
        try:
            return await preprocess_data(*args, **kwargs)
        except gr.Error as e:
            raise (user_error(e.message) if e.print_exception else e) from None
        except pydantic.ValidationError as e:
            raise user_error(f"an input was refused: {e.errors()[0]['msg']}") from None
        except InvalidPathError:
            raise user_error(NOT_UPLOADED) from None
        except ComponentProcessingError as e:  # a component's own preprocess failed on the value (its type, say)
            raise user_error(f"an input was refused: {str(e).splitlines()[0]}") from None

    blocks.preprocess_data = refusing


def number_preprocess(component, preprocess, payload):
    """A slider's or number box's preprocess with a finite, in-range payload only; one line naming it otherwise."""
    name = component.label or "a number"
    if payload is None and isinstance(component, gr.Number):
        return preprocess(component, payload)
    if isinstance(payload, bool) or not isinstance(payload, (int, float)) or not math.isfinite(payload):
        raise user_error(f"{name} must be a finite number, got {payload}")
    lo, hi = component.minimum, component.maximum
    if (lo is not None and payload < lo) or (hi is not None and payload > hi):
        raise user_error(f"{name} must be between {lo} and {hi}, got {payload}")
    return preprocess(component, payload)


def check_inputs(model: ARRCOCQwen, image, question: str) -> tuple[Image.Image, str]:
    """
    The request's image in 8-bit RGB (converted here once: the views take an RGB image as it is) and its question
    checked for the model, once (ARRCOCQwen.check_question: its text and its tokens; the pipelines the handler runs
    take it as it is), and a fast failure, before any output is cleared or streamed, on a missing image or a
    question the model refuses. A file path is read as read_upload reads an upload: gradio hands one over from a copy of the
    image box that an update of it re-created (from its constructor arguments: gradio's own "filepath"
    preprocess, not image_input's read_upload), as a click on an example did before app.examples loaded them
    around the box.
    """
    if isinstance(image, str):
        image = read_upload(FileData(path=image))
    elif image is not None and not isinstance(image, Image.Image):  # a raw client's dict, say: never a file to open
        raise user_error(NOT_UPLOADED)
    rgb = to_rgb(image)
    return rgb, model.check_question(question)


def image_input(**kwargs) -> gr.Image:
    """
    A gr.Image whose uploads reach the handlers as PIL images in their own mode (16-bit, RGBA, animated:
    arr_coc.vlm.views.to_rgb handles them), read by read_upload, which fails unreadable ones with a clear
    gr.Error. Its type is "filepath": gradio's "pil" preprocess decodes and turns an EXIF-rotated file in full
    before any check of ours. Its preprocess is replaced on the instance, not overridden in a subclass, because
    gradio writes a .pyi stub beside the module of every Component subclass; a copy that gradio re-creates (any
    update of the box's props) hands over a file path instead, which check_inputs reads the same way.
    """
    component = gr.Image(type="filepath", image_mode=None, **kwargs)
    component.preprocess = read_upload
    return component


def read_upload(payload) -> Image.Image | None:
    """
    gr.Image's payload -> the image, decoded and upright (arr_coc.vlm.images.open_image, as the commands read
    theirs): a file only from gradio's cache (cached_file, checked before anything is opened), or the bytes a
    client sent inline as a data: URL (base64); the pixel limit is checked on the file's header, before anything
    decodes it. Each refusal is one line naming the file as uploaded, never the server's path to it.
    """
    if payload is None:
        return None
    name = upload_name(payload)
    inline = payload.url.split(",", 1)[-1] if payload.url and payload.url.startswith("data:") else None
    path = cached_file(payload.path) if inline is None else None
    try:
        return open_image(path or io.BytesIO(base64.b64decode(inline, validate=True)), MAX_IMAGE_PIXELS)
    except Image.DecompressionBombError as e:
        raise user_error(f"{name} is too large ({e}); the limit is {MAX_IMAGE_PIXELS // 10**6} megapixels: downscale "
                         f"it first (the model reads at most {PIPELINE.max_cells} cells of it, a few megapixels, "
                         "anyway)") from None
    except UnidentifiedImageError:
        raise user_error(f"{name} is not an image: upload a PNG, JPEG, WebP, GIF, BMP or TIFF file") from None
    except (OSError, ValueError) as e:  # ValueError: a data: URL that is no base64
        reason = str(e)
        for server_path in {payload.path, path} - {None}:
            reason = reason.replace(server_path, name)
        raise user_error(f"{name} could not be decoded as an image ({reason})") from None


def cached_file(path) -> str:
    """
    A file a client named, as the server may open it: only one inside gradio's cache folder (its upload folder,
    where every upload and every example the page shows lands: gradio's own rule for a FileData with `meta`), the
    path resolved, links and '..' included. Gradio checks only FileData dicts that carry `meta`; one without it, a
    plain string, a URL or any other path reaches the app as given, so this check is the app's own: every such
    path gets the same one line (NOT_UPLOADED), whatever is there (a file, a folder or nothing), and nothing outside
    the cache is opened or even looked at.
    """
    if not isinstance(path, str) or not path:
        raise user_error(NOT_UPLOADED)
    cache = os.path.realpath(get_upload_folder())
    real = os.path.realpath(path)
    if os.path.commonpath([real, cache]) != cache or real == cache:
        raise user_error(NOT_UPLOADED)
    return real


def cached_files(payload):
    """A gr.File payload (one FileData, ListFiles of them, or None) whose every file is cached_file's."""
    items = [] if payload is None else getattr(payload, "root", payload)
    for item in items if isinstance(items, list) else [items]:
        cached_file(getattr(item, "path", None))
    return payload


def checkpoint_upload(**kwargs) -> gr.File:
    """A gr.File for a checkpoint's two files; gradio's own refusal of another file type becomes a user error."""
    component = gr.File(file_count="multiple", file_types=[".json", ".safetensors"], **kwargs)
    component.preprocess = functools.partial(quietly, component.preprocess)
    return component


def quietly(preprocess, payload):
    """A component's preprocess over files in gradio's cache only (cached_files), whose gr.Error (a bad upload) logs
    one line and no traceback."""
    try:
        return preprocess(cached_files(payload))
    except gr.Error as e:
        raise user_error(e.message) from None


def fresh_cells_note(answer: Answer, fresh_cells: bool, budget: int) -> str:
    """What a follow-up with fresh cells only (`fresh_cells`) read, where it is fewer than the `budget` saccades
    asked for (earlier turns read the rest): '' otherwise. With none left, ARR answers from the conversation alone,
    and says so."""
    if not fresh_cells or answer.reads_native:  # read whole: nothing chosen, fresh or not
        return ""
    read = answer.tokens.saccade  # not answer.arr: Conversation.to drops it before this note is written
    if read >= budget:
        return ""
    if read == 0:
        return (" Fresh cells only: earlier turns read every cell of the image, so ARR read no new cell and answered "
                "from the conversation alone.")
    return f" Fresh cells only: {read} of the {budget} saccades asked for were left unread by earlier turns."


def upload_summary(image: Image.Image | None) -> str:
    """The status line once an upload is read (read_upload, its preprocess, refuses a bad one before this runs)."""
    return "" if image is None else f"Image: {image.width} x {image.height} px, ready."


def upload_name(payload) -> str:
    return payload.orig_name or (Path(payload.path).name if payload.path else "the image")


# ----------------------------------------------------------------------------- checkpoints


def checkpoint_choices(root: Path, model: ARRCOCQwen) -> list[str]:
    """The A/B's choices: the prior, then the checkpoints under root made for the loaded model (the model family and
    hidden size their config.json names, as the default rule reads them); the others could not load on it."""
    return [PRIOR, *(name for name in list_checkpoints(root) if made_for(Path(root) / name, model))]


def made_for(folder: Path, model: ARRCOCQwen) -> bool:
    """Whether a checkpoint folder's config.json names the loaded model's family and hidden size (unreadable: no)."""
    try:
        config = read_checkpoint_config(folder)
    except CheckpointError:
        return False
    return (config.base_model_family, config.hidden_size) == (model.vlm.family, model.vlm.hidden_size)


def install_default_layer(model: ARRCOCQwen, requested: str | None, root: Path) -> tuple[str, str | None]:
    """
    Make the requested checkpoint (else the default of relevance.layer.choose_checkpoint, the commands' rule too)
    the model's layer. Returns its name and, if it could not be loaded, a notice saying so (the prior is used).
    """
    folder = choose_checkpoint(requested, model.vlm.family, model.vlm.hidden_size, root)
    try:
        model.layer = model.prior_layer() if folder is None else model.load_layer(folder)
        return checkpoints.label(folder), None
    except CheckpointError as e:
        model.layer = model.prior_layer()
        return PRIOR, f"Checkpoint {requested or folder!r} could not be loaded ({e}); using the untrained prior."


def load_uploaded_layer(model: ARRCOCQwen, files: list[str]) -> ARRCOCLayer:
    """Uploaded config.json + model.safetensors -> layer, via a temporary folder (safetensors only, no pickles)."""
    by_name = {Path(f).name: Path(f) for f in files}
    if sorted(by_name) != sorted((CONFIG_FILE, WEIGHTS_FILE)):
        raise CheckpointError(f"upload exactly {CONFIG_FILE} and {WEIGHTS_FILE}; got {', '.join(sorted(by_name))}")
    with tempfile.TemporaryDirectory(prefix="arr-coc-") as tmp:
        folder = Path(tmp) / "uploaded"  # error messages name the folder: "uploaded/model.safetensors ..."
        folder.mkdir()
        for name, path in by_name.items():
            shutil.copyfile(path, folder / name)
        return model.load_layer(str(folder))


def choose_layer(model: ARRCOCQwen, side: str, choice: str, files: list[str] | None, root: Path) -> ARRCOCLayer:
    """One side of the A/B: the uploaded files if any, else the chosen checkpoint (or the prior)."""
    try:
        if files:
            return load_uploaded_layer(model, files)
        if choice in checkpoints.PRIOR_NAMES:
            return model.prior_layer()
        return model.load_layer(checkpoints.resolve_checkpoint(choice, root))
    except CheckpointError as e:
        raise CheckpointError(f"checkpoint {side}: {e}") from None


# ----------------------------------------------------------------------------- what the app shows


def load_examples(path: Path) -> list[list[str]]:
    """assets/examples.json -> [[image path, question], ...] for gr.Examples, in the file's order (the fine-print
    pages the offline pocket model answers first)."""
    return [[str(path.parent / e["image"]), e["question"]] for e in json.loads(path.read_text())]


def example_labels(path: Path) -> list[str]:
    """
    What the examples list shows for each of load_examples' rows: a pocket page (POCKET_EXAMPLE) its question and
    the expected answer (its note's "Expected answer: ..."), which the offline pocket model gives; any other (the
    photos, the synthetic scenes) its question, said to be meaningful only with real Qwen-VL weights.
    """
    labels = []
    for e in json.loads(path.read_text()):
        expected = e["note"].split("Expected answer:", 1)[-1].strip().rstrip(".")
        labels.append(f"{e['question']} → {expected} (answers offline: the pocket model)"
                      if e["image"].startswith(POCKET_EXAMPLE) else
                      f"{e['question']} · meaningful only with real Qwen-VL weights")
    return labels


def channels_markdown() -> str:
    rows = "\n".join(f"| {i} | `{name}` | {meaning} |" for i, (name, meaning) in enumerate(CHANNELS))
    return "| # | channel | meaning |\n| --- | --- | --- |\n" + rows


def grid_text(grid: tuple[int, int], cell: int) -> str:
    """A token/cell grid and the view it covers: '64 x 64 cells (1792 x 1792 px)'."""
    rows, cols = grid
    return f"{rows} x {cols} cells ({cols * cell} x {rows * cell} px)"


def stats_rows(answer: Answer) -> list[list]:
    """
    The image and the grids it was read at, token counts, the latency split, time to first token, decode speed
    and memory of one answer, as [metric, value] rows.
    """
    tokens, ms, views = answer.tokens, answer.timings, answer.views
    grids = [["native grid (full)", grid_text(views.native_grid, views.cell)]]
    if answer.arr is not None:
        grids.append(["candidate grid", grid_text(views.candidate_grid, views.cell)])
    return [
        ["image", f"{views.image.width} x {views.image.height} px"],
        *grids,
        ["visual tokens: gestalt", tokens.gestalt],
        ["visual tokens: saccade", tokens.saccade],
        ["visual tokens: total", tokens.total_visual],
        ["text tokens", tokens.text],
        *[[f"{part} ms", round(value, 1)] for part, value in asdict(ms).items()],
        ["TTFT ms", round(answer.ttft_ms, 1)],
        ["new tokens", answer.new_tokens],
        ["ms/token (decode)", round(answer.decode_ms_per_token, 2)],
        ["tokens/s (decode)", round(answer.tokens_per_s, 1)],
        ["GFLOPs: vision", round(answer.compute.vision)],
        ["GFLOPs: prefill", round(answer.compute.prefill)],
        ["peak memory MB", memory_text(answer.peak_memory_mb)],
        *([["no selection", native_note(answer)]] if answer.reads_native else []),
        *([["safe mode", "fp16 overflowed: redone with an fp32 residual stream"]] if answer.safe_mode else []),
        *([["confidence (least probable token)", round(answer.confidence, 4)]] if answer.confidence is not None else []),
        *fixation_rows(answer),
    ]


def native_note(answer: Answer) -> str:
    """Why an ARR answer read the native view whole, as full does, and so has no selection to draw (Answer.reads_native:
    the image holds no more cells than the gestalt plus the budget); '' where it chose saccades."""
    if answer.reads_native is None:
        return ""
    return (f"ARR read the image whole, as full does ({answer.reads_native}): choosing saccades would read more "
            "tokens than full, so there is no selection to draw.")


def fixation_rows(answer: Answer) -> list[list]:
    """Under a second-look threshold: whether it fired, and each look's saccades, time, confidence and answer."""
    if answer.refixate is None:
        return []
    first = answer.fixations[0].confidence
    fired = (f"fired: confidence {first:.4f} < tau {answer.refixate}" if answer.refixated
             else f"not needed: confidence {first:.4f} >= tau {answer.refixate}")
    rows = [["second look", fired]]
    if answer.refixated:
        rows.append(["second look guided by", answer.fixations[1].guide])
    for i, look in enumerate(answer.fixations, start=1):
        t = look.timings
        rows += [[f"look {i}: saccades", look.saccades], [f"look {i}: total ms", round(t.total, 1)],
                 [f"look {i}: ms (vision / selection / prefill / decode)",
                  " / ".join(f"{v:.1f}" for v in (t.vision, t.selection, t.prefill, t.decode))],
                 [f"look {i}: confidence", round(look.confidence, 4)], [f"look {i}: answer", look.text]]
    return rows


def memory_text(mb: float) -> int | str:
    """A request's peak memory in MB; NaN (no request's own peak on this CPU) says so instead of a number."""
    return "n/a on CPU" if math.isnan(mb) else round(mb)


def saccade_rows(out: ARRCOCOutput) -> list[list]:
    """The saccades of the first image most relevant first, as [rank, row, col, score, fed] rows: fed is the place
    each one has in the LLM's input (out's order: the same as rank in relevance order, row by row in raster order)."""
    fed = {cell: place for place, cell in enumerate(out.indices[0].tolist(), start=1)}
    ranked = out.in_order("relevance")
    return [[rank, r, c, round(s, 4), fed[cell]] for rank, ((r, c), s, cell) in enumerate(
        zip(ranked.positions[0].tolist(), ranked.scores[0].tolist(), ranked.indices[0].tolist()), start=1)]


def selection_summary(out: ARRCOCOutput, ms: float, ablation: str | None = None, overridden: bool = False) -> str:
    """One line on the selection: count, strategy, grid, time, the ablation if any; one on the tensions (set by
    the balancer, or overridden by the sliders); plus the fallback in words."""
    gh, gw = out.grid
    line = (f"**{out.indices.shape[1]} saccades** · strategy `{out.strategy}` · {gh}×{gw} = {gh * gw} candidate "
            f"cells · fed in {out.saccade_order} order (numbered most relevant first) · selected and drawn in "
            f"{ms:.0f} ms" + (f" · ablation: {ablation}" if ablation else ""))
    budget = (f"K = {out.budgets[0]} (adaptive, f = {float(out.particularize[0]):.2f})" if out.auto_budget
              else f"K = {out.budgets[0]} (fixed)")
    tensions = (f"**Tensions** ({'the sliders' if overridden else 'set by the balancer'}) · explore e = "
                f"{float(out.explore[0]):.2f} · diversify λ = {float(out.diversify[0]):.2f} · {budget} · "
                f"image structure {float(out.structure[0]):.2f}")
    reason = out.fallback[0]
    return f"{line}\n\n{tensions}" + (f"\n\n**Fallback** — {FALLBACK_NOTES[reason]}." if reason else "")


def tension_request(auto: bool, override: bool, explore: float, diversify: float,
                    particularize: float) -> tuple[str | None, TensionSettings]:
    """The Microscope's tension controls -> (AUTO for the adaptive budget, else None: the budget slider's) and the
    settings: the sliders' values when overriding, else the balancer's own."""
    if not override:
        return (AUTO if auto else None), NO_SETTINGS
    return (AUTO if auto else None), TensionSettings(explore=float(explore), diversify=float(diversify),
                                                     particularize=float(particularize) if auto else None)


def turn_row(question: str, base: Answer, arr: Answer, moved) -> list:
    """One turn of the Conversation tab: both answers, their TTFT, the tokens each prefilled, each conversation's
    length after it, and how ARR's saccades moved from the turn before (moved: a conversation.Moves, or None)."""
    moves = "-" if moved is None else f"{len(moved.new)} / {len(moved.kept)} / {len(moved.dropped)}"
    return [arr.turn, question, answer_text(base), answer_text(arr), round(base.ttft_ms, 1), round(arr.ttft_ms, 1),
            base.prefilled, arr.prefilled, base.context, arr.context, moves]


def answer_text(answer: Answer) -> str:
    """The answer, or a note when the generated tokens decode to no visible text."""
    return answer.text or f"(no visible text: the {answer.new_tokens} generated tokens decode to nothing)"


def faithfulness_summary(curves: FaithfulnessCurves) -> str:
    """The scored answer, the three areas, and what the gap between deletion and random says."""
    areas = curves.areas
    gap = areas["random"] - areas["deletion"]
    verdict = (f"removing the most relevant saccades first costs the answer **{gap:.3f}** more log-likelihood per "
               "token (area) than removing them at random" if gap > 0 else
               f"removing the most relevant saccades first costs the answer no more than removing them at random "
               f"(**{-gap:.3f}** less log-likelihood per token, area): ARR's ranking does not show in this answer")
    rows = "\n".join(f"| {name} | {area:.4f} |" for name, area in areas.items())
    return (f"Answer scored: **{curves.answer!r}** · {curves.counts[-1]} saccades, {len(curves.counts)} points per "
            f"curve\n\n| curve | area (mean log-likelihood per token) |\n| --- | --- |\n{rows}\n\n{verdict}.")


def ab_summary(a: Answer, b: Answer) -> str:
    """How far checkpoints A and B agree: saccade IoU, Spearman correlation of the maps, the answers; where either
    read the image whole (native_note), only the answers, and why there is no selection to compare."""
    if a.reads_native or b.reads_native:
        return "\n\n".join([*(f"Checkpoint {name}: {native_note(x)}" for name, x in (("A", a), ("B", b))
                               if x.reads_native),
                              f"Answers: {'agree' if answers_agree(a.text, b.text) else 'differ'}."])
    rho = rank_correlation(a.arr.relevance[0], b.arr.relevance[0])
    return "\n".join([
        "| measure | value |",
        "| --- | --- |",
        f"| saccade overlap (IoU of the selected cells) | {saccade_overlap(a.saccades, b.saccades):.3f} |",
        f"| rank correlation of the relevance maps (Spearman) | "
        f"{'undefined (a map is flat or not finite)' if math.isnan(rho) else f'{rho:.3f}'} |",
        f"| answers | {'agree' if answers_agree(a.text, b.text) else 'differ'} |",
    ])
