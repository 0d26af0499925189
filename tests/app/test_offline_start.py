"""
The app's start-up with no network (issue 54 item 14): one quick probe of the hub instead of transformers' retries
(23 s here, each line printed twice), HF_HUB_OFFLINE=1 said as such, no "a hub id downloads" for an offline
model, and a typo of an offline model's name named in the banner, as `run` names it.
"""

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_hub(monkeypatch, tmp_path):
    """No hub (its one quick probe gets no answer), an empty cache, no earlier offline reason; all put back."""
    from huggingface_hub import constants

    from arr_coc import checkpoints

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(checkpoints, "_OFFLINE", {})
    monkeypatch.setattr(checkpoints, "hub_answers", lambda endpoint, timeout=checkpoints.HUB_TIMEOUT_S: False)
    return constants


def load(name: str, caplog) -> tuple:
    import app

    caplog.clear()
    start = time.perf_counter()
    with caplog.at_level(logging.INFO, logger="arr_coc.app"):
        model = app.load_model(name)
    return model, caplog.text, time.perf_counter() - start


def test_a_typo_offline_is_named_at_once_in_the_banner(no_hub, caplog):
    model, log, seconds = load("pockt", caplog)
    assert seconds < 15 and model.vlm.name == "pocket"  # transformers' retries alone took 23 s
    assert model.notice.startswith("Could not load the model 'pockt' (did you mean 'pocket'?): the hub (")
    assert "cannot be reached, and it is not in the local cache. Running pocket-qwen2-vl" in model.notice
    assert "loading the model pockt ..." in log and "downloads on its first run" not in log  # the hub was not asked


def test_hf_hub_offline_is_said_as_such_not_as_a_failed_connection(no_hub, caplog):
    no_hub.HF_HUB_OFFLINE = True
    model, log, _ = load("Qwen/Qwen2-VL-2B-Instruct", caplog)
    assert model.notice.startswith("Could not load the model 'Qwen/Qwen2-VL-2B-Instruct': HF_HUB_OFFLINE=1 is set, "
                                   "and it is not in the local cache. Running pocket-qwen2-vl")
    assert "connect" not in model.notice.lower() and "downloads on its first run" not in log


def test_an_offline_model_asked_for_is_not_called_a_download(no_hub, caplog):
    model, log, _ = load("pocket", caplog)
    assert "loading the model pocket ..." in log and "hub" not in log.split("loading the model pocket")[1][:40]


def test_a_hub_warning_is_printed_once():
    code = ("import app; app.configure_logging()\n"
            "from huggingface_hub.utils import logging as hub_logging\n"
            "hub_logging.get_logger('huggingface_hub.file_download').warning('probe: Retrying in 1s')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.stderr.count("probe: Retrying in 1s") == 1, proc.stderr
