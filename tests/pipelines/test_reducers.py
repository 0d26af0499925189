"""
The published token reducers (arr_coc/pipelines/divprune.py, visionzip.py) on every family's tiny model (the
`family` fixture): each keeps exactly N unique tokens at their original M-RoPE positions; with N = every token
each reproduces stock `full`'s logits; VisionZip's dominant set is the top-D cells of transformers' own eager
last-block attention; DivPrune's greedy order is the one worked out by hand below.

    python -m pytest -x -q tests/pipelines/test_reducers.py
"""

import math
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.vision_utils import get_vision_window_index

from arr_coc.pipelines import divprune, visionzip
from arr_coc.pipelines.request import Request
from arr_coc.pipelines.steps import views_of
from arr_coc.pipelines.arr_scene import arr_visual_tokens
from arr_coc.vlm.base import VisualTokens
from arr_coc.vlm.views import MERGE

QUESTION = "What is written on the sign?"
REDUCERS = {"divprune": divprune, "visionzip": visionzip}
SHARPER = 300  # the last block's softmax scale, times this, in the test against the stock attention
ENCODE_REDUCE = {"divprune": (divprune.encode_native, divprune.keep_diverse),
                 "visionzip": (visionzip.encode_with_attention, visionzip.keep_zipped)}


def photo(w=400, h=300, seed=0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def reduced(model, image, name: str, request: Request):
    """The native view's every token, what the reducer kept of them, and N."""
    encode, reduce = ENCODE_REDUCE[name]
    views = views_of(model.parts, image)
    with torch.no_grad():
        every, read = encode(model.vlm, views.tensor("native"))
        n = arr_visual_tokens(model.parts, views, request)
        kept, _ = reduce(every, read, n)
        return every, kept, n


def image_positions(vlm, tokens) -> torch.Tensor:
    """The M-RoPE ids [3, K] of the image tokens of a one-image prompt."""
    prompt = vlm.prompt(QUESTION, [tokens])
    return prompt.position_ids[:, 0, (prompt.ids[0] == vlm.image_token_id)]


@pytest.mark.parametrize("name", REDUCERS)
def test_a_reducer_keeps_exactly_n_unique_tokens_at_their_original_positions(family, name):
    vlm = family.vlm
    image = photo(1400, 900)  # 1600 native cells (Qwen3-VL: 1232) for N = the gestalt + 273 saccades
    every, kept, n = reduced(family, image, name, Request())
    views = views_of(family.parts, image)
    assert n == views.gestalt_grid[0] * views.gestalt_grid[1] + family.layer.config.budget < len(every)
    cells = kept.positions[:, 0] * kept.grid[1] + kept.positions[:, 1]  # [N] raster indices
    assert len(kept) == n and len(cells.unique()) == n and kept.grid == every.grid
    assert torch.equal(cells, cells.sort().values)  # raster order
    assert torch.equal(image_positions(vlm, kept), image_positions(vlm, every)[:, cells])  # the full view's places
    unchanged = (kept.features == every.features[cells]).all(dim=1)  # [N] tokens kept as encoded
    contextual = 0 if name == "divprune" else visionzip.contextual_count(n)
    assert int((~unchanged).sum()) == contextual  # VisionZip: only its contextual tokens are merged ones
    if every.deepstack is not None:  # Qwen3-VL: the kept cells' own DeepStack features, the others' dropped
        assert torch.equal(kept.deepstack, every.deepstack[:, cells])
    answer = family.answer(image, QUESTION, name, max_new_tokens=2)
    assert answer.tokens.total_visual == n and answer.pipeline == name


@pytest.mark.parametrize("name", REDUCERS)
def test_with_n_every_token_a_reducer_reproduces_full_logits(family, name):
    vlm = family.vlm
    image = photo(500, 400)
    views = views_of(family.parts, image)
    K = views.native_grid[0] * views.native_grid[1]
    every, kept, n = reduced(family, image, name, Request(budget=K - views.gestalt_grid[0] * views.gestalt_grid[1]))
    assert n == K == len(kept)
    with torch.no_grad():
        full = vlm.prompt(QUESTION, [vlm.encode_view(views.tensor("native"))])  # the `full` pipeline's prompt
        ours = vlm.prompt(QUESTION, [kept])
        logits = [vlm.decoder.forward(p.embeds, p.position_ids, p.deepstack) for p in (full, ours)]
    assert torch.equal(ours.ids, full.ids) and torch.equal(ours.position_ids, full.position_ids)
    assert logits[0].std() > 1e-3  # not a vacuous comparison
    torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=0)


