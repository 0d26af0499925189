"""
Benchmarks: the ARR relevance layer alone, then every pipeline end to end, with memory.

Latency and memory do not depend on weight values, so on a GPU the full-size Qwen2-VL-2B architecture
(or Qwen2.5-VL-3B: --family qwen2_5_vl) with random weights stands in for the real model (--random-weights).
Timings are medians of CUDA-synchronised runs after warm-up; every decode generates exactly --new-tokens tokens.
With the published token reducers among --pipelines, a second table sets ARR beside each of them and stock `full`
on the fast engine (vision, selection and prefill ms, TTFT, GFLOPs, peak memory, ARR's TTFT over theirs): the
reducers pay for the whole native view before they prune, ARR encodes only what it picked. --pipelines also
takes ARR's ablations (arr-no-gestalt, ...: arr_coc.relevance.ablation).

    python -m arr_coc.bench --model tiny                              # CPU smoke run (on a CPU, the only kind)
    python -m arr_coc.bench --random-weights --json out/bench.json    # on a GPU: the numbers in the README
    python -m arr_coc.bench --random-weights --family qwen2_5_vl      # the Qwen2.5-VL-3B architecture
    python -m arr_coc.bench --random-weights --sizes 1792 --pipelines full,divprune,visionzip,fastv,arr --engines fast
    python -m arr_coc.bench --random-weights --check benchmarks/h100_....json   # exit 1 if ARR got > 15% slower
    python -m arr_coc.bench --random-weights --conversation 4         # + the TTFT of follow-up questions
    python -m arr_coc.bench --random-weights --sizes 1792 --profile out/prof   # + where ARR's time goes, per kernel

--budgets B1,B2,... also times, at each size, ARR and every baseline that reads ARR's visual tokens (budget and
the reducers) at each saccade budget, fast engine: the TTFT of a budget sweep (evaluate --budgets), for plotting
accuracy against the 2B architecture's time (arr_coc.eval.figures).

--conversation N also asks N questions about each image in one conversation (arr and full, fast engine;
arr_coc.pipelines.conversation) and reports the TTFT of turn 1, the median of turns 2..N, and the TTFT of the
same follow-up questions asked afresh, one conversation per question, with the tokens each prefilled.

With the hf engine, each size also times transformers as its users run a Qwen-VL, nothing of this repo's in the
path (the image processor on the PIL image, the chat template, model.generate): what a newcomer would time
by hand. --profile DIR writes, after every timing, one ARR answer's torch.profiler trace
and its busiest kernels per size.

--check compares ARR's TTFT and decode ms/token on the fast engine, size by size, with a saved run (--json) of the
same kind of card, and exits 1 when either is more than CHECK_TOLERANCE slower, or when the runs share no such row:
CI has no GPU, so the guard runs wherever the bench does.
"""

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from PIL import Image

from arr_coc.commands import cli
from arr_coc.settings import DEFAULT_MODEL, ENGINES, PipelineConfig
from arr_coc.pipelines import PIPELINES
from arr_coc.flags import config_parser, device_flag, flag, parse_config
from arr_coc.pipelines import BUDGET_FREE, FAST_ENGINE_ONLY, FROM_EMBEDS, REDUCERS
from arr_coc.relevance.ablation import ABLATIONS
from arr_coc.runtime import distributed

CHOICES = (*PIPELINES, *(f"arr-{name}" for name in ABLATIONS))  # --pipelines: the pipelines and ARR's ablations
CHECK_TOLERANCE = 0.15  # --check fails on ARR's TTFT or decode more than this much slower than the baseline's
CHECKED = (("ttft_ms", "TTFT"), ("decode_ms_per_token", "decode ms/token"))  # what --check compares


