"""
What the `python -m arr_coc.X` commands share: their argument parser, flag validators, the model-loading
lines, the one Request of their flags (request) and the one place they ask for an answer (answer), the package
versions, and the console-script entry points that `pip install .` puts on the PATH.

Validators are argparse `type=` callables, so a bad flag is refused at parse time, before torch or a model
loads: one line on stderr names the flag and the reason and points to --help, and the exit code is 2.
Paths are checked there too (an --image that is missing or no image, a --json that is a folder, an --out that
cannot be written, a --model that is an ARR checkpoint), and so is --device (torch loads only to ask whether a
CUDA device is there, and only when one is asked for).

A hub model is looked for on the hub only if the hub answers at once (hub_out_of_reach): otherwise the command
goes offline, as HF_HUB_OFFLINE=1 would have it, and loads from the local cache alone, with no retries. The
default model, left out and not in the cache, then becomes the pocket model (--model pocket), with a note.

    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", type=bounded_int(1, 16384), default=273, help="number of saccades")
    model, checkpoint = load_model("tiny", checkpoint=None, device=None)   # prints "loading ..." / "loaded in ..."
    answer = answer(model, image, question, "arr", request(args, ablation="raster"))  # the flags, a row's ablation

This module imports nothing heavy at the top: every command imports it before parsing.
"""

import argparse
import importlib
import json
import re
import sys
import tempfile
import time
import warnings
from importlib import metadata
from pathlib import Path

from arr_coc import checkpoints, pipelines, settings
from arr_coc.checkpoints import POCKET, POCKET_NOTICE
from arr_coc.settings import (DEFAULT_MODEL, GESTALT_PER_CELLS, LOOKS, MAX_CELLS, MAX_QUESTION_CHARS,
                              MIN_CELLS, MIN_CROP_TOKENS, REFIXATE_GUIDES, PipelineConfig)
from arr_coc.errors import InputError, check_text
from arr_coc.settings import IMAGE_FORMATS, MAX_IMAGE_PIXELS
from arr_coc.flags import (ArgumentParser, bounded_float, bounded_int, comma_list, device, flag,  # noqa: F401
                           int_list, names, one_of)  # (re-exported: the commands write cli.bounded_int)
from arr_coc.checkpoints import hub_out_of_reach
from arr_coc.pipelines.arr_options import Options as ArrOptions  # ARR's settings: the flags' defaults
from arr_coc.relevance.ablation import ABLATIONS
from arr_coc.relevance.config import AUTO, ARRCOCConfig, TensionSettings

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")  # a hub repo id: name or owner/name
OFFLINE_HINT = "--model pocket runs the shipped offline model (HF_HUB_OFFLINE=1: the local cache alone, no hub)"


def ablation_list(text: str) -> str:
    """An argparse type: comma-separated names of ARR's ablations (arr_coc.relevance.ablation), "all" or ""."""
    return ",".join(ABLATIONS) if text.strip() == "all" else comma_list(tuple(ABLATIONS), allow_empty=True)(text)


def nonblank(text: str) -> str:
    """An argparse type: a string with something in it (a question, say)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def question(text: str) -> str:
    """An argparse type: a question with something in it, no longer than the pipelines take (MAX_QUESTION_CHARS)."""
    nonblank(text)
    if len(text) > MAX_QUESTION_CHARS:
        raise argparse.ArgumentTypeError(f"{len(text)} characters, over the limit of {MAX_QUESTION_CHARS}")
    try:
        return check_text(text, "question")  # bytes that are no UTF-8 reach argv as lone surrogates
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def blocking_file(path: Path) -> Path | None:
    """The first of path's parent folders that is a file (so path cannot be written), else None."""
    return next((parent for parent in reversed(path.parents) if parent.exists() and not parent.is_dir()), None)


def unwritable(path: Path) -> str | None:
    """
    Why nothing can be written at path (a folder to make, or a file in one), else None: the nearest folder at or
    above it that exists refuses a new entry. Tried, not read from the permission bits, which root writes past
    and a read-only mount ignores; the trial folder is removed at once.
    """
    folder = next(p for p in (path, *path.parents) if p.exists())
    try:
        with tempfile.TemporaryDirectory(prefix=".arr-coc-write-test-", dir=folder):
            return None
    except OSError as e:
        return f"{folder.absolute()} is not writable ({type(e).__name__}: {e.strerror or e})"


