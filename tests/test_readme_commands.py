"""
The README's commands as a new user copies them (issue 54 items 12, 13, 15): the command line says to activate
the venv (bare `python` gave "No module named 'PIL'"), each example command that runs for long on a CPU has a size
that finishes in minutes and says how long it takes (evaluate, evaluate --conversation and train ran 22-25 min),
and the quick start says how a machine with no NVIDIA GPU gets PyTorch's CPU build (CUDA torch is 6.1 GB), as
PyTorch documents it, with the default command left as it was.
"""

import re
from pathlib import Path

from test_readme import section

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
DEFAULT_INSTALL = "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt && .venv/bin/python app.py"
CPU_TORCH = ".venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu"


def commands(text: str) -> list[str]:
    """The bash blocks' commands, each with its continuation lines and the comment lines under it joined."""
    lines = "\n".join(re.findall(r"^```bash\n(.*?)^```", text, flags=re.M | re.S)).splitlines()
    joined = []
    for line in lines:
        if joined and (joined[-1].endswith("\\") or line.lstrip().startswith(("#", "--")) or line.startswith("    ")):
            joined[-1] = joined[-1].rstrip("\\") + " " + line.strip()
        else:
            joined.append(line)
    return joined


def test_the_command_line_says_to_activate_the_venv():
    assert ". .venv/bin/activate" in section(README, "The command line")


def test_every_cpu_command_has_a_size_and_its_time():
    slow = [c for c in commands(section(README, "The command line"))
            if re.match(r"python -m arr_coc\.(run|evaluate|train) ", c)]
    assert len(slow) >= 5
    for command in slow:
        assert re.search(r"~\d+ (s|min)\b", command), command  # how long, on the 2-core CPU
        if "arr_coc.evaluate" in command:
            assert re.search(r"--(synthetic|limit) \d+ ", command), command
        if "arr_coc.train" in command:
            assert re.search(r"--steps \d+ ", command), command


def test_the_quick_start_gives_a_cpu_torch_and_keeps_the_default_command():
    quick = section(README, "Quick start")
    assert f"```bash\n{DEFAULT_INSTALL}\n```" in quick
    assert CPU_TORCH in quick and "no NVIDIA GPU" in quick


def test_the_cpu_install_is_two_plain_commands_torch_then_the_app():
    """Issue 67 item 4: the sentence once said "then the same command:" and showed the torch command instead; now the
    CPU torch install and the app's command stand as two lines of one block, to copy as they are."""
    cpu = ("```bash\npython3 -m venv .venv && .venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu"
           "\n.venv/bin/pip install -r requirements.txt && .venv/bin/python app.py\n```")
    assert cpu in section(README, "Quick start")
    assert "same command" not in section(README, "Quick start")
