"""
The headless microscope: one image, one question, every pipeline, a table on stdout and a JSON file.

    python -m arr_coc.run --model tiny --image assets/chelsea.png --question "What colour are the cat's eyes?" \
        --json out/run.json --save-dir out/run

Exit codes: 0 on success; 2 on bad input (unreadable image, empty question, bad checkpoint), with a
one-line reason on stderr.
"""

import argparse
import json
import sys
from pathlib import Path

import transformers
from PIL import Image, UnidentifiedImageError

from arr_coc.config import STRATEGIES
from arr_coc.layer import CheckpointError
from arr_coc.model import PIPELINES, ARRCOCQwen, OutOfMemory
from arr_coc.qwen import DEFAULT_MODEL, InputError


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help='hub id, local folder, or "tiny" for the offline model')
    p.add_argument("--image", required=True, help="path of the image to look at")
    p.add_argument("--question", required=True, help="the question to ask about the image")
    p.add_argument("--checkpoint", default=None, help="ARR checkpoint folder (default: the untrained prior)")
    p.add_argument("--strategy", default="topk", choices=STRATEGIES, help="saccade allocation strategy")
    p.add_argument("--budget", type=int, default=273, help="number of saccades")
    p.add_argument("--pipelines", default=",".join(PIPELINES), help=f"comma-separated subset of {PIPELINES}")
    p.add_argument("--max-new-tokens", type=int, default=64, help="answer length limit")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available)")
    p.add_argument("--json", default=None, help="write the results here as JSON")
    p.add_argument("--save-dir", default=None, help="write heatmap, channel and scorer PNGs here")
    return p.parse_args(argv)


def load_image(path: str) -> Image.Image:
    try:
        with Image.open(path) as image:
            image.load()
            return image.copy()  # the first frame of an animation
    except FileNotFoundError:
        raise InputError(f"no such image: {path}") from None
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        raise InputError(f"cannot read {path} as an image ({type(e).__name__}: {e})") from None


def table(results: dict) -> str:
    """One row per pipeline: tokens, latency split, memory, answer."""
    head = f"{'pipeline':<9}{'visual':>7}{'text':>6}{'vision':>9}{'select':>9}{'prefill':>9}{'decode':>9}{'total':>9}{'MB':>8}  answer"
    rows = [head, "-" * len(head)]
    for name, r in results.items():
        t, ms = r["tokens"], r["timings_ms"]
        rows.append(f"{name:<9}{t['total_visual']:>7}{t['text']:>6}{ms['vision']:>9.1f}{ms['selection']:>9.1f}"
                    f"{ms['prefill']:>9.1f}{ms['decode']:>9.1f}{ms['total']:>9.1f}{r['peak_memory_mb']:>8.0f}  "
                    f"{r['answer'][:60]!r}")
    return "\n".join(rows)


def main(argv=None) -> int:
    args = parse_args(argv)
    transformers.utils.logging.disable_progress_bar()  # stderr is for the one-line error
    try:
        pipelines = [p.strip() for p in args.pipelines.split(",") if p.strip()]
        unknown = set(pipelines) - set(PIPELINES)
        if unknown or not pipelines:
            raise InputError(f"unknown pipelines {sorted(unknown)}; choose from {PIPELINES}")
        if not args.question.strip():
            raise InputError("the question is empty")
        image = load_image(args.image)
        try:
            model = ARRCOCQwen.from_pretrained(args.model, checkpoint=args.checkpoint, device=args.device)
        except (OSError, ValueError) as e:
            if isinstance(e, (InputError, CheckpointError)):
                raise
            print(f"error: cannot load the model {args.model!r} ({str(e).splitlines()[0][:200]}); "
                  "--model tiny runs the offline model", file=sys.stderr)
            return 1
        results, arr_answer = {}, None
        for pipeline in pipelines:
            answer = model.answer(image, args.question, pipeline, max_new_tokens=args.max_new_tokens,
                                  strategy=args.strategy, budget=args.budget)
            results[pipeline] = answer.to_json()
            arr_answer = answer if pipeline == "arr" else arr_answer
    except (InputError, CheckpointError, OutOfMemory) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(results))
    if arr_answer is not None and arr_answer.arr.fallback[0]:
        print(f"note: ARR fell back to an even grid ({arr_answer.arr.fallback[0]})")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2))
    if args.save_dir and arr_answer is not None:
        from arr_coc.viz import save_all

        for path in save_all(arr_answer, args.save_dir, image):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