def baseline_file(path: str) -> dict:
    """--check's argument: a saved bench report (--json), read and checked at parse time."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"cannot read the baseline {path}: {e}") from None
    if not isinstance(report, dict) or not {"device", "sizes"} <= report.keys():
        raise argparse.ArgumentTypeError(f"{path} is not a bench report (written by --json)")
    return report


@dataclass
class BenchConfig:
    """bench's flags, each field one (arr_coc.flags.flag: its help and parse-time check)."""
    model: str | None = cli.model_flag(use="the VLM to time (ignored with --random-weights)",
                                       then=f"Default: {DEFAULT_MODEL}")
    random_weights: bool = flag(False, "full-size architecture of --family, random weights")
    family: str = flag("qwen2_vl", "with --random-weights: Qwen2-VL-2B, Qwen2.5-VL-3B or Qwen3-VL-2B",
                       cli.one_of(("qwen2_vl", "qwen2_5_vl", "qwen3_vl")))
    device: str | None = device_flag()
    dtype: str | None = flag(None, "weights' dtype (default: bf16 on Ampere+, fp16 on older GPUs such as the T4, fp32 "
                                   "on CPU)", cli.one_of(("bfloat16", "float16", "float32")))
    sizes: list[int] = flag([448, 896, 1344, 1792], "comma-separated sides of the square test images in px",
                            cli.int_list(56, 8192))
    max_cells: int = cli.max_cells_flag()
    gestalt_tokens: int = cli.gestalt_tokens_flag()
    new_tokens: int = flag(64, "tokens generated per answer (EOS is suppressed)", cli.new_tokens)
    repeats: int = flag(3, "timed runs per measurement (median reported)", cli.bounded_int(1, 10_000))
    layer_repeats: int = flag(50, "timed runs of the relevance layer", cli.bounded_int(1, 100_000))
    pipelines: str = flag(",".join(PIPELINES), "comma-separated pipelines to time, or ARR under an ablation "
                                               "(arr-no-gestalt, ...)", cli.comma_list(CHOICES))
    engines: str = flag("fast,hf", "comma-separated engines: fast (static cache + CUDA graphs) and hf (stock "
                                   "generate)", cli.comma_list(ENGINES))
    budgets: list[int] | None = flag(None, "also time ARR and the baselines that read its visual tokens at these "
                                           "saccade budgets (fast engine), comma-separated",
                                     cli.int_list(1, cli.MAX_CELLS))
    conversation: int | None = flag(None, "also time N questions in one conversation (arr and full, fast engine) "
                                          "against each asked afresh", cli.bounded_int(2, 64), metavar="N")
    no_compile: bool = flag(False, "capture the decode step and the vision tower uncompiled (as before Inductor fused "
                                   "them), for a before/after")
    json: str | None = flag(None, "write all numbers here (a file path)", cli.output_file)
    check: dict | None = flag(None, "compare ARR's TTFT and decode (fast engine) with this saved run (--json) on the "
                                    f"same kind of card; exit 1 if either is more than {CHECK_TOLERANCE:.0%} slower "
                                    "(or if the two runs share no such row)",
                              baseline_file, metavar="BASELINE.json")
    profile: str | None = flag(None, "after every timing, profile one ARR answer (fast engine) at each size with "
                                     "torch.profiler: a gzipped Chrome trace and a table of the busiest kernels per "
                                     "size, in this folder", cli.output_folder, metavar="DIR")


def parse_args(argv=None) -> BenchConfig:
    p = config_parser(BenchConfig, __doc__)
    args = parse_config(BenchConfig, argv, p)
    args.model = args.model or DEFAULT_MODEL
    cli.check_gestalt_tokens(p, args)
    if on_cpu(args.device) and (args.random_weights or args.model not in tiny_models()):
        flag = "--random-weights" if args.random_weights else "--model"
        p.error(f"argument {flag}: no GPU, and on a CPU only the offline tiny and pocket models are benched (a full-size "
                "Qwen-VL is ~10 GB of fp32 weights and takes hours); pass --model tiny, or run on a GPU")
    return args


def on_cpu(device: str | None) -> bool:
    """Whether the bench will run on the CPU: asked for, or no CUDA GPU to default to."""
    return distributed.default_device(device) == "cpu"


