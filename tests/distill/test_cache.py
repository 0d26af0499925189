"""
The teacher's cache of targets (arr_coc/distill/cache.py): targets written in shards come back as written, by item
id, across shards and after a resumed build; a target of another model or other heads, a repeated item and a missing
one are refused, each naming what is wrong.

    .venv/bin/python -m pytest -q tests/distill/test_cache.py
"""

import pytest
import torch

from arr_coc.distill.cache import INDEX, Target, TargetCache, TargetWriter

HEADS = ((3, 2), (1, 0))


def target(item: str, grid=(2, 3), answer="0427") -> Target:
    values = torch.arange(grid[0] * grid[1], dtype=torch.float32).view(grid) + len(item)
    return Target(item, grid, values / values.sum(), "pocket", HEADS, answer)


def test_targets_come_back_as_written_across_shards(tmp_path):
    written = [target("a"), target("page:7", (4, 2), "silver"), target("c", (1, 5), "")]
    with TargetWriter(tmp_path, "pocket", list(HEADS), shard_size=2) as writer:
        for t in written:
            writer.add(t)
    assert sorted(p.name for p in tmp_path.glob("targets-*.safetensors")) == ["targets-00000.safetensors",
                                                                            "targets-00001.safetensors"]
    cache = TargetCache(tmp_path)
    assert cache.items == ["a", "page:7", "c"] and len(cache) == 3 and "c" in cache and "d" not in cache
    for t in written:
        got = cache[t.item]
        assert (got.item, got.grid, got.model, got.heads, got.answer) == (t.item, t.grid, "pocket", HEADS, t.answer)
        assert got.map.dtype == torch.float32 and torch.equal(got.map, t.map)


def test_a_resumed_build_keeps_what_is_there_and_refuses_what_does_not_fit(tmp_path):
    with TargetWriter(tmp_path, "pocket", list(HEADS)) as writer:
        writer.add(target("a"))
    with TargetWriter(tmp_path, "pocket", list(HEADS)) as writer:
        assert "a" in writer
        with pytest.raises(ValueError, match="item 'a' is in the cache already"):
            writer.add(target("a"))
        with pytest.raises(ValueError, match=r"comes from tiny heads \[\(3, 2\), \(1, 0\)\]"):
            writer.add(Target("b", (1, 1), torch.ones(1, 1), "tiny", HEADS))
        writer.add(target("b"))
    cache = TargetCache(tmp_path)
    assert cache.items == ["a", "b"] and torch.equal(cache["a"].map, target("a").map)  # its shard not overwritten
    with pytest.raises(ValueError, match=r"holds targets of pocket heads \[\[3, 2\], \[1, 0\]\], not of pocket heads"):
        TargetWriter(tmp_path, "pocket", [(0, 0)])
    with pytest.raises(KeyError, match="no teacher target for item 'z'"):
        TargetCache(tmp_path)["z"]
    with pytest.raises(FileNotFoundError, match=INDEX):
        TargetCache(tmp_path / "empty")
