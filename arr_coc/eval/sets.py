"""
The evaluation sets: DocVQA, TextVQA and ChartQA through `datasets.load_dataset`, the JSONL format of
arr_coc.eval.data, and fresh synthetic scenes, all as one stream of Items for evaluate.py.

A source is a hub id ("lmms-lab/DocVQA"), a local folder of parquet files in a hub set's schema, one parquet
file, or a folder holding data.jsonl. Its schema says which columns hold the question, the reference answers
and the image, and which metric the set is scored by:

    schema   columns                                   metric (arr_coc.eval.metrics)   new tokens
    docvqa   question, answers, image                  anls                       32
    textvqa  question, answers (10), image             vqa                        128
    chartqa  query | question, label | answer, image   relaxed                    16
    jsonl    image, question, answer, box              contains                   16
    suite    the fine-print pages (--synthetic)        exact                      16

The hub sets are asked as lmms-eval asks Qwen2-VL (its tasks' `default` prompt kwargs and generation limits):
the question (TextVQA's through str.capitalize()), then the set's one-line instruction.

    source = open_source("lmms-lab/DocVQA", split="validation", config="DocVQA", limit=100)
    for item in source.items: item.question, item.answers, item.open()

Images are decoded only when an item is evaluated (`Item.open`), so a resumed or sharded run skips the rest
cheaply, and an unreadable image is reported with its item's index.
"""

from __future__ import annotations

import io
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from PIL import Image, UnidentifiedImageError

from arr_coc.eval.data import Box, Sample, check_at, load_jsonl, make_dataset
from arr_coc.vlm.images import open_image
from arr_coc.synth.fineprint import PAGE_KINDS
from arr_coc.errors import InputError

SHORT_ANSWER = "Answer the question using a single word or phrase."  # lmms-eval's DocVQA and TextVQA instruction
SINGLE_WORD = "Answer the question with a single word."  # lmms-eval's ChartQA instruction


@dataclass(frozen=True)
class Schema:
    question: tuple[str, ...]  # the question's column: the first of these the set has
    answers: tuple[str, ...]  # the reference answer(s) column, a string or a list of strings: the first found
    metric: str  # the set's official metric, a key of arr_coc.eval.metrics.METRICS
    instruction: str = ""  # on its own line after every question (the sets expect one short answer)
    capitalize: bool = False  # the question goes through str.capitalize() first (lmms-eval's TextVQA does)
    max_new_tokens: int = 16  # evaluate's answer length limit unless --max-new-tokens says otherwise
    reference: str = ""  # where the prompt and the limit come from, recorded in evaluate's run.json
    image: str = "image"  # the image's column
    hub_ids: tuple[str, ...] = ()  # hub datasets known to use this schema (others are told by their name)


SCHEMAS = {  # prompts and limits verified in lmms-eval's tasks/{docvqa,textvqa,chartqa} and models/simple/qwen2_vl.py
    "docvqa": Schema(("question",), ("answers",), "anls", SHORT_ANSWER, max_new_tokens=32,
                     reference="lmms-eval docvqa_val: default post_prompt, max_new_tokens 32",
                     hub_ids=("lmms-lab/DocVQA", "HuggingFaceM4/DocumentVQA")),
    "textvqa": Schema(("question",), ("answers",), "vqa", SHORT_ANSWER, capitalize=True, max_new_tokens=128,
                      reference="lmms-eval textvqa_val: question.capitalize(), default post_prompt; no "
                                "max_new_tokens, so its Qwen2-VL model's default of 128",
                      hub_ids=("lmms-lab/textvqa", "facebook/textvqa")),
    "chartqa": Schema(("query", "question"), ("label", "answer"), "relaxed", SINGLE_WORD, max_new_tokens=16,
                      reference="lmms-eval chartqa: default post_prompt, max_new_tokens 16",
                      hub_ids=("HuggingFaceM4/ChartQA", "lmms-lab/ChartQA")),
    "jsonl": Schema(("question",), ("answer",), "contains", reference="ARR-COC's own sets: the question as written"),
    "suite": Schema(("question",), ("answer",), "exact", reference="the fine-print suite (arr_coc.synth.fineprint): "
                                                                    "exact match, as the pocket model is trained"),
}
ID_COLUMNS = ("questionId", "question_id", "id")  # a set's own id for an item, kept in the results when present