def stock_last_block_received(vlm, view, monkeypatch) -> torch.Tensor:
    """
    Per cell of a view (raster order): the attention it receives in the stock vision tower's last block, from
    transformers' own eager attention (its returned weights), per patch head-averaged and query-summed, cell mean.
    """
    visual, recorded = vlm.visual, []
    modeling = sys.modules[type(visual.blocks[-1].attn).__module__]
    eager = modeling.eager_attention_forward

    def recording_eager(module, *args, **kwargs):
        out, weights = eager(module, *args, **kwargs)
        if module is visual.blocks[-1].attn:
            recorded.append(weights)  # [1, heads, n, n], one per attention sequence
        return out, weights

    monkeypatch.setattr(modeling, "eager_attention_forward", recording_eager)
    monkeypatch.setattr(visual.config, "_attn_implementation", "eager")
    pixels, grid_thw = vlm.vision.image_inputs(view)
    with torch.no_grad():
        visual(pixels, grid_thw=grid_thw)
    (weights,) = recorded  # the last block attends over the whole view: one sequence
    received = weights[0].mean(0).sum(0).view(-1, MERGE**2).mean(1)  # [K] in the stock sequence's cell order
    if hasattr(visual, "fullatt_block_indexes"):  # Qwen2.5-VL: the stock sequence is in window order
        c = visual.config
        window_index, _ = get_vision_window_index(grid_thw, c.spatial_merge_size, c.window_size, c.patch_size)
        received = torch.empty_like(received).index_copy_(0, window_index.to(received.device), received)
    return received


def test_visionzip_dominant_cells_are_the_top_cells_of_the_stock_last_block_attention(family, monkeypatch):
    vlm = family.vlm
    views = views_of(family.parts, photo(700, 500))
    view = views.tensor("native")
    attn = vlm.visual.blocks[-1].attn  # tiny random weights attend almost evenly: sharpen the last block's softmax
    monkeypatch.setattr(attn, "scaling", attn.scaling * SHARPER)  # (both towers read it; restored after the test)
    with torch.no_grad():
        every, attention = vlm.encode_view_attention(view)
    stock = stock_last_block_received(vlm, view, monkeypatch)
    assert stock.max() - stock.min() > 0.2 and len(stock) == len(every)  # far apart: no near-ties to flip
    torch.testing.assert_close(attention.received, stock, atol=1e-5, rtol=0)
    n = len(every) // 3
    D = n - visionzip.contextual_count(n)
    ours = visionzip.dominant_cells(attention.received, n)
    assert len(ours) == D and set(ours.tolist()) == set(stock.topk(D).indices.tolist())


def test_visionzip_merges_the_rest_into_targets_by_key():
    """Cells 1..5 left over for 2 contextual tokens: targets at stride 5 / 2 (rest[0], rest[2]: cells 1 and 3);
    cell 2 joins target 3 and cells 4, 5 join target 1, whose keys point their way (lengths do not count); a
    contextual token is its target plus the mean of its cells."""
    features = torch.arange(6.0).unsqueeze(1) * torch.tensor([[1.0, 10.0]])  # [6, 2]: cell i is (i, 10 i)
    tokens = VisualTokens(features, (2, 3), torch.tensor([[r, c] for r in range(2) for c in range(3)]))
    keys = torch.tensor([[1.0, 0], [0, 1], [2, 0.1], [1, 0], [0.1, 1], [0, 3]])  # [6, 2]
    targets, contextual = visionzip.merge_contextual(tokens, keys, torch.tensor([1, 2, 3, 4, 5]), 2)
    assert targets.tolist() == [1, 3]
    torch.testing.assert_close(contextual, torch.stack([features[1] + (features[4] + features[5]) / 2,
                                                        features[3] + features[2]]))


