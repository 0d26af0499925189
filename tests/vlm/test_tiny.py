"""The offline tiny Qwen2-VL loads through the real from_pretrained path and answers a templated prompt."""

import json

from transformers import AutoTokenizer, Qwen2VLForConditionalGeneration

from arr_coc.vlm.tiny import build_tiny, tiny_model_path


def test_tiny_is_a_real_save_pretrained_folder(tmp_path):
    path = build_tiny(tmp_path / "tiny")
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "qwen2_vl" and config["image_token_id"] == 151655
    model = Qwen2VLForConditionalGeneration.from_pretrained(path)
    assert model.config.text_config.hidden_size == 64
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert len(tokenizer) == 151669
    ids = tokenizer.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|im_start|>", "<|im_end|>"])
    assert ids == [151652, 151653, 151655, 151644, 151645]


def test_tiny_is_cached_and_deterministic(tmp_path):
    first = tiny_model_path()
    assert tiny_model_path() == first  # second call: no rebuild
    rebuilt = build_tiny(tmp_path / "again")
    a = (first / "model.safetensors").read_bytes()
    assert a == (rebuilt / "model.safetensors").read_bytes()  # seeded weights


def test_tiny_generates_for_a_templated_image_question(arr_model):
    from PIL import Image

    vlm = arr_model.vlm
    inputs = vlm.stock_inputs("What colour is this?", Image.new("RGB", (56, 84), (200, 30, 30)))
    n = int(inputs.image_grid_thw.prod()) // 4
    text = vlm.tokenizer.decode(inputs.input_ids[0])
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<|vision_start|>")
    assert text.endswith("What colour is this?<|im_end|>\n<|im_start|>assistant\n") and text.count("<|image_pad|>") == n
    new = vlm.generate(inputs, 5).ids
    assert 1 <= new.shape[1] <= 5 and (new < 151936).all()


def test_tampered_tokenizer_files_are_refused_naming_the_file(tmp_path, monkeypatch):
    import shutil

    import pytest

    from arr_coc.vlm import tiny

    original = tiny.installed_tokenizer_folder()
    assert tiny.tokenizer_folder() == original  # the pinned release passes
    copy = tmp_path / "tokenizer_files"
    shutil.copytree(original, copy)
    with open(copy / "merges.txt", "a") as f:
        f.write("\nx y\n")  # one extra merge rule
    monkeypatch.setattr(tiny, "installed_tokenizer_folder", lambda: copy)
    with pytest.raises(RuntimeError, match=r"merges\.txt has sha256 .* expected b8e04af9"):
        tiny.tokenizer_folder()
    (copy / "vocab.json").unlink()
    (copy / "merges.txt").write_bytes((original / "merges.txt").read_bytes())
    with pytest.raises(RuntimeError, match=r"vocab\.json is missing"):
        tiny.tokenizer_folder()
