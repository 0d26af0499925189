"""
arr_coc/engines/vllm_bench.py without a server: --out's JSON (the run's settings and one row a level with each
request's time to first token, written after each level) and the nearest-rank percentile the table's p50 / p99 come
from. Values written out by hand.

    .venv/bin/python -m pytest -q tests/test_vllm_bench.py
"""

import json
from pathlib import Path

from arr_coc.engines.vllm_bench import ServingBenchConfig, Level, percentile, write_json
from arr_coc.flags import config_parser, parse_config


def test_out_writes_settings_and_levels(tmp_path):
    args = parse_config(ServingBenchConfig, ["--data", "pages", "--concurrency", "1,4", "--requests", "3", "--out",
                                      str(tmp_path / "run" / "arr.json"), "--served",
                                      "ArrCocQwen2VLForConditionalGeneration"], config_parser(ServingBenchConfig, ""))
    assert args.out == tmp_path / "run" / "arr.json"
    levels = [Level("ArrCocQwen2VLForConditionalGeneration", 1, 3, 1.5, 800.0, 900.0, 559.0, [900.0, 700.0, 800.0]),
              Level("ArrCocQwen2VLForConditionalGeneration", 4, 3, 1.25, 3000.0, 3400.0, 559.0)]
    write_json(args.out, args, levels)
    got = json.loads(args.out.read_text())
    assert got == {
        "settings": {"data": "pages", "model": "models/pocket-qwen2-vl", "concurrency": [1, 4], "requests": 3,
                     "max_tokens": 16, "max_model_len": 8192, "served": ["ArrCocQwen2VLForConditionalGeneration"]},
        "levels": [
            {"architecture": "ArrCocQwen2VLForConditionalGeneration", "concurrency": 1, "requests": 3,
             "per_second": 1.5, "ttft_p50_ms": 800.0, "ttft_p99_ms": 900.0, "prompt_tokens": 559.0,
             "ttft_ms": [900.0, 700.0, 800.0]},
            {"architecture": "ArrCocQwen2VLForConditionalGeneration", "concurrency": 4, "requests": 3,
             "per_second": 1.25, "ttft_p50_ms": 3000.0, "ttft_p99_ms": 3400.0, "prompt_tokens": 559.0,
             "ttft_ms": []}]}


def test_out_defaults_to_none():
    assert parse_config(ServingBenchConfig, ["--data", "pages"], config_parser(ServingBenchConfig, "")).out is None


def test_percentile_nearest_rank():
    eight = [8.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 4.0]
    assert percentile(eight, 50) == 4.0  # rank ceil(0.5 * 8) = 4
    assert percentile(eight, 99) == 8.0  # rank ceil(0.99 * 8) = 8
    assert percentile([3.0], 99) == 3.0
