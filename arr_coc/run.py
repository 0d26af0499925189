"""
The headless microscope: one image, one question, every pipeline, a table on stdout and a JSON file.

    python -m arr_coc.run --model tiny --image assets/chelsea.png --question "What colour are the cat's eyes?" \
        --json out/run.json --save-dir out/run
    python -m arr_coc.run --model tiny --image assets/chelsea.png --question "What is it?" --faithfulness --save-dir out/run
    python -m arr_coc.run --model tiny --image assets/chelsea.png --question "What is it?" --pipelines arr --ablations all

--ablations adds a row per ablation of ARR (arr-no-gestalt, ...: arr_coc.relevance.ablation), at the same budget;
arr-explore, arr-diversify and arr-auto-budget switch one tension on instead. Every ARR row prints its tensions (the
explore share e, the spacing penalty lambda, the budget K) after the table; the JSON records them per row.
--budget auto spends K saccades chosen from the relevance map's concentration, in [--min-budget, --max-budget].
Where the image holds no more cells than ARR would read (the gestalt plus the budget), ARR reads its native view
whole, as full does, and a line under the table says so and why (the JSON's "reads_native"; --faithfulness then
has no saccades to remove and says so; --save-dir draws no ARR pictures).

--refixate TAU gives ARR a second look when its answer's confidence is below TAU: a line per ARR row says whether
it fired, what guided it (--refixate-guide: the prior pass again, or where the first answer's attention fell), with
both confidences and both answers; the JSON records them under each row's "refixation".

    python -m arr_coc.run --model tiny --image assets/synth_invoice_page.png --question "What is the total?" \
        --pipelines arr --refixate 0.9 --save-dir out/run      # heatmap.png: the second look in green

Several --question flags ask them in one conversation about the image, in order (arr_coc.pipelines.conversation):
each pipeline keeps its own, ARR reading each question anew (a new block of saccades a turn; --fresh-cells: only
cells no earlier turn read), the others reading the image once. A table per turn, a line per turn with each
pipeline's TTFT, prefilled tokens and context, and the JSON's "turns" holds one entry per turn; --save-dir
draws each turn into turn-K/, with moves.png: the cells new in the turn, kept from the one before, dropped. FastV cannot
hold a conversation: it is left out of the default pipelines then.

    python -m arr_coc.run --model pocket --image assets/pocket_box_word.png --pipelines arr,full \
        --question "What word is in the red box?" --question "What word is in the blue box?" --fresh-cells

--teacher FOLDER (with --save-dir) also draws teacher.png: the teacher's map (arr_coc.distill.teacher: where the model
looks when it reads the whole native view and gives its own answer, at the heads FOLDER/teacher_heads.json names)
beside ARR's relevance and saccades, and their overlap.

--faithfulness also measures whether ARR's answer depends on its saccades (arr_coc.eval.faithfulness): the answer's
log-likelihood as they are removed in rank order, in a random order, and inserted; areas on stdout, the
curves in the JSON and, with --save-dir, faithfulness.png.

The ARR layer follows the app's rule: --checkpoint (a name under checkpoints/, a folder, a hub id, or
"prior"), else the first checkpoint in checkpoints/ made for the model whose evidence.json shows it beats the
prior (python -m arr_coc.commands.evidence), else the untrained prior.
Progress lines and notes go to stderr; the table to stdout. The JSON records the model, the checkpoint,
the question, any notice about the model and the package versions, beside each pipeline's results.

--model left out is Qwen/Qwen2-VL-2B-Instruct; where the hub cannot be reached (checked at once, or
HF_HUB_OFFLINE=1) and the local cache lacks it, the pocket model runs instead (--model pocket), with a note.

Exit codes: 0 on success; 2 on bad input (a bad flag, unreadable image, empty question, bad checkpoint, a
model that cannot be loaded), with a one-line reason on stderr. Bad flags, a missing --image or one that is no
image (a PDF), over the app's 64 megapixels (read from its header) or no regular file (a fifo), a question over
the length limit, an ARR checkpoint given as --model, an unusable --device, a --fastv-layer the model lacks
(where its depth is known unloaded: the tiny and pocket models, a folder, a cached hub model) and a --json that is
a folder or cannot be written are refused before anything loads.
"""

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from arr_coc import pipelines
from arr_coc.commands import cli
from arr_coc.settings import MAX_QUESTION_CHARS
from arr_coc.pipelines import PIPELINES
from arr_coc.relevance.config import STRATEGIES
from arr_coc.errors import InputError, OutOfMemory
from arr_coc.vlm.images import open_image
from arr_coc.flags import config_parser, device_flag, flag, parse_config, with_flags_of
from arr_coc.relevance import ablation as ablations
from arr_coc.settings import MAX_IMAGE_PIXELS

