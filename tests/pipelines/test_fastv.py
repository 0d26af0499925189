"""
The fastv pipeline (FastV, Chen et al. 2024) on every family's tiny model, fp32 CPU: it keeps exactly N unique
image tokens at their original places; with N = every token it is stock `full`; its statistic is the attention
row transformers returns (eager, output_attentions) at layer K-1; and the fast engine's mixed cache (layers < K
the whole prompt, layers >= K the shortened one) gives, step by step, the logits of a no-cache forward of the
same pruned computation, whose shortened prompt is built independently (VisualTokens.take, VLM.prompt).
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from arr_coc.errors import InputError
from arr_coc.pipelines import BASELINES, FAST_ENGINE_ONLY, PIPELINES
from arr_coc.vlm.base import Prompt

QUESTION = "What is written on the sign?"
FORCED = "The sign says: STOP here, then turn left at the old mill."  # a teacher-forced answer of many tokens


def photo(w=400, h=300, seed=0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def native_prompt(model, image=None, answer=None):
    """The native view's tokens (as `full` reads them) and their prompt."""
    vlm = model.vlm
    tokens = vlm.encode_view(model.views(image or photo()).tensor("native"))  # [M, D]
    return tokens, vlm.prompt(QUESTION, [tokens], answer=answer)


def stock_attention_row(vlm, view, layer: int) -> torch.Tensor:
    """transformers' own forward from pixels with eager attention: layer `layer`'s attention of the last prompt
    token, averaged over heads -> [L]."""
    before = vlm.model.config._attn_implementation  # switched to eager for this forward, then put back
    s = vlm.stock_inputs(QUESTION, view)
    try:
        vlm.model.set_attn_implementation("eager")
        with torch.no_grad():
            out = vlm.model(input_ids=s.input_ids, pixel_values=s.pixel_values, image_grid_thw=s.image_grid_thw,
                            mm_token_type_ids=s.mm_token_type_ids, output_attentions=True)
    finally:
        vlm.model.set_attn_implementation(before)
    return out.attentions[layer][0, :, -1].float().mean(0)  # [L]


def pruned_forward(decoder, full, pruned, rows: torch.Tensor, K: int) -> torch.Tensor:
    """The reference: no cache; layers < K over the full prompt, layers >= K over its rows `rows`, which read the
    shortened prompt's own M-RoPE ids and DeepStack features -> logits [1, L', V]."""
    cos, sin = decoder._rope(full.embeds, full.position_ids)
    x = full.embeds
    for i, layer in enumerate(decoder.lm.layers[:K]):
        x = decoder._add_deepstack(decoder._layer(layer, x, cos, sin), full.deepstack, i)
    x = x[:, rows]
    cos, sin = decoder._rope(pruned.embeds, pruned.position_ids)
    for i, layer in enumerate(decoder.lm.layers[K:], start=K):
        x = decoder._add_deepstack(decoder._layer(layer, x, cos, sin), pruned.deepstack, i)
    return decoder._logits(x)


def test_fastv_is_a_baseline_of_every_command_and_the_app():
    from arr_coc import evaluate, run

    assert "fastv" in PIPELINES and "fastv" in BASELINES and "fastv" in FAST_ENGINE_ONLY  # app: Compare's choices
    assert evaluate.parse_args(["--baselines", "fastv", "--strategies", ""]).baselines == "fastv"
    args = run.parse_args(["--image", "assets/chelsea.png", "--question", "q", "--pipelines", "fastv", "--fastv-layer", "3"])
    assert (args.pipelines, args.fastv_layer) == ("fastv", 3)


def test_fastv_keeps_arr_token_count_of_unique_cells_in_raster_order(family):
    vlm = family.vlm
    answer = family.answer(photo(700, 500), QUESTION, "fastv", max_new_tokens=2, budget=40)
    gh, gw = answer.views.gestalt_grid
    N = gh * gw + 40  # what ARR's LLM reads at budget 40
    cells = [tuple(c) for c in answer.kept.tolist()]
    nh, nw = answer.views.native_grid
    assert nh * nw > N and answer.tokens.total_visual == N == len(set(cells)) == len(cells)
    assert cells == sorted(cells) and all(0 <= r < nh and 0 <= c < nw for r, c in cells)  # the original order
    full = family.answer(photo(700, 500), QUESTION, "full", max_new_tokens=2)
    assert answer.tokens.text == full.tokens.text and answer.compute.vision == full.compute.vision
    assert answer.compute.prefill < full.compute.prefill
    later = family.answer(photo(700, 500), QUESTION, "fastv", max_new_tokens=2, budget=40, fastv_layer=3)
    assert answer.compute.prefill < later.compute.prefill < full.compute.prefill  # K layers read every token
    with pytest.raises(InputError, match="between 1 and 3"):
        family.answer(photo(), QUESTION, "fastv", max_new_tokens=2, fastv_layer=len(vlm.language_model.layers))


def test_the_statistic_is_transformers_eager_attention_row_and_ranks_the_kept_set(family, monkeypatch):
    vlm, K, N = family.vlm, 2, 11
    tokens, prompt = native_prompt(family)
    decoder, rows = vlm.decoder, []
    statistic = decoder.last_token_attention
    monkeypatch.setattr(decoder, "last_token_attention", lambda *a: rows.append(statistic(*a)) or rows[-1])
    generation = vlm.generate(prompt, 2, prune=(K, N))
    stock = stock_attention_row(vlm, family.views(photo()).tensor("native"), K - 1)  # [L]
    assert len(rows) == 1 and stock.shape == rows[0].shape == (prompt.length,)
    torch.testing.assert_close(rows[0], stock, atol=1e-5, rtol=1e-4)
    image = (prompt.ids[0] == vlm.image_token_id).nonzero()[:, 0]
    ranked = stock[image].sort(descending=True).values  # [M]
    assert ranked[N - 1] - ranked[N] > 1e-7 and stock[image].std() > 1e-3 * stock[image].mean()  # a real ranking
    assert generation.kept.tolist() == sorted(stock[image].topk(N).indices.tolist())