def output_file(text: str) -> str:
    """An argparse type: a file to write (its folder is made): not an existing folder, not under a file, not
    where nothing can be written."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; name a file in it, e.g. {path / 'results.json'}")
    if blocker := blocking_file(path):
        raise argparse.ArgumentTypeError(f"cannot write {text}: {blocker} is a file, not a folder")
    if why := unwritable(path.parent if not path.exists() else path):
        raise argparse.ArgumentTypeError(f"cannot write {text}: {why}")
    return text


def default_folder(p: argparse.ArgumentParser, flag: str, text: str) -> str:
    """A default output folder (a fresh runs/...), checked as output_folder checks a given one: refused now, not
    after the run's work."""
    try:
        return output_folder(text)
    except argparse.ArgumentTypeError as e:
        p.error(f"argument {flag}: {e}")


def output_folder(text: str) -> str:
    """An argparse type: a folder to write into (made if needed): not an existing file, not under a file, not
    where nothing can be written (checked now, not after a run's work)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    if blocker := blocking_file(path):
        raise argparse.ArgumentTypeError(f"cannot make the folder {text}: {blocker} is a file")
    if why := unwritable(path):
        raise argparse.ArgumentTypeError(f"cannot write into {text}: {why}")
    return text


def input_file(what: str):
    """An argparse type: an existing file (an image, say), named as `what` in the messages."""
    def parse(text: str) -> str:
        path = Path(text)
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
        if not path.exists():
            raise argparse.ArgumentTypeError(f"no such {what}: {text}")
        return text
    parse.__name__ = what
    return parse


def image_file(text: str) -> str:
    """An argparse type: an existing file that PIL knows as an image (its header is read, not the pixels: a PDF or a
    text file is refused here, before torch loads; a truncated image is found when it is decoded), of at most the
    app's MAX_IMAGE_PIXELS. A fifo or a device is refused unread: reading one waits for a writer."""
    from PIL import Image, UnidentifiedImageError

    input_file("image")(text)
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a regular file (a fifo, a socket or a device)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # past PIL's warning size: our line only
            with Image.open(text, formats=IMAGE_FORMATS) as image:  # as the app and open_image read them
                width, height = image.size
    except UnidentifiedImageError:
        with open(text, "rb") as f:
            pdf = f.read(5) == b"%PDF-"
        raise argparse.ArgumentTypeError(f"{text} is not an image PIL can read" + (
            " (a PDF: export the page as PNG or JPEG)" if pdf else "")) from None
    except (OSError, ValueError, Image.DecompressionBombError) as e:  # ValueError: a PNG text chunk that inflates
        raise argparse.ArgumentTypeError(f"cannot read {text} as an image ({type(e).__name__}: {e})") from None
    if width * height > MAX_IMAGE_PIXELS:
        raise argparse.ArgumentTypeError(f"{text} is too large ({width}x{height} pixels); the limit is "
                                         f"{MAX_IMAGE_PIXELS // 10**6} megapixels, as in the app: downscale it first")
    return text


def arr_checkpoint(folder: Path) -> dict | None:
    """The config of an ARR checkpoint folder (a config.json naming base_model_family and hidden_size, as
    arr_coc.relevance.layer writes it), else None: a VLM's folder has a model_type instead."""
    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # no folder, no config.json, not JSON (or nested past Python)
        return None
    raw = raw.get("config", raw) if isinstance(raw, dict) else raw  # the mixin may nest the dataclass
    return raw if isinstance(raw, dict) and {"base_model_family", "hidden_size"} <= raw.keys() else None


def model_name(text: str) -> str:
    """
    An argparse type: the VLM to load: an offline model's name, a folder or a hub id (owner/name), not read yet.
    An ARR checkpoint (a folder, or a name under checkpoints/), which --checkpoint takes, is refused, and so is a
    path that is not there and cannot be a hub id.
    """
    if (config := arr_checkpoint(Path(checkpoints.resolve_checkpoint(text)))) is not None:
        raise argparse.ArgumentTypeError(
            f"{text} is an ARR checkpoint (an ARR layer made for a {config['base_model_family']} model of hidden size "
            f"{config['hidden_size']}), not a VLM: pass it as --checkpoint {text}, with --model the VLM it was made for")
    if not Path(text).exists() and not HUB_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"no such model folder: {text} (a hub model id is name or owner/name)")
    return text


MODELS = ("a Qwen-VL hub id or folder, 'pocket' (the offline model shipped in models/pocket-qwen2-vl, trained here "
          "on synthetic fine-print scenes) or a tiny random model ('tiny', 'tiny-qwen2.5-vl', 'tiny-qwen3-vl')")
