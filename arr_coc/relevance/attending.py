"""
TokenAllocator: turns a relevance map into exactly K saccades (unique cells), most relevant first; K is the fixed
`budget`, or each image's own adaptive budget (arr_coc.relevance.tensions).

Strategies (docs/ARCHITECTURE.md §1), all returning the same shapes so they can be ablated side by side:
- topk      the `budget` highest cells
- logpolar  a foveated sample: 16 rho x 17 theta bins around the relevance peak, the best cell of each
            bin, filled up to the budget with the best remaining cells (seed Part 12)
- grid      evenly spread coverage, whatever the map says
- random    seeded random cells
- regions   a few rectangles around relevance peaks, so a box or a word is read whole (region_cells): from the
            best free cell a rectangle grows a row or a column at a time while the strip it adds scores, on average,
            at least half-way from the map's median to that peak; then the next peak. A peak below half-way from the
            median to the first one starts no region: the rest of the budget goes to the most relevant cells left
- regions_ink  regions, the rest of the budget (the cells relevance does not need) to the cells of most ink
            (the texture's highpass_energy: text strokes), most first: it covers the ink it has not placed by
            relevance, as PixelPrune keeps every cell with ink in it

Two tensions shape the selection (arr_coc.relevance.tensions; both 0 by default, which is exactly the above):
- explore e   (topk, logpolar) round(e * K) of the K cells go to coverage: farthest-point sampling from the cells
              already picked
- diversify λ (topk) a greedy pick of relevance (standardised) minus λ x proximity to the cells picked so far

A map that is not finite, or flat, or of a busy image (voids: noise, a dense texture) is a "semantic void": it
falls back to `grid` and says why. With busy_pages "keep" (the default), a busy image's picks stay the strategy's
own and its fallback only says "busy" (a dense page's asked box is still where relevance points; a grid holds
little of it). Cells marked in `exclude` (those a first fixation already read) are never
chosen: the strategy picks on the map with them at -inf, and any it still lands on are swapped for the best cells
left (see `avoid`). Cells marked in `include` (evaluate's oracle row: the asked box's) are always chosen, most
relevant first where they outnumber the budget (`forced_cells`, kind FORCED); the strategy picks the rest of the
budget as ever (its fallback included) among the other cells, as if the included ones were excluded.
"""

import math
from dataclasses import dataclass

import torch

from arr_coc.errors import InputError
from arr_coc.relevance.config import BUSY_PAGES, STRATEGIES, ARRCOCConfig
from arr_coc.relevance.tensions import COVERAGE, FORCED, RELEVANCE, SPACED

FALLBACKS = (None, "non_finite", "semantic_void", "busy")  # why a map was not trusted (Allocation.fallback), by
# code; "busy" (busy_pages "keep"): a busy image, recorded, its selection kept
KEPT = (None, "busy")  # the fallbacks under which the strategy's own picks stay
REGION_LEVEL = 0.5  # regions: a strip joins a rectangle when its mean score is at least this far from the map's
# median to the rectangle's peak (0: any strip above the median; 1: only strips as high as the peak)
REGION_SHARE = 0.75  # regions: one rectangle takes at most this share of the budget, so a wrong first peak leaves
# room for the next ones


@dataclass
class Allocation:
    indices: torch.Tensor  # [B, K] flat cell index row * gw + col, relevance-ordered
    positions: torch.Tensor  # [B, K, 2] (row, col) of each saccade
    scores: torch.Tensor  # [B, K] relevance of each saccade (non-finite values reported as 0)
    fallback: list[str | None]  # per image: one of FALLBACKS (None: the map was trusted)
    kinds: torch.Tensor  # [B, K] what picked each saccade: tensions.RELEVANCE, SPACED (the spacing penalty) or COVERAGE


def grid_cells(n_cells: int, budget: int, device=None) -> torch.Tensor:
    """`budget` evenly spaced raster indices: about the same count in every row, staggered across columns."""
    return ((torch.arange(budget, device=device, dtype=torch.float64) + 0.5) * n_cells / budget).long()