def test_with_every_token_kept_fastv_is_stock_full(family):
    """N = M: the stock logits of the native view (transformers from pixels), in fp32, at the prefill and at every
    teacher-forced decode step, which read the mixed cache."""
    vlm = family.vlm
    tokens, prompt = native_prompt(family)
    forced = vlm.tokenizer(FORCED, add_special_tokens=False)["input_ids"][:6]
    s = vlm.stock_inputs(QUESTION, family.views(photo()).tensor("native"))
    ids = torch.cat([s.input_ids, torch.tensor([forced], device=vlm.device)], dim=1)
    with torch.no_grad():
        stock = vlm.model(input_ids=ids, pixel_values=s.pixel_values, image_grid_thw=s.image_grid_thw,
                          mm_token_type_ids=(ids == vlm.image_token_id).int()).logits[0, s.length - 1:].float()
        pruning = vlm.pruning(prompt, 2, len(tokens))
        cap, logits = vlm.decoder.start(prompt.embeds, prompt.position_ids, len(forced) + 1, prompt.deepstack,
                                        pruning=pruning)
        ours = [logits[0]]
        for token in forced:
            vlm.decoder.states[cap].token.fill_(token)
            ours.append(vlm.decoder._decode_step(cap)[1][0].clone())
    assert torch.equal(pruning.kept, torch.arange(prompt.length))
    torch.testing.assert_close(torch.stack(ours), stock, atol=1e-4, rtol=1e-4)


def extend(vlm, prompt: Prompt, ids: list[int]) -> Prompt:
    """The prompt followed by the text tokens `ids`, at the next M-RoPE positions (no DeepStack there)."""
    new = torch.tensor([ids], dtype=torch.long, device=vlm.device).view(1, -1)
    embeds = torch.cat([prompt.embeds, vlm.model.get_input_embeddings()(new)], dim=1)
    after = prompt.position_ids[:, 0, -1].max() + 1 + torch.arange(len(ids), device=vlm.device)  # [n]
    position_ids = torch.cat([prompt.position_ids, after.view(1, 1, -1).expand(3, 1, -1)], dim=2)
    deepstack = None if prompt.deepstack is None else F.pad(prompt.deepstack, (0, 0, 0, len(ids)))
    return Prompt(torch.cat([prompt.ids, new], dim=1), embeds, position_ids, prompt.length, deepstack)


@pytest.mark.parametrize("K", [1, 2])
def test_the_mixed_cache_decodes_as_a_no_cache_forward_of_the_pruned_computation(family, K):
    """
    Every teacher-forced decode step and the greedy answer of the fast engine equal the reference forward, whose
    shortened prompt is built from the kept cells alone. K = 1 has Qwen3-VL's DeepStack reach pruned layers,
    where the dropped tokens' features must be gone.
    """
    vlm, N, decoder = family.vlm, 9, family.vlm.decoder
    tokens, prompt = native_prompt(family)
    generation = vlm.generate(prompt, 4, prune=(K, N))
    pruned = vlm.prompt(QUESTION, [tokens.take(generation.kept)])  # the kept cells at their own places
    image = (prompt.ids[0] == vlm.image_token_id).nonzero()[:, 0]
    keep = torch.ones(prompt.length, dtype=torch.bool, device=vlm.device)
    keep[image] = False
    keep[image[generation.kept]] = True
    rows = keep.nonzero()[:, 0]  # the prompt's rows that layers >= K read
    assert torch.equal(pruned.ids, prompt.ids[:, rows]) and len(rows) == prompt.length - len(image) + N

    def reference(ids: list[int]) -> torch.Tensor:  # logits [n + 1, V] of the prompt's last token and after ids
        tail = torch.arange(prompt.length, prompt.length + len(ids), device=vlm.device)
        logits = pruned_forward(decoder, extend(vlm, prompt, ids), extend(vlm, pruned, ids), torch.cat([rows, tail]), K)
        return logits[0, len(rows) - 1:]

    forced = vlm.tokenizer(FORCED, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        cap, logits = decoder.start(prompt.embeds, prompt.position_ids, len(forced) + 1, prompt.deepstack,
                                    pruning=vlm.pruning(prompt, K, N))
        ours = [logits[0]]
        for token in forced:
            decoder.states[cap].token.fill_(token)  # teacher forcing: the step reads the token it is given
            ours.append(decoder._decode_step(cap)[1][0].clone())
        torch.testing.assert_close(torch.stack(ours), reference(forced), atol=1e-4, rtol=1e-4)
        greedy = []
        for _ in range(generation.ids.shape[1]):
            greedy.append(int(reference(greedy)[-1].argmax()))
    assert generation.ids[0].tolist() == greedy


def test_fastv_answers_with_the_fast_engine_only(arr_model):
    try:
        arr_model.vlm.engine = "hf"
        with pytest.raises(InputError, match="fast engine only"):
            arr_model.answer(photo(), QUESTION, "fastv", max_new_tokens=2)
    finally:
        arr_model.vlm.engine = "fast"
