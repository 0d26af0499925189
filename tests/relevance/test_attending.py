"""TokenAllocator invariants: exactly `budget` unique in-bounds cells, relevance-ordered, with fallbacks."""

import math

import pytest
import torch

from arr_coc.config import STRATEGIES
from arr_coc.relevance.attending import TokenAllocator


def peaked_map(gh=32, gw=32, centre=(16, 16), seed=0):
    torch.manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    bump = torch.exp(-((yy - centre[0]) ** 2 + (xx - centre[1]) ** 2).float() / 50)
    return (bump + 0.01 * torch.rand(gh, gw)).unsqueeze(0)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("grid", [(32, 32), (12, 48), (116, 8), (64, 64), (128, 128), (48, 86)])
def test_exactly_budget_unique_cells_in_relevance_order(strategy, grid):
    relevance = peaked_map(*grid, centre=(grid[0] // 3, grid[1] // 2))
    out = TokenAllocator(273, strategy)(relevance)
    idx = out.indices[0]
    assert idx.shape == (273,) and idx.unique().numel() == 273
    assert ((idx >= 0) & (idx < grid[0] * grid[1])).all()
    assert (out.positions[0, :, 0] < grid[0]).all() and (out.positions[0, :, 1] < grid[1]).all()
    torch.testing.assert_close(out.positions[0, :, 0] * grid[1] + out.positions[0, :, 1], idx)
    torch.testing.assert_close(out.scores[0], relevance.flatten()[idx])
    assert (out.scores[0][:-1] >= out.scores[0][1:]).all()
    assert out.fallback == [None]


def test_topk_takes_the_maxima():
    relevance = torch.rand(1, 32, 32)
    out = TokenAllocator(273, "topk")(relevance)
    assert set(out.indices[0].tolist()) == set(relevance.flatten().topk(273).indices.tolist())


def test_logpolar_covers_every_angle_around_the_peak():
    relevance = peaked_map()
    out = TokenAllocator(273, "logpolar")(relevance)
    dy = (out.positions[0, :, 0] - 16).float()
    dx = (out.positions[0, :, 1] - 16).float()
    theta = ((torch.atan2(dy, dx) + math.pi) / (2 * math.pi) * 17).long().clamp(max=16)
    theta = theta[(dy != 0) | (dx != 0)]
    assert set(theta.tolist()) == set(range(17))
    assert out.indices[0, 0] == 16 * 32 + 16  # the fovea first
    # foveated: it reaches farther out than top-k, which hugs the peak
    far = lambda o: ((o.positions[0].float() - 16) ** 2).sum(-1).sqrt().max()
    assert far(out) > far(TokenAllocator(273, "topk")(relevance)) + 3


def test_grid_spreads_evenly():
    out = TokenAllocator(273, "grid")(peaked_map())
    rows = torch.bincount(out.positions[0, :, 0], minlength=32)
    cols = torch.bincount(out.positions[0, :, 1], minlength=32)
    assert rows.min() >= 8 and rows.max() <= 9
    assert cols.min() >= 6 and cols.max() <= 11


def test_random_is_seeded():
    relevance = peaked_map()
    a = TokenAllocator(273, "random", seed=1)(relevance).indices
    b = TokenAllocator(273, "random", seed=1)(relevance).indices
    c = TokenAllocator(273, "random", seed=2)(relevance).indices
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_uniform_map_falls_back_to_grid(strategy):
    out = TokenAllocator(273, strategy)(torch.full((1, 32, 32), 0.7))
    assert out.fallback == ["semantic_void"]
    torch.testing.assert_close(out.indices, TokenAllocator(273, "grid")(peaked_map()).indices.sort().values)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_map_falls_back_to_grid(bad):
    relevance = peaked_map()
    relevance[0, 3, 4] = bad
    out = TokenAllocator(273, "topk")(relevance)
    assert out.fallback == ["non_finite"]
    assert out.indices[0].unique().numel() == 273 and torch.isfinite(out.scores).all()


def test_each_image_of_a_batch_gets_its_own_fallback():
    relevance = torch.cat([peaked_map(), torch.zeros(1, 32, 32)])
    out = TokenAllocator(273, "topk")(relevance)
    assert out.fallback == [None, "semantic_void"] and out.indices.shape == (2, 273)


def test_budget_larger_than_the_grid_is_refused():
    with pytest.raises(ValueError, match="exceeds"):
        TokenAllocator(273)(torch.rand(1, 10, 10))
    with pytest.raises(ValueError, match="strategy"):
        TokenAllocator(273, "bogus")


def test_an_empty_image_is_a_void_whatever_its_map_says():
    out = TokenAllocator(273, "topk")(torch.cat([peaked_map(), peaked_map()]), empty_images=[False, True])
    assert out.fallback == [None, "semantic_void"]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("flat", [False, True])  # True: a void, which falls back to grid
def test_excluded_cells_are_never_chosen_and_the_budget_is_kept(strategy, flat):
    """A second fixation's allocation: `exclude` (the first round's cells, here the peak's 273) is never chosen,
    whatever the strategy or fallback, and the budget is still met with unique cells."""
    relevance = torch.zeros(1, 32, 32) if flat else peaked_map()
    first = TokenAllocator(273, "topk")(peaked_map()).indices[0]
    exclude = torch.zeros(1, 32 * 32, dtype=torch.bool)
    exclude[0, first] = True
    out = TokenAllocator(300, strategy)(relevance, exclude=exclude.view(1, 32, 32))
    idx = out.indices[0]
    assert idx.unique().numel() == 300 and not exclude[0, idx].any()
    assert (out.scores[0][:-1] >= out.scores[0][1:]).all()


def test_topk_with_exclusion_takes_the_maxima_of_the_rest():
    relevance = torch.rand(1, 32, 32)
    exclude = relevance > relevance.flatten().kthvalue(1024 - 100).values  # the 100 best cells
    out = TokenAllocator(50, "topk")(relevance, exclude=exclude)
    torch.testing.assert_close(out.indices[0], relevance.masked_fill(exclude, -1).flatten().topk(50).indices)


def test_a_budget_over_the_cells_not_yet_read_is_refused():
    exclude = torch.zeros(1, 10, 10, dtype=torch.bool)
    exclude[0, :5] = True  # 50 cells read, 50 left
    assert TokenAllocator(50)(torch.rand(1, 10, 10), exclude=exclude).indices.shape == (1, 50)
    with pytest.raises(ValueError, match="not yet read"):
        TokenAllocator(51)(torch.rand(1, 10, 10), exclude=exclude)
