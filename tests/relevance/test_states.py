"""
The participatory scorer's StateScorer (arr_coc/relevance/states.py): a fresh one adds exactly nothing, so a layer
given the prior pass's states scores as one without them; every shipped checkpoint (made before it) loads with it at
zero and scores as before; a loss on the relevance map reaches it; its shapes follow the grids.

    .venv/bin/python -m pytest -q tests/relevance/test_states.py
"""

from pathlib import Path

import pytest
import torch

from arr_coc.relevance.config import ARRCOCConfig
from arr_coc.relevance.layer import ARRCOCLayer, list_checkpoints

D = 64
ROOT = Path(__file__).resolve().parents[2]


def inputs(seed: int = 0, grid=(32, 24), gestalt=(16, 12), question=9, hidden=D):
    g = torch.Generator().manual_seed(seed)
    return dict(textures=torch.rand(1, 13, *grid, generator=g), query_embeds=torch.randn(1, 7, hidden, generator=g),
                gestalt_embeds=torch.randn(1, gestalt[0] * gestalt[1], hidden, generator=g),
                participatory_prior=torch.rand(1, *grid, generator=g),
                gestalt_states=torch.randn(1, *gestalt, hidden, generator=g) * 30,  # middle layers' states are large
                question_states=torch.randn(1, question, hidden, generator=g) * 30)


def without_states(x: dict) -> dict:
    return {k: v for k, v in x.items() if k not in ("gestalt_states", "question_states")}


def test_a_fresh_state_scorer_adds_exactly_nothing():
    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=D)).eval()
    x = inputs()
    with torch.no_grad():
        residual = layer.participatory.states(x["textures"], x["gestalt_states"], x["question_states"])
        a, b = layer(**x), layer(**without_states(x))
    assert residual.shape == (1, 32, 24) and torch.equal(residual, torch.zeros(1, 32, 24))
    assert torch.equal(a.relevance, b.relevance) and torch.equal(a.participatory, b.participatory)


@pytest.mark.parametrize("name", list_checkpoints(ROOT / "checkpoints"))
def test_every_shipped_checkpoint_loads_with_the_state_scorer_at_zero_and_scores_as_before(name):
    folder = ROOT / "checkpoints" / name
    layer = ARRCOCLayer.from_pretrained(folder).eval()
    last = layer.participatory.states.guide[-1]
    assert torch.equal(last.weight, torch.zeros_like(last.weight)) and torch.equal(last.bias, torch.zeros(1))
    x = inputs(hidden=layer.config.hidden_size)
    with torch.no_grad():
        assert torch.equal(layer(**x).relevance, layer(**without_states(x)).relevance)


def test_a_loss_on_the_relevance_map_reaches_the_state_scorer_and_moves_the_map():
    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=D))
    x = inputs(seed=3)
    target = torch.zeros(32, 24)
    target[5, 7] = 1.0
    optimizer = torch.optim.SGD(layer.participatory.states.parameters(), lr=0.5)
    with torch.no_grad():
        before = float(layer(**x).relevance[0, 5, 7])
    for _ in range(3):
        loss = -(target * layer(**x).relevance[0].flatten().log_softmax(0).view(32, 24)).sum()
        optimizer.zero_grad()
        loss.backward()
        assert layer.participatory.states.guide[-1].weight.grad.abs().sum() > 0
        optimizer.step()
    with torch.no_grad():
        assert float(layer(**x).relevance[0, 5, 7]) > before + 0.1  # only the state scorer moved


def test_the_residual_follows_the_candidate_grid_whatever_the_gestalt_grid():
    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=D))
    torch.nn.init.normal_(layer.participatory.states.guide[-1].weight)  # as if trained: not zero
    for grid, gestalt, question in (((64, 64), (16, 16), 3), ((38, 27), (19, 13), 20), ((32, 32), (16, 16), 1)):
        x = inputs(grid=grid, gestalt=gestalt, question=question)
        out = layer.participatory.states(x["textures"], x["gestalt_states"], x["question_states"])
        assert out.shape == (1, *grid) and out.abs().sum() > 0 and torch.isfinite(out).all()
