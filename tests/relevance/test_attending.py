"""TokenAllocator invariants: exactly `budget` unique in-bounds cells, relevance-ordered, with fallbacks."""

import math

import pytest
import torch

from arr_coc.relevance.config import STRATEGIES
from arr_coc.relevance.attending import TokenAllocator
from arr_coc.relevance.tensions import COVERAGE
from conftest import peaked_map


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


# ----------------------------------------------------------------------------- the tensions' selection


def mean_pairwise_distance(positions: torch.Tensor) -> float:
    """[K, 2] cells -> their mean pairwise Euclidean distance, in cells."""
    return float(torch.pdist(positions.float()).mean())


def quadrants(positions: torch.Tensor, grid=(32, 32)) -> set:
    """[K, 2] cells -> the quadrants of the grid they fall in."""
    return {(int(r) * 2 // grid[0], int(c) * 2 // grid[1]) for r, c in positions.tolist()}


@pytest.mark.parametrize("seed", range(3))
def test_every_tension_at_its_prior_is_exactly_topk(seed):
    torch.manual_seed(seed)
    relevance = torch.rand(1, 32, 32)
    relevance[0, 4, :8] = relevance[0, 4, 0]  # ties: topk's own tie order must survive too
    plain = TokenAllocator(273, "topk")(relevance)
    prior = TokenAllocator(273, "topk")(relevance, explore=[0.0], diversify=[0.0], budgets=[273])
    assert torch.equal(prior.indices, plain.indices) and torch.equal(prior.scores, plain.scores)
    order = relevance.flatten().topk(273).indices
    assert set(prior.indices[0].tolist()) == set(order.tolist())
    assert (prior.kinds == 0).all()


def test_a_spacing_penalty_spreads_the_picks():
    relevance = peaked_map(centre=(10, 20))
    plain = TokenAllocator(40, "topk")(relevance)
    spaced = TokenAllocator(40, "topk")(relevance, diversify=[2.0])  # λ in standard units of the map: the peak is ~5
    distances = [mean_pairwise_distance(TokenAllocator(40, "topk")(relevance, diversify=[lam]).positions[0])
                 for lam in (0.0, 2.0, 4.0, 8.0)]
    assert distances == sorted(set(distances)), distances  # strictly increasing with λ
    assert spaced.indices[0].unique().numel() == 40 and spaced.indices[0, 0] == plain.indices[0, 0]  # the peak first
    assert (spaced.kinds == 1).any()  # the penalty brought in cells plain topk leaves out


def test_exploring_covers_more_of_the_grid():
    relevance = peaked_map(centre=(6, 6))  # everything relevant in the top-left quadrant
    plain = TokenAllocator(60, "topk")(relevance)
    explored = TokenAllocator(60, "topk")(relevance, explore=[0.25])
    assert quadrants(plain.positions[0]) == {(0, 0)}
    assert quadrants(explored.positions[0]) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert int((explored.kinds == 2).sum()) == 15  # a quarter of the budget went to coverage
    assert explored.indices[0].unique().numel() == 60
    focus = set(explored.indices[0][explored.kinds[0] != 2].tolist())
    assert focus == set(plain.indices[0, :45].tolist())  # the rest is the top 45, as before


def test_logpolar_explores_too_and_grid_ignores_the_tensions():
    relevance = peaked_map(centre=(6, 6))
    logpolar = TokenAllocator(60, "logpolar")(relevance, explore=[0.25])
    assert int((logpolar.kinds == 2).sum()) == 15
    grid = TokenAllocator(60, "grid")
    assert torch.equal(grid(relevance, explore=[0.25], diversify=[2.0]).indices, grid(relevance).indices)


def test_a_busy_image_falls_back_to_grid():
    relevance = peaked_map()
    out = TokenAllocator(50, "topk")(relevance, busy_images=[True])
    assert out.fallback == ["semantic_void"]
    assert torch.equal(out.indices, TokenAllocator(50, "grid")(relevance).indices)


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


# ----------------------------------------------------------------------------- the tensions on a second look


def read_by_a_first_look(relevance: torch.Tensor, budget: int = 273) -> torch.Tensor:
    """[1, gh, gw] bool: the cells a plain topk first look of `budget` read."""
    exclude = torch.zeros(1, relevance[0].numel(), dtype=torch.bool)
    exclude[0, TokenAllocator(budget, "topk")(relevance).indices[0]] = True
    return exclude.view_as(relevance)


@pytest.mark.parametrize("strategy", ["topk", "logpolar"])
def test_coverage_on_a_second_look_reads_only_cells_not_yet_read(strategy):
    """Exploring after a first look: the coverage share is still round(e * K), all of it among the cells not yet
    read (the excluded blob's middle, far from every pick, is never taken), and the cells stay unique."""
    relevance = peaked_map(centre=(6, 6))
    exclude = read_by_a_first_look(relevance)
    out = TokenAllocator(100, strategy)(relevance, exclude=exclude, explore=[0.25])
    idx = out.indices[0]
    assert idx.unique().numel() == 100 and not exclude.flatten()[idx].any()
    assert int((out.kinds == COVERAGE).sum()) == 25


def test_spacing_on_a_second_look_starts_at_the_best_cell_left_and_spreads():
    """Diversifying after a first look: λ in standard units of the cells not yet read, so the first pick is the
    best of them and the picks spread as λ grows; none was read before."""
    relevance = peaked_map(centre=(10, 20))
    exclude = read_by_a_first_look(relevance, 100)
    plain = TokenAllocator(40, "topk")(relevance, exclude=exclude)
    distances = []
    for lam in (0.0, 2.0, 8.0):
        out = TokenAllocator(40, "topk")(relevance, exclude=exclude, diversify=[lam])
        assert out.indices[0, 0] == plain.indices[0, 0] and not exclude.flatten()[out.indices[0]].any()
        distances.append(mean_pairwise_distance(out.positions[0]))
    assert distances == sorted(set(distances)), distances