WARMUP_SIDE = 448  # px: the copy of the image every pipeline warms up on before the timed runs


def teacher_folder(text: str) -> str:
    """An argparse type: a folder holding the teacher's heads (teacher_heads.json)."""
    if not (Path(text) / "teacher_heads.json").is_file():
        raise argparse.ArgumentTypeError(f"{text} holds no teacher_heads.json (python -m arr_coc.commands.teacher "
                                         "--out writes one)")
    return text


@with_flags_of("gestalt_tokens", pipelines.OPTIONS)  # then each pipeline's own settings (--fastv-layer, ...)
@dataclass
class RunConfig:
    """run's flags, each field one (arr_coc.flags.flag: its help and parse-time check)."""
    model: str | None = cli.model_flag()
    image: str = flag(None, "path of the image to look at (PNG, JPEG, ...: a format PIL reads; not a PDF)",
                      cli.image_file, required=True)
    question: list[str] = flag(None, f"the question to ask about the image (at most {MAX_QUESTION_CHARS} characters); "
                                     "given several times, they are asked in one conversation, in order",
                               cli.question, required=True, append=True)
    fresh_cells: bool = flag(False, "with several --question: ARR's follow-ups read only cells no earlier turn read")
    checkpoint: str | None = cli.checkpoint_flag()
    strategy: str = flag("topk", "saccade allocation strategy", cli.one_of(STRATEGIES))
    budget: int | str = cli.budget_flag()
    min_budget: int = cli.min_budget_flag()
    max_budget: int = cli.max_budget_flag()
    pipelines: str | None = flag(None, f"comma-separated subset of {','.join(PIPELINES)} ({pipelines.describe()}); "
                                       "default: all (all but fastv with several --question)",
                                 cli.comma_list(PIPELINES))
    ablations: str = flag("", "also run ARR under these ablations, comma-separated, or \"all\" (default none): "
                              + ablations.describe(), cli.ablation_list, shown="none")
    max_new_tokens: int = flag(64, "answer length limit", cli.new_tokens)
    max_cells: int = cli.max_cells_flag()
    gestalt_tokens: int = cli.gestalt_tokens_flag()
    refixate: float | None = cli.refixate_flag()
    refixate_budget: int | None = cli.refixate_budget_flag()
    refixate_guide: str = cli.refixate_guide_flag()
    look: str = cli.look_flag()
    crop_tokens: int = cli.crop_tokens_flag()
    device: str | None = device_flag()
    faithfulness: bool = flag(False, "also measure the deletion / random / insertion curves of ARR's answer (needs the "
                                     "arr pipeline)")
    faithfulness_steps: int = cli.faithfulness_steps_flag()
    answer: str | None = flag(None, "with --faithfulness: score this answer instead of ARR's own (e.g. the reference "
                                    "answer)", cli.nonblank)
    json: str | None = flag(None, "write the results here as JSON (a file path)", cli.output_file)
    save_dir: str | None = flag(None, "write heatmap, channel and scorer PNGs into this folder", cli.output_folder)
    teacher: str | None = flag(None, "with --save-dir: also draw teacher.png, the teacher's map (where the model looks "
                                     "reading the whole native view) beside ARR's relevance, with its heads from "
                                     "this folder's teacher_heads.json (python -m arr_coc.commands.teacher --out)",
                               teacher_folder)
    fallback: bool = False  # not a flag: --model left out, so the pocket model may stand in offline (default_model)


