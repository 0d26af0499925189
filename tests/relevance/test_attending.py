"""TokenAllocator invariants: exactly `budget` unique in-bounds cells, relevance-ordered, with fallbacks."""

import math

import pytest
import torch

from arr_coc.relevance.config import STRATEGIES
from arr_coc.relevance.attending import TokenAllocator
from arr_coc.relevance.tensions import COVERAGE, FORCED, RELEVANCE
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


def box_and_spikes() -> torch.Tensor:
    """[1, 12, 12]: a box (rows 2-4, cols 3-6) whose middle row is 0.8 with its peak 1.0 at (3, 4) and whose edge rows
    are 0.6, eight lone spikes of 0.75 down to 0.68 (SPIKES' order), 0 elsewhere."""
    relevance = torch.zeros(1, 12, 12)
    relevance[0, 2:5, 3:7] = 0.6
    relevance[0, 3, 3:7] = 0.8
    relevance[0, 3, 4] = 1.0
    for i, cell in enumerate(SPIKES):
        relevance[0, cell // 12, cell % 12] = 0.75 - 0.01 * i
    return relevance


BOX = [27, 28, 29, 30, 39, 40, 41, 42, 51, 52, 53, 54]  # rows 2-4, cols 3-6 of a 12-wide grid
SPIKES = [11, 97, 117, 132, 82, 126, 84, 143]  # (0, 11), (8, 1), (9, 9), (11, 0), (6, 10), (10, 6), (7, 0), (11, 11)


def test_regions_read_the_box_whole_and_the_lone_peaks():
    out = TokenAllocator(16, "regions")(box_and_spikes())
    idx = out.indices[0]
    assert idx.unique().numel() == 16 and ((idx >= 0) & (idx < 144)).all()
    # the 3x4 rectangle, then the four highest spikes, each a rectangle of one cell
    assert set(idx.tolist()) == {27, 28, 29, 30, 39, 40, 41, 42, 51, 52, 53, 54, 11, 97, 117, 132}
    # topk takes all eight spikes before the box's edge rows (0.6): 4 of the box's 12 cells are left out
    assert len(set(BOX) - set(TokenAllocator(16, "topk")(box_and_spikes()).indices[0].tolist())) == 4


def test_regions_fill_the_rest_by_relevance_or_by_ink():
    relevance = box_and_spikes()
    relevance[0, 10, 5] = 0.3  # below half-way from the median (0) to the peak (1.0): no region, the first of the rest
    plain = TokenAllocator(23, "regions")(relevance).indices[0].tolist()
    assert set(plain) == set(BOX) | set(SPIKES) | {125, 0, 1}  # (10, 5), then the zeros in raster order
    ink = torch.zeros(1, 12, 12)
    ink[0, 6, 6], ink[0, 7, 7], ink[0, 3, 4] = 0.9, 0.8, 1.0  # (3, 4) is in the box already
    inked = TokenAllocator(23, "regions_ink")(relevance, ink=ink).indices[0].tolist()
    assert set(inked) == set(BOX) | set(SPIKES) | {78, 91, 0}  # the ink left, then the first cell of no ink


def test_regions_skip_excluded_cells_and_keep_the_budget():
    exclude = torch.zeros(1, 12, 12, dtype=torch.bool)
    exclude[0, 3, 5] = True  # a box cell (41) a first look read
    out = TokenAllocator(16, "regions")(box_and_spikes(), exclude=exclude)
    assert set(out.indices[0].tolist()) == {27, 28, 29, 30, 39, 40, 42, 51, 52, 53, 54, 11, 97, 117, 132, 82}


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


MAP_4X4 = torch.tensor([[[0.10, 0.90, 0.20, 0.80],  # a hand-made map of a busy image: its top 4 are cells 13 (0.95),
                         [0.30, 0.05, 0.70, 0.00],  # 1 (0.90), 3 (0.80) and 6 (0.70)
                         [0.60, 0.15, 0.40, 0.50],
                         [0.25, 0.95, 0.35, 0.45]]])


def test_a_busy_image_keeps_its_selection_where_busy_pages_says_keep():
    """busy_pages "grid": a busy image's picks are an even grid (grid_cells of 4 in 16: cells 2, 6, 10, 14), said
    "semantic_void"; "keep": the map's own top 4, most relevant first, said "busy". An empty image is a void
    either way."""
    grid = TokenAllocator(4, "topk", busy_pages="grid")(MAP_4X4, busy_images=[True])
    assert grid.fallback == ["semantic_void"] and grid.indices.tolist() == [[6, 10, 14, 2]]  # by relevance
    kept = TokenAllocator(4, "topk", busy_pages="keep")(MAP_4X4, busy_images=[True])
    assert kept.fallback == ["busy"] and kept.indices.tolist() == [[13, 1, 3, 6]]
    assert kept.positions.tolist() == [[[3, 1], [0, 1], [0, 3], [1, 2]]]
    calm = TokenAllocator(4, "topk", busy_pages="keep")(MAP_4X4, busy_images=[False])
    assert calm.fallback == [None] and calm.indices.tolist() == [[13, 1, 3, 6]]
    empty = TokenAllocator(4, "topk", busy_pages="keep")(MAP_4X4, empty_images=[True], busy_images=[True])
    assert empty.fallback == ["semantic_void"] and empty.indices.tolist() == [[6, 10, 14, 2]]
    with pytest.raises(ValueError, match="busy_pages must be one of"):
        TokenAllocator(4, busy_pages="ignore")


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


def test_a_busy_image_falls_back_to_grid_under_busy_pages_grid():
    relevance = peaked_map()
    out = TokenAllocator(50, "topk", busy_pages="grid")(relevance, busy_images=[True])
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


# ----------------------------------------------------------------------------- cells forced in (evaluate's oracle)

# A hand-made 4 x 4 relevance map, raster index i at row i // 4, column i % 4:
#    0: .10   1: .90   2: .30   3: .20
#    4: .80   5: .05   6: .70   7: .40
#    8: .60   9: .50  10: .02  11: .01
#   12: .15  13: .35  14: .03  15: .04
HAND_MAP = torch.tensor([[[0.10, 0.90, 0.30, 0.20],
                          [0.80, 0.05, 0.70, 0.40],
                          [0.60, 0.50, 0.02, 0.01],
                          [0.15, 0.35, 0.03, 0.04]]])


def box_mask(rows: slice, cols: slice, grid=(4, 4)) -> torch.Tensor:
    """[1, gh, gw] bool: the cells of a box of rows x cols."""
    mask = torch.zeros(1, *grid, dtype=torch.bool)
    mask[0, rows, cols] = True
    return mask


def test_an_included_box_is_read_whole_and_the_rest_of_the_budget_goes_by_relevance():
    """The 2 x 2 box of the map's four least relevant cells (10, 11, 14, 15) forced into 6: all four, and the two
    best cells outside it (1 at .90, 4 at .80), most relevant first; the box's cells marked FORCED."""
    out = TokenAllocator(6, "topk")(HAND_MAP, include=box_mask(slice(2, 4), slice(2, 4)))
    assert out.indices[0].tolist() == [1, 4, 15, 14, 10, 11]
    assert out.positions[0].tolist() == [[0, 1], [1, 0], [3, 3], [3, 2], [2, 2], [2, 3]]
    assert out.kinds[0].tolist() == [RELEVANCE, RELEVANCE, FORCED, FORCED, FORCED, FORCED]
    assert out.fallback == [None]


def test_a_box_among_the_best_cells_is_not_read_twice():
    """The box over cells 0, 1, 4, 5 (two of the map's best) forced into 6: the fill is the best cells outside
    the box (6 at .70, 8 at .60), none repeated."""
    out = TokenAllocator(6, "topk")(HAND_MAP, include=box_mask(slice(0, 2), slice(0, 2)))
    assert out.indices[0].tolist() == [1, 4, 6, 8, 0, 5]


def test_a_box_larger_than_the_budget_gives_its_most_relevant_cells_only():
    """Budget 3, the box over cells 0, 1, 4, 5: its three most relevant (1, 4, 0), all inside it; budget 2, the
    box of the four least relevant: its best two (15, 14), not the map's best."""
    high = TokenAllocator(3, "topk")(HAND_MAP, include=box_mask(slice(0, 2), slice(0, 2)))
    assert high.indices[0].tolist() == [1, 4, 0]
    low = TokenAllocator(2, "topk")(HAND_MAP, include=box_mask(slice(2, 4), slice(2, 4)))
    assert low.indices[0].tolist() == [15, 14] and low.kinds[0].tolist() == [FORCED, FORCED]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("flat", [False, True])  # True: a void, which falls back to grid for the rest
def test_an_included_box_is_read_whatever_the_strategy_or_fallback(strategy, flat):
    """A 6 x 5 box far from the peak forced into 273 cells of a 32 x 32 map: exactly 273 unique in-bounds cells,
    the box's 30 among them, under every strategy and the grid fallback."""
    relevance = torch.zeros(1, 32, 32) if flat else peaked_map(centre=(8, 8))
    box = box_mask(slice(24, 30), slice(20, 25), (32, 32))
    out = TokenAllocator(273, strategy)(relevance, include=box)
    idx = out.indices[0]
    assert idx.shape == (273,) and idx.unique().numel() == 273 and ((idx >= 0) & (idx < 32 * 32)).all()
    assert box.flatten()[idx].sum() == 30 and int((out.kinds == FORCED).sum()) == 30
    assert out.fallback == (["semantic_void"] if flat else [None])


def test_a_cell_both_included_and_excluded_is_refused():
    with pytest.raises(ValueError, match="both included and excluded"):
        TokenAllocator(4)(HAND_MAP, include=box_mask(slice(0, 2), slice(0, 2)),
                          exclude=box_mask(slice(1, 3), slice(1, 3)))