FALLBACK = (f"Default: {DEFAULT_MODEL}; where the hub cannot be reached and the cache lacks it, the pocket model, "
            "with a note")  # --model left out: default_model


def model_flag(default: str | None = None, use: str = "the VLM", then: str = FALLBACK):
    """--model, one flag for every command: `use` says what the command does with it, `then` its default."""
    return flag(default, f"{use}: {MODELS}. {then}", model_name)


def checkpoint_flag():
    """--checkpoint, one flag for the app, run and evaluate (arr_coc.relevance.layer.choose_checkpoint reads it)."""
    return flag(None, "ARR checkpoint: a name under checkpoints/, a folder, a hub repo id, or 'prior' for the "
                      "untrained layer (default: the first checkpoint under checkpoints/ made for the model whose "
                      "evidence.json shows it beats the prior, else the prior; the app's rule)")


def default_model(args) -> None:
    """After parsing: --model left out is DEFAULT_MODEL, and only then may it fall back to the pocket model offline
    (args.fallback); a model asked for by name is loaded or refused."""
    args.fallback = args.model is None
    args.model = args.model or DEFAULT_MODEL


def budget(text: str) -> int | str:
    """An argparse type: a saccade count in [1, MAX_CELLS], or "auto" for the adaptive budget."""
    return AUTO if text.strip().lower() == AUTO else bounded_int(1, MAX_CELLS)(text)


budget.__name__ = "budget"


def budget_flag(group: str | None = None):
    """--budget, one flag for run, evaluate and train (`group`: evaluate's, where --budgets excludes it)."""
    return flag(ARRCOCConfig.budget, "saccades per image (at most the candidate grid's cells), or 'auto': the adaptive "
                                     "budget, K from the relevance map's concentration between --min-budget and "
                                     "--max-budget (a spread-out map gets more saccades than a peaked one; the "
                                     "reducers keep as many tokens)", budget, group=group)


def min_budget_flag():
    """--min-budget, beside budget_flag."""
    return flag(ARRCOCConfig.min_budget, "with --budget auto: the fewest saccades per image", bounded_int(1, MAX_CELLS))


def max_budget_flag():
    """--max-budget, beside budget_flag."""
    return flag(ARRCOCConfig.max_budget, "with --budget auto: the most saccades per image (capped by the candidate "
                                         "grid's cells)", bounded_int(1, MAX_CELLS))


def reads_adaptive_budget(args) -> bool:
    """Whether a row of the command reads the adaptive budget's bounds (--min-budget, --max-budget): --budget auto,
    or an ablation on it (--ablations auto-budget, where the command has --ablations)."""
    return args.budget == AUTO or any(ABLATIONS[name].auto_budget for name in names(getattr(args, "ablations", "")))


def check_budget(p: ArgumentParser, args, max_cells: int | None = None) -> None:
    """Refuse a fixed --budget over --max-cells, adaptive bounds the wrong way round, and adaptive bounds given
    where no row reads them (run, train and evaluate)."""
    if max_cells is not None and args.budget != AUTO and args.budget > max_cells:
        p.error(f"argument --budget: {args.budget} exceeds --max-cells {max_cells}")
    if args.min_budget > args.max_budget:
        p.error(f"argument --min-budget: {args.min_budget} exceeds --max-budget {args.max_budget}")
    for name in ("min_budget", "max_budget"):
        if name in p.given and not reads_adaptive_budget(args):
            p.error(f"argument --{name.replace('_', '-')}: only used with --budget auto"
                    + (" or --ablations auto-budget" if hasattr(args, "ablations") else ""))


def check_refixate(p: ArgumentParser, args) -> None:
    """Refuse the second look's settings without --refixate (run and evaluate), given on the command line at any
    value (ArgumentParser.given)."""
    for name in ("refixate_budget", "refixate_guide"):
        if name in p.given and args.refixate is None:
            p.error(f"argument --{name.replace('_', '-')}: only used with --refixate")


def budget_settings(args) -> TensionSettings:
    """The adaptive budget's bounds from the flags, as ARR's tension settings."""
    return TensionSettings(min_budget=args.min_budget, max_budget=args.max_budget)


new_tokens = bounded_int(1, settings.MAX_NEW_TOKENS)  # --max-new-tokens, --new-tokens: as ARRCOCQwen.answer takes them