def parse_args(argv=None) -> RunConfig:
    p = config_parser(RunConfig, __doc__)
    args = parse_config(RunConfig, argv, p)
    cli.default_model(args)
    cli.check_fastv_layer(p, args)  # where the model's depth is known before it loads
    conversation = len(args.question) > 1
    if args.pipelines is None:
        args.pipelines = ",".join(p for p in PIPELINES if not (conversation and p in pipelines.FAST_ENGINE_ONLY))
    if conversation:
        unheld = sorted(set(cli.names(args.pipelines)) & set(pipelines.FAST_ENGINE_ONLY))
        for flag, wrong, why in (("--pipelines", unheld, f"{', '.join(unheld)} cannot hold one"),
                                 ("--faithfulness", args.faithfulness, "one question only"),
                                 ("--refixate", args.refixate is not None, "one question only")):
            if wrong:
                p.error(f"argument {flag}: not with several --question (a conversation): {why}")
    elif args.fresh_cells:
        p.error("argument --fresh-cells: only used with several --question (a conversation)")
    cli.check_budget(p, args, args.max_cells)
    cli.check_gestalt_tokens(p, args)
    if args.faithfulness and "arr" not in cli.names(args.pipelines):
        p.error("argument --faithfulness: needs the arr pipeline in --pipelines")
    if args.answer is not None and not args.faithfulness:
        p.error("argument --answer: only used with --faithfulness")
    cli.check_refixate(p, args)
    cli.check_look(p, args, [args.look])
    if args.teacher is not None and not args.save_dir:
        p.error("argument --teacher: only used with --save-dir")
    return args


def load_image(path: str):
    """The image as the app would get it (EXIF orientation applied, at most the app's MAX_IMAGE_PIXELS, checked on
    its header); InputError with the reason if unreadable or too large."""
    from PIL import Image, UnidentifiedImageError

    try:
        return open_image(path, MAX_IMAGE_PIXELS)
    except FileNotFoundError:
        raise InputError(f"no such image: {path}") from None
    except Image.DecompressionBombError as e:
        raise InputError(f"{path} is too large ({e}); the limit is {MAX_IMAGE_PIXELS // 10**6} megapixels, as in the "
                         "app: downscale it first") from None
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        raise InputError(f"cannot read {path} as an image ({type(e).__name__}: {e})") from None


def table(results: dict) -> str:
    """One row per pipeline: tokens, latency split, peak memory, answer; the header's second line gives the units."""
    from arr_coc.runtime.timing import TIMING_KEYS

    width = max(9, *(len(name) + 1 for name in results))
    columns = [("visual", "tokens", 8), ("text", "tokens", 8)] + [(k, "ms", 11) for k in TIMING_KEYS] + \
        [("peak", "MB", 8)]
    head = f"{'pipeline':<{width}}" + "".join(f"{name:>{w}}" for name, _, w in columns) + "  answer"
    units = f"{'':<{width}}" + "".join(f"{unit:>{w}}" for _, unit, w in columns)
    rows = [head, units, "-" * len(head)]
    for name, r in results.items():
        t, ms = r["tokens"], r["timings_ms"]
        rows.append(f"{name:<{width}}{t['total_visual']:>8}{t['text']:>8}" + "".join(f"{ms[k]:>11.1f}" for k in TIMING_KEYS)
                    + f"{r['peak_memory_mb']:>8.0f}  {r['answer'][:60]!r}")
    return "\n".join(rows)


def warm_up(model, image, question: str, runs: list, args: argparse.Namespace) -> None:
    """
    Each row's pipeline once, untimed, on a copy of the image at most WARMUP_SIDE px a side, one new token: the
    first request's one-time costs (kernels chosen, the relevance layer's first call) then land on no row's
    timings (the first row's total carried them: ARR's 9092 ms against full's 9132 on the pocket page). ARR warms
    up choosing saccades (ARR's Options.upsample), as the small copy's native view holds fewer cells than it reads.
    """
    small = image.copy()
    small.thumbnail((WARMUP_SIDE, WARMUP_SIDE))
    start = time.perf_counter()
    for pipeline in dict.fromkeys(p for p, _ in runs):
        try:
            cli.answer(model, small, question, pipeline, cli.request(args, max_new_tokens=1, upsample=True))
        except ValueError:  # a budget past the small copy's cells: that pipeline warms up on its timed run
            pass
    cli.log(f"warmed up in {time.perf_counter() - start:.1f} s (each pipeline once, untimed, on a "
            f"{small.width}x{small.height} copy)")


def tension_line(name: str, tensions: dict) -> str:
    """One ARR row's tensions, as recorded in the JSON (answer.tension_record)."""
    budget = f"K={tensions['budget']}" + (f" (auto, f={tensions['particularize']:.3f})" if tensions["auto_budget"]
                                          else " (fixed)")
    return (f"{name} tensions: explore e={tensions['explore']:.3f}, diversify lambda={tensions['diversify']:.3f}, "
            f"{budget}; image structure {tensions['structure']:.2f}; saccades fed in {tensions['saccade_order']} order")


