"""
The teacher's targets on disk, for training to read cheaply: safetensors shards of SHARD_SIZE maps each, keyed by
item id, and an index naming each item's shard. Data only (safetensors + JSON), never pickle.

    folder/
      teacher_heads.json         the heads the maps came from (teacher.TeacherHeads)
      index.json                 {"model": ..., "heads": [[layer, head], ...], "items": {item id: shard file}}
      targets-00000.safetensors  one float32 [gh, gw] tensor per item (its key: the item id); its metadata holds
                                 each item's teacher-forced answer as JSON ({"answers": {item id: answer}})

    with TargetWriter("out/teacher", model="pocket", heads=[(3, 0), (3, 1)]) as writer:
        writer.add(target)                                   # a Target, e.g. teacher.teach(...)
    cache = TargetCache("out/teacher")
    target = cache["fine_print:slide:1000000007"]            # Target: item, grid, map [gh, gw], model, heads, answer
    for item in cache.items: ...                             # every item id, in the order written
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

INDEX = "index.json"  # the cache's index: model, heads, item id -> shard
SHARD_SIZE = 1024  # maps a shard holds (a 64 x 64 map is 16 KiB: a shard of them 16 MiB)


@dataclass
class Target:
    """What the teacher says of one item: where the frozen VLM looked when it read the whole image and answered."""
    item: str  # the item's id in its set (a synthetic page's "family:kind:seed")
    grid: tuple[int, int]  # (gh, gw) the native view's cells, one merged token each
    map: torch.Tensor  # [gh, gw] float32, sums to 1: the teacher's attention mass per cell
    model: str  # the VLM it came from (its name as loaded)
    heads: tuple[tuple[int, int], ...]  # the (layer, head) pairs averaged
    answer: str = ""  # the answer that was teacher-forced (the model's own, unless one was given)


class TargetWriter:
    """Writes Targets of one model and one set of heads into a folder, SHARD_SIZE to a shard; `close` (or leaving a
    `with`) writes the last shard and the index. Items already in the folder's index are kept (a resumed build)."""

    def __init__(self, folder: str | Path, model: str, heads: list[tuple[int, int]], shard_size: int = SHARD_SIZE):
        self.folder, self.model, self.heads, self.shard_size = Path(folder), model, [list(h) for h in heads], shard_size
        self.folder.mkdir(parents=True, exist_ok=True)
        self.items: dict[str, str] = {}  # item id -> shard file name
        if (self.folder / INDEX).is_file():
            index = json.loads((self.folder / INDEX).read_text())
            if index["model"] != model or index["heads"] != self.heads:
                raise ValueError(f"{self.folder} holds targets of {index['model']} heads {index['heads']}, not of "
                                 f"{model} heads {self.heads}: use another folder")
            self.items = index["items"]
        self.maps: dict[str, torch.Tensor] = {}  # the shard being filled
        self.answers: dict[str, str] = {}

    def __contains__(self, item: str) -> bool:
        return item in self.items or item in self.maps

    def add(self, target: Target) -> None:
        if (target.model, [list(h) for h in target.heads]) != (self.model, self.heads):
            raise ValueError(f"target {target.item!r} comes from {target.model} heads {list(target.heads)}, the cache "
                             f"holds {self.model} heads {self.heads}")
        if target.item in self:
            raise ValueError(f"item {target.item!r} is in the cache already")
        self.maps[target.item] = target.map.detach().float().cpu().contiguous()  # [gh, gw]
        self.answers[target.item] = target.answer
        if len(self.maps) >= self.shard_size:
            self.flush()

    def flush(self) -> None:
        """The maps held so far as one new shard, and the index."""
        if self.maps:
            name = f"targets-{len(set(self.items.values())):05d}.safetensors"
            save_file(self.maps, str(self.folder / name), metadata={"answers": json.dumps(self.answers)})
            self.items.update({item: name for item in self.maps})
            self.maps, self.answers = {}, {}
        index = {"model": self.model, "heads": self.heads, "items": self.items}
        (self.folder / INDEX).write_text(json.dumps(index))

    close = flush

    def __enter__(self) -> "TargetWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TargetCache:
    """A folder of targets, read lazily: `cache[item]` -> Target (its shard opened once, memory-mapped)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if not (self.folder / INDEX).is_file():
            raise FileNotFoundError(f"{self.folder} holds no teacher targets ({INDEX} missing)")
        index = json.loads((self.folder / INDEX).read_text())
        self.model: str = index["model"]  # the VLM the maps came from
        self.heads: tuple[tuple[int, int], ...] = tuple(tuple(h) for h in index["heads"])  # the heads averaged
        self.shard_of: dict[str, str] = index["items"]  # item id -> shard file
        self.shards: dict[str, tuple] = {}  # shard file -> (its open handle, its answers)

    @property
    def items(self) -> list[str]:
        return list(self.shard_of)

    def __len__(self) -> int:
        return len(self.shard_of)

    def __contains__(self, item: str) -> bool:
        return item in self.shard_of

    def __getitem__(self, item: str) -> Target:
        if item not in self.shard_of:
            raise KeyError(f"no teacher target for item {item!r} in {self.folder}")
        name = self.shard_of[item]
        if name not in self.shards:
            handle = safe_open(str(self.folder / name), framework="pt")
            self.shards[name] = (handle, json.loads(handle.metadata()["answers"]))
        handle, answers = self.shards[name]
        grid_map = handle.get_tensor(item)  # [gh, gw]
        return Target(item, tuple(grid_map.shape), grid_map, self.model, self.heads, answers[item])
