"""The three scorers: a fresh scorer is exactly its prior; the priors mean what they say."""

import torch

from arr_coc.relevance.knowing import InformationScorer, ParticipatoryScorer, PerspectivalScorer
from arr_coc.relevance.texture import generate_texture_array


def textured_scene():
    """Top half: flat 'sky'; bottom half: fine random texture."""
    torch.manual_seed(0)
    img = torch.full((1, 3, 448, 448), 0.6)
    img[:, :, 224:] = torch.rand(1, 3, 224, 448)
    return generate_texture_array(img, (32, 32))


def test_fresh_scorers_equal_their_priors():
    tex = textured_scene()
    info, persp = InformationScorer(), PerspectivalScorer()
    torch.testing.assert_close(info(tex), info.prior(tex), atol=0, rtol=0)
    torch.testing.assert_close(persp(tex), persp.prior(tex), atol=0, rtol=0)
    partic = ParticipatoryScorer(hidden_size=64)
    prior = torch.rand(1, 32, 32)
    torch.testing.assert_close(partic(tex, torch.randn(1, 5, 64), None, prior), prior, atol=0, rtol=0)
    assert partic(tex, torch.randn(1, 5, 64)).abs().max() == 0  # no prior, no training: no query signal yet


def test_information_is_higher_on_texture_than_sky():
    scores = InformationScorer()(textured_scene())[0]
    assert scores[16:].mean() > 5 * scores[:16].mean()


def test_participatory_depends_on_the_query_once_trained():
    torch.manual_seed(0)
    partic = ParticipatoryScorer(hidden_size=64)
    with torch.no_grad():
        partic.gain.fill_(1.0)  # as after training
    tex = textured_scene()
    a, b = partic(tex, torch.randn(1, 4, 64)), partic(tex, torch.randn(1, 4, 64))
    assert not torch.allclose(a, b)


def test_participatory_ignores_masked_tokens():
    torch.manual_seed(0)
    partic = ParticipatoryScorer(hidden_size=64)
    with torch.no_grad():
        partic.gain.fill_(1.0)
    tex, query = textured_scene(), torch.randn(1, 6, 64)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0]])
    padded = query.clone()
    padded[:, 3:] = 100.0  # garbage in the padding
    torch.testing.assert_close(partic(tex, query[:, :3]), partic(tex, padded, mask))
