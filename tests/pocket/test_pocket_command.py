"""
The pocket trainer's command (arr_coc/pocket/train.py) where a new user meets it (issue 67 item 3):
torchrun on a machine with no CUDA GPU is refused in one line, exit 2, before any model or page worker starts (it
once started four ranks of 14 page workers each on a 2-core CPU), and --resume into a folder with no run says in one
line that it starts from --init's exported folder (the shipped model by default).

    python -m pytest -q tests/pocket/test_pocket_command.py
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN_ENV = dict(WORLD_SIZE="4", RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="4", GROUP_RANK="0",
                    MASTER_ADDR="127.0.0.1", MASTER_PORT="29531")  # what torchrun --nproc-per-node 4 gives rank 0


def test_torchrun_without_cuda_is_refused_in_one_line_before_anything_starts(tmp_path):
    out = tmp_path / "pocket"
    env = {**os.environ, **TORCHRUN_ENV, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "arr_coc.pocket.train", "--out", str(out), "--resume"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stdout == "", done.stderr
    assert "torchrun started 4 processes, and with no CUDA GPU (or --device cpu) they would all train on the CPU, " \
           "each with 14 page workers" in done.stderr
    assert not out.exists()  # nothing written, no tokenizer saved, no model loaded


def test_the_other_ranks_exit_2_silently_and_an_explicit_cpu_device_is_refused_too(monkeypatch, tmp_path, capsys):
    from arr_coc.pocket.train import main

    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(tmp_path / "run"), "--device", "cpu", "--workers", "2"])
    assert exit_.value.code == 2 and capsys.readouterr().err == ""  # rank 0 says it, once
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(tmp_path / "run"), "--device", "cpu", "--workers", "2"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "each with 2 page workers" in err, err


def test_resume_into_a_folder_with_no_run_says_what_it_starts_from(monkeypatch, tmp_path, capsys):
    from arr_coc.checkpoints import POCKET_FOLDER
    from arr_coc.pocket import train as pocket_train
    from arr_coc.pocket.trainer import resume_line

    exported = tmp_path / "exported"
    shutil.copytree(POCKET_FOLDER, exported)
    state = json.loads((exported / "training_state.json").read_text())
    (exported / "training_state.json").write_text(json.dumps(state | {"step": 123456}))
    ran = []
    monkeypatch.setattr(pocket_train, "train", lambda cfg, resume, process: ran.append(resume) or
                        dict(step=123457, gpu_seconds=0.0))
    pocket_train.main(["--out", str(tmp_path / "empty"), "--resume", "--init", str(exported), "--device", "cpu"])
    assert ran == [True]
    assert capsys.readouterr().err.splitlines()[0] == (
        f"pocket: --resume, and {tmp_path / 'empty'} holds no run (state.json) yet: starting from {exported} "
        "(--init), at its step 123456")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "state.json").write_text("{}")
    assert resume_line(tmp_path / "run", True, exported) is None  # a run to resume: nothing to say
    assert resume_line(tmp_path / "empty", False, exported) is None  # no --resume: a fresh run, as asked
    assert resume_line(tmp_path / "empty", True, tmp_path / "nothing") == (
        f"pocket: --resume, and {tmp_path / 'empty'} holds no run (state.json) yet, nor {tmp_path / 'nothing'} a "
        "model: starting fresh")
