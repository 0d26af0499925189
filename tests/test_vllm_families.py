"""
ARR-COC served by vLLM for Qwen2.5-VL and Qwen3-VL (arr_coc/engines/vllm_model.py: ArrCocQwen2_5_VL, ArrCocQwen3VL),
each on its family's tiny random model, against the project's own ARR on the same model (tests/test_vllm.py does the
Qwen2-VL pocket model). One server a family, started as the README starts one (arr-coc-serve on the model's folder:
the architecture is chosen from its config), fp32, CPU, offline, --budget 64:

    test_serves_the_family_architecture   vLLM resolved the family's ARR-COC architecture (serve.py read the config)
    test_plugin_equals_the_project_arr    3 pages (the fine-print asset and 2 pocket-suite pages, arr_coc.eval.data
                                          seed 0): the plugin's cells (feed order), prompt ids and M-RoPE positions, the
                                          greedy answer's token ids and each token's probability equal the project's
                                          ARR (ARRCOCQwen.answer under pipeline "arr", arr_prompt and the VLM's own
                                          greedy decoding, generate_tokens). On Qwen3-VL the probabilities are
                                          DeepStack's test: vLLM adds each level after its LLM layer from the packed
                                          features. Seen failing with the DeepStack levels packed in reverse order
                                          (ArrCocModel.packed: Qwen3-VL's greedy tokens apart on the first page,
                                          its cells, ids and positions still equal).

The tiny models are the tests' own recipe (arr_coc.vlm.tiny) with the LLM's 4 heads of 16 made 2 heads of 32
(VLLM_TEXT): vLLM's CPU attention has no kernel for a head size of 16 ("Unsupported CPU attention configuration").
The venv is tests/test_vllm.py's (.venv-vllm, built there when missing or stale).

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/test_vllm_families.py
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_checked
from test_vllm import (FINE_PRINT, VLLM_ARGS, free_port, server_env, stop, vllm_python,  # noqa: F401
                       wait_until_up)

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = {"tiny-qwen2.5-vl": "ArrCocQwen2_5_VLForConditionalGeneration",
            "tiny-qwen3-vl": "ArrCocQwen3VLForConditionalGeneration"}
VLLM_TEXT = {"num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32}  # 2 heads of 32, not 4 of 16
BUDGET = 16 * 4  # saccades a page (the server's --budget)
MAX_TOKENS = 8


def vllm_tiny(name: str, folder: Path) -> Path:
    """The family's tiny model (its recipe and seed) with VLLM_TEXT's heads, mrope sections summing to 16."""
    from arr_coc.vlm.tiny import TINY_MODELS, build_tiny

    rope = dict(TINY_MODELS[name].config().text_config.rope_parameters, mrope_section=[4, 6, 6])
    return build_tiny(folder / name, name, text_config={**VLLM_TEXT, "rope_parameters": rope})


@pytest.fixture(scope="module", params=list(FAMILIES))
def served(request, vllm_python, tmp_path_factory):
    """(family name, its model folder, the server's port, its looks file, its log): one server a family."""
    folder = tmp_path_factory.mktemp(f"vllm-{request.param}")
    model = vllm_tiny(request.param, folder)
    port, looks, log = free_port(), folder / "looks.jsonl", folder / "server.log"
    command = [str(vllm_python), "-m", "arr_coc.engines.serve", "--model", str(model), "--budget", str(BUDGET),
               "--port", str(port), "--", *VLLM_ARGS]
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=folder, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env=server_env(ARR_COC_VLLM_LOG=str(looks)))
    try:
        wait_until_up(process, port, log)
        yield request.param, model, port, looks, log
    finally:
        stop(process)


