"""
argparse types, a parser whose errors are one line, and flag(): a command's config is a dataclass whose fields are
its flags (help, type, parse-time check in the field), read by config_parser and printed by flag_rows into
docs/commands.md. What every command, at any layer, builds its flags from. A bad flag is refused at parse time,
before torch or a model loads. Standard library only (torch loads only to ask whether --device cuda is there).

    @dataclass
    class Config:
        budget: int = flag(273, "number of saccades", bounded_int(1, 16384))
        kinds: str = flag("a", "which kinds", comma_list(("a", "b")))  # names(cfg.kinds)
    cfg = parse_config(Config, argv)  # --budget 300 --kinds a,b
"""

import argparse
import math
import sys
from dataclasses import MISSING, field, fields, make_dataclass
from pathlib import Path


def command_name() -> str:
    """How the user started this command, for messages: "python -m arr_coc.run", "arr-coc-run", "app.py"."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name.startswith("arr_coc."):  # python -m: argv[0] is the module's file
        return f"python -m {spec.name}"
    return Path(sys.argv[0]).name


NOT_GIVEN = object()  # ArgumentParser.given's mark of a flag the command line left out


class ArgumentParser(argparse.ArgumentParser):
    """
    argparse's parser, whose errors are one line: the reason (which names the flag), then where the flags are
    listed. argparse's own puts the whole usage block first, burying the reason under it. After a parse, `given`
    names the flags (their dests) that the command line gave, whatever their values: a flag that needs another is
    refused when given without it, even at its default value (`--turns 4` without --conversation).
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("prog", command_name())
        super().__init__(*args, **kwargs)
        self.given: frozenset[str] = frozenset()  # the last parse's flags given on the command line

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        parsed = super().parse_known_args(args, namespace)  # a bad flag is refused here, in one line
        # again, into a namespace that holds a mark for every flag already: argparse sets a default only where the
        # namespace lacks the name, so a mark left in place is a flag the command line did not give. A store
        # overwrites its mark; append and count build on theirs, so theirs is None (given: a list, a number)
        marks = {a.dest: NOT_GIVEN if isinstance(a, (argparse._StoreAction, argparse._StoreConstAction)) else None
                 for a in self._actions if a.dest != argparse.SUPPRESS}
        again, _ = super().parse_known_args(args, argparse.Namespace(**marks))
        self.given = frozenset(dest for dest, mark in marks.items() if getattr(again, dest) is not mark)
        return parsed


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
    parse.choices = tuple(choices)  # named in the help (config_parser)
    return parse


def names(text: str) -> list[str]:
    """A comma_list value -> its names ("" -> [])."""
    return [n for n in text.split(",") if n]


def device(text: str) -> str:
    """
    An argparse type: "cpu", "cuda" or "cuda:N", refused unless this machine has it. Torch loads only to ask
    about CUDA, so --device cpu and no --device stay torch-free at parse time.
    """
    name = text.strip().lower()
    kind, colon, index = name.partition(":")
    if name == "cpu":
        return name
    if kind != "cuda" or (colon and not index.isdigit()):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; choose cpu, cuda or cuda:N")
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise argparse.ArgumentTypeError(f"no CUDA GPU on this machine (torch {torch.__version__} finds none) for "
                                         f"{text!r}; use --device cpu, or leave --device out")
    if colon and int(index) >= count:
        raise argparse.ArgumentTypeError(f"no {text!r} on this machine: it has {count} CUDA GPU(s), cuda:0 .. "
                                         f"cuda:{count - 1}")
    return name


# ----------------------------------------------------------------------------- a command's config is its flags


def flag(default=None, help: str = "", type=None, *, metavar: str | None = None, required: bool = False,
         append: bool = False, group: str | None = None, shown: str | None = None):
    """
    A field of a command's config dataclass that is also its flag --field-name: its help text, its argparse type
    (a parse-time check: bounded_int, one_of, ...; str when None), and how the flag reads: `metavar`, `required`,
    `append` (given several times, a list), `group` (flags of one group exclude each other), `shown` (the default
    as docs/commands.md prints it, where the value itself depends on the machine). A False default is an on/off
    switch. A field without help is the command's own, never a flag.
    """
    meta = dict(help=help, type=type, metavar=metavar, required=required, append=append, group=group, shown=shown)
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def flag_fields(config) -> list:
    """The fields of a config dataclass that are flags, in --help's order."""
    return [f for f in fields(config) if "help" in f.metadata]


