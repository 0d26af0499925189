"""
`run`'s table (issue 54 item 16): every header whole ("selection" was cut to "selecti"), its units on a second
line, and a warm-up of each pipeline before the timed rows (the first row carried it: ARR's total 9092 ms against
full's 9132 on the pocket page).
"""

from arr_coc import run
from arr_coc.commands import cli
from arr_coc.runtime.timing import TIMING_KEYS


def result(answer: str) -> dict:
    return dict(tokens=dict(total_visual=529, text=30), timings_ms={k: 1234.5 for k in TIMING_KEYS},
                peak_memory_mb=887.0, answer=answer)


def test_every_header_is_whole_with_its_units():
    head, units, rule, row = run.table({"arr": result("6407")}).splitlines()
    assert head.split() == ["pipeline", "visual", "text", *TIMING_KEYS, "peak", "answer"]
    assert units.split() == ["tokens", "tokens", *["ms"] * len(TIMING_KEYS), "MB"]
    assert set(rule) == {"-"} and row.split() == ["arr", "529", "30", *["1234.5"] * len(TIMING_KEYS), "887", "'6407'"]
    for name, unit in zip(head.split()[1:-1], units.split()):  # each unit right-aligned under its header
        assert head.index(name) + len(name) == units.index(unit, head.index(name) - 2) + len(unit)


def test_each_pipeline_warms_up_once_untimed_before_the_timed_rows(monkeypatch, capsys):
    calls = []
    answer = cli.answer

    def recording(model, image, question, pipeline, request, conversation=None):
        calls.append((pipeline, max(image.size), request.max_new_tokens))
        return answer(model, image, question, pipeline, request, conversation)

    monkeypatch.setattr(cli, "answer", recording)
    assert run.main(["--model", "tiny", "--image", "assets/chelsea.png", "--question", "What is here?",
                     "--pipelines", "arr,gestalt", "--max-new-tokens", "2"]) == 0
    side = max(run.load_image("assets/chelsea.png").size)
    assert calls == [("arr", run.WARMUP_SIDE, 1), ("gestalt", run.WARMUP_SIDE, 1),
                     ("arr", side, 2), ("gestalt", side, 2)]
    assert "warmed up in" in capsys.readouterr().err
