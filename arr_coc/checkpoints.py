"""
Which ARR checkpoint to use: one resolver and one default rule for the app and every command.

A checkpoint is named by a folder, a name under checkpoints/ (e.g. "tiny-text-vs-distractor") or a hub
repo id; "prior" means the untrained layer. With no checkpoint asked for, the default is the first
checkpoint in checkpoints/ made for the loaded model (its config.json names the model family and hidden
size), else the untrained prior.

    folder = choose(None, model.vlm.family, model.vlm.hidden_size)   # None: the untrained prior
    model.layer = model.load_layer(folder) if folder else model.prior_layer()

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


def default_checkpoint(model_family: str, hidden_size: int, root: Path = ROOT) -> str | None:
    """The first checkpoint under root whose config.json was made for this model (its folder), else None."""
    from arr_coc.relevance.layer import CheckpointError, list_checkpoints, read_checkpoint_config

    for name in list_checkpoints(root):
        try:
            config = read_checkpoint_config(Path(root) / name)
        except CheckpointError:
            continue  # unreadable: not a candidate for the default
        if config.base_model_family == model_family and config.hidden_size == hidden_size:
            return str(Path(root) / name)
    return None


def choose(requested: str | None, model_family: str, hidden_size: int, root: Path = ROOT) -> str | None:
    """The checkpoint to load (folder or hub id), or None for the untrained prior."""
    if requested in PRIOR_NAMES:
        return None
    if requested:
        return resolve_checkpoint(requested, root)
    return default_checkpoint(model_family, hidden_size, root)


def label(checkpoint: str | None) -> str:
    """A checkpoint's short name, as the app's dropdown and the reports show it."""
    return PRIOR if checkpoint is None else (Path(checkpoint).name if Path(checkpoint).is_dir() else checkpoint)