def native_line(name: str, why: str) -> str:
    """An ARR row that read the native view whole, as full does, and why (Answer.reads_native)."""
    return (f"{name}: read the native view whole, as full does: {why} (choosing saccades would read more tokens, from "
            "a candidate grid upsampled past the image)")


def refixation_line(name: str, result: dict) -> str | None:
    """Whether an ARR row looked a second time, its confidences and answers (None: refixation was off)."""
    r = result.get("refixation")
    if r is None:
        return None
    first = f"{name}: confidence {r['confidences'][0]:.4f}"
    if not r["fired"]:
        return f"{first} >= tau {r['tau']}: no second look"
    return (f"{first} < tau {r['tau']}: a second look of {r['saccades'][1]} saccades ({r['guide']}), confidence "
            f"{r['confidences'][1]:.4f}; answers {r['answers'][0][:40]!r} -> {r['answers'][1][:40]!r}")


def turn_line(turn: int, results: dict) -> str:
    """A conversation's turn: each pipeline's TTFT, the tokens it prefilled and the conversation's length after it."""
    return f"turn {turn}: " + "; ".join(
        f"{name} TTFT {r['ttft_ms']:.1f} ms, {r['conversation']['prefilled']} tokens prefilled, context "
        f"{r['conversation']['context']}" for name, r in results.items())


def print_turn(results: dict, arr_answer) -> None:
    """One turn's table and the lines under it."""
    print(table(results))
    for name, result in results.items():
        if "tensions" in result:
            print(tension_line(name, result["tensions"]))
        if result.get("reads_native"):
            print(native_line(name, result["reads_native"]))
    for line in filter(None, (refixation_line(name, r) for name, r in results.items())):
        print(line)
    fallback = arr_answer.arr.fallback[0] if arr_answer is not None and arr_answer.arr is not None else None
    if fallback == "busy":
        print("note: a busy image (no cells stand out in its content); ARR kept its own saccades")
    elif fallback:
        print(f"note: ARR fell back to an even grid ({fallback})")


def ask(model, image, question: str, runs: list, chats: dict, args: argparse.Namespace) -> tuple[dict, object]:
    """One question through every row (a conversation's next turn where chats has the row) -> (its results by row,
    ARR's Answer or None)."""
    results, arr_answer = {}, None
    for pipeline, ablation in runs:
        try:
            answer = cli.answer(model, image, question, pipeline, cli.request(args, ablation=ablation),
                                conversation=chats.get((pipeline, ablation)))
        except ValueError as e:  # a value the image cannot take, e.g. a budget over its candidate cells
            raise InputError(str(e)) from None
        results[f"arr-{ablation}" if ablation else pipeline] = answer.to_json()
        arr_answer = answer if pipeline == "arr" and not ablation else arr_answer
    return results, arr_answer


def main(argv=None) -> int:
    args = parse_args(argv)
    from arr_coc.model import check_question  # after parsing: --help and bad flags answer without torch
    from arr_coc.pipelines.conversation import Conversation
    from arr_coc.relevance.layer import CheckpointError

    try:
        questions = [check_question(q) for q in args.question]
        if args.answer is not None:
            from arr_coc.eval.faithfulness import check_answer

            check_answer(args.answer)  # its length cap, before the model loads
        image = load_image(args.image)
        model, checkpoint = cli.load_model(args.model, args.checkpoint, args.device, fallback=args.fallback)
        args.model = model.vlm.name  # "pocket" where the default model fell back to it (the note says why)
        runs = [(p, None) for p in cli.names(args.pipelines)] + [("arr", a) for a in cli.names(args.ablations)]
        chats = {run: Conversation(run[0], image) for run in runs} if len(questions) > 1 else {}
        warm_up(model, image, questions[0], runs, args)
        turns = [ask(model, image, question, runs, chats, args) for question in questions]
        curves = faithfulness(model, turns[0][1], args) if args.faithfulness else None
    except (InputError, CheckpointError, OutOfMemory) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for turn, (question, (results, arr_answer)) in enumerate(zip(questions, turns), start=1):
        if chats:
            print(f"{'' if turn == 1 else chr(10)}turn {turn}: {question!r}")
        print_turn(results, arr_answer)
        if chats:
            print(turn_line(turn, results))
    if args.faithfulness:
        print(f"faithfulness of {curves.answer!r}: areas " + ", ".join(f"{k} {v:.4f}" for k, v in curves.areas.items())
              + " (mean log-likelihood per answer token; deletion below random: the answer depends on the saccades)")
    if args.json:
        report = dict(model=args.model, model_name=model.vlm.name, checkpoint=checkpoint, image=args.image,
                      notice=model.notice, max_cells=args.max_cells,
                      gestalt_tokens=args.gestalt_tokens, versions=cli.versions())
        if chats:
            report.update(questions=questions, fresh_cells=args.fresh_cells,
                          turns=[dict(question=q, pipelines=r) for q, (r, _) in zip(questions, turns)])
        else:
            report.update(question=questions[0], pipelines=turns[0][0],
                          faithfulness=curves.to_json() if args.faithfulness else None)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))
    if args.save_dir:
        for path in save_pictures(Path(args.save_dir), image, turns, bool(chats), curves) + teacher_pictures(
                model, image, questions, turns, args):
            print(f"wrote {path}")
    return 0


