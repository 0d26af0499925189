"""The evaluation sets through datasets.load_dataset: local parquet in each hub schema, JSONL, and bad sets."""

import pytest
from conftest import write_parquet_set

from arr_coc.eval import data, sets
from arr_coc.eval.sets import open_source
from arr_coc.errors import InputError


@pytest.mark.parametrize("schema, metric, question, answers, item_id", [
    ("docvqa", "anls", "What is the total of invoice 1?", ["100", "$100"], "q1"),
    ("textvqa", "vqa", "What does the sign say?", ["stop"] * 7 + ["halt"] * 3, "1"),
    ("chartqa", "relaxed", "What is the value of bar 1?", ["10"], "1"),
])
def test_each_hub_schema_loads_from_a_local_parquet_folder(tmp_path, schema, metric, question, answers, item_id):
    folder = write_parquet_set(tmp_path / f"my-{schema}-copy", schema, 3)
    source = open_source(str(folder), split="validation")  # the schema told by the folder's name
    items = list(source.items)
    assert source.schema == schema and source.metric == metric and len(items) == 3
    item = items[1]
    assert (item.index, item.id, item.question, item.answers) == (1, item_id, question, answers)
    assert item.open().size == (130, 90) and item.box is None


# lmms-eval's prompts and limits for Qwen2-VL (tasks/<set>/*.yaml `default` kwargs, models/simple/qwen2_vl.py)
@pytest.mark.parametrize("schema, question, prompt, max_new_tokens", [
    ("docvqa", "What is the DATE?", "What is the DATE?\nAnswer the question using a single word or phrase.", 32),
    ("textvqa", "what does the SIGN say?", "What does the sign say?\nAnswer the question using a single word or phrase.",
     128),  # str.capitalize(): the first letter up, the rest down
    ("chartqa", "Which bar is HIGHEST?", "Which bar is HIGHEST?\nAnswer the question with a single word.", 16),
    ("jsonl", "what colour is the Dot?", "what colour is the Dot?", 16),
])
def test_each_set_is_asked_as_lmms_eval_asks_qwen2_vl(schema, question, prompt, max_new_tokens):
    source = sets.Source("a set", schema, [])
    assert source.prompt(sets.Item(0, "0", question, ["x"], None)) == prompt
    assert sets.SCHEMAS[schema].max_new_tokens == max_new_tokens and sets.SCHEMAS[schema].reference
    question_in_run_json = "{question.capitalize()}" if schema == "textvqa" else "{question}"
    assert source.prompt_template == prompt.replace(prompt.split("\n")[0], question_in_run_json)


def test_items_without_answers_load_with_none():
    rows = [dict(question="q?", answers=None, image=None), dict(question="q?", answers=[], image=None),
            dict(question="q?", answers=["a"], image=None)]
    items = list(sets.from_rows(rows, sets.SCHEMAS["docvqa"], "docvqa", "a test split", None))
    assert [item.answers for item in items] == [[], [], ["a"]]


def test_a_parquet_file_a_schema_flag_and_a_limit(tmp_path):
    folder = write_parquet_set(tmp_path / "unnamed", "chartqa", 5, split="test")
    with pytest.raises(InputError, match="cannot tell the schema"):
        open_source(str(folder), split="test")
    file = next(folder.rglob("*.parquet"))
    items = list(open_source(str(file), split="test", schema="chartqa", limit=2).items)
    assert [i.index for i in items] == [0, 1] and items[1].answers == ["10"]
    with pytest.raises(InputError, match="validation"):  # the folder has only a test split
        open_source(str(folder), split="validation", schema="chartqa")


def test_known_hub_ids_tell_their_schema():
    assert sets.guess_schema("lmms-lab/DocVQA") == "docvqa"
    assert sets.guess_schema("HuggingFaceM4/ChartQA") == "chartqa"
    assert sets.guess_schema("facebook/textvqa") == "textvqa"
    with pytest.raises(InputError, match="--schema"):
        sets.guess_schema("someone/vqa-set")


def test_missing_columns_are_named(tmp_path):
    folder = write_parquet_set(tmp_path / "docvqa", "docvqa", 2, drop="answers")
    with pytest.raises(InputError, match=r"no answers column, which the docvqa schema needs \(it has: questionId, "
                                         r"question, image\)"):
        open_source(str(folder))
    with pytest.raises(InputError, match="no image column"):
        open_source(str(write_parquet_set(tmp_path / "chartqa", "chartqa", 2, drop="image")))


def test_an_unreadable_image_fails_when_its_item_opens(tmp_path):
    items = list(open_source(str(write_parquet_set(tmp_path / "textvqa", "textvqa", 3, corrupt=(1,)))).items)
    assert items[0].open() and items[2].open()  # the others still read
    with pytest.raises(InputError, match=r"item 1 \(id 1\): cannot read its image"):
        items[1].open()


def test_a_jsonl_folder_and_synthetic_scenes(tmp_path):
    samples = data.make_dataset(3, ("chart", "noise"), seed=5, size=128)
    data.save_jsonl(samples, tmp_path / "set")
    source = open_source(str(tmp_path / "set"), limit=2)
    items = list(source.items)
    assert source.schema == "jsonl" and source.metric == "contains" and len(items) == 2
    assert items[0].answers == [samples[0].answer] and items[0].box == samples[0].box
    assert source.prompt(items[0]) == samples[0].question  # no instruction for the JSONL sets
    synthetic = list(sets.synthetic_source(3, ("chart",), seed=1).items)
    assert [i.kind for i in synthetic] == ["chart"] * 3 and synthetic[2].index == 2
    with pytest.raises(InputError, match="no such dataset"):
        open_source(str(tmp_path / "nothing" / "data.jsonl"), schema="jsonl")
