"""
Where the shipped folders are and what the checkpoints are called: a utility, importing nothing of the project.

A checkpoint is named by a folder, a name under checkpoints/ (e.g. "tiny-text-vs-distractor") or a hub
repo id; "prior" means the untrained layer. Which checkpoint a model gets when none is asked for (the first made
for it, read from its config.json) is the relevance layer's rule, arr_coc.relevance.layer.choose_checkpoint.

    folder = resolve_checkpoint("tiny-text-vs-distractor")   # checkpoints/tiny-text-vs-distractor, from anywhere
    label(folder), label(None)                               # "tiny-text-vs-distractor", PRIOR

The shipped checkpoints are the repo's checkpoints/ folder, or after `pip install .` the copy inside the
package (setup.py installs it as arr_coc/shipped/checkpoints): `shipped(name)` finds either, from any folder.
"""

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

# the offline model (--model pocket), trained by arr_coc.pocket.train: its name, folder and notice live here, beside
# the other shipped folders, so that loading it loads nothing of its trainer
POCKET = "pocket"  # --model pocket
POCKET_FOLDER = shipped("models") / "pocket-qwen2-vl"  # the repo's folder, or the copy `pip install .` ships
POCKET_NOTICE = ("Running pocket-qwen2-vl, the offline model (--model pocket): a 10M-parameter Qwen2-VL trained here "
                 "from scratch on synthetic fine-print scenes (arr_coc.synth.fineprint). Its answers are real on such "
                 "scenes and meaningless on any other image. It is still in training: it names the boxes' words and "
                 "the shapes' colours (two in three where a shape lies over print), reads about five in six of the "
                 "suite's fine-print values at 896 px (see its model card), and says nothing about real Qwen-VL.")

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