def with_flags_of(after: str, configs):
    """
    A class decorator for a command's config dataclass (above @dataclass): the flag fields of the dataclasses
    `configs` (the pipelines' Options, arr_coc.pipelines.OPTIONS: each pipeline declares its own settings once)
    inserted after its field `after`, in their order, so --help, the parse and docs/commands.md read them as its own.
    """
    def copy(f):
        return (f.name, f.type, field(default=f.default, default_factory=f.default_factory, metadata=f.metadata))

    def add(config):
        own = fields(config)
        if after not in [f.name for f in own]:
            raise ValueError(f"{config.__name__} has no field {after!r} to put its pipelines' options after")
        spec = []
        for f in own:
            spec += [copy(f)] + ([copy(o) for c in configs for o in flag_fields(c)] if f.name == after else [])
        return make_dataclass(config.__name__, spec, namespace={"__doc__": config.__doc__, "__module__":
                                                                config.__module__, "__qualname__": config.__qualname__})
    return add


def flag_help(f) -> str:
    """A flag's help, the names its type takes (one_of, comma_list) after it."""
    choices = getattr(f.metadata["type"], "choices", None)
    return f.metadata["help"] + (f" ({', '.join(map(str, choices))})" if choices else "")


def default_of(f):
    """A field's default value (a fresh list where it has a factory)."""
    return f.default_factory() if f.default is MISSING else f.default


def config_parser(config, description: str | None = None) -> ArgumentParser:
    """The one-line-error parser of a config dataclass's flags (flag_fields), in their order."""
    p = ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    groups = {}
    for f in flag_fields(config):
        meta, name = f.metadata, "--" + f.name.replace("_", "-")
        if meta["group"] and meta["group"] not in groups:
            groups[meta["group"]] = p.add_mutually_exclusive_group()
        to = groups[meta["group"]] if meta["group"] else p
        help = flag_help(f).replace("%", "%%")  # argparse formats help with %
        if default_of(f) is False:
            to.add_argument(name, action="store_true", help=help)
            continue
        extra = dict(metavar=meta["metavar"]) if meta["metavar"] else {}
        to.add_argument(name, type=meta["type"] or str, default=default_of(f), required=meta["required"],
                        action="append" if meta["append"] else "store", help=help, **extra)
    return p


def check_fresh_folder(parser: argparse.ArgumentParser, folder: str, overwrite: bool, flag: str = "--out") -> None:
    """Refuse, in one line and exit 2, writing into `folder` where it already holds files, unless --overwrite says
    to (train's checkpoint folder, arr_coc.eval.data's dataset): nothing is overwritten silently."""
    path = Path(folder)
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        parser.error(f"argument {flag}: {folder} already exists and is not empty; pass --overwrite to write into it, "
                     "or choose another folder")


def parse_config(config, argv=None, parser: ArgumentParser | None = None):
    """The config dataclass `config` of the command line argv (sys.argv when None), refused in one line if bad."""
    parser = parser or config_parser(config)
    return config(**vars(parser.parse_args(argv)))


def flag_rows(config) -> list[tuple[str, str, str]]:
    """docs/commands.md's rows of a config's flags: (flag and its metavar, default, what), as --help reads them."""
    rows = []
    for f in flag_fields(config):
        meta, name, value = f.metadata, "--" + f.name.replace("_", "-"), default_of(f)
        switch = value is False
        usage = name if switch else f"{name} {meta['metavar'] or f.name.upper()}"
        if meta["shown"] is not None:
            shown = meta["shown"]
        elif meta["required"]:
            shown = "required"
        elif switch:
            shown = "off"
        elif value is None:
            shown = "–"
        else:
            shown = f"`{','.join(map(str, value)) if isinstance(value, (list, tuple)) else value}`"
        rows.append((f"`{usage}`", shown, flag_help(f)))
    return rows


# ----------------------------------------------------------------------------- the flags every command shares


def device_flag(torchrun: bool = False):
    """--device, one flag for every command that loads a model (`torchrun`: one that runs under it too)."""
    return flag(None, "cpu, cuda or cuda:N (default: cuda when available"
                      + ("; under torchrun each process takes cuda:LOCAL_RANK)" if torchrun else ")"), device)


def seed_flag(default: int, what: str):
    """--seed, one flag for every command that draws or shuffles: `what` it seeds."""
    return flag(default, f"seed of {what}", bounded_int(0, 2**32 - 1))
