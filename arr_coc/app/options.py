"""
The app's flags, as one dataclass (arr_coc.flags.flag: each field's help and parse-time check); app.py parses them
before gradio and torch load, and docs/commands.md's table is generated from them (arr_coc.commands.docs).

    cfg = parse_args(["--model", "pocket", "--port", "8000"])   # AppConfig(model="pocket", port=8000, ...)

and the pipeline dropdowns' choices, read from the registry's records (arr_coc.pipelines): choices(DROPDOWNS[...]).
"""

import os
from dataclasses import dataclass

from arr_coc import pipelines
from arr_coc.commands import cli
from arr_coc.flags import bounded_int, config_parser, flag, parse_config
from arr_coc.settings import DEFAULT_MODEL

CACHE_AGE_S = 3600  # uploads and drawings leave gradio's cache an hour after they were written (--cache-age)
UPLOAD_CACHE_MB = 1024  # the uploads gradio's cache keeps, at most: the oldest go first (--upload-cache-mb)
QUEUE_SIZE = 64  # events gradio's queue holds at most, from every client together (--queue-size)
SESSION_JOBS = 4  # events one session may have waiting in it (--session-jobs): a page sends one at a time
PORT = 7860  # gradio's own default port
NO_REDUCER = "none"  # the Microscope's reducer choice that draws none
DESCRIPTION = "ARR-COC microscope: the Gradio app."


@dataclass
class AppConfig:
    """`python app.py`'s flags, each field one."""
    model: str | None = cli.model_flag(use="the VLM the app serves", then=(
        f"Default: $ARR_COC_MODEL, else {DEFAULT_MODEL}; one that cannot be loaded falls back to pocket with a banner"))
    checkpoint: str | None = cli.checkpoint_flag()
    port: int | None = flag(None, f"port to serve on, a free one (default: $GRADIO_SERVER_PORT or {PORT})",
                            bounded_int(1, 65535), shown=f"`{PORT}`")
    share: bool = flag(False, "also serve on a public gradio.live link (off by default: anyone with it can use your "
                              "GPU)")
    cache_age: int = flag(CACHE_AGE_S, "delete uploads and drawn images from gradio's cache ($GRADIO_TEMP_DIR) this "
                                       "long after they were written, and all of them when the app stops (default: "
                                       f"{CACHE_AGE_S})", bounded_int(1, 7 * 86400), metavar="SECONDS")
    upload_cache_mb: int = flag(UPLOAD_CACHE_MB, "keep at most this many MB of uploads in gradio's cache: each upload "
                                                 "first deletes the oldest ones past it (anyone can upload, with no "
                                                 f"session; default: {UPLOAD_CACHE_MB})", bounded_int(1, 1024 * 1024),
                                metavar="MB")
    queue_size: int = flag(QUEUE_SIZE, "at most this many requests wait in the queue, from every client together; "
                                       f"one more is told the queue is full (default: {QUEUE_SIZE})",
                           bounded_int(1, 100_000))
    session_jobs: int = flag(SESSION_JOBS, "at most this many requests of one browser session wait in the queue; "
                                           f"one more is refused in one line (default: {SESSION_JOBS})",
                             bounded_int(1, 1000))


def parse_args(argv: list[str] | None = None, host: str = "127.0.0.1", port_free=lambda host, port: True) -> AppConfig:
    """The app's flags; the model and port left out are read from the environment ($ARR_COC_MODEL,
    $GRADIO_SERVER_PORT); a port that `port_free` says is taken on `host` is refused now, not after the model
    loaded."""
    p = config_parser(AppConfig, DESCRIPTION)
    cfg = parse_config(AppConfig, argv, p)
    cfg.model = cfg.model or os.environ.get("ARR_COC_MODEL", DEFAULT_MODEL)
    cfg.port = cfg.port or int(os.environ.get("GRADIO_SERVER_PORT", PORT))
    if not port_free(host, cfg.port):
        p.error(f"argument --port: {cfg.port} is in use on {host}")
    return cfg


DROPDOWNS = ("compare", "microscope", "chat")  # the app's pipeline dropdowns: Compare's baseline, the Microscope's
# reducer, Chat's baseline


def choices(dropdown: str) -> list[str]:
    """A pipeline dropdown's choices, from the registry: Compare's every baseline; the Microscope's none or a
    reducer (whose kept cells it draws); Chat's the baselines that hold a conversation (not the fast-engine-only)."""
    if dropdown == "compare":
        return list(pipelines.BASELINES)
    if dropdown == "microscope":
        return [NO_REDUCER, *pipelines.REDUCERS]
    if dropdown == "chat":
        return [b for b in pipelines.BASELINES if b not in pipelines.FAST_ENGINE_ONLY]
    raise KeyError(f"unknown dropdown {dropdown!r}: one of {', '.join(DROPDOWNS)}")
