"""
Benchmarks: the ARR relevance layer alone, then the four pipelines end to end, with memory.

Latency and memory do not depend on weight values, so on a GPU the full-size Qwen2-VL-2B architecture
with random weights stands in for the real model (--random-weights). Timings are medians of CUDA-
synchronised runs after warm-up; every decode generates exactly --new-tokens tokens.

    python -m arr_coc.bench --model tiny                              # CPU smoke run
    python -m arr_coc.bench --random-weights --json out/bench.json    # on a GPU: the numbers in the README
"""

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from arr_coc.model import PIPELINES, ARRCOCQwen
from arr_coc.qwen import DEFAULT_MODEL
from arr_coc.texture import generate_texture_array
from arr_coc.timing import peak_memory_mb, reset_peak_memory, synchronize
from arr_coc.tiny import qwen2_vl_2b_config, random_vlm


def parse_args(argv=None) -> argparse.Namespace:
    from arr_coc import cli

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help='hub id, folder or "tiny" (ignored with --random-weights)')
    p.add_argument("--random-weights", action="store_true", help="full-size Qwen2-VL-2B architecture, random weights")
    p.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
    p.add_argument("--image-size", type=cli.bounded_int(56, 8192), default=896, help="side of the square test image in px")
    p.add_argument("--new-tokens", type=cli.bounded_int(*cli.MAX_NEW_TOKENS), default=32,
                   help="tokens generated per answer (EOS is suppressed)")
    p.add_argument("--repeats", type=cli.bounded_int(1, 10_000), default=5, help="timed runs per measurement (median reported)")
    p.add_argument("--layer-repeats", type=cli.bounded_int(1, 100_000), default=50, help="timed runs of the relevance layer")
    p.add_argument("--pipelines", type=cli.comma_list(PIPELINES), default=",".join(PIPELINES),
                   help="comma-separated pipelines to time")
    p.add_argument("--json", default=None, help="write all numbers here")
    return p.parse_args(argv)


def test_image(size: int) -> Image.Image:
    """A natural-ish test image: smooth gradients, a block of fine texture and a saturated disc."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:size, 0:size] / size
    a = np.stack([x, y, 0.5 * (x + y)], -1) * 200
    a[size // 2:, : size // 2] += rng.normal(0, 40, (size - size // 2, size // 2, 3))
    a[(y - 0.3) ** 2 + (x - 0.7) ** 2 < 0.01] = (230, 20, 20)
    return Image.fromarray(a.clip(0, 255).astype(np.uint8))


def median_ms(fn, repeats: int, device: torch.device, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def bench_layer(model: ARRCOCQwen, image: Image.Image, repeats: int) -> dict:
    """
    texture + scorers + balancer + allocator for B=1 on the 32x32 grid, from the on-device 896^2 view:
    eagerly, and as the app runs it (CUDA-graph replay on a GPU).
    """
    device = model.vlm.device
    o = model.observe(image, "Where is the red disc?")
    grid, layer = o.views.candidate_grid, model.layer

    @torch.no_grad()
    def eager():
        maps = layer.score(generate_texture_array(o.highres, grid), o.question_embeds, None, o.gestalt.unsqueeze(0), o.prior)
        return layer.select(maps, grid)

    @torch.no_grad()
    def as_served():
        observation = replace(o, textures=model.texture(o.highres, grid))
        return layer.select(model.score(observation), grid)

    return dict(grid=list(grid), texture_eager_ms=median_ms(lambda: generate_texture_array(o.highres, grid), repeats, device),
                layer_eager_ms=median_ms(eager, repeats, device), layer_ms=median_ms(as_served, repeats, device))


def bench_pipelines(model: ARRCOCQwen, image: Image.Image, pipelines: list[str], new_tokens: int, repeats: int) -> dict:
    """Median latency split, tokens and peak memory of each pipeline."""
    model.vlm.model.generation_config.min_new_tokens = new_tokens  # exact length: EOS is suppressed until then
    results = {}
    for pipeline in pipelines:
        runs = [model.answer(image, "Describe the image in detail.", pipeline, max_new_tokens=new_tokens)
                for _ in range(repeats + 2)][2:]  # two warm-up runs
        timings = {k: statistics.median(r.timings_ms[k] for r in runs) for k in runs[0].timings_ms}
        results[pipeline] = dict(tokens=runs[0].tokens, timings_ms=timings, new_tokens=runs[0].new_tokens,
                                 decode_ms_per_token=timings["decode"] / max(runs[0].new_tokens - 1, 1),
                                 peak_memory_mb=max(r.peak_memory_mb for r in runs))
    return results


def format_table(results: dict) -> str:
    head = "| pipeline | visual tokens | vision ms | selection ms | prefill ms | decode ms | ms/token | total ms | peak MB |"
    rows = [head, "|" + "---|" * 9]
    for name, r in results.items():
        t = r["timings_ms"]
        rows.append(f"| {name} | {r['tokens']['total_visual']} | {t['vision']:.1f} | {t['selection']:.1f} | "
                    f"{t['prefill']:.1f} | {t['decode']:.1f} | {r['decode_ms_per_token']:.1f} | {t['total']:.1f} | "
                    f"{r['peak_memory_mb']:.0f} |")
    return "\n".join(rows)


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.random_weights:
        from arr_coc.qwen import default_dtype

        model = ARRCOCQwen(random_vlm(qwen2_vl_2b_config(), str(device), default_dtype(device), "Qwen2-VL-2B (random)"))
    else:
        model = ARRCOCQwen.from_pretrained(args.model, device=str(device))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    synchronize(device)
    weights_mb = (torch.cuda.memory_allocated(device) / 2**20) if device.type == "cuda" else peak_memory_mb(device)
    image = test_image(args.image_size)
    reset_peak_memory(device)
    report = dict(device=name, model=model.vlm.name, dtype=str(model.vlm.dtype), torch=torch.__version__,
                  weights_mb=weights_mb, layer=bench_layer(model, image, args.layer_repeats),
                  pipelines=bench_pipelines(model, image, args.pipelines.split(","), args.new_tokens, args.repeats))
    print(f"device: {name}  model: {report['model']}  dtype: {report['dtype']}  weights: {weights_mb:.0f} MB")
    layer = report["layer"]
    print(f"relevance layer (texture+scorers+balancer+allocator), B=1, {layer['grid']} grid: {layer['layer_ms']:.2f} ms "
          f"as served, {layer['layer_eager_ms']:.2f} ms eager (texture alone {layer['texture_eager_ms']:.2f} ms)")
    print(format_table(report["pipelines"]))
    peak = max(r["peak_memory_mb"] for r in report["pipelines"].values())
    print(f"one copy of the weights for every pipeline: peak {peak:.0f} MB = {peak / weights_mb:.2f} x the weights")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