def tiny_models() -> tuple[str, ...]:
    """The offline models' names ("tiny", ..., "pocket"), the only ones benched on a CPU."""
    from arr_coc.vlm.tiny import TINY_MODELS

    return (*TINY_MODELS, "pocket")


def test_image(size: int) -> Image.Image:
    """A natural-ish test image: smooth gradients, a block of fine texture and a saturated disc."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:size, 0:size] / size
    a = np.stack([x, y, 0.5 * (x + y)], -1) * 200
    a[size // 2:, : size // 2] += rng.normal(0, 40, (size - size // 2, size // 2, 3))
    a[(y - 0.3) ** 2 + (x - 0.7) ** 2 < 0.01] = (230, 20, 20)
    return Image.fromarray(a.clip(0, 255).astype(np.uint8))


def median_ms(fn, repeats: int, device, warmup: int = 3) -> float:
    from arr_coc.runtime.timing import synchronize

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


def bench_layer(model, image: Image.Image, repeats: int, max_cells: int) -> dict:
    """
    texture + scorers + balancer + allocator for B=1 on the image's candidate grid (64x64 at 1792^2), from the
    on-device high-res view: eagerly, and as the app runs it (CUDA-graph replay on a GPU).
    """
    import torch

    from arr_coc.pipelines import arr_scene
    from arr_coc.relevance.texture import generate_texture_array

    device = model.vlm.device
    o = arr_scene.observe(model.parts, model.views(image, max_cells), "Where is the red disc?")
    grid, layer = o.views.candidate_grid, model.layer

    @torch.no_grad()
    def eager():
        maps = layer(generate_texture_array(o.highres, grid), o.question_embeds, None, o.gestalt.features.unsqueeze(0),
                     o.prior, o.gestalt_states, o.question_states)
        return layer.select(maps, grid)

    @torch.no_grad()
    def as_served():
        observation = replace(o, textures=model.texture(o.highres, grid))
        return layer.select(arr_scene.score(observation, layer.graphed_score), grid)

    return dict(grid=list(grid), texture_eager_ms=median_ms(lambda: generate_texture_array(o.highres, grid), repeats, device),
                layer_eager_ms=median_ms(eager, repeats, device), layer_ms=median_ms(as_served, repeats, device))


@contextmanager
def exact_lengths(vlm, new_tokens: int):
    """Every answer inside generates exactly new_tokens (EOS suppressed until then); the engine and min_new_tokens
    it finds on the shared model are restored afterwards, even on an error."""
    saved = vlm.engine, vlm.model.generation_config.min_new_tokens
    try:
        vlm.model.generation_config.min_new_tokens = new_tokens
        yield
    finally:
        vlm.engine, vlm.model.generation_config.min_new_tokens = saved


def bench_pipelines(model, image: Image.Image, pipelines: list[str], engines: list[str],
                    new_tokens: int, repeats: int, max_cells: int) -> dict:
    """Median latency split, TTFT, tokens and peak memory of each pipeline with each engine, on one image
    (exact_lengths)."""
    vlm = model.vlm
    with exact_lengths(vlm, new_tokens):
        # stock generate() cannot run a DeepStack family's ARR embeddings (Qwen3-VL): arr/hf is left out there
        return {f"{row}/{engine}": bench_pipeline(model, image, row, engine, new_tokens, repeats, max_cells)
                for engine in engines for row in pipelines if runs_on(vlm, row.partition("-")[0], engine)}


def runs_on(vlm, pipeline: str, engine: str) -> bool:
    """Whether an engine can run a pipeline: stock generate() cannot run a DeepStack family's embeddings
    (Qwen3-VL: arr, divprune, visionzip), nor FastV's two sequence lengths."""
    return (not (pipeline in FROM_EMBEDS and engine == "hf" and not vlm.stock_generate_takes_embeds)
            and not (pipeline in FAST_ENGINE_ONLY and engine == "hf"))


