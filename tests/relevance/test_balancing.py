"""The balancer: prior weights when fresh, sigmoid range, query-aware once trained."""

import torch

from arr_coc.relevance.balancing import AdaptiveTensionBalancer, standardise


def test_fresh_balancer_returns_the_prior_weights_and_mix():
    torch.manual_seed(0)
    bal = AdaptiveTensionBalancer(hidden_size=64, prior_weights=(0.2, 0.2, 0.6))
    maps = torch.rand(2, 3, 8, 8)
    relevance, weights, residuals = bal(maps, torch.randn(2, 5, 64), None, torch.randn(2, 16, 64))
    torch.testing.assert_close(weights, torch.tensor([[0.2, 0.2, 0.6]] * 2))
    assert torch.equal(residuals, torch.zeros(2, 3))  # every tension at its prior
    expected = 0.2 * standardise(maps[:, 0]) + 0.2 * standardise(maps[:, 1]) + 0.6 * standardise(maps[:, 2])
    torch.testing.assert_close(relevance, expected)


def test_weights_are_independent_sigmoids_and_follow_the_query():
    """Not a softmax: the weights need not sum to 1, and one question can want more of every scorer at once."""
    torch.manual_seed(0)
    bal = AdaptiveTensionBalancer(hidden_size=64)
    torch.nn.init.normal_(bal.head[1].weight, std=1.0)  # as after training
    maps = torch.rand(1, 3, 8, 8)
    weights = torch.cat([bal(maps, torch.randn(1, 5, 64))[1] for _ in range(32)])  # [32, 3], one row per question
    assert ((weights > 0) & (weights < 1)).all()
    sums = weights.sum(1)
    assert (sums - 1).abs().max() > 0.1 and sums.max() - sums.min() > 0.1  # no fixed total
    rises_all = (weights[:, None, :] > weights[None, :, :]).all(-1)  # [i, j]: question i raises all 3 over j
    assert rises_all.any()  # impossible for weights with a fixed sum
    assert not torch.allclose(weights[0], weights[1])  # the question moves them


def test_a_flat_map_stays_flat():
    z = standardise(torch.full((1, 4, 4), 0.3) + 1e-6 * torch.rand(1, 4, 4))
    assert z.abs().max() < 1e-3  # std floor: rounding noise is not stretched into a signal
