"""
Growing the pocket model's ViT (arr_coc.pocket.model.grow_vision; pocket.train's --vit-depth and --vit-mlp-ratio):
the grown model answers exactly as the shipped one did, saves as a folder stock transformers loads, and its new
weights learn; a run grows from the exported folder and resumes with its optimizer.
"""

import json

import torch

from arr_coc.checkpoints import POCKET_FOLDER
from arr_coc.pocket.data import collate, model_inputs
from arr_coc.pocket.model import grow_vision, image_processor
from arr_coc.pocket.train import TrainConfig, train
from arr_coc.synth.fineprint import make_page


def _shipped():
    from transformers import AutoTokenizer, Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(POCKET_FOLDER, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(POCKET_FOLDER)


def _inputs(model, tokenizer, kind="fine_print", size=280):
    page = make_page(kind, 7, size)
    q = page.questions[0]
    inputs = model_inputs(collate(tokenizer, [page.image], [[(q.question, q.answer)]]), image_processor(),
                          model.config.image_token_id, torch.device("cpu"))
    return inputs, inputs.pop("labels")


def test_a_grown_vit_answers_as_the_shipped_one_and_loads_with_stock_transformers(tmp_path):
    from transformers import Qwen2VLForConditionalGeneration

    model, tokenizer = _shipped()
    inputs, _ = _inputs(model, tokenizer)
    with torch.no_grad():
        expected = model(**inputs).logits  # [1, L, V]: the shipped model's, before it grows
    grow_vision(model, depth=8, mlp_ratio=8)
    blocks = model.model.visual.blocks
    assert len(blocks) == 8 and blocks[0].mlp.fc1.out_features == 2048 and blocks[7].mlp.fc2.in_features == 2048
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, expected, rtol=0, atol=1e-5)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())["vision_config"]
    assert (config["depth"], config["mlp_ratio"]) == (8, 8)
    reloaded = Qwen2VLForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs).logits, expected, rtol=0, atol=1e-5)


def test_the_grown_weights_learn():
    """A new block writes nothing and new MLP units write nothing at first, but the answer loss reaches the weights
    that write: the first step moves them."""
    model, tokenizer = _shipped()
    grow_vision(model, depth=7, mlp_ratio=5)
    inputs, labels = _inputs(model, tokenizer)
    model.train()
    model(**inputs, labels=labels).loss.backward()
    new_block, old_block = model.model.visual.blocks[6], model.model.visual.blocks[0]
    assert new_block.attn.proj.weight.grad.abs().sum() > 0 and new_block.mlp.fc2.weight.grad.abs().sum() > 0
    assert old_block.mlp.fc2.weight.grad[:, 1024:].abs().sum() > 0  # the new units' (silent) outputs


def test_a_run_grows_its_vit_and_resumes_with_its_optimizer(tmp_path):
    """A run from the exported folder, then resumed with a larger ViT (its moments for the grown weights start
    afresh, the rest carry on), then resumed again at that size: the run folder saves the grown architecture."""
    start = json.loads((POCKET_FOLDER / "training_state.json").read_text())["step"]
    base = TrainConfig(out=str(tmp_path), steps=start + 1, minutes=5, image_tokens=64, workers=0, eval_every=1000,
                       eval_pages=1, eval_sizes=(224,), device="cpu", warmup=1, init=str(POCKET_FOLDER),
                       stage=0)  # the first stage's small pages: a CPU step
    assert train(base, resume=True)["step"] == start + 1
    grown = TrainConfig(**{**base.__dict__, "steps": start + 2, "vit_depth": 7, "vit_mlp_ratio": 5})
    assert train(grown, resume=True)["step"] == start + 2
    assert train(TrainConfig(**{**grown.__dict__, "steps": start + 3}), resume=True)["step"] == start + 3
    config = json.loads((tmp_path / "weights" / "config.json").read_text())["vision_config"]
    assert (config["depth"], config["mlp_ratio"]) == (7, 5)