def faithfulness(model, arr_answer, args: argparse.Namespace):
    """--faithfulness: the deletion, random and insertion curves of ARR's answer (or --answer) on the first
    question."""
    from arr_coc.eval.faithfulness import faithfulness_curves

    if arr_answer.arr is None:
        raise InputError(f"--faithfulness needs ARR's saccades, and ARR read the native view whole "
                         f"({arr_answer.reads_native}): no saccades to remove")
    cli.log(f"faithfulness: {3 * args.faithfulness_steps + 1} teacher-forced forwards ...")
    return faithfulness_curves(model.parts, arr_answer.observation, arr_answer.arr,
                               args.answer or arr_answer.text, args.faithfulness_steps)


def save_pictures(save_dir: Path, image, turns: list, per_turn: bool, curves) -> list[Path]:
    """--save-dir: ARR's pictures of each turn (in turn-K/ for a conversation, with moves.png from the second turn
    on) and, with --faithfulness, faithfulness.png -> the files written."""
    from arr_coc import viz
    from arr_coc.pipelines.conversation import moves

    paths, before = [], None
    for turn, (_, arr_answer) in enumerate(turns, start=1):
        if arr_answer is None or arr_answer.arr is None:  # no ARR row, or it read the native view (nothing chosen)
            continue
        folder = save_dir / f"turn-{turn}" if per_turn else save_dir
        paths += viz.save_all(arr_answer, folder, image)
        if before is not None:  # how the saccades moved from the turn before
            moved = moves(before, arr_answer)
            viz.moves_overlay(image, arr_answer.arr.grid, moved.new, moved.kept, moved.dropped,
                              arr_answer.arr.relevance[0], turn).save(folder / "moves.png")
            paths.append(folder / "moves.png")
        before = arr_answer
    if curves is not None:
        paths.append(save_dir / "faithfulness.png")
        viz.faithfulness_chart(curves.fractions, curves.curves, f"faithfulness of {curves.answer!r}").save(paths[-1])
    return paths


def teacher_pictures(model, image, questions: list[str], turns: list, args: argparse.Namespace) -> list[Path]:
    """--teacher: each turn's teacher.png, the teacher's map of its question (the model's own answer on the whole
    native view, arr_coc.distill.teacher) beside ARR's relevance and saccades, and their overlap."""
    from arr_coc import viz
    from arr_coc.distill.teacher import TeacherHeads, teach

    if args.teacher is None:
        return []
    heads, paths = TeacherHeads.load(args.teacher), []
    for turn, (question, (_, arr_answer)) in enumerate(zip(questions, turns), start=1):
        if arr_answer is None or arr_answer.arr is None:  # no ARR row, or it read the native view (nothing chosen)
            continue
        target = teach(model.vlm, heads, image, question, max_cells=args.max_cells)
        ranked = arr_answer.arr.in_order("relevance").positions[0]
        paths.append(Path(args.save_dir) / (f"turn-{turn}" if len(turns) > 1 else "") / "teacher.png")
        viz.teacher_comparison(image, target.map, arr_answer.arr.relevance[0], saccades=ranked).save(paths[-1])
    return paths


if __name__ == "__main__":
    sys.exit(main())
