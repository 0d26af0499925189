"""
Growing the pocket model's ViT (arr_coc.pocket.model.grow_vision; pocket.trainer's --vit-depth and --vit-mlp-ratio)
and its LLM's width (grow_language; --llm-width): the grown model answers exactly as the shipped one did, saves as
a folder stock transformers loads, and its new weights learn; a run grows from the exported folder, its heads keep
what they had, and it resumes with its optimizer.
"""

import json

import torch

from arr_coc.checkpoints import POCKET_FOLDER
from arr_coc.pocket.data import collate, model_inputs
from arr_coc.pocket.model import grow_language, grow_vision, image_processor
from arr_coc.pocket.trainer import PocketTrainConfig, in_corner, train
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


def test_a_wider_llm_answers_as_the_shipped_one_and_loads_with_stock_transformers(tmp_path):
    from transformers import Qwen2VLForConditionalGeneration

    model, tokenizer = _shipped()
    inputs, _ = _inputs(model, tokenizer, size=448)
    with torch.no_grad():
        expected = model(**inputs).logits  # [1, L, V]: the shipped model's, before it grows
    wide = grow_language(model, width=384)
    text = wide.config.text_config
    assert (text.hidden_size, text.num_attention_heads, text.num_key_value_heads, text.intermediate_size) == (
        384, 6, 3, 1536)
    assert wide.model.visual.merger.mlp[2].out_features == 384  # the visual tokens the LLM reads are as wide
    assert wide.lm_head.weight is wide.model.language_model.embed_tokens.weight  # still tied
    with torch.no_grad():
        torch.testing.assert_close(wide(**inputs).logits, expected, rtol=0, atol=1e-4)
    wide.save_pretrained(tmp_path)
    reloaded = Qwen2VLForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs).logits, expected, rtol=0, atol=1e-4)
    assert grow_language(model, width=256) is model and grow_language(model, None) is model  # not wider: as it is


def test_the_wider_llms_new_weights_learn():
    """The new dimensions of the residual stream start at zero and the new heads and units write nothing, but the
    answer loss reaches everything that writes to them: the first step moves each."""
    model, tokenizer = _shipped()
    wide = grow_language(model, width=384)
    inputs, labels = _inputs(wide, tokenizer)
    wide(**inputs, labels=labels).loss.backward()
    layer = wide.model.language_model.layers[1]
    grads = {"o_proj's new rows": layer.self_attn.o_proj.weight.grad[256:],
             "the new heads' o_proj columns": layer.self_attn.o_proj.weight.grad[:, 256:],
             "down_proj's new rows": layer.mlp.down_proj.weight.grad[256:],
             "the new units' down_proj columns": layer.mlp.down_proj.weight.grad[:, 1024:],
             "the merger's new outputs": wide.model.visual.merger.mlp[2].weight.grad[256:],
             "the embeddings' new columns": wide.model.language_model.embed_tokens.weight.grad[:, 256:]}
    assert all(g.abs().sum() > 0 for g in grads.values()), [k for k, g in grads.items() if not g.abs().sum() > 0]


def test_a_head_keeps_what_it_had_when_its_input_grows():
    own = {"proj.weight": torch.zeros(3, 5), "proj.bias": torch.zeros(3), "new.weight": torch.ones(2)}
    saved = {"proj.weight": torch.arange(6.0).view(3, 2), "proj.bias": torch.tensor([7.0, 8.0, 9.0])}
    kept = in_corner(saved, own)
    assert kept["proj.weight"].tolist() == [[0, 1, 0, 0, 0], [2, 3, 0, 0, 0], [4, 5, 0, 0, 0]]
    assert kept["proj.bias"].tolist() == [7, 8, 9] and "new.weight" not in kept
    assert in_corner({"proj.weight": torch.zeros(4, 2)}, own) is None  # more outputs: saved for other targets
    assert in_corner({"proj.weight": torch.zeros(2, 2)}, own) is None  # fewer outputs: other targets too
    assert in_corner({"gone.weight": torch.zeros(1)}, own) is None


def test_a_run_grows_its_vit_and_resumes_with_its_optimizer(tmp_path):
    """A run from the exported folder, then resumed with a larger ViT (its moments for the grown weights start
    afresh, the rest carry on), then resumed again at that size: the run folder saves the grown architecture."""
    start = json.loads((POCKET_FOLDER / "training_state.json").read_text())["step"]
    base = PocketTrainConfig(out=str(tmp_path), steps=start + 1, minutes=5, image_tokens=64, workers=0, eval_every=1000,
                       eval_pages=1, eval_sizes=(224,), device="cpu", warmup=1, init=str(POCKET_FOLDER),
                       stage=0)  # the first stage's small pages: a CPU step
    assert train(base, resume=True)["step"] == start + 1
    grown = PocketTrainConfig(**{**base.__dict__, "steps": start + 2, "vit_depth": 7, "vit_mlp_ratio": 5, "llm_width": 384})
    assert train(grown, resume=True)["step"] == start + 2
    assert train(PocketTrainConfig(**{**grown.__dict__, "steps": start + 3}), resume=True)["step"] == start + 3
    config = json.loads((tmp_path / "weights" / "config.json").read_text())
    assert (config["vision_config"]["depth"], config["vision_config"]["mlp_ratio"]) == (7, 5)
    assert config["text_config"]["hidden_size"] == 384