def test_divprune_picks_in_the_greedy_order_worked_out_by_hand():
    """Five directions at 0, 20, 90, 180 and 100 degrees (cosine distance grows with the angle between them).
    Nearest neighbours: 20, 20, 10, 80, 10 degrees away: the first pick is 180 (cell 3). The farthest from
    {180} is 0 (cell 0); from {180, 0}: 90 (cell 2, 90 away; 100 is 80 away, 20 is 20); from {180, 0, 90}:
    20 (cell 1, 20 away; 100 is 10); then 100 (cell 4)."""
    degrees = torch.tensor([0.0, 20.0, 90.0, 180.0, 100.0]) * math.pi / 180
    norms = torch.tensor([1.0, 3.0, 0.5, 2.0, 7.0])  # cosine distance: lengths do not count
    embeddings = torch.stack([degrees.cos(), degrees.sin()], dim=1) * norms[:, None]  # [5, 2]
    assert divprune.diverse_order(embeddings, 5).tolist() == [3, 0, 2, 1, 4]
    tokens = VisualTokens(embeddings, (1, 5), torch.tensor([[0, c] for c in range(5)]))
    kept, merged = divprune.keep_diverse(tokens, None, 3)
    assert kept.positions[:, 1].tolist() == [0, 2, 3] and merged is None  # the first three picks, in raster order


def test_divprune_never_picks_a_cell_twice_among_duplicates():
    """A flat image: every embedding the same, every distance 0: still n different cells."""
    picks = divprune.diverse_order(torch.ones(10, 4), 6)
    assert len(set(picks.tolist())) == 6


def test_the_reducers_are_baselines_for_evaluate_run_bench_and_the_app(capsys):
    """evaluate --baselines and the app's Compare choice read BASELINES; run and bench --pipelines read PIPELINES:
    a list with a reducer and an unknown name is refused for the unknown name alone, before any model loads."""
    from arr_coc import evaluate, run
    from arr_coc.pipelines import BASELINES, PIPELINES

    assert set(REDUCERS) <= set(BASELINES) and set(REDUCERS) <= set(PIPELINES)
    for main, flags in ((evaluate.main, ["--synthetic", "1", "--out", "x", "--baselines"]),
                        (run.main, ["--image", "assets/chelsea.png", "--question", "q", "--pipelines"])):
        with pytest.raises(SystemExit):
            main(["--model", "tiny", *flags, "divprune,visionzip,fastzip"])
        assert "unknown ['fastzip']" in capsys.readouterr().err


@pytest.mark.parametrize("name", REDUCERS)
def test_the_answer_names_exactly_the_cells_the_llm_read(arr_model, name, monkeypatch):
    """Answer.kept: the places of the image tokens the reducer put in the prompt (N, unique, on the native grid);
    VisionZip's Answer.merged: C of them, the contextual tokens' places, whose features are not their own cell's."""
    vlm, fed = arr_model.vlm, []
    prompt = vlm.prompt

    def recording(question, images, **kwargs):
        fed.extend(images)
        return prompt(question, images, **kwargs)

    monkeypatch.setattr(vlm, "prompt", recording)
    answer = arr_model.answer(photo(700, 500), QUESTION, name, max_new_tokens=1, budget=40)
    (tokens,) = fed
    gh, gw = answer.views.gestalt_grid
    nh, nw = answer.views.native_grid
    n = gh * gw + 40
    assert torch.equal(answer.kept, tokens.positions) and len(answer.kept) == n < nh * nw
    assert len({tuple(c) for c in answer.kept.tolist()}) == n
    assert ((answer.kept >= 0) & (answer.kept < torch.tensor([nh, nw]))).all()
    assert answer.to_json()["kept"] == answer.kept.tolist()  # run --json lists them
    if name == "divprune":
        assert answer.merged is None and answer.to_json()["merged"] is None
        return
    merged = {tuple(c) for c in answer.merged.tolist()}
    assert answer.to_json()["merged"] == answer.merged.tolist()
    assert len(merged) == visionzip.contextual_count(n) and merged <= {tuple(c) for c in answer.kept.tolist()}
    monkeypatch.setattr(vlm, "prompt", prompt)
    every = vlm.encode_view(answer.views.tensor("native"))  # each cell's own token, in raster order
    own = every.features[answer.kept[:, 0] * nw + answer.kept[:, 1]]  # [N, D]
    is_merged = torch.tensor([tuple(c) in merged for c in answer.kept.tolist()])
    unchanged = torch.isclose(tokens.features, own, atol=1e-5).all(dim=1)  # [N]
    assert torch.equal(unchanged, ~is_merged)  # the merged places hold context, the others their own cell