def logpolar_cells(scores: torch.Tensor, grid: tuple[int, int], budget: int, rho_bins: int, theta_bins: int) -> torch.Tensor:
    """[N] scores -> `budget` unique indices: the best cell of every log-polar bin, then the global best."""
    gh, gw = grid
    N = gh * gw
    device = scores.device
    peak = int(scores.argmax())
    rows = torch.arange(N, device=device) // gw
    cols = torch.arange(N, device=device) % gw
    dy = (rows - peak // gw).float()
    dx = (cols - peak % gw).float()
    log_r = torch.log1p(torch.sqrt(dy * dy + dx * dx))  # [N]
    rho = (log_r / log_r.max().clamp_min(1e-6) * rho_bins).long().clamp(max=rho_bins - 1)
    theta = ((torch.atan2(dy, dx) + math.pi) / (2 * math.pi) * theta_bins).long().clamp(max=theta_bins - 1)
    bins = rho * theta_bins + theta  # [N]
    bins[peak] = -1  # the fovea is its own bin
    rank = torch.empty(N, dtype=torch.long, device=device)
    order = scores.argsort(descending=True, stable=True)
    rank[order] = torch.arange(N, device=device)
    # best (lowest-rank) cell of every non-empty bin
    best = torch.full((rho_bins * theta_bins + 1,), N, dtype=torch.long, device=device)
    best = best.scatter_reduce(0, bins + 1, rank, reduce="amin")
    chosen = torch.zeros(N, dtype=torch.bool, device=device)
    chosen[order[best[best < N]]] = True
    chosen = chosen & (torch.cumsum(chosen[order].long(), 0)[rank] <= budget)  # at most `budget` bin winners
    # fill up with the best cells not yet chosen
    rest = order[~chosen[order]][: budget - int(chosen.sum())]
    chosen[rest] = True
    return chosen.nonzero().squeeze(1)


def rectangle_strips(box: tuple[int, int, int, int],
                     grid: tuple[int, int]) -> list[tuple[tuple[int, ...], torch.Tensor]]:
    """A rectangle (r0, r1, c0, c1), inclusive, on a (gh, gw) grid -> each in-bounds row or column next to it, as
    (the rectangle grown by it, the strip's [n] flat indices): above, below, left, right."""
    (r0, r1, c0, c1), (gh, gw) = box, grid
    rows, cols = torch.arange(r0, r1 + 1), torch.arange(c0, c1 + 1)
    strips = []
    if r0 > 0:
        strips.append(((r0 - 1, r1, c0, c1), (r0 - 1) * gw + cols))
    if r1 < gh - 1:
        strips.append(((r0, r1 + 1, c0, c1), (r1 + 1) * gw + cols))
    if c0 > 0:
        strips.append(((r0, r1, c0 - 1, c1), rows * gw + c0 - 1))
    if c1 < gw - 1:
        strips.append(((r0, r1, c0, c1 + 1), rows * gw + c1 + 1))
    return strips


def grow_region(scores: torch.Tensor, taken: torch.Tensor, grid: tuple[int, int], peak: int, level: float,
                size: int) -> list[int]:
    """[N] finite-or--inf scores (cpu, float64), [N] bool taken (updated) -> at most `size` free cells of one
    rectangle around `peak`: it grows by the in-bounds strip of highest mean score over its free cells while that
    mean is >= level; a strip larger than the room left gives its best cells."""
    box, cells = (peak // grid[1], peak // grid[1], peak % grid[1], peak % grid[1]), [peak]
    taken[peak] = True
    while len(cells) < size:
        best = None
        for grown, strip in rectangle_strips(box, grid):
            free = strip[~taken[strip]]
            if len(free) and (best is None or scores[free].mean() > best[0]):
                best = (scores[free].mean(), grown, free)
        if best is None or best[0] < level:
            break
        box, free = best[1], best[2]
        free = free[scores[free].argsort(descending=True, stable=True)][: size - len(cells)]
        taken[free] = True
        cells.extend(free.tolist())
    return cells


def region_cells(scores: torch.Tensor, grid: tuple[int, int], budget: int,
                 fill: torch.Tensor | None = None) -> torch.Tensor:
    """
    [N] scores (-inf: not to choose) -> `budget` unique indices: rectangles around relevance peaks (grow_region, each
    at most REGION_SHARE of the budget) while the best free cell is at least REGION_LEVEL of the way from the map's
    median to the first peak; the rest the free cells of highest `fill` [N] (None: of highest score), raster order on
    ties.
    """
    work = torch.nan_to_num(scores.detach().double().cpu(), nan=0.0, posinf=0.0, neginf=float("-inf"))  # [N]
    taken = work == float("-inf")  # [N]
    if budget == 0:
        return scores.new_zeros(0, dtype=torch.long)
    median = work[~taken].median()
    worth = median + REGION_LEVEL * (work.masked_fill(taken, float("-inf")).max() - median)
    size, cells = max(1, int(REGION_SHARE * budget)), []
    while len(cells) < budget:
        peak = int(work.masked_fill(taken, float("-inf")).argmax())
        if work[peak] < worth:
            break
        level = median + REGION_LEVEL * (work[peak] - median)
        cells.extend(grow_region(work, taken, grid, peak, level, min(size, budget - len(cells))))
    rest = work if fill is None else torch.nan_to_num(fill.detach().double().cpu(), nan=0.0, posinf=0.0, neginf=0.0)
    free = rest.masked_fill(taken, float("-inf")).argsort(descending=True, stable=True)[: budget - len(cells)]
    return torch.tensor(cells + free.tolist(), dtype=torch.long, device=scores.device)


def cell_distances(index: int, grid: tuple[int, int], device=None) -> torch.Tensor:
    """[N] Euclidean distance, in cells, of every cell of a (gh, gw) grid from cell `index`."""
    gh, gw = grid
    cells = torch.arange(gh * gw, device=device)
    return torch.hypot((cells // gw - index // gw).float(), (cells % gw - index % gw).float())


def spaced_topk(scores: torch.Tensor, grid: tuple[int, int], budget: int, spacing: float,
                radius: float) -> tuple[torch.Tensor, torch.Tensor]:
    """
    [N] scores -> (`budget` indices, their kinds): greedily the cell of highest z-score minus spacing x its proximity
    exp(-d^2 / 2 radius^2) to the nearest cell picked so far. spacing 0 is plain topk (taken as is: ties and all).
    """
    plain = scores.topk(budget).indices
    if spacing == 0 or budget == 0:
        return plain, torch.full_like(plain, RELEVANCE)
    readable = scores[torch.isfinite(scores)]  # cells at -inf (excluded: already read) stay at -inf
    z = (scores - readable.mean()) / readable.std(unbiased=False).clamp_min(1e-12)  # [N]: λ in standard units
    proximity = torch.zeros_like(z)  # [N] to the nearest pick so far
    taken = torch.zeros(z.shape, dtype=torch.bool, device=z.device)
    picks = []
    for _ in range(budget):
        i = int((z - spacing * proximity).masked_fill(taken, float("-inf")).argmax())
        picks.append(i)
        taken[i] = True
        proximity = torch.maximum(proximity, torch.exp(-cell_distances(i, grid, z.device) ** 2 / (2 * radius**2)))
    chosen = torch.tensor(picks, device=scores.device)
    in_plain = torch.isin(chosen, plain)
    return chosen, torch.where(in_plain, RELEVANCE, SPACED)


def coverage_cells(scores: torch.Tensor, grid: tuple[int, int], chosen: torch.Tensor, count: int) -> torch.Tensor:
    """
    `count` more indices, each the cell farthest from every pick so far (the relevance peak if there is none); cells
    at -inf (excluded: already read) are never picked.
    """
    N = scores.numel()
    nearest = torch.full((N,), float("inf"), device=scores.device)  # [N] distance to the nearest pick
    nearest = nearest.masked_fill(scores == float("-inf"), float("-inf"))
    for i in chosen.tolist():
        nearest = torch.minimum(nearest, cell_distances(i, grid, scores.device))
    picks = []
    for _ in range(count):
        i = int(scores.argmax()) if not torch.isfinite(nearest).any() and not picks else int(nearest.argmax())
        picks.append(i)
        nearest = torch.minimum(nearest, cell_distances(i, grid, scores.device))
    return torch.tensor(picks, dtype=torch.long, device=scores.device)


def avoid(chosen: torch.Tensor, kinds: torch.Tensor, scores: torch.Tensor,
          excluded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """
    [K] chosen indices and their kinds minus the excluded [N] cells, filled back up to K with the best cells neither
    chosen nor excluded (raster order on ties; kind RELEVANCE). topk and coverage never need it; grid, random and
    logpolar's empty bins may.
    """
    keep = ~excluded[chosen]  # [K]
    kept = chosen[keep]
    taken = excluded.clone()
    taken[kept] = True
    free = torch.nan_to_num(scores, nan=0.0, posinf=0.0, neginf=0.0).masked_fill(taken, float("-inf"))  # [N]
    fill = free.argsort(descending=True, stable=True)[: len(chosen) - len(kept)]
    return torch.cat([kept, fill]), torch.cat([kinds[keep], torch.full_like(fill, RELEVANCE)])


def forced_cells(scores: torch.Tensor, included: torch.Tensor, budget: int) -> torch.Tensor:
    """[N] scores, [N] bool included cells -> the included cells, most relevant first (raster order on ties; a
    non-finite score counts as 0), at most `budget` of them."""
    cells = included.nonzero().squeeze(1)  # [M] raster order
    return ranked(scores, cells, cells)[0][:budget]  # ranked's order: most relevant first, raster on ties


def cell_mask(cells: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """[B, gh, gw] cells (any dtype, any device) -> [B, N] bool on `like`'s device, or None."""
    return None if cells is None else cells.flatten(1).to(like.device, torch.bool)


class TokenAllocator:
    def __init__(self, budget: int = ARRCOCConfig.budget, strategy: str = "topk", seed: int = 0, rho_bins: int = 16,
                 theta_bins: int = 17, void_tolerance: float = 1e-4, spacing_radius: float = 2.0,
                 busy_pages: str = ARRCOCConfig.busy_pages):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        if busy_pages not in BUSY_PAGES:
            raise ValueError(f"busy_pages must be one of {BUSY_PAGES}, got {busy_pages!r}")
        self.budget, self.strategy, self.seed = budget, strategy, seed
        self.rho_bins, self.theta_bins, self.void_tolerance = rho_bins, theta_bins, void_tolerance
        self.spacing_radius, self.busy_pages = spacing_radius, busy_pages

    def fallback_codes(self, flat: torch.Tensor, empty: torch.Tensor | None = None,
                       busy: torch.Tensor | None = None) -> torch.Tensor:
        """[B, N] scores, [B] bool empty and busy images -> [B] each map's index into FALLBACKS (0: it can be
        trusted), with no host sync: a map not finite is "non_finite"; of an empty image, or flat within the void
        tolerance of its largest value (compared in float64), "semantic_void"; of a busy image, "semantic_void" too
        (busy_pages "grid") or "busy" (busy_pages "keep")."""
        finite = torch.isfinite(flat).all(1)  # [B]
        span = (flat.amax(1) - flat.amin(1)).double()  # [B]
        void = span <= self.void_tolerance * flat.abs().amax(1).double().clamp_min(1.0)  # [B]
        marks = [torch.zeros_like(finite) if m is None else torch.as_tensor(m, dtype=torch.bool, device=flat.device)
                 for m in (empty, busy)]  # [B] each
        if self.busy_pages == "grid":
            void = void | marks[1]
        codes = torch.where(void | marks[0], 2, torch.where(marks[1], 3, 0))  # [B]
        return torch.where(finite, codes, 1)  # [B] FALLBACKS' order

    def select(self, scores: torch.Tensor, grid: tuple[int, int], strategy: str, budget: int | None = None,
               explore: float = 0.0, diversify: float = 0.0,
               ink: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """[N] finite scores -> (K unique indices in any order, their kinds); K = budget (default: self.budget);
        ink [N]: what regions_ink fills the budget's rest by (None: relevance, as regions)."""
        N, K = scores.numel(), self.budget if budget is None else budget
        coverage = round(explore * K) if strategy in ("topk", "logpolar") else 0
        focus = K - coverage
        if strategy == "topk":
            chosen, kinds = spaced_topk(scores, grid, focus, diversify, self.spacing_radius)
        else:
            if strategy == "logpolar":
                chosen = logpolar_cells(scores, grid, focus, self.rho_bins, self.theta_bins)
            elif strategy in ("regions", "regions_ink"):
                chosen = region_cells(scores, grid, K, ink if strategy == "regions_ink" else None)
            elif strategy == "grid":
                chosen = grid_cells(N, K, scores.device)
            else:
                chosen = torch.randperm(N, generator=torch.Generator().manual_seed(self.seed))[:K].to(scores.device)
            kinds = torch.full_like(chosen, RELEVANCE)
        if coverage:
            chosen = torch.cat([chosen, coverage_cells(scores, grid, chosen, coverage)])
            kinds = torch.cat([kinds, torch.full((coverage,), COVERAGE, device=kinds.device)])
        return chosen, kinds

    def __call__(self, relevance: torch.Tensor, strategy: str | None = None,
                 empty_images: torch.Tensor | list[bool] | None = None,
                 busy_images: torch.Tensor | list[bool] | None = None, budgets: list[int] | None = None,
                 explore: list[float] | None = None, diversify: list[float] | None = None,
                 exclude: torch.Tensor | None = None, include: torch.Tensor | None = None,
                 ink: torch.Tensor | None = None) -> Allocation:
        """
        relevance [B, gh, gw] -> Allocation of exactly K cells per image (budgets: each image's K; default the
        budget). empty_images marks images with nothing in them, busy_images those without structure: whatever
        the map says there (e.g. attention that only follows position), it is a void (busy_pages "grid"), or only
        said to be busy, its picks kept (busy_pages "keep"). explore and diversify are
        each image's e and λ (default 0: plain topk). exclude [B, gh, gw] bool: cells never to choose (a second
        fixation's already-read cells). include [B, gh, gw] bool: cells always chosen (at most K, most relevant
        first), the strategy choosing the rest among the others (evaluate's oracle row: the asked box's cells).
        ink [B, gh, gw]: each cell's ink (regions_ink fills the budget's rest by it; None: by relevance).
        """
        strategy = strategy or self.strategy
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        B, gh, gw = relevance.shape
        budgets = budgets or [self.budget] * B
        if max(budgets) > gh * gw:  # a budget asked for (or a checkpoint's) that this image cannot give
            raise InputError(f"budget {max(budgets)} exceeds the {gh}x{gw} = {gh * gw} candidate cells of this image: "
                             "ask for fewer saccades (or more max cells)")
        if len(set(budgets)) > 1:
            raise ValueError(f"adaptive budgets {budgets} differ across the batch: select one image at a time")
        excluded, included = cell_mask(exclude, relevance), cell_mask(include, relevance)  # [B, N] each, or None
        inks = None if ink is None else ink.detach().flatten(1).float()  # [B, N]
        if excluded is not None and budgets[0] > gh * gw - int(excluded.sum(1).max()):
            raise InputError(f"budget {budgets[0]} exceeds the {gh * gw - int(excluded.sum(1).max())} candidate "
                             "cells not yet read")
        if excluded is not None and included is not None and bool((excluded & included).any()):
            raise InputError("a cell is both included and excluded: it cannot be forced in and kept out")
        flat = relevance.detach().flatten(1).float()  # [B, N]
        fallbacks = [FALLBACKS[code] for code in self.fallback_codes(flat, empty_images, busy_images).tolist()]
        picks = []
        for b, reason in enumerate(fallbacks):  # B is small (1 in the app); each image may take a different strategy
            chosen, kinds = self.pick(flat[b], (gh, gw), strategy if reason in KEPT else "grid", budgets[b],
                                      explore[b] if explore else 0.0, diversify[b] if diversify else 0.0,
                                      None if excluded is None else excluded[b],
                                      None if included is None else included[b], None if inks is None else inks[b])
            picks.append(ranked(flat[b], chosen, kinds))
        return allocation(picks, gw, fallbacks)

    def pick(self, scores: torch.Tensor, grid: tuple[int, int], strategy: str, budget: int, explore: float,
             diversify: float, excluded: torch.Tensor | None = None,
             included: torch.Tensor | None = None,
             ink: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One image's [N] scores -> (`budget` unique indices in any order, their kinds): the included [N] cells
        (forced_cells), then the strategy's picks on the map with the excluded and included cells at -inf, any it
        still lands on swapped for the best cells left (avoid)."""
        forced = scores.new_zeros(0, dtype=torch.long) if included is None else forced_cells(scores, included, budget)
        taken = excluded
        if len(forced):
            taken = torch.zeros_like(scores, dtype=torch.bool) if excluded is None else excluded.clone()
            taken[forced] = True  # [N]
        masked = scores if taken is None else scores.masked_fill(taken, float("-inf"))  # [N]
        chosen, kinds = self.select(masked, grid, strategy, budget - len(forced), explore, diversify, ink)
        if taken is not None:
            chosen, kinds = avoid(chosen, kinds, scores, taken)
        return torch.cat([forced, chosen]), torch.cat([torch.full_like(forced, FORCED), kinds])

    def topk(self, flat: torch.Tensor, grid: tuple[int, int]) -> Allocation:
        """[B, N] scores on a (gh, gw) grid -> every image's plain topk of the budget, with no host sync (what
        __call__ gives where no fallback, coverage or spacing comes in; the caller checks fallback_codes and the
        tensions)."""
        picks = [ranked(scores, *self.select(scores, grid, "topk")) for scores in flat]
        return allocation(picks, grid[1], [None] * len(flat))


def ranked(scores: torch.Tensor, chosen: torch.Tensor, kinds: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """[N] scores, [K] chosen cells and their kinds -> (indices, scores, kinds), most relevant first (raster order
    on ties; non-finite scores reported as 0)."""
    safe = torch.nan_to_num(scores, nan=0.0, posinf=0.0, neginf=0.0)[chosen]  # [K]
    order = safe.argsort(descending=True, stable=True)
    return chosen[order], safe[order], kinds[order]


def allocation(picks: list[tuple[torch.Tensor, ...]], gw: int, fallbacks: list[str | None]) -> Allocation:
    """Each image's ranked (indices, scores, kinds) -> the batch's Allocation on a grid gw cells wide."""
    indices, scores, kinds = (torch.stack(column) for column in zip(*picks))  # [B, K] each
    positions = torch.stack([indices // gw, indices % gw], dim=-1)  # [B, K, 2]
    return Allocation(indices, positions, scores, fallbacks, kinds)
