"""The bench's pipeline timings on the tiny model: exact lengths while it runs, the shared model as it found it after."""

import pytest

from arr_coc import bench


def test_bench_restores_the_engine_and_min_new_tokens_it_sets(arr_model, monkeypatch):
    vlm = arr_model.vlm
    config = vlm.model.generation_config
    before = vlm.engine, config.min_new_tokens
    results = bench.bench_pipelines(arr_model, bench.test_image(112), ["gestalt"], ["fast", "hf"], 3, 1, 1024)
    assert set(results) == {"gestalt/fast", "gestalt/hf"}
    assert all(r["new_tokens"] == 3 for r in results.values())  # EOS suppressed while it ran
    assert (vlm.engine, config.min_new_tokens) == before  # the app's requests after it see the model unchanged

    def fails(*args, **kwargs):
        raise RuntimeError("a failed run")

    monkeypatch.setattr(arr_model, "answer", fails)
    with pytest.raises(RuntimeError, match="a failed run"):
        bench.bench_pipelines(arr_model, bench.test_image(112), ["gestalt"], ["hf"], 3, 1, 1024)
    assert (vlm.engine, config.min_new_tokens) == before  # restored on an error too