@pytest.fixture(scope="module")
def family_pages(tmp_path_factory) -> list[tuple[Path, str]]:
    """(image, question): the fine-print page and 2 pocket-suite pages (arr_coc.eval.data, seed 0, 896 px)."""
    folder = tmp_path_factory.mktemp("family-pages")
    run_checked([sys.executable, "-m", "arr_coc.eval.data", "--out", folder, "--n", 2, "--kinds",
                 "box_word,shape_colour", "--seed", 0, "--size", 896], ROOT, 300)
    rows = [json.loads(line) for line in (folder / "data.jsonl").read_text().splitlines()]
    return [(FINE_PRINT, "What is the value of PAGE?")] + [(folder / row["image"], row["question"]) for row in rows]


ASK_SCRIPT = """
import base64, json, math, sys
from openai import OpenAI
port, path, question = sys.argv[1], sys.argv[2], sys.argv[3]
client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
url = "data:image/png;base64," + base64.b64encode(open(path, "rb").read()).decode()
r = client.chat.completions.create(model=client.models.list().data[0].id, temperature=0, max_tokens=%d,
    logprobs=True, extra_body={"return_tokens_as_token_ids": True}, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}]}])
content = r.choices[0].logprobs.content
print(json.dumps({"ids": [int(t.token.split(":")[1]) for t in content], "probs": [math.exp(t.logprob) for t in content]}))
""" % MAX_TOKENS


def ask(python: Path, port: int, image: Path, question: str) -> dict:
    """One greedy OpenAI-client chat request with an image -> its answer's token ids and their probabilities."""
    done = run_checked([python, "-c", ASK_SCRIPT, port, image, question], ROOT, 300)
    return json.loads(done.stdout.splitlines()[-1])


def project_arr(model_folder: Path, pages: list[tuple[Path, str]]) -> list[dict]:
    """The project's ARR on each page (the answer's cells, its LLM prompt, and the VLM's own greedy tokens over that
    prompt with their probabilities), on the same model folder, budget and answer length."""
    from arr_coc.commands import cli
    from arr_coc.pipelines import arr_layout
    from arr_coc.vlm.images import open_image

    model, _ = cli.load_model(str(model_folder), None, "cpu", quiet=True)
    out = []
    for image, question in pages:
        a = model.answer(open_image(str(image)), question, "arr", budget=BUDGET, max_new_tokens=MAX_TOKENS)
        prompt = arr_layout.arr_prompt(model.vlm, a.observation, arr_layout.encode_saccades(model.vlm, a.observation,
                                                                                            a.arr.positions[0]))
        ids, tokens = [], model.vlm.generate_tokens(prompt, MAX_TOKENS)
        while True:
            try:
                ids.append(next(tokens))
            except StopIteration as end:
                probs = end.value.probs.tolist()
                break
        out.append({"cells": a.arr.positions[0].tolist(), "prompt_ids": prompt.ids[0].tolist(),
                    "positions": prompt.position_ids[:, 0].tolist(), "ids": ids, "probs": probs})
    return out


def looks_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_serves_the_family_architecture(served):
    name, _, _, _, log = served
    assert f"Resolved architecture: {FAMILIES[name]}" in log.read_text()


def test_plugin_equals_the_project_arr(vllm_python, served, family_pages):
    name, model, port, looks, _ = served
    expected = project_arr(model, family_pages)
    for (image, question), want in zip(family_pages, expected):
        before = len(looks_of(looks))
        got = ask(vllm_python, port, image, question)
        new = looks_of(looks)[before:]
        look, layout = [x for x in new if "cells" in x], [x for x in new if "positions" in x]
        assert len(look) == 1 and look[0]["question"] == question and len(layout) == 1, (name, image.name)
        assert look[0]["cells"] == want["cells"], (name, image.name)
        assert layout[0]["prompt_ids"] == want["prompt_ids"], (name, image.name)
        assert layout[0]["positions"] == want["positions"], (name, image.name)
        assert got["ids"] == want["ids"], (name, image.name)
        assert got["probs"] == pytest.approx(want["probs"], rel=1e-4), (name, image.name)
