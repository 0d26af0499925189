"""
`full` against stock transformers on the shipped example (issue 54 item 11): assets/pocket_fine_print.png,
"What is the value of PAGE?", 896², fp32, CPU, the pocket model. The expected answer and confidence come from
stock transformers run here, never from this repo's code, so new pocket weights need no edit.

Stock's inputs are what Qwen2VLProcessor returns: the tokenizer's chat template (its default system prompt), the
folder's image processor, and mm_token_type_ids. Without mm_token_type_ids, transformers' generate() silently gives
the image tokens 1-D text positions instead of M-RoPE's (h, w): the README says so, and the last test pins it.
"""

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = next(e for e in json.loads((ROOT / "assets" / "examples.json").read_text()) if
               e["image"] == "pocket_fine_print.png")


@pytest.fixture(scope="module")
def stock():
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLForConditionalGeneration

    from arr_coc.vlm.families import POCKET_FOLDER

    folder = str(POCKET_FOLDER)
    model = Qwen2VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(folder), AutoImageProcessor.from_pretrained(folder)


def stock_inputs(stock, with_types: bool = True) -> dict:
    """A user's stock inputs for the example: chat template, image processor, and (as the processor) token types."""
    model, tokenizer, processor = stock
    image = Image.open(ROOT / "assets" / EXAMPLE["image"]).convert("RGB")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": EXAMPLE["question"]}]}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    vision = processor(images=[image], return_tensors="pt")
    text = text.replace("<|image_pad|>", "<|image_pad|>" * (int(vision["image_grid_thw"].prod()) // 4))
    inputs = dict(tokenizer(text, return_tensors="pt", add_special_tokens=False), **vision)
    if with_types:
        inputs["mm_token_type_ids"] = (inputs["input_ids"] == model.config.image_token_id).int()
    return inputs


def stock_answer(stock, inputs: dict) -> tuple[str, float]:
    """Stock greedy generate() -> (the answer, its least probable token's probability)."""
    model, tokenizer, _ = stock
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False, output_scores=True,
                             return_dict_in_generate=True)
    new = out.sequences[0, inputs["input_ids"].shape[1]:]
    probs = [torch.softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, new)]
    return tokenizer.decode(new, skip_special_tokens=True), min(probs)


def test_full_answers_the_shipped_example_as_stock_transformers(stock):
    from arr_coc.model import ARRCOCQwen

    inputs = stock_inputs(stock)
    expected, confidence = stock_answer(stock, inputs)
    model = ARRCOCQwen.from_pretrained("pocket", device="cpu", dtype=torch.float32)
    image = Image.open(ROOT / "assets" / EXAMPLE["image"]).convert("RGB")
    ours = model.answer(image, EXAMPLE["question"], "full", max_new_tokens=8)
    assert ours.text == expected
    assert ours.tokens.total_visual + ours.tokens.text == inputs["input_ids"].shape[1]  # 1024 + 28 = 1052
    assert ours.confidence == pytest.approx(confidence, abs=2e-3)


def test_without_token_types_stock_generate_reads_the_image_at_1d_positions(stock):
    """The README's note: a user's inputs without mm_token_type_ids give the image tokens text positions."""
    model, _, _ = stock
    seen = []
    hook = model.model.language_model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["position_ids"]), with_kwargs=True)
    try:
        for with_types in (True, False):
            with torch.no_grad():
                model.generate(**stock_inputs(stock, with_types), max_new_tokens=1, do_sample=False)
    finally:
        hook.remove()
    mrope, flat = seen[0][-3:], seen[-1][-3:]  # [3, 1, L] (t, h, w) ids of the prefill
    length = flat.shape[-1]
    assert torch.equal(flat, torch.arange(length).expand(3, 1, length))  # every token, image or not: 0, 1, 2, ...
    assert not torch.equal(mrope, flat) and int(mrope.max()) < length - 900  # M-RoPE: 1024 tokens on a 32x32 grid
