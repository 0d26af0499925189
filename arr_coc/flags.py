"""
argparse types and a parser whose errors are one line: what every command, at any layer, builds its flags from.
A bad flag is refused at parse time, before torch or a model loads. Standard library only.

    p = ArgumentParser(description=__doc__)
    p.add_argument("--budget", type=bounded_int(1, 16384), default=273, help="number of saccades")
    p.add_argument("--kinds", type=comma_list(("a", "b")), default="a", help="which kinds")  # names(args.kinds)
"""

import argparse
import math
import sys
from pathlib import Path


def command_name() -> str:
    """How the user started this command, for messages: "python -m arr_coc.run", "arr-coc-run", "app.py"."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.startswith("arr_coc."):  # python -m: argv[0] is the module's file
        return f"python -m {spec.name}"
    return Path(sys.argv[0]).name


class ArgumentParser(argparse.ArgumentParser):
    """
    argparse's parser, whose errors are one line: the reason (which names the flag), then where the flags are
    listed. argparse's own puts the whole usage block first, burying the reason under it.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("prog", command_name())
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def bounded_int(lo: int, hi: int):
    """An argparse type: an integer in [lo, hi]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be between {lo} and {hi}, got {value}")
        return value
    parse.__name__ = "integer"  # argparse names the type in its own messages
    return parse


def bounded_float(lo: float, hi: float = math.inf, above: bool = False):
    """An argparse type: a finite number in [lo, hi] (in (lo, hi] with above=True)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < lo or (above and value == lo) or value > hi:
            low = f"> {lo}" if above else f">= {lo}"
            raise argparse.ArgumentTypeError(f"must be {low}" + (f" and <= {hi}" if hi < math.inf else "")
                                             + f", got {text}")
        return value
    parse.__name__ = "number"
    return parse


def int_list(lo: int, hi: int):
    """An argparse type: comma-separated integers in [lo, hi] -> list[int]."""
    one = bounded_int(lo, hi)

    def parse(text: str) -> list[int]:
        values = [one(v) for v in text.split(",") if v.strip()]
        if not values:
            raise argparse.ArgumentTypeError("expected at least one integer")
        return values
    parse.__name__ = "integers"
    return parse


def comma_list(choices, allow_empty: bool = False):
    """An argparse type: comma-separated names from `choices`, returned cleaned as "a,b" (callers split it)."""
    def parse(text: str) -> str:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in choices]
        if unknown or (not names and not allow_empty):
            raise argparse.ArgumentTypeError(f"unknown {unknown or 'empty list'}; choose from {','.join(choices)}")
        return ",".join(names)
    parse.__name__ = "list"
    return parse


def one_of(choices):
    """An argparse type: one of `choices` (a flag a dataclass declares, where argparse's choices= cannot go)."""
    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"unknown {text!r}; choose from {', '.join(choices)}")
        return text
    parse.__name__ = "choice"
    return parse


def names(text: str) -> list[str]:
    """A comma_list value -> its names ("" -> [])."""
    return [n for n in text.split(",") if n]
