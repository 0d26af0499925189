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


def test_arr_beside_each_reducer_and_full_in_one_table_with_its_ratios(arr_model, capsys):
    rows = ["full", "divprune", "fastv", "arr", "arr-no-gestalt"]
    args = bench.parse_args(["--model", "tiny", "--device", "cpu", "--pipelines", ",".join(rows)])
    assert args.pipelines == ",".join(rows)
    with pytest.raises(SystemExit):
        bench.parse_args(["--model", "tiny", "--device", "cpu", "--pipelines", "arr-nope"])
    assert "unknown ['arr-nope']" in capsys.readouterr().err
    results = bench.bench_pipelines(arr_model, bench.test_image(448), rows, ["fast"], 2, 1, 1024)
    assert list(results) == [f"{row}/fast" for row in rows]
    no_gestalt, arr = results["arr-no-gestalt/fast"]["tokens"], results["arr/fast"]["tokens"]
    assert no_gestalt["gestalt"] == 0 and no_gestalt["saccade"] == arr["total_visual"] == 256 + 273  # the ablation ran
    table = bench.versus_table(results).splitlines()
    assert table[0].startswith("ARR against the token reducers (fast engine)")
    assert [line.split("|")[1].strip() for line in table[3:]] == rows  # one line each, full beside them
    for line, row in zip(table[3:], rows):
        cells = [c.strip() for c in line.strip("|").split("|")]
        r = results[f"{row}/fast"]
        times = [f"{r['timings_ms'][k]:.1f}" for k in ("vision", "selection", "prefill")]
        assert cells[1:6] == [str(r["tokens"]["total_visual"]), *times, f"{r['ttft_ms']:.1f}"]
        assert cells[-1] == f"{results['arr/fast']['ttft_ms'] / r['ttft_ms']:.2f}x"
    ratios = bench.ratios(results)
    assert set(ratios) == {"arr/fast vs full/fast", "arr/fast vs divprune/fast", "arr/fast vs fastv/fast"}
    fastv = results["fastv/fast"]
    assert ratios["arr/fast vs fastv/fast"]["ttft"] == pytest.approx(results["arr/fast"]["ttft_ms"] / fastv["ttft_ms"])
    assert bench.versus_table({k: v for k, v in results.items() if not k.startswith(("divprune", "fastv"))}) is None