def max_cells_flag():
    """--max-cells, one flag for run, evaluate and bench."""
    return flag(PipelineConfig.max_cells, "cap on the native-resolution candidate grid (cells of 28 px); the `full` "
                                          "baseline uses the same cap", bounded_int(MIN_CELLS, MAX_CELLS))


def gestalt_tokens_flag():
    """--gestalt-tokens, one flag for run, evaluate and bench, beside max_cells_flag (check_gestalt_tokens)."""
    return flag(PipelineConfig.gestalt_max_tokens, "at most this many gestalt tokens, the low-res view every pipeline "
                                                   "reads first (576: Q-Zoom's coarse pass, 24x24 on a square); at "
                                                   "most --max-cells / 4, so the candidate grid stays twice it per "
                                                   "side", bounded_int(1, MAX_CELLS // GESTALT_PER_CELLS))


def check_gestalt_tokens(p: argparse.ArgumentParser, args) -> None:
    """Refuse a --gestalt-tokens over --max-cells / 4 (the candidate grid would not be twice the gestalt per side)."""
    if args.gestalt_tokens > args.max_cells // GESTALT_PER_CELLS:
        p.error(f"argument --gestalt-tokens: {args.gestalt_tokens} exceeds --max-cells / {GESTALT_PER_CELLS} = "
                f"{args.max_cells // GESTALT_PER_CELLS}")


def llm_layers(model: str) -> int | None:
    """
    The LLM depth of a --model, read without loading it: the tiny models' recipe, a folder's config.json (the pocket
    model's shipped one), a hub model's config.json in the local cache; None where only loading it tells.
    """
    if model in settings.TINY_NAMES:
        return settings.TINY_LLM_LAYERS
    path = (checkpoints.POCKET_FOLDER if model == POCKET else Path(model)) / "config.json"
    if not path.is_file() and HUB_ID.fullmatch(model):
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(model, "config.json")
        except ValueError:  # not a repo id the hub takes
            cached = None
        path = Path(cached) if isinstance(cached, str) else path
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        layers = raw.get("text_config", raw).get("num_hidden_layers") or raw.get("num_hidden_layers")
    except (OSError, ValueError, RecursionError, AttributeError):
        return None
    return layers if isinstance(layers, int) else None


def check_fastv_layer(p: argparse.ArgumentParser, args) -> None:
    """After default_model: refuse a --fastv-layer the model's LLM does not have (K in [1, layers - 1]), where its
    depth is known before it loads (llm_layers); otherwise the model's own check refuses it once loaded."""
    layers = llm_layers(args.model)
    if layers is not None and not 1 <= args.fastv_layer < layers:
        p.error(f"argument --fastv-layer: {args.model}'s LLM has {layers} layers, so FastV's K is between 1 and "
                f"{layers - 1}, got {args.fastv_layer}")


def refixate_flag():
    """--refixate, one flag for run and evaluate."""
    return flag(None, "ARR looks a second time when its answer's confidence (its least probable token's probability) "
                      "is below TAU, in [0, 1] (default: off)", bounded_float(0.0, 1.0), metavar="TAU")


def refixate_budget_flag():
    """--refixate-budget, beside refixate_flag."""
    return flag(None, "saccades of the second look (default: half of --budget, cells not read in the first)",
                bounded_int(1, MAX_CELLS))


def refixate_guide_flag():
    """--refixate-guide, beside refixate_flag."""
    return flag(ArrOptions.refixate_guide, "what points the second look: prior (the prior pass again, the first "
                                           "saccades in its context) or attention (where the first answer's own "
                                           "attention fell, beside the saccades it read most)", one_of(REFIXATE_GUIDES))


def look_flag():
    """--look, run's: how ARR's first look chooses its cells (ARR's Options.look)."""
    return flag(ArrOptions.look, "how ARR's first look chooses its cells: one (the gestalt's prior alone) or two_scale "
                                 "(the region around the relevance peak re-read as a crop of --crop-tokens native "
                                 "cells, whose own prior pass chooses the cells inside it; its tokens count in ARR's)",
                one_of(LOOKS))


def looks_flag():
    """--looks, evaluate's: a row of ARR per look and strategy (arr:topk, arr+two_scale:topk)."""
    return flag(LOOKS[0], f"ARR's looks to run under each strategy, comma-separated, of {','.join(LOOKS)}: one "
                          "(arr:topk) and two_scale (arr+two_scale:topk: the region around the relevance peak re-read "
                          "as a crop of --crop-tokens native cells, whose own prior chooses the cells inside it); with "
                          "two_scale the reducers at ARR's count count its crop's tokens too", comma_list(LOOKS))


def crop_tokens_flag():
    """--crop-tokens, beside look_flag and looks_flag (check_look)."""
    return flag(ArrOptions.crop_tokens, "the two-scale look's crop: this many native cells around the relevance peak, "
                                        "read at native resolution, one token a cell (256: 16x16 cells, 448 px on a "
                                        "square page)", bounded_int(MIN_CROP_TOKENS, MAX_CELLS))


def check_look(p: ArgumentParser, args, looks: list[str]) -> None:
    """Refuse --crop-tokens where no row looks at two scales (`looks`: the looks the command's ARR rows run), given on
    the command line at any value (ArgumentParser.given), and a crop over --max-cells."""
    if "crop_tokens" in p.given and "two_scale" not in looks:
        p.error("argument --crop-tokens: only used with the two_scale look")
    if args.crop_tokens > args.max_cells:
        p.error(f"argument --crop-tokens: {args.crop_tokens} exceeds --max-cells {args.max_cells}")


def faithfulness_steps_flag():
    """--faithfulness-steps, one flag for run and evaluate."""
    return flag(10, "points per faithfulness curve, minus one", bounded_int(1, 100))


def log(message: str) -> None:
    """Progress goes to stderr, so stdout holds only the command's results."""
    print(message, file=sys.stderr, flush=True)


def load_model(name: str, checkpoint: str | None, device: str | None, quiet: bool = False, fallback: bool = False):
    """
    ARRCOCQwen with its ARR layer, printing a line before and after loading, and the model's notice (none when
    quiet: torchrun's other ranks). With `fallback` (the default model, not asked for by name), a hub model that
    the hub cannot give and the cache lacks becomes the pocket model (load_vlm's "offline"), and its notice says so.
    The layer follows the one rule of arr_coc.relevance.layer.choose_checkpoint (as in the app). Returns (model, the
    checkpoint's name or checkpoints.PRIOR); model.vlm.name is the model that loaded.
    """
    import torch
    import transformers

    from arr_coc.relevance.layer import choose_checkpoint

    transformers.utils.logging.disable_progress_bar()  # stderr gets our lines, not download bars
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if not quiet:
        log(f"loading {name} on {device} ...")
    start = time.perf_counter()
    model = load_vlm(name, device, "offline" if fallback else None)
    folder = choose_checkpoint(checkpoint, model.vlm.family, model.vlm.hidden_size)
    model.layer = model.load_layer(folder) if folder is not None else model.prior_layer()
    if not quiet:
        log(f"loaded {model.vlm.name} in {time.perf_counter() - start:.1f} s (ARR layer: {checkpoints.label(folder)})")
        if model.notice:
            log(f"note: {model.notice}")
    return model, checkpoints.label(folder)


MODEL_FALLBACKS = (None, "offline", "any")  # load_vlm: when the pocket model stands in for the model asked for


def load_vlm(name: str, device: str | None, fallback: str | None = None):
    """
    ARRCOCQwen on the VLM `name` (its layer is the caller's to set), the one offline fallback of the commands and the
    app. A hub id is looked for on the hub only if one quick probe answers (hub_out_of_reach): else from the local
    cache alone, at once. A model that does not load is refused (refusal: ModelOffline, InputError), unless
    `fallback` lets the pocket model stand in, its notice naming `name` and why: "offline" (a command's default
    model) where the hub could not give it, "any" (the app) whatever the reason. An offline model is never replaced.
    """
    from arr_coc.model import ARRCOCQwen
    from arr_coc.vlm.tiny import TINY_MODELS

    if fallback not in MODEL_FALLBACKS:
        raise ValueError(f"fallback must be one of {MODEL_FALLBACKS}, got {fallback!r}")
    offline = hub_out_of_reach() if hub_model(name) else None
    try:
        return ARRCOCQwen.from_pretrained(name, device=device)
    except Exception as e:  # no network, no cache, a typo, a bad folder, not a Qwen-VL
        missing = bool(offline) and isinstance(e, OSError)  # the hub out of reach, and the cache lacks it
        if fallback is None or (fallback == "offline" and not missing) or name in TINY_MODELS or name == POCKET:
            raise refusal(name, e, offline) from None
        why = f"{offline}, and it is not in the local cache" if missing else f"{type(e).__name__}: {first_line(e)}"
        model = ARRCOCQwen.from_pretrained(POCKET, device=device)
        model.notice = f"Could not load the model {name!r}{typo_hint(name)}: {why}. {POCKET_NOTICE}"
        return model


def refusal(name: str, e: Exception, offline: str | None) -> Exception:
    """What a model that did not load is refused with: ModelOffline where the hub was out of reach and the cache
    lacks it, InputError for no such folder or hub model or one that is no Qwen-VL, else the error as it was."""
    from arr_coc.errors import ModelOffline

    if isinstance(e, InputError) or not isinstance(e, (OSError, ValueError)):
        return e
    if offline and isinstance(e, OSError):
        return ModelOffline(f"cannot load the model {name!r}: {offline}, and it is not in the local cache"
                            f"{typo_hint(name)}; {OFFLINE_HINT}", offline)
    return InputError(f"cannot load the model {name!r} ({first_line(e)}){typo_hint(name)}; {OFFLINE_HINT}")


def first_line(e: Exception) -> str:
    """An error's first line, at most 200 characters: what a one-line message quotes of it."""
    return (str(e).splitlines() or [""])[0][:200]


def typo_hint(name: str) -> str:
    """' (did you mean 'pocket'?)' where `name` is one letter or two off an offline model's name ('pockt'), else ''."""
    import difflib

    from arr_coc.vlm.tiny import TINY_MODELS

    near = difflib.get_close_matches(name, [POCKET, *TINY_MODELS], n=1, cutoff=0.75)
    return f" (did you mean {near[0]!r}?)" if near and near[0] != name else ""


def hub_model(name: str) -> bool:
    """Whether --model names a hub repo: no folder here, no offline model (tiny ones, pocket), a hub id's form."""
    from arr_coc.vlm.tiny import TINY_MODELS

    return name not in TINY_MODELS and name != POCKET and not Path(name).exists() and bool(HUB_ID.fullmatch(name))


def request(args, **row):
    """
    The one Request (arr_coc.pipelines.request) of a command's flags: every flag whose name is a Request field's
    (--max-new-tokens, --budget, --max-cells, --gestalt-tokens: those the command has), the pipelines' own settings'
    flags as their Options (Request.options): ARR's (arr_options.Options: --strategy, --refixate, --refixate-budget,
    --refixate-guide, --look, --crop-tokens, --fresh-cells, those the command has, and the adaptive budget's bounds,
    budget_settings, as its tensions) and a reducer's where the command has all its flags (--fastv-layer,
    --pixelprune-tau), and a row's own settings (`row`, by their names: its strategy, budget, ablation, ...) over
    them (with_settings: None, a setting's default).
    """
    from dataclasses import fields

    from arr_coc.flags import flag_fields
    from arr_coc.pipelines.request import Request, with_settings  # torch: only once the flags are parsed

    flags = {f.name: getattr(args, f.name) for f in fields(Request) if hasattr(args, f.name)}
    options = tuple(kind(**{f.name: getattr(args, f.name) for f in fields(kind) if hasattr(args, f.name)})
                    for kind in pipelines.OPTIONS if all(hasattr(args, f.name) for f in flag_fields(kind)))
    return with_settings(Request(**flags, options=options), {"tensions": budget_settings(args), **row})


def answer(model, image, question: str, pipeline: str, request, conversation=None):
    """The one place the commands ask the model for an answer, with the one Request of their flags (request(args));
    its second look (refixate, refixate_budget) reaches the arr pipeline only (the others have none). conversation:
    ask the question as its next turn (arr_coc.pipelines.conversation)."""
    from arr_coc.pipelines.request import with_settings

    if pipeline != "arr":
        request = with_settings(request, dict(refixate=None, refixate_budget=None))
    return model.answer(image, question, pipeline, request, conversation=conversation)


def versions() -> dict:
    """Versions of the packages that decide the numbers, for the JSON reports."""
    import arr_coc

    found = {"arr_coc": arr_coc.__version__}
    for package in ("torch", "transformers"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


# ----------------------------------------------------------------------------- console scripts (pyproject.toml)


def _script(module: str) -> int:
    """Run arr_coc.<module>.main(); a main that returns a report rather than an exit code succeeded."""
    code = importlib.import_module(f"arr_coc.{module}").main()
    return code if isinstance(code, int) else 0


def run() -> int:
    return _script("run")


def train() -> int:
    return _script("train")


def evaluate() -> int:
    return _script("evaluate")


def bench() -> int:
    return _script("bench")


def data() -> int:
    return _script("eval.data")


def serve() -> int:
    return _script("engines.serve")