def bench_pipeline(model, image: Image.Image, row: str, engine: str, new_tokens: int, repeats: int,
                   max_cells: int, budget: int | None = None) -> dict:
    """One pipeline (or ARR under an ablation: "arr-no-gestalt") with one engine (at a saccade budget: ARR's,
    or the visual tokens ARR reads at it): medians over `repeats` runs after two warm-up runs."""
    model.vlm.engine = engine
    pipeline, _, ablation = row.partition("-")
    runs = [model.answer(image, "Describe the image in detail.", pipeline, max_new_tokens=new_tokens,
                         max_cells=max_cells, ablation=ablation or None, budget=budget)
            for _ in range(repeats + 2)][2:]  # two warm-up runs
    timings = {k: statistics.median(asdict(r.timings)[k] for r in runs) for k in asdict(runs[0].timings)}
    return dict(pipeline=row, engine=engine, tokens=runs[0].tokens.as_dict(), timings_ms=timings,
                ttft_ms=statistics.median(r.ttft_ms for r in runs), new_tokens=runs[0].new_tokens,
                decode_ms_per_token=timings["decode"] / max(runs[0].new_tokens - 1, 1),
                peak_memory_mb=max(r.peak_memory_mb for r in runs), candidate_grid=list(runs[0].views.candidate_grid),
                gflops=asdict(runs[0].compute))


def bench_transformers(vlm, image: Image.Image, question: str, new_tokens: int, repeats: int, max_cells: int) -> dict:
    """
    transformers as its users run a Qwen-VL, nothing of this repo's in the path: the family's image processor on
    the PIL image (up to max_cells merged tokens, as `full` reads it), the chat template with the image pad
    expanded to the image's tokens (what the family's Processor does; its class also wants torchvision, for
    video), then model.generate (greedy, exactly new_tokens). TTFT is a one-token generate with the processing
    included; decode is (T(new_tokens) - T(1)) / (new_tokens - 1); medians after one warm-up.
    """
    import torch

    from arr_coc.runtime.timing import peak_memory_mb, reset_peak_memory

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    text = vlm.tokenizer.apply_chat_template(messages, chat_template=vlm.chat_template, add_generation_prompt=True,
                                             tokenize=False)
    merge = vlm.image_processor.merge_size
    size = {"shortest_edge": vlm.image_processor.size["shortest_edge"], "longest_edge": vlm.cell ** 2 * max_cells}

    def inputs() -> dict:
        pixels = vlm.image_processor(images=[image], size=size, return_tensors="pt")
        n = int(pixels["image_grid_thw"].prod()) // merge ** 2  # the image's merged tokens
        ids = vlm.tokenizer(text.replace("<|image_pad|>", "<|image_pad|>" * n), return_tensors="pt")
        return {**ids, **pixels}

    def answer(n: int):
        with torch.no_grad():
            made = {k: v.to(vlm.device) for k, v in inputs().items()}
            return vlm.model.generate(**made, max_new_tokens=n, min_new_tokens=n, do_sample=False)

    reset_peak_memory(vlm.device)
    first = median_ms(lambda: answer(1), repeats, vlm.device, warmup=1)
    whole = median_ms(lambda: answer(new_tokens), repeats, vlm.device, warmup=1)
    made = inputs()
    return dict(visual_tokens=int((made["input_ids"] == vlm.image_token_id).sum()), new_tokens=new_tokens,
                processor_ms=median_ms(inputs, repeats, vlm.device, warmup=1), ttft_ms=first, total_ms=whole,
                decode_ms_per_token=(whole - first) / max(new_tokens - 1, 1), peak_memory_mb=peak_memory_mb(vlm.device))


