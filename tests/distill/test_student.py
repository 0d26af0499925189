"""
The student's side of self-distillation (arr_coc/distill/student.py): the map brought to the candidate grid, the KL
loss and the teacher's mass in the top cells, on hand-worked maps. (Whether distillation raises the teacher's mass
on held-out pages is measured, not pinned: docs/distillation.md.)

    .venv/bin/python -m pytest -q tests/distill/test_student.py
"""

import math

import pytest
import torch

from arr_coc.distill.student import bce_loss, distill_loss, labels, mass_at, on_grid, top_mass


def test_on_grid_keeps_the_mass_where_it_was():
    m = torch.tensor([[0.1, 0.2], [0.3, 0.4]])
    assert torch.equal(on_grid(m, (2, 2)), m)
    torch.testing.assert_close(on_grid(m, (1, 1)), torch.tensor([[1.0]]))
    peak = torch.zeros(4, 4)
    peak[0, 0] = 2.0  # not normalised: on_grid makes it sum 1
    torch.testing.assert_close(on_grid(peak, (2, 2)), torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
    halves = on_grid(torch.tensor([[0.25, 0.75]]), (2, 4))  # grown: each half keeps its share
    torch.testing.assert_close(halves.sum(), torch.tensor(1.0))
    torch.testing.assert_close(halves, torch.tensor([[0.0625, 0.0625, 0.1875, 0.1875]] * 2))
    torch.testing.assert_close(on_grid(torch.zeros(3, 3), (2, 2)), torch.full((2, 2), 0.25))  # no mass: uniform


def test_the_distillation_loss_is_the_kl_to_the_teacher():
    flat, peak = torch.zeros(2, 2), torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    assert float(distill_loss(flat, peak, 0.5)) == pytest.approx(math.log(4))  # uniform p: log(1 / (1/4))
    assert float(distill_loss(flat, torch.full((2, 2), 0.25), 0.5)) == pytest.approx(0.0, abs=1e-7)
    relevance = torch.tensor([[1.0, 0.0], [0.0, 0.0]])  # temperature 0.5: p(0, 0) = e^2 / (e^2 + 3)
    assert float(distill_loss(relevance, peak, 0.5)) == pytest.approx(-math.log(math.e**2 / (math.e**2 + 3)))


def test_the_teachers_mass_in_the_top_cells():
    relevance = torch.tensor([[0.9, 0.1], [0.5, 0.7]])
    target = torch.tensor([[0.4, 0.3], [0.2, 0.1]])
    assert top_mass(relevance, target, 1) == pytest.approx(0.4)
    assert top_mass(relevance, target, 2) == pytest.approx(0.5)  # cells (0, 0) and (1, 1)
    assert top_mass(relevance, target, 9) == pytest.approx(1.0)
    assert mass_at(target, torch.tensor([1, 2])) == pytest.approx(0.5)


def test_sd_rpns_labels_and_balanced_bce():
    target = torch.tensor([[0.5, 0.3], [0.15, 0.05]])  # the first cell holds half the mass; 1/N = 0.25
    positives, negatives = labels(target)
    assert positives.tolist() == [True, False, False, False] and negatives.tolist() == [False, False, True, True]
    assert float(bce_loss(torch.zeros(2, 2), target, 1.0)) == pytest.approx(math.log(2))
    relevance = torch.tensor([[2.0, 0.0], [0.0, 0.0]])  # positive: softplus(-2); negatives: softplus(0) each
    expected = (math.log(1 + math.exp(-2)) + math.log(2)) / 2
    assert float(bce_loss(relevance, target, 1.0)) == pytest.approx(expected)
