"""
The pocket model's numbers have one source (issue 54 item 17): the banner said "about five in six" while the README
said 0.90. Both now come from models/pocket-qwen2-vl/training_state.json's held-out check of the shipped step.
"""

import json
import re
from pathlib import Path

from arr_coc.checkpoints import POCKET_KINDS, POCKET_NOTICE, POCKET_STATE, pocket_accuracy, pocket_notice

ROOT = Path(__file__).resolve().parents[1]


def shipped_check() -> dict:
    """The trainer's held-out checks of the shipped step at 896 px, the one with the most pages (read here anew)."""
    state = json.loads(POCKET_STATE.read_text())
    checks = [c for c in state["heldout"] if c["step"] == state["step"] and "896" in c["accuracy"]]
    return max(checks, key=lambda c: c["pages"])


def test_the_banner_says_the_shipped_steps_held_out_check():
    check = shipped_check()
    numbers = [f"{check['accuracy']['896']['full'][kind]:.2f}" for kind in POCKET_KINDS]
    assert (f"At 896 px its full view reads {numbers[0]} of the suite's fine-print values, {numbers[1]} of its box "
            f"words and {numbers[2]} of its shape colours (step {check['step']}, {check['pages']} held-out pages") \
        in POCKET_NOTICE
    assert "five in six" not in POCKET_NOTICE and "two in three" not in POCKET_NOTICE


def test_the_readme_gives_the_banners_numbers():
    """The README's offline table (full at 896², held-out pages) opens each kind's row with the banner's number."""
    readme = (ROOT / "README.md").read_text()
    check = pocket_accuracy()
    for kind in POCKET_KINDS:
        row = re.search(rf"^\| `{kind}` \|[^|]*\| (\d\.\d\d) \[", readme, flags=re.M)
        assert row and row.group(1) == f"{check['full'][kind]:.2f}", kind


def test_other_weights_other_numbers_and_no_record_no_numbers(tmp_path):
    state = tmp_path / "training_state.json"
    accuracy = {"896": {"full": {"fine_print": 0.5, "box_word": 0.25, "shape_colour": 1.0}}}
    state.write_text(json.dumps({"step": 7, "heldout": [{"step": 7, "pages": 4, "accuracy": accuracy},
                                                        {"step": 7, "pages": 96, "accuracy": accuracy}]}))
    assert "reads 0.50 of the suite's fine-print values, 0.25 of its box words and 1.00 of its shape colours " \
           "(step 7, 96 held-out pages" in pocket_notice(state)
    assert "model card gives how often" in pocket_notice(tmp_path / "none.json")