def transformers_line(r: dict, arr: dict | None) -> str:
    versus = f"; ARR (fast) TTFT {arr['ttft_ms'] / r['ttft_ms']:.2f}x of it" if arr else ""
    return (f"  transformers as its users run it (image processor, chat template, generate): {r['visual_tokens']} visual "
            f"tokens, TTFT {r['ttft_ms']:.1f} ms (processor {r['processor_ms']:.1f}), "
            f"{r['decode_ms_per_token']:.2f} ms/token, total {r['total_ms']:.1f} ms, peak {r['peak_memory_mb']:.0f} MB"
            f"{versus}")


def profile_answer(model, image: Image.Image, out: Path, size: int, new_tokens: int, max_cells: int) -> str:
    """One ARR answer (fast engine) under torch.profiler: its Chrome trace in `out`, and the table of its busiest
    kernels, returned and written beside it. Run it after every timing: once the profiler has traced CUDA, later
    launches are slower (stock `full` at 448 px took 2x its usual TTFT in the run that found it, one H200)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if model.vlm.device.type == "cuda" else [])
    with exact_lengths(model.vlm, new_tokens):
        model.vlm.engine = "fast"
        with profile(activities=activities) as prof:
            model.answer(image, "Describe the image in detail.", "arr", max_new_tokens=new_tokens, max_cells=max_cells)
    out.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out / f"arr_{size}.json.gz"))  # gzipped: a trace is ~10 MB of JSON
    key = "self_cuda_time_total" if model.vlm.device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=30, max_name_column_width=90)
    (out / f"arr_{size}.txt").write_text(table)
    return table


FOLLOW_UPS = ("Where is the red disc?", "What is in the bottom left?", "Describe the colours.",
              "What is at the top?")  # the follow-up questions --conversation asks, in turn (cycled)


def bench_conversation(model, image: Image.Image, pipeline: str, turns: int, new_tokens: int, repeats: int,
                       max_cells: int) -> dict:
    """
    `turns` questions in one conversation (fast engine), `repeats` times after one warm-up conversation: the
    median TTFT and prefilled tokens of turn 1 and of turns 2..N, and the median TTFT of those same follow-up
    questions asked afresh (each its own first turn).
    """
    from arr_coc.pipelines.conversation import Conversation

    questions = ["Describe the image in detail."] + [FOLLOW_UPS[i % len(FOLLOW_UPS)] for i in range(turns - 1)]
    with exact_lengths(model.vlm, new_tokens):
        model.vlm.engine = "fast"
        chats = []
        for _ in range(repeats + 1):  # the first is a warm-up
            chat = Conversation(pipeline, image)
            for question in questions:
                model.answer(None, question, conversation=chat, max_new_tokens=new_tokens, max_cells=max_cells)
            chats.append(chat)
        fresh = [model.answer(image, q, pipeline, max_new_tokens=new_tokens, max_cells=max_cells)
                 for q in questions[1:] for _ in range(repeats)]
    firsts = [chat.answers[0] for chat in chats[1:]]
    laters = [a for chat in chats[1:] for a in chat.answers[1:]]
    return dict(pipeline=pipeline, turns=turns, first_ttft_ms=statistics.median(a.ttft_ms for a in firsts),
                follow_up_ttft_ms=statistics.median(a.ttft_ms for a in laters),
                fresh_ttft_ms=statistics.median(a.ttft_ms for a in fresh),
                first_prefilled=firsts[0].prefilled, follow_up_prefilled=statistics.median(a.prefilled for a in laters),
                context=chats[-1].answers[-1].context)


def conversation_line(r: dict) -> str:
    return (f"  conversation, {r['pipeline']}: turn 1 TTFT {r['first_ttft_ms']:.1f} ms ({r['first_prefilled']} tokens "
            f"prefilled); turns 2-{r['turns']} {r['follow_up_ttft_ms']:.1f} ms ({r['follow_up_prefilled']:.0f} "
            f"prefilled), the same questions asked afresh {r['fresh_ttft_ms']:.1f} ms; context after turn "
            f"{r['turns']}: {r['context']} tokens")


SWEPT = ("arr", "budget", *(r for r in REDUCERS if r not in BUDGET_FREE))  # --budgets: the pipelines whose
# visual tokens follow ARR's budget


def bench_budgets(model, image: Image.Image, budgets: list[int], new_tokens: int, repeats: int,
                  max_cells: int) -> dict:
    """SWEPT at each budget on the fast engine (exact_lengths) -> {budget: {pipeline: its bench_pipeline result}}."""
    with exact_lengths(model.vlm, new_tokens):
        return {b: {row: bench_pipeline(model, image, row, "fast", new_tokens, repeats, max_cells, b) for row in SWEPT}
                for b in budgets}


def ratios(results: dict) -> dict:
    """ARR over `full` (TTFT and total, against stock generate (hf) and against the fast engine), and ARR over
    each reducer on the same engine (TTFT, total, GFLOPs and peak memory)."""
    out = {}
    for arr_engine in ("fast", "hf"):
        for full_engine in ("hf", "fast"):
            a, f = results.get(f"arr/{arr_engine}"), results.get(f"full/{full_engine}")
            if a and f:
                out[f"arr/{arr_engine} vs full/{full_engine}"] = dict(
                    ttft=a["ttft_ms"] / f["ttft_ms"], total=a["timings_ms"]["total"] / f["timings_ms"]["total"])
        for reducer in REDUCERS:  # ARR over each reducer on the same engine
            a, r = results.get(f"arr/{arr_engine}"), results.get(f"{reducer}/{arr_engine}")
            if a and r:
                out[f"arr/{arr_engine} vs {reducer}/{arr_engine}"] = dict(
                    ttft=a["ttft_ms"] / r["ttft_ms"], total=a["timings_ms"]["total"] / r["timings_ms"]["total"],
                    gflops=sum(a["gflops"].values()) / max(sum(r["gflops"].values()), 1e-9),
                    peak_memory=a["peak_memory_mb"] / r["peak_memory_mb"])
    return out


def regressions(baseline: dict, report: dict, tolerance: float = CHECK_TOLERANCE) -> list[str]:
    """One line per ARR measurement on the fast engine (every such row and size the two runs share) that is more
    than `tolerance` slower in `report` than in `baseline`. ARR's rows under the hf engine are left out: their
    prefill and decode are stock generate()'s loop, not ARR's, and swing run to run. Both runs must come from the
    same kind of device and share at least one row, else nothing would be checked."""
    if baseline["device"] != report["device"]:
        raise ValueError(f"the baseline was measured on {baseline['device']}, this run on {report['device']}: "
                         f"compare runs on the same kind of card")
    found, compared = [], 0
    for size, measured in report["sizes"].items():
        saved = baseline["sizes"].get(str(size), {}).get("pipelines", {})
        for key, row in measured["pipelines"].items():
            if not (key.startswith("arr") and key.endswith("/fast")) or key not in saved:
                continue
            compared += 1
            for field, label in CHECKED:
                old, new = saved[key][field], row[field]
                if new > old * (1 + tolerance):
                    found.append(f"{size} px {key}: {label} {new:.2f} against {old:.2f} (+{new / old - 1:.0%})")
    if not compared:
        raise ValueError(f"the two runs share no ARR row on the fast engine (sizes {', '.join(report['sizes'])} "
                         f"here, {', '.join(baseline['sizes'])} in the baseline): nothing to check")
    return found


def format_table(results: dict) -> str:
    head = ("| pipeline | engine | visual tokens | GFLOPs (vision + prefill) | TTFT ms | vision ms | selection ms | "
            "prefill ms | ms/token | total ms | peak MB |")
    rows = [head, "|" + "---|" * 11]
    for r in results.values():
        t = r["timings_ms"]
        g = r["gflops"]
        rows.append(f"| {r['pipeline']} | {r['engine']} | {r['tokens']['total_visual']} | "
                    f"{g['vision']:.0f} + {g['prefill']:.0f} | {r['ttft_ms']:.1f} | "
                    f"{t['vision']:.1f} | {t['selection']:.1f} | {t['prefill']:.1f} | {r['decode_ms_per_token']:.2f} | "
                    f"{t['total']:.1f} | {r['peak_memory_mb']:.0f} |")
    return "\n".join(rows)


def versus_table(results: dict, engine: str = "fast") -> str | None:
    """ARR (and its ablations) beside each reducer and stock `full` on one engine: the cost of pruning after the
    whole vision tower against selecting before it. None without ARR and a reducer among the results."""
    rows = [r for key, r in results.items() if key.endswith(f"/{engine}")
            and (r["pipeline"] in ("full", *REDUCERS) or r["pipeline"].startswith("arr"))]
    arr = results.get(f"arr/{engine}")
    if arr is None or not any(r["pipeline"] in REDUCERS for r in rows):
        return None
    lines = [f"ARR against the token reducers ({engine} engine), stock full beside them:",
             "| pipeline | visual tokens | vision ms | selection ms | prefill ms | TTFT ms | GFLOPs | peak MB | "
             "ARR's TTFT / its |", "|" + "---|" * 9]
    for r in rows:
        t = r["timings_ms"]
        lines.append(f"| {r['pipeline']} | {r['tokens']['total_visual']} | {t['vision']:.1f} | {t['selection']:.1f} | "
                     f"{t['prefill']:.1f} | {r['ttft_ms']:.1f} | {sum(r['gflops'].values()):.1f} | "
                     f"{r['peak_memory_mb']:.0f} | {arr['ttft_ms'] / r['ttft_ms']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch
    import transformers

    from arr_coc.runtime.timing import peak_memory_mb, reset_peak_memory, synchronize

    model, device = load_model(args)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    synchronize(device)
    weights_mb = (torch.cuda.memory_allocated(device) / 2**20) if device.type == "cuda" else peak_memory_mb(device)
    sizes = args.sizes
    print(f"device: {name}  model: {model.vlm.name}  dtype: {model.vlm.dtype}  weights: {weights_mb:.0f} MB", flush=True)
    report = dict(device=name, model=model.vlm.name, dtype=str(model.vlm.dtype), torch=torch.__version__,
                  transformers=transformers.__version__, weights_mb=weights_mb, max_cells=args.max_cells,
                  gestalt_tokens=args.gestalt_tokens,
                  new_tokens=args.new_tokens, sizes={})
    model.vlm.set_compile(not args.no_compile)
    report["warmup_s"] = model.warmup()  # what the app pays before its first user: graph captures and the compiles
    compiled = model.vlm.compile_seconds()
    report["decode_compile_s"], report["vision_compile_s"] = compiled.decode, compiled.vision
    print(f"warm-up {report['warmup_s']:.1f} s, of which capturing the compiled decode step "
          f"{report['decode_compile_s']:.1f} s and the compiled vision tower {report['vision_compile_s']:.1f} s",
          flush=True)
    report["layer"] = bench_layer(model, test_image(max(sizes)), args.layer_repeats, args.max_cells)
    layer = report["layer"]
    print(f"relevance layer (texture+scorers+balancer+allocator), B=1, {layer['grid']} grid: {layer['layer_ms']:.2f} ms "
          f"as served, {layer['layer_eager_ms']:.2f} ms eager (texture alone {layer['texture_eager_ms']:.2f} ms)", flush=True)
    for size in sizes:
        reset_peak_memory(device)
        results = bench_pipelines(model, test_image(size), args.pipelines.split(","), args.engines.split(","),
                                  args.new_tokens, args.repeats, args.max_cells)
        report["sizes"][size] = dict(pipelines=results, ratios=ratios(results))
        print_pipelines(size, args.new_tokens, results, report["sizes"][size]["ratios"])
        if "hf" in args.engines.split(","):
            reference = bench_transformers(model.vlm, test_image(size), "Describe the image in detail.",
                                           args.new_tokens, args.repeats, args.max_cells)
            report["sizes"][size]["transformers"] = reference
            print(transformers_line(reference, results.get("arr/fast")))
        if args.budgets:
            swept = bench_budgets(model, test_image(size), args.budgets, args.new_tokens, args.repeats, args.max_cells)
            report["sizes"][size]["budgets"] = swept
            print_budgets(swept)
        if args.conversation:
            chats = [bench_conversation(model, test_image(size), pipeline, args.conversation, args.new_tokens,
                                        args.repeats, args.max_cells) for pipeline in ("arr", "full")]
            report["sizes"][size]["conversation"] = chats
            print("\n".join(conversation_line(r) for r in chats))
        if args.json:  # written after every size, so a run cut short keeps what it measured
            write_json(Path(args.json), report)
    for size in sizes if args.profile else ():  # after every timing: the profiler's CUDA tracing slows later launches
        print(f"\nARR's busiest kernels at {size} px (trace: {args.profile}/arr_{size}.json.gz):")
        print(profile_answer(model, test_image(size), Path(args.profile), size, args.new_tokens, args.max_cells))
    peak = max(r["peak_memory_mb"] for s in report["sizes"].values() for r in s["pipelines"].values())
    print(f"one copy of the weights for every pipeline: peak {peak:.0f} MB = {peak / weights_mb:.2f} x the weights")
    if args.check is not None:
        check(args.check, report)
    return report


def load_model(args: argparse.Namespace):
    """The model to time: --model, or --family's full-size architecture with random weights; on --device (default:
    cuda when available) in --dtype (default: the device's) -> (model, device)."""
    import torch

    from arr_coc.model import ARRCOCQwen
    from arr_coc.vlm.families import default_dtype, random_vlm
    from arr_coc.vlm.tiny import FULL_SIZE

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype) if args.dtype else None
    pipeline = PipelineConfig(gestalt_max_tokens=args.gestalt_tokens, max_cells=args.max_cells)  # every view's
    if args.random_weights:
        arch, config = FULL_SIZE[args.family]
        vlm = random_vlm(config(), str(device), dtype or default_dtype(device), f"{arch} (random)")
        model = ARRCOCQwen(vlm, pipeline=pipeline)
    else:
        model = ARRCOCQwen.from_pretrained(args.model, device=str(device), dtype=dtype, pipeline=pipeline)
    return model, device


