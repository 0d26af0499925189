"""
Serving numbers: requests per second and time to first token (p50, p99) at several concurrencies, ARR-COC through
the vLLM plugin against stock Qwen2-VL on vLLM at its native view, each on its own server with the same settings.
Run it in the vLLM venv (requirements-vllm.txt) on pages made by arr_coc.eval.data:

    .venv/bin/python -m arr_coc.eval.data --out out/pages-1792 --n 25 --kinds fine_print --size 1792 --seed 1
    .venv-vllm/bin/python -m arr_coc.engines.vllm_bench --data out/pages-1792 --concurrency 1,4,8 --requests 8

Each concurrency level sends its own `--requests` pages (so no level reads another's from a cache), streamed, greedy,
at most --max-tokens tokens; a warm-up request first. A markdown table goes to stdout; --out also writes the
settings and each level's numbers (every request's time to first token too) as JSON.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from arr_coc.commands.cli import model_flag
from arr_coc.engines.vllm_plugin import ARCHITECTURE
from arr_coc.flags import bounded_int, comma_list, config_parser, flag, int_list, parse_config

STOCK = "Qwen2VLForConditionalGeneration"  # vLLM's own Qwen2-VL: the native view (its processor's smart_resize)


@dataclass
class Level:
    """One concurrency level's measurements."""
    architecture: str  # the served architecture
    concurrency: int  # requests in flight at once
    requests: int  # requests sent
    per_second: float  # requests finished per second of wall time
    ttft_p50_ms: float  # median time to first token
    ttft_p99_ms: float  # 99th percentile time to first token (nearest rank)
    prompt_tokens: float  # mean prompt tokens a request
    ttft_ms: list[float] = field(default_factory=list)  # each request's time to first token, in the pages' order


def server_command(model: str, port: int, architecture: str, max_model_len: int) -> list[str]:
    """The OpenAI-compatible server: fp32, eager, prefix caching off (every request pays its prefill), one setting
    list for both architectures."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--dtype", "float32",
            "--enforce-eager", "--port", str(port), "--host", "127.0.0.1", "--max-model-len", str(max_model_len),
            "--gpu-memory-utilization", "0.1", "--no-enable-prefix-caching",
            "--hf-overrides", json.dumps({"architectures": [architecture]})]


@contextmanager
def serving(command: list[str], port: int, log: Path, timeout: float = 900):
    """A server started in its own session, up (/health) before the block, stopped after it."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        start = time.monotonic()
        while True:
            if process.poll() is not None or time.monotonic() - start > timeout:
                raise RuntimeError(f"the server did not come up; its log: {log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                time.sleep(2)
        yield
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=120)


async def one(client, model: str, page: dict, max_tokens: int) -> tuple[float, int]:
    """One streamed chat request -> (seconds to its first content token, its prompt tokens)."""
    url = "data:image/png;base64," + base64.b64encode(Path(page["path"]).read_bytes()).decode()
    start, first, prompt = time.perf_counter(), None, 0
    stream = await client.chat.completions.create(
        model=model, temperature=0, max_tokens=max_tokens, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                               {"type": "text", "text": page["question"]}]}])
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
        if chunk.usage:
            prompt = chunk.usage.prompt_tokens
    return (first if first is not None else time.perf_counter() - start), prompt


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-th percentile."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))]


async def level(port: int, architecture: str, pages: list[dict], concurrency: int, max_tokens: int) -> Level:
    """`pages` sent with at most `concurrency` in flight -> the level's numbers."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=3600)
    model = (await client.models.list()).data[0].id
    gate = asyncio.Semaphore(concurrency)

    async def gated(page):
        async with gate:
            return await one(client, model, page, max_tokens)

    start = time.perf_counter()
    results = await asyncio.gather(*(gated(page) for page in pages))
    wall = time.perf_counter() - start
    ttfts = [r[0] * 1000 for r in results]
    return Level(architecture, concurrency, len(pages), len(pages) / wall, percentile(ttfts, 50), percentile(ttfts, 99),
                 sum(r[1] for r in results) / len(results), ttfts)


def table(levels: list[Level]) -> str:
    """The levels as a markdown table."""
    lines = ["| served | concurrency | requests | requests/s | TTFT p50 ms | TTFT p99 ms | prompt tokens |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {'ARR-COC plugin' if x.architecture == ARCHITECTURE else 'stock Qwen2-VL'} | {x.concurrency} | "
              f"{x.requests} | {x.per_second:.3f} | {x.ttft_p50_ms:.0f} | {x.ttft_p99_ms:.0f} | {x.prompt_tokens:.0f} |"
              for x in levels]
    return "\n".join(lines)


def pages_of(folder: Path) -> list[dict]:
    rows = [json.loads(line) for line in (folder / "data.jsonl").read_text().splitlines()]
    return [{"path": str(folder / row["image"]), "question": row["question"]} for row in rows]


@dataclass
class ServingBenchConfig:
    """The serving bench's flags, each field one (arr_coc.flags.flag)."""
    data: Path = flag(None, "a folder made by arr_coc.eval.data (data.jsonl, images/)", Path, required=True)
    model: str = model_flag("models/pocket-qwen2-vl", "the model both servers load",
                            "Default: models/pocket-qwen2-vl.")
    concurrency: list[int] = flag([1, 4, 8], "requests in flight, one level each, comma-separated", int_list(1, 256))
    requests: int = flag(8, "requests per level (each level its own pages)", bounded_int(1, 10**4))
    max_tokens: int = flag(16, "at most this many generated tokens a request", bounded_int(1, 4096))
    max_model_len: int = flag(8192, "both servers' --max-model-len", bounded_int(256, 2**20))
    port: int = flag(8391, "the port each server listens on, in turn", bounded_int(1024, 65535))
    served: str = flag(f"{STOCK},{ARCHITECTURE}", "the architectures to serve, in turn",
                       comma_list((STOCK, ARCHITECTURE)))
    log_dir: Path = flag(Path("out/vllm-bench"), "where each server's log goes", Path)
    out: Path | None = flag(None, "also write the levels here as JSON (the settings and one row a level), after each "
                            "level", Path)


def write_json(path: Path, args: ServingBenchConfig, levels: list[Level]) -> None:
    """The run's settings and its levels so far, as one JSON object."""
    from dataclasses import asdict

    settings = {"data": str(args.data), "model": args.model, "concurrency": args.concurrency,
                "requests": args.requests, "max_tokens": args.max_tokens, "max_model_len": args.max_model_len,
                "served": args.served.split(",")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"settings": settings, "levels": [asdict(x) for x in levels]}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    args = parse_config(ServingBenchConfig, argv, config_parser(ServingBenchConfig, __doc__))
    levels_asked = args.concurrency
    pages = pages_of(args.data)
    need = 1 + args.requests * len(levels_asked)
    if len(pages) < need:
        raise SystemExit(f"--data has {len(pages)} pages; {need} are needed (a warm-up and --requests per level)")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    levels = []
    for architecture in args.served.split(","):
        command = server_command(args.model, args.port, architecture, args.max_model_len)
        with serving(command, args.port, args.log_dir / f"{architecture}.log"):
            asyncio.run(level(args.port, architecture, pages[:1], 1, args.max_tokens))  # warm-up
            for i, concurrency in enumerate(levels_asked):
                chunk = pages[1 + i * args.requests: 1 + (i + 1) * args.requests]
                levels.append(asyncio.run(level(args.port, architecture, chunk, concurrency, args.max_tokens)))
                print(table(levels[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
                if args.out:
                    write_json(args.out, args, levels)
    print(table(levels))


if __name__ == "__main__":
    main()
