"""
Where the shipped folders are, what the checkpoints are called, and whether the HuggingFace hub can be asked now:
a utility, importing nothing of the project.

A checkpoint is named by a folder, a name under checkpoints/ (e.g. "tiny-text-vs-distractor") or a hub
repo id; "prior" means the untrained layer. Which checkpoint a model gets when none is asked for is the relevance
layer's rule, arr_coc.relevance.layer.choose_checkpoint: the first made for it (its config.json) whose evidence.json
says it passes DefaultRule (issue 61: it beats the untrained prior on the held-out families), else the prior.
python -m arr_coc.commands.evidence measures a folder and writes that file; evidence_passes reads it.

    folder = resolve_checkpoint("tiny-text-vs-distractor")   # checkpoints/tiny-text-vs-distractor, from anywhere
    label(folder), label(None)                               # "tiny-text-vs-distractor", PRIOR
    evidence_passes(folder)                                  # False: no evidence.json there

The shipped checkpoints are the repo's checkpoints/ folder, or after `pip install .` the copy inside the
package (setup.py installs it as arr_coc/shipped/checkpoints): `shipped(name)` finds either, from any folder.

The hub: one quick probe instead of transformers' and datasets' retries (about 35 s each) for nothing, under every
command and set loader; out of reach, the process goes offline.

    reason = hub_out_of_reach()   # None: the hub answers; else why not (the process is now offline)
"""

import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent  # arr_coc/, in the repo or where pip installed it


def shipped(name: str, package: Path = PACKAGE) -> Path:
    """
    A folder the repo ships beside the package ("checkpoints", "models"): the copy `pip install .` put inside
    the package (setup.py's SHIPPED), else the repo's own, beside arr_coc/.
    """
    installed = package / "shipped" / name
    return installed if installed.is_dir() else package.parent / name


ROOT = shipped("checkpoints")  # the shipped checkpoints, found by name (--checkpoint tiny-text-vs-distractor)
CONFIG_FILE = "config.json"  # a checkpoint folder's ARRCOCConfig
WEIGHTS_FILE = "model.safetensors"  # its weights
EVIDENCE_FILE = "evidence.json"  # what python -m arr_coc.commands.evidence measured of it: whether it may be a default

# the offline model (--model pocket), trained by arr_coc.pocket.train: its name, folder and notice live here, beside
# the other shipped folders, so that loading it loads nothing of its trainer
POCKET = "pocket"  # --model pocket
POCKET_FOLDER = shipped("models") / "pocket-qwen2-vl"  # the repo's folder, or the copy `pip install .` ships
POCKET_STATE = POCKET_FOLDER / "training_state.json"  # its trainer's record: the one source of its accuracy
POCKET_KINDS = ("fine_print", "box_word", "shape_colour")  # the suite's question kinds


def pocket_accuracy(state_file: Path = POCKET_STATE) -> dict | None:
    """
    The shipped weights' held-out check at 896 px, as training_state.json records it (the numbers the README's
    and the model card's tables give): {"step", "pages", "full": {kind: fraction}}; the check at the shipped step
    with the most pages, else the latest; None where the file has none.
    """
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        checks = [c for c in state["heldout"] if "full" in c["accuracy"].get("896", {})]
        shipped = [c for c in checks if c["step"] == state["step"]] or checks
        check = max(shipped, key=lambda c: (c["step"], c.get("pages", 0)))
        return dict(step=check["step"], pages=check.get("pages"), full=check["accuracy"]["896"]["full"])
    except (OSError, ValueError, KeyError, TypeError):  # no record, or not one the trainer writes
        return None


def pocket_notice(state_file: Path = POCKET_STATE) -> str:
    """What the app's banner and the commands' note say of the pocket model, its numbers read from state_file."""
    said = ("Running pocket-qwen2-vl, the offline model (--model pocket): a 10M-parameter Qwen2-VL trained here from "
            "scratch on synthetic fine-print scenes (arr_coc.synth.fineprint). Its answers are real on such scenes "
            "and meaningless on any other image. ")
    check = pocket_accuracy(state_file)
    if check is None or not all(kind in check["full"] for kind in POCKET_KINDS):
        return said + "Its model card gives how often it is right. It says nothing about real Qwen-VL."
    fine, word, colour = (f"{check['full'][kind]:.2f}" for kind in POCKET_KINDS)
    pages = f", {check['pages']} held-out pages a kind" if check["pages"] else ""
    return (said + f"At 896 px its full view reads {fine} of the suite's fine-print values, {word} of its box words "
            f"and {colour} of its shape colours (step {check['step']}{pages}: models/pocket-qwen2-vl/"
            "training_state.json, as in the README and its model card). It says nothing about real Qwen-VL.")


