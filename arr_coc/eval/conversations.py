"""
Follow-up accuracy (evaluate --conversation): each fine-print page of the pocket suite (arr_coc.synth.fineprint)
is asked up to `turns` of its own questions, by every row twice: in one conversation (arr_coc.pipelines.conversation)
and each question alone. Exact match by turn, with 95% Wilson intervals, so a drop at later turns shows whether
a conversation's earlier turns help or hinder.

    python -m arr_coc.evaluate --model pocket --conversation --synthetic 96 --kinds box_word,fine_print \
        --baselines full --strategies topk --budget 64 --out runs/eval-conversation
"""

import json
import random
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from arr_coc.eval.metrics import METRICS
from arr_coc.eval.rows import split_row
from arr_coc.eval.intervals import interval_text
from arr_coc.synth.fineprint import PAGE_KINDS, make_page

MODES = ("conversation", "alone")  # every question asked as a turn of one conversation, and asked alone


@dataclass
class TurnResult:
    """One question of one page, asked by one row in one mode."""
    item: int  # the page's index
    kind: str  # its kind (a PAGE_KINDS name)
    seed: int  # its seed (make_page)
    row: str  # the row: a pipeline, or "arr:<strategy>"
    mode: str  # one of MODES
    turn: int  # the question's place in the page's conversation, 1 first (asked alone too: its place there)
    question: str
    answer: str  # the reference
    prediction: str
    score: float  # exact match
    ttft_ms: float
    prefilled: int  # tokens this answer's prefill read (a follow-up: its own turn only)


def page_questions(kind: str, seed: int, size: int, turns: int):
    """A page and up to `turns` of its questions, in an order drawn from the seed -> (page, questions)."""
    page = make_page(kind, seed, size)
    questions = random.Random(f"conversation-{kind}-{seed}").sample(page.questions, min(turns, len(page.questions)))
    return page, questions


def ask_page(model, ask, page, questions, rows: list[str], item: int, seed: int) -> list[TurnResult]:
    """
    Every row's answers to one page's questions, in one conversation and each alone. `ask(image, question,
    pipeline, strategy, conversation)` answers one (cli.answer with the command's settings).
    """
    from arr_coc.pipelines.conversation import Conversation

    out = []
    for row in rows:
        pipeline, strategy, _, _ = split_row(row)
        chat = Conversation(pipeline, page.image)
        for turn, q in enumerate(questions, start=1):
            for mode in MODES:
                a = ask(page.image, q.question, pipeline, strategy, chat if mode == "conversation" else None)
                out.append(TurnResult(item, page.kind, seed, row, mode, turn, q.question, q.answer, a.text,
                                      METRICS["exact"](a.text, [q.answer]), round(a.ttft_ms, 2), a.prefilled))
    return out


def evaluate_conversations(model, ask, rows: list[str], kinds: list[str], pages: int, seed: int, size: int,
                           turns: int, progress=iter) -> list[TurnResult]:
    """`pages` pages cycling through `kinds` (page i: seed * 1_000_003 + i // len(kinds), as evaluate's synthetic
    scenes), each asked up to `turns` questions by every row, in one conversation and alone."""
    unknown = sorted(set(kinds) - set(PAGE_KINDS))
    if unknown:
        raise ValueError(f"--conversation asks the pocket suite's pages ({', '.join(PAGE_KINDS)}), not {unknown}")
    results = []
    for i in progress(range(pages)):
        kind, page_seed = kinds[i % len(kinds)], seed * 1_000_003 + i // len(kinds)
        page, questions = page_questions(kind, page_seed, size, turns)
        results += ask_page(model, ask, page, questions, rows, i, page_seed)
    return results


def by_turn(results: list[TurnResult]) -> dict:
    """{(kind or "all", row, mode): {turn: (correct, n)}}."""
    table = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    for r in results:
        for kind in (r.kind, "all"):
            cell = table[(kind, r.row, r.mode)][r.turn]
            cell[0] += r.score
            cell[1] += 1
    return {key: {turn: tuple(v) for turn, v in sorted(turns.items())} for key, turns in table.items()}


def markdown(results: list[TurnResult]) -> str:
    """Exact match by turn, per kind (and all kinds), one line per row and mode, with intervals and counts."""
    table = by_turn(results)
    turns = max(r.turn for r in results)
    head = "| kind | row | mode | " + " | ".join(f"turn {t}" for t in range(1, turns + 1)) + " |"
    lines = [head, "|" + "---|" * (3 + turns)]
    for (kind, row, mode), cells in sorted(table.items(), key=lambda kv: (kv[0][0] == "all", kv[0])):
        lines.append(f"| {kind} | {row} | {mode} | "
                     + " | ".join(interval_text(*cells[t]) if t in cells else "-" for t in range(1, turns + 1)) + " |")
    return "\n".join(lines)


def write(folder: str | Path, results: list[TurnResult], settings: dict) -> list[Path]:
    """results.jsonl (one line per answer), report.md (by turn) and report.json (the counts) in `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "results.jsonl", folder / "report.md", folder / "report.json"]
    paths[0].write_text("".join(json.dumps(asdict(r)) + "\n" for r in results))
    paths[1].write_text("# Follow-up accuracy (exact match by turn, 95% Wilson intervals)\n\n"
                        f"```json\n{json.dumps(settings, indent=2)}\n```\n\n{markdown(results)}\n")
    counts = [dict(kind=k, row=row, mode=mode, turns={t: dict(correct=c, n=n) for t, (c, n) in cells.items()})
              for (k, row, mode), cells in by_turn(results).items()]
    paths[2].write_text(json.dumps(dict(settings=settings, by_turn=counts), indent=2))
    return paths
