"""The three tensions: their priors, the adaptive budget's bounds and direction, the straight-through gates, and
checkpoints saved before the tension head existed."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from arr_coc.relevance.config import ARRCOCConfig, TensionSettings
from arr_coc.relevance.layer import ARRCOCLayer
from arr_coc.relevance.tensions import budgets, tension_values
from conftest import D, peaked_map, select_saccades

NO_RESIDUALS = torch.zeros(1, 3)


def test_a_fresh_layer_selects_exactly_topk_at_every_prior():
    out = select_saccades(ARRCOCLayer(ARRCOCConfig(hidden_size=D)), participatory_prior=torch.rand(2, 32, 32))
    assert (out.explore == 0).all() and (out.diversify == 0).all() and out.budgets == [273, 273]
    for b in range(2):
        top = out.relevance[b].flatten().topk(273).indices
        assert set(out.indices[b].tolist()) == set(top.tolist())
    assert out.fallback == [None, None] and not out.auto_budget


def test_the_adaptive_budget_spends_more_on_a_spread_map_than_on_a_peaked_one():
    """The direction this relaxation takes (the seeds' "high entropy -> more tokens"): a map whose relevance is spread
    out asks for more saccades than one with a single peak."""
    peaked = 10 * peaked_map()  # [1, 32, 32] one sharp bump
    spread = torch.rand(1, 32, 32)  # no peak at all
    bounds = (64, 512)
    k_peaked = budgets(tension_values(NO_RESIDUALS, peaked, 0.5).particularize, bounds)[0]
    k_spread = budgets(tension_values(NO_RESIDUALS, spread, 0.5).particularize, bounds)[0]
    assert 64 <= k_peaked < k_spread <= 512, (k_peaked, k_spread)


@pytest.mark.parametrize("bounds", [(64, 512), (10, 20), (300, 300), (900, 2000)])
def test_the_adaptive_budget_stays_within_its_bounds(bounds):
    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=D))
    settings = TensionSettings(min_budget=bounds[0], max_budget=bounds[1])
    out = select_saccades(layer, budget="auto", settings=settings, n=1)
    lo, hi = min(bounds[0], 1024), min(bounds[1], 1024)  # the 32 x 32 grid caps both
    assert out.auto_budget and lo <= out.budgets[0] <= hi and out.indices.shape == (1, out.budgets[0])
    assert out.indices[0].unique().numel() == out.budgets[0]


def test_fixed_settings_replace_the_balancers_tensions():
    settings = TensionSettings(explore=0.25, diversify=2.0, particularize=1.0, min_budget=50, max_budget=100)
    out = select_saccades(ARRCOCLayer(ARRCOCConfig(hidden_size=D)), budget="auto", settings=settings, n=1)
    assert float(out.explore[0]) == 0.25 and float(out.diversify[0]) == 2.0 and out.budgets == [100]
    assert int((out.kinds == 2).sum()) == 25  # a quarter of K on coverage
    with pytest.raises(ValueError, match="explore"):
        TensionSettings(explore=0.6)


def test_the_gates_are_exactly_one_forward_and_carry_each_tensions_gradient():
    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=D, min_budget=100, max_budget=200))
    with torch.no_grad():  # a trained head: every tension away from its prior
        layer.balancer.tension_head[1].bias.copy_(torch.tensor([0.2, 2.0, 0.5]))
    out = select_saccades(layer, budget="auto", n=1)
    assert torch.equal(out.gates, torch.ones_like(out.gates))
    (out.gates * torch.randn_like(out.gates)).sum().backward()
    grad = layer.balancer.tension_head[1].bias.grad
    assert (grad != 0).all(), grad  # e, λ and K each get a gradient from the answer loss


def test_a_checkpoint_without_the_tension_head_loads_at_the_prior(tmp_path):
    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=D))
    torch.nn.init.normal_(layer.information.residual[2].weight)  # a trained scorer
    layer.save_pretrained(tmp_path / "old")
    weights = tmp_path / "old" / "model.safetensors"
    old = {k: v for k, v in load_file(weights).items() if not k.startswith("balancer.tension_head.")}
    save_file(old, weights)  # as saved before the tension head existed
    loaded = ARRCOCLayer.from_pretrained(tmp_path / "old", expect_hidden_size=D)
    assert all((p == 0).all() for p in loaded.balancer.tension_head[1].parameters())
    a, b = select_saccades(loaded), select_saccades(layer)
    assert torch.equal(a.indices, b.indices) and (a.explore == 0).all() and (a.diversify == 0).all()