POCKET_NOTICE = pocket_notice()  # the banner, read once at import

PRIOR = "prior (untrained)"  # how the untrained layer is shown; "prior" also asks for it
PRIOR_NAMES = ("prior", PRIOR)


def resolve_checkpoint(name: str, root: Path = ROOT) -> str:
    """A folder as given, else a name under root, else the name itself (a hub repo id, fetched on load)."""
    if Path(name).is_dir():
        return name
    local = Path(root) / name
    return str(local) if local.is_dir() else name


def label(checkpoint: str | None) -> str:
    """A checkpoint's short name, as the app's dropdown and the reports show it."""
    return PRIOR if checkpoint is None else (Path(checkpoint).name if Path(checkpoint).is_dir() else checkpoint)


@dataclass(frozen=True)
class DefaultRule:
    """The scale at which a layer must beat the untrained prior to be its model's default (issue 61): on every
    held-out layout family, box recall at `budget` saccades above the prior's with the 95% intervals apart, and no
    kind's exact match below the prior's with the intervals apart (arr_coc.commands.evidence judges it)."""
    size: int = 896  # page area, about size^2 px
    pages: int = 96  # at least this many pages a kind and family
    budget: int = 64  # saccades


RULE = DefaultRule()


def file_digests(folder: str | Path) -> dict[str, str | None]:
    """The sha256 of a checkpoint's config.json and weights (None for a missing file): what its evidence was
    measured on, so that evidence of other weights or another config counts for nothing."""
    def digest(path: Path) -> str | None:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None

    return {name: digest(Path(folder) / name) for name in (CONFIG_FILE, WEIGHTS_FILE)}


def evidence_passes(folder: str | Path) -> bool:
    """Whether folder/evidence.json says the layer passes the rule: its verdict passes, under RULE as it stands, on
    these very files (file_digests). No file, a failing, stale or unreadable one: False."""
    try:
        evidence = json.loads((Path(folder) / EVIDENCE_FILE).read_text(encoding="utf-8"))
        return (evidence["verdict"]["passes"] is True and evidence["rule"] == asdict(RULE)
                and evidence["files"] == file_digests(folder))
    except (OSError, ValueError, KeyError, TypeError):
        return False


# ----------------------------------------------------------------------------- the hub

HUB_TIMEOUT_S = 3.0  # how long the hub may take to answer before a command goes offline
_OFFLINE: dict[str, str] = {}  # "reason": why this process went offline (go_offline), for the messages


def hub_out_of_reach() -> str | None:
    """
    Why the hub cannot be asked now, or None when it answers: HF_HUB_OFFLINE=1, or no answer to one request
    within HUB_TIMEOUT_S. Out of reach, the process goes offline (go_offline), so that transformers and datasets
    read their local caches at once instead of waiting out their retries (about 35 s) for nothing.
    """
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return _OFFLINE.get("reason", "HF_HUB_OFFLINE=1 is set")
    if hub_answers(constants.ENDPOINT):
        return None
    go_offline(f"the hub ({constants.ENDPOINT}) cannot be reached")
    return _OFFLINE["reason"]


def hub_answers(endpoint: str, timeout: float = HUB_TIMEOUT_S) -> bool:
    """Whether the hub answers one HEAD request, whatever its status, within `timeout` (proxies as configured)."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(endpoint, timeout=timeout)
        return True
    except Exception:  # no network, no name resolution, a refusing proxy, a timeout: nothing would load from there
        return False


def go_offline(reason: str) -> None:
    """This process from now on as under HF_HUB_OFFLINE=1: huggingface_hub and transformers read the flag at each
    request; datasets copies it when imported, so an imported one is told too."""
    from huggingface_hub import constants

    _OFFLINE["reason"] = reason
    constants.HF_HUB_OFFLINE = True
    if (datasets := sys.modules.get("datasets")) is not None:
        datasets.config.HF_HUB_OFFLINE = True