def print_pipelines(size: int, new_tokens: int, results: dict, arr_over: dict) -> None:
    """One size's pipelines: the table, ARR beside the reducers, and ARR's time over full's and each reducer's
    (`ratios`)."""
    print(f"\n{size}x{size} px, {new_tokens} new tokens:\n{format_table(results)}")
    if versus := versus_table(results):
        print(f"\n{versus}")
    for k, v in arr_over.items():
        print(f"  {k}: TTFT {v['ttft']:.2f}x, total {v['total']:.2f}x")


def print_budgets(swept: dict) -> None:
    """--budgets: one line a budget, each row's visual tokens and TTFT."""
    for b, rows in swept.items():
        timed = [f"{row} {r['tokens']['total_visual']} tokens TTFT {r['ttft_ms']:.1f} ms" for row, r in rows.items()]
        print(f"  budget {b}: " + ", ".join(timed))


def write_json(path: Path, report: dict) -> None:
    """--json: every number so far."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))


def check(baseline: dict, report: dict) -> None:
    """--check: say what got slower and exit 1, or say that nothing did."""
    try:
        slower = regressions(baseline, json.loads(json.dumps(report)))  # the report as saved: sizes as strings
    except ValueError as e:
        sys.exit(f"bench --check: {e}")
    if slower:
        print(f"\nbench --check: ARR is more than {CHECK_TOLERANCE:.0%} slower than the baseline:", *slower, sep="\n  ")
        sys.exit(1)
    print(f"\nbench --check: no ARR measurement is more than {CHECK_TOLERANCE:.0%} slower than the baseline")


if __name__ == "__main__":
    main()
