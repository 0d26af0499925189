"""
Which attention the prior pass reads (issue 61, part 2): the decoder layer, the heads and the query rows of the
question->gestalt attention, and whether it is divided by a generic question's map (ViCrop's relative attention,
Zhang et al. 2025). It is chosen once per model on synthetic pages with known boxes (arr_coc.distill.prior;
`python -m arr_coc.commands.prior`) and saved as PRIOR_FILE in the model's folder, or for a hub id under
checkpoints/priors/ (prior_file); the VLM reads it at load (arr_coc.vlm.families.load_vlm). Where none exists,
DEFAULT is today's choice: every head averaged over the question's rows (from the one after the last
<|vision_end|> to the end of the prompt) at the pipeline's middle layer.

    readout = PriorReadout.load(prior_file("models/pocket-qwen2-vl"))      # None where the model has none
    weights = row_weights(readout.rows, question_start=130, question_tokens=9, length=145)   # [145]
    heads = head_weights(readout.heads, 4)                                  # [4], sums to 1
    attention = relative_attention(question_map, generic_map) if readout.relative else question_map
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from arr_coc.checkpoints import shipped

PRIOR_FILE = "prior.json"  # a model's calibrated prior readout, in its folder
PRIORS = shipped("checkpoints") / "priors"  # hub models' readouts: <owner>--<name>.json
ROWS = ("all", "question_mean", "question_last", "prompt_last")  # the query rows a readout may average: every row
# after the image block (today's), the question's own tokens, the question's last token, the prompt's last token
GENERIC_QUESTION = "Write a general description of the image."  # ViCrop's generic question (relative attention)
RELATIVE_FLOOR = 1e-3  # relative attention divides by max(generic, this x the generic map's mean): no 0 divides


@dataclass(frozen=True)
class PriorReadout:
    """Which attention of the prior pass becomes the prior; saved as PRIOR_FILE. The defaults are today's."""
    layer: int | None = None  # the decoder layer read (None: PipelineConfig.prior_layer_fraction of the depth)
    heads: tuple[int, ...] = ()  # the query heads averaged (empty: every head)
    rows: str = "all"  # which query rows are averaged (one of ROWS)
    relative: bool = False  # divide by GENERIC_QUESTION's map at the same layer, heads and rows (a second pass)
    model: str = ""  # the VLM it was chosen for (its name as loaded; "" for the default)
    pages: int = 0  # calibration pages it was chosen on
    budget: int = 0  # the top cells whose box recall chose it
    recall: float | None = None  # its mean box recall there
    default_recall: float | None = None  # DEFAULT's mean box recall on the same pages
    scores: dict = field(default_factory=dict, compare=False)  # every candidate's mean recall, by describe()

    def __post_init__(self):
        if self.rows not in ROWS:
            raise ValueError(f"rows must be one of {', '.join(ROWS)}, got {self.rows!r}")

    @property
    def choice(self) -> tuple:
        """What the prior pass reads by it (layer, heads, rows, relative): two readouts read alike when equal."""
        return self.layer, self.heads, self.rows, self.relative

    def describe(self) -> str:
        """'layer 2, heads 0, question_last' (as logs and the candidates' scores name it)."""
        layer = "the middle layer" if self.layer is None else f"layer {self.layer}"
        heads = "every head" if not self.heads else "heads " + ",".join(map(str, self.heads))
        return f"{layer}, {heads}, {self.rows}" + (", relative" if self.relative else "")

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "PriorReadout | None":
        """The readout saved at path, None where there is no file (a broken one is an error naming it)."""
        path = Path(path)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(**{**data, "heads": tuple(data["heads"])})
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path} is no prior readout ({type(e).__name__}: {e})") from None


DEFAULT = PriorReadout()  # today's prior: every head, every row after the image, the middle layer


def prior_file(model: str | Path) -> Path:
    """Where a model's readout lives: a folder's own PRIOR_FILE, else (a hub id) PRIORS/<owner>--<name>.json."""
    if Path(model).is_dir():
        return Path(model) / PRIOR_FILE
    return PRIORS / (str(model).replace("/", "--") + ".json")


def prior_index(readout: PriorReadout, layer_fraction: float, num_layers: int) -> int:
    """The decoder layer the prior pass reads: the readout's, else layer_fraction of the depth (the last at most)."""
    if readout.layer is not None:
        return readout.layer
    return min(num_layers - 1, int(layer_fraction * num_layers))


def row_weights(rows: str, question_start: int, question_tokens: int, length: int) -> torch.Tensor:
    """The weight of each prompt position [length] in the prior's mean over query rows (sums to 1): the question's
    tokens are [question_start, question_start + question_tokens), the chat template's tail follows to the end."""
    first, last = {"all": (question_start, length),
                   "question_mean": (question_start, question_start + question_tokens),
                   "question_last": (question_start + question_tokens - 1, question_start + question_tokens),
                   "prompt_last": (length - 1, length)}[rows]
    weights = torch.zeros(length)
    weights[first:last] = 1.0 / (last - first)
    return weights


def head_weights(heads: tuple[int, ...], num_heads: int) -> torch.Tensor:
    """The weight of each query head [num_heads] in the prior's mean (sums to 1): the chosen ones, else all."""
    weights = torch.zeros(num_heads)
    chosen = list(heads) or list(range(num_heads))
    if min(chosen) < 0 or max(chosen) >= num_heads:
        raise ValueError(f"heads must be in 0..{num_heads - 1}, got {list(heads)}")
    weights[chosen] = 1.0 / len(chosen)
    return weights


def relative_attention(question: torch.Tensor, generic: torch.Tensor) -> torch.Tensor:
    """ViCrop's relative attention on the gestalt tokens: the question's map [Ng] over the generic question's [Ng],
    rescaled to the question's total mass -> [Ng]."""
    ratio = question / generic.clamp(min=RELATIVE_FLOOR * float(generic.mean().clamp(min=1e-12)))  # [Ng]
    return ratio * (question.sum() / ratio.sum().clamp(min=1e-12))
