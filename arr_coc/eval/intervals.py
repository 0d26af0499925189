"""
How sure a measured accuracy is: the Wilson score interval of a proportion, and the one way this project prints an
accuracy with it; a percentile bootstrap interval of a mean of per-item values (box recall, a share per
item). Pure arithmetic, torch-free, importing nothing of the project: the evaluation (arr_coc.eval) and
the pocket model's training (arr_coc.pocket.train) both report with it.

    from arr_coc.eval.intervals import interval_text, wilson
    low, high = wilson(45, 96)        # (0.37..., 0.57...): a 95% interval
    interval_text(45, 96)             # '0.47 [0.37, 0.57] (n=96)'
    low, high = bootstrap_mean([1.0, 0.5, 0.25, 1.0])   # a 95% interval of their mean, seeded: the same every run
"""

import random


def wilson(correct: int | float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a proportion, correct of n (95% by default): (low, high); (0, 1) for n = 0."""
    if n <= 0:
        return 0.0, 1.0
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    return max(0.0, centre - half), min(1.0, centre + half)


def interval_text(correct: int | float, n: int) -> str:
    """An accuracy as this project reports it: '0.62 [0.52, 0.71] (n=96)'."""
    low, high = wilson(correct, n)
    return f"{correct / max(n, 1):.2f} [{low:.2f}, {high:.2f}] (n={n})"


def bootstrap_mean(values: list[float], resamples: int = 4000, seed: int = 0,
                   level: float = 0.95) -> tuple[float, float]:
    """A percentile bootstrap interval of the mean of `values` (95% by default): `resamples` means of as many values
    drawn with replacement, seeded (the same interval every run), their (1 - level) / 2 and (1 + level) / 2
    quantiles; (0, 1) for no values (a share's whole range, as wilson gives for n = 0)."""
    if not values:
        return 0.0, 1.0
    rng, n = random.Random(seed), len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(resamples))
    tail = (1 - level) / 2
    return means[int(tail * (resamples - 1))], means[int(round((1 - tail) * (resamples - 1)))]