@dataclass
class Item:
    index: int  # position in the source (0 .. limit - 1): results are resumed and merged by it
    id: str  # the set's own id for the item, else the index
    question: str  # as the set asks it (evaluate adds the schema's instruction)
    answers: list[str]  # reference answers (TextVQA: the ten human answers); none in a test split
    image: object  # a PIL image, a path, or the set's {"bytes", "path"}: decoded by open()
    box: Box | None = None  # half-open pixel box of the region the question is about, where the set has one
    kind: str = ""  # the schema, or the synthetic scene kind
    family: str = ""  # a pocket page's layout family (synth/families.py), "" for every other item
    where: str = ""  # its data.jsonl line ("file:line"), "" for a hub row or a generated scene

    def open(self) -> Image.Image:
        """The item's image, RGB-ready; InputError naming the item if it cannot be read."""
        try:
            if isinstance(self.image, Image.Image):
                return self.image
            if isinstance(self.image, dict) and self.image.get("bytes"):
                return open_image(io.BytesIO(self.image["bytes"]))
            path = self.image.get("path") if isinstance(self.image, dict) else self.image
            return open_image(path)
        except UnidentifiedImageError:  # its message would name the in-memory file by its repr
            reason = "not an image format PIL can read"
        except Exception as e:  # PIL raises several types for broken files
            reason = f"{type(e).__name__}: {str(e)[:120]}"
        raise InputError(f"item {self.index} (id {self.id}): cannot read its image ({reason})")


@dataclass
class Source:
    name: str  # what the user passed: a hub id, a folder, a file, or "synthetic"
    schema: str  # a key of SCHEMAS
    items: Iterable[Item]  # streamed: images load when evaluated

    @property
    def metric(self) -> str:
        return SCHEMAS[self.schema].metric

    def prompt(self, item: Item) -> str:
        """The question as the model is asked it: capitalised where the schema says, its instruction on its own line."""
        return self.ask(item.question.capitalize() if SCHEMAS[self.schema].capitalize else item.question)

    @property
    def prompt_template(self) -> str:
        """What every item is asked, for run.json: "{question}" (or "{question.capitalize()}") and the instruction."""
        return self.ask("{question.capitalize()}" if SCHEMAS[self.schema].capitalize else "{question}")

    def ask(self, question: str) -> str:
        instruction = SCHEMAS[self.schema].instruction
        return f"{question}\n{instruction}" if instruction else question


def check_questions(source: Source, check: Callable[[str], str]) -> None:
    """Every question of a source read whole (a JSONL set, generated scenes) as the model is asked it, by `check`
    (ARRCOCQwen.check_question: its length in the model's tokens too), before the first item runs: one that cannot
    run is refused naming its line, not met in the middle of a run, where resuming would meet it again."""
    if isinstance(source.items, list):  # a hub set streams: its rows are not read ahead
        for item in source.items:
            check_at(item.where, check, source.prompt(item))


def guess_schema(name: str) -> str:
    """The schema of a source: data.jsonl -> jsonl, a known hub id, else a schema named in the path or id."""
    path = Path(name)
    if path.is_file() and path.suffix == ".jsonl" or (path / "data.jsonl").is_file():
        return "jsonl"
    for schema, s in SCHEMAS.items():
        if name in s.hub_ids or schema in name.lower().replace("-", "").replace("_", ""):
            return schema
    raise InputError(f"cannot tell the schema of {name!r}; pass --schema ({', '.join(SCHEMAS)})")


