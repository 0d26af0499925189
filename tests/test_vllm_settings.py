"""
The vLLM plugin's settings, checked before any work (arr_coc/engines/vllm_plugin.py: torch- and vLLM-free, so in the
project's venv): a server's --hf-overrides arr_* keys and $ARR_COC_* variables (server_settings), a request's
mm_processor_kwargs (request_settings). Each bad one is a ValueError in one line (vLLM answers a request's with HTTP
400; a server's stops it before it loads). Seen failing with the budget's bound check removed.

    .venv/bin/python -m pytest -q tests/test_vllm_settings.py
"""

from types import SimpleNamespace

import pytest

from arr_coc.engines.vllm_plugin import ServerSettings, request_settings, server_settings


def one_line_error(call, *args) -> str:
    with pytest.raises(ValueError) as e:
        call(*args)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_server_settings_from_overrides_and_environment(monkeypatch):
    monkeypatch.delenv("ARR_COC_BUDGET", raising=False)
    monkeypatch.setenv("ARR_COC_STRATEGY", "grid")
    got = server_settings(SimpleNamespace(arr_budget=64, arr_max_cells=2048))
    assert got == ServerSettings(checkpoint=None, budget=64, strategy="grid", max_cells=2048)
    assert server_settings(SimpleNamespace(arr_strategy="topk")).strategy == "topk"  # the override over $ARR_COC_*


@pytest.mark.parametrize("overrides, says", [
    (dict(arr_budget=0), "--hf-overrides arr_budget: must be between 1 and 16384, got 0"),
    (dict(arr_budget=1.5), "--hf-overrides arr_budget: expected an integer, got '1.5'"),
    (dict(arr_budget=True), "--hf-overrides arr_budget: expected an integer, got 'true'"),
    (dict(arr_max_cells=10), "--hf-overrides arr_max_cells: must be between 1024 and 16384, got 10"),
    (dict(arr_strategy="best"), "--hf-overrides arr_strategy: unknown 'best'; choose from topk, logpolar, grid, random, "
                                "regions, regions_ink"),
    (dict(arr_budget=2000, arr_max_cells=1024), "arr_budget 2000 exceeds arr_max_cells 1024"),
    (dict(arr_bugdet=16), "unknown ARR-COC setting arr_bugdet in --hf-overrides; the settings are arr_checkpoint, "
                          "arr_budget, arr_strategy, arr_max_cells"),
])
def test_server_settings_refused(monkeypatch, overrides, says):
    monkeypatch.delenv("ARR_COC_STRATEGY", raising=False)
    assert one_line_error(server_settings, SimpleNamespace(**overrides)) == says


def test_server_settings_environment_refused(monkeypatch):
    monkeypatch.setenv("ARR_COC_BUDGET", "many")
    assert one_line_error(server_settings, SimpleNamespace()) == "$ARR_COC_BUDGET: expected an integer, got 'many'"


SERVER = ServerSettings(strategy="logpolar")


def test_request_settings():
    assert request_settings(SERVER, 273, {}) == (273, "logpolar")
    assert request_settings(SERVER, 273, {"arr_budget": 16, "arr_strategy": "grid", "arr_question": "?"}) == (16, "grid")
    assert request_settings(SERVER, 273, {"arr_budget": 273, "max_pixels": 100}) == (273, "logpolar")  # not ARR's


@pytest.mark.parametrize("kwargs, says", [
    ({"arr_budget": 0}, "mm_processor_kwargs arr_budget (at most the server's budget): must be between 1 and 273, got 0"),
    ({"arr_budget": 274}, "mm_processor_kwargs arr_budget (at most the server's budget): must be between 1 and 273, "
                          "got 274"),
    ({"arr_budget": True}, "mm_processor_kwargs arr_budget (at most the server's budget): expected an integer, got "
                           "'true'"),
    ({"arr_strategy": "best"}, "mm_processor_kwargs arr_strategy: unknown 'best'; choose from topk, logpolar, grid, "
                               "random, regions, regions_ink"),
    ({"arr_max_cells": 99}, "unknown mm_processor_kwargs arr_max_cells; ARR-COC takes arr_budget, arr_strategy"),
])
def test_request_settings_refused(kwargs, says):
    assert one_line_error(request_settings, SERVER, 273, kwargs) == says