def open_source(name: str, split: str = "validation", config: str | None = None, schema: str | None = None,
                limit: int | None = None) -> Source:
    """A dataset's items (the first `limit`), streamed; InputError for a set that cannot be read as its schema."""
    schema = schema or guess_schema(name)
    if schema == "jsonl":
        return Source(name, schema, from_samples(load_jsonl(name)[:limit]))
    rows = load_rows(name, split, config)
    return Source(name, schema, from_rows(rows, SCHEMAS[schema], schema, name, limit))


def synthetic_source(n: int, kinds: tuple[str, ...], seed: int, size: int = 896,
                     held_out_layouts: bool = False, families: tuple[str, ...] = ()) -> Source:
    """Fresh synthetic scenes (arr_coc.eval.data) of size x size px, scored like the JSONL sets; pages of the
    fine-print suite alone by exact match (contains is reported beside it); held_out_layouts, families: make_scene's."""
    schema = "suite" if set(kinds) <= set(PAGE_KINDS) else "jsonl"
    return Source("synthetic", schema, from_samples(make_dataset(n, kinds, seed=seed, size=size,
                                                                 held_out_layouts=held_out_layouts,
                                                                 families=families)))


def from_samples(samples: list[Sample]) -> list[Item]:
    return [Item(i, str(i), s.question, [s.answer], s.image, s.box, s.kind, s.family, s.where)
            for i, s in enumerate(samples)]


def load_rows(name: str, split: str, config: str | None):
    """
    The split as a stream of rows, images left undecoded; a parquet file or folder loads as parquet. A name that is
    not here is a hub id: where the hub is out of reach (checkpoints.hub_out_of_reach) it loads from the cache alone, at
    once, and the error says that it is neither here nor to be had.
    """
    from arr_coc import checkpoints

    path = Path(name)
    offline = None if path.exists() else checkpoints.hub_out_of_reach()  # before datasets reads the offline flag
    import datasets

    try:
        if path.is_file():
            rows = datasets.load_dataset("parquet", data_files={split: str(path)}, split=split, streaming=True)
        else:
            rows = datasets.load_dataset(name, config, split=split, streaming=True)
    except (OSError, ValueError, datasets.exceptions.DatasetNotFoundError) as e:
        if path.exists():
            raise InputError(f"cannot load the dataset {name!r} (split {split!r}): {str(e).splitlines()[0][:200]}") from None
        why = f"{offline}, and it is not in the local cache" if offline else f"the hub: {str(e).splitlines()[0][:200]}"
        raise InputError(f"cannot load the dataset {name!r} (split {split!r}): no such file or folder here, and as a "
                         f"hub dataset: {why}") from None
    for column, feature in (rows.features or {}).items():
        if isinstance(feature, datasets.Image):  # decoded per item by Item.open, only on the rank that needs it
            rows = rows.cast_column(column, datasets.Image(decode=False))
    return rows


def from_rows(rows, schema: Schema, kind: str, name: str, limit: int | None) -> Iterator[Item]:
    """Rows -> Items, the columns found by the schema from the first row; InputError now, naming what is missing."""
    rows = iter(rows)
    first = next(rows, None)
    if first is None:
        return iter(())
    question, answers = (next((c for c in options if c in first), None) for options in (schema.question, schema.answers))
    missing = [wanted for wanted, found in (("|".join(schema.question), question), ("|".join(schema.answers), answers),
                                            (schema.image, schema.image if schema.image in first else None)) if not found]
    if missing:
        raise InputError(f"the dataset {name!r} has no {' or '.join(missing)} column, which the {kind} schema needs "
                         f"(it has: {', '.join(first)})")
    id_column = next((c for c in ID_COLUMNS if c in first), None)

    def items() -> Iterator[Item]:
        for index, row in enumerate(itertools.islice(itertools.chain([first], rows), limit)):
            refs = row[answers]  # None or [] in a test split: the item is answered but not scored
            refs = [refs] if isinstance(refs, str) else [str(a) for a in refs or ()]
            yield Item(index, str(row[id_column]) if id_column else str(index), row[question], refs, row[schema.image],
                       kind=kind)
    return items()
