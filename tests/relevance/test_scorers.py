"""
A scorer is one entry (issue 62 step 2): config.SCORERS sizes the layer, the balancer, the ablations and the drawing,
and a checkpoint saved with fewer scorers loads with the newer ones at their priors. The shipped checkpoints score
exactly what they scored before the scorers became entries: EXPECTED was computed on main (5b24194) with the three
scorers as three fields, on the fixed inputs below.

    .venv/bin/python -m pytest tests/relevance/test_scorers.py -q
"""

import torch
import torch.nn as nn

from arr_coc import viz
from arr_coc.relevance import ablation, config
from arr_coc.relevance.config import ARRCOCConfig, Scorer
from arr_coc.relevance.layer import ARRCOCLayer

CHECKPOINTS = "checkpoints"
# per shipped checkpoint, on inputs(): weights (3), relevance[0, 2, 3], relevance[0, 5, 6], information[0, 4, 5],
# perspectival[0, 3, 2], participatory[0, 1, 1], tension_residuals (3); computed on main before the change
EXPECTED = {
    "pocket-fineprint": [0.556950, 0.635574, 0.911478, -1.256000, 1.248637, 0.793214, 1.189156, -0.095195, -0.409383,
                         -1.335397, -5.176658],
    "tiny-text-vs-distractor": [0.193456, 0.248018, 0.575239, 0.588695, -0.538559, 0.247552, 0.862477, 0.989740, 0.0,
                                0.0, 0.0],
    "tiny-charts-documents": [0.257163, 0.375054, 0.745428, 0.060446, 0.038839, -0.526184, -0.912370, 3.919216, 0.0,
                              0.0, 0.0],
}


def inputs(D: int, gh: int = 6, gw: int = 7, L: int = 5, Ng: int = 4) -> dict[str, torch.Tensor]:
    """Fixed inputs, made by arithmetic (no random numbers): every argument of the layer's forward."""
    def wave(fn, shape, step):
        return fn(torch.arange(torch.Size(shape).numel(), dtype=torch.float32).view(shape) * step)
    return dict(textures=(wave(torch.sin, (1, 13, gh, gw), 0.37) + 1) / 2,  # [1, 13, gh, gw] in [0, 1]
                query_embeds=wave(torch.cos, (1, L, D), 0.11), gestalt_embeds=wave(torch.sin, (1, Ng, D), 0.07),
                participatory_prior=torch.softmax(wave(torch.sin, (gh * gw,), 0.5), 0).view(1, gh, gw),
                gestalt_states=wave(torch.cos, (1, 2, 2, D), 0.05), question_states=wave(torch.sin, (1, 3, D), 0.03))


def probe(maps) -> list[float]:
    return [*maps.weights[0, :3].tolist(), maps.relevance[0, 2, 3].item(), maps.relevance[0, 5, 6].item(),
            maps.information[0, 4, 5].item(), maps.perspectival[0, 3, 2].item(), maps.participatory[0, 1, 1].item(),
            *maps.tension_residuals[0].tolist()]


def scored(name: str):
    layer = ARRCOCLayer.from_pretrained(f"{CHECKPOINTS}/{name}").eval()
    with torch.no_grad():
        return layer, layer(**inputs(layer.config.hidden_size))


class Brightness(nn.Module):
    """A throwaway fourth way of knowing: the first texture channel, plus a residual that starts at zero."""

    def __init__(self, channels: int):
        super().__init__()
        self.residual = nn.Conv2d(channels, 1, 1)
        nn.init.zeros_(self.residual.weight)
        nn.init.zeros_(self.residual.bias)

    @classmethod
    def from_config(cls, cfg) -> "Brightness":
        return cls(cfg.texture_channels)

    def prior(self, textures: torch.Tensor) -> torch.Tensor:
        return textures[:, 0]  # [B, gh, gw]

    def score(self, textures: torch.Tensor, inputs) -> torch.Tensor:
        return self.prior(textures) + self.residual(textures).squeeze(1)  # [B, gh, gw]


BRIGHTNESS = Scorer("brightness", "the brightness scorer", 0.4, f"{__name__}.Brightness")


def test_the_shipped_checkpoints_score_as_before():
    for name, expected in EXPECTED.items():
        _, maps = scored(name)
        assert maps.scorers.shape == (1, 3, 6, 7)
        torch.testing.assert_close(torch.tensor(probe(maps)), torch.tensor(expected), atol=1e-5, rtol=0,
                                   msg=name)  # 2e-6 apart between two CPUs (their float kernels), not one run


def test_a_fourth_scorer_is_one_entry(monkeypatch):
    monkeypatch.setattr(config, "SCORERS", (*config.SCORERS, BRIGHTNESS))
    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=64)).eval()
    assert list(layer.scorer_modules) == ["information", "perspectival", "participatory", "brightness"]
    assert layer.config.prior_weights == [0.2, 0.2, 0.6, 0.4]
    assert layer.balancer.map_stats.in_features == 12 and layer.balancer.head[1].out_features == 4
    x = inputs(64)
    with torch.no_grad():
        maps = layer(**x)
    assert maps.scorers.shape == (1, 4, 6, 7) and torch.equal(maps.brightness, x["textures"][:, 0])
    torch.testing.assert_close(maps.weights, torch.tensor([[0.2, 0.2, 0.6, 0.4]]))  # a fresh balancer: the priors
    alone = ablation.ablations()["brightness"]
    assert alone.description == "the brightness scorer alone" and alone.weights == (0.0, 0.0, 0.0, 1.0)
    assert ablation.ablations()["fixed-weights"].weights == (0.2, 0.2, 0.6, 0.4)
    mixed = alone.mix(maps)
    flat = maps.brightness.flatten()
    torch.testing.assert_close(mixed.relevance.flatten(), (flat - flat.mean()) / flat.std(unbiased=False))
    titles = [title for title, _ in viz.scorer_panels(maps)]
    assert titles[:4] == ["information (w=0.20)", "perspectival (w=0.20)", "participatory (w=0.60)",
                          "brightness (w=0.40)"]
    assert viz.weights_bar(maps.weights[0], torch.tensor([0.1, 0.2, 0.3, 0.4])).width > 0


def test_a_checkpoint_of_three_loads_with_the_fourth_at_its_prior(monkeypatch):
    monkeypatch.setattr(config, "SCORERS", (*config.SCORERS, BRIGHTNESS))
    for name, expected in EXPECTED.items():
        layer, maps = scored(name)
        assert layer.config.prior_weights[3] == 0.4 and maps.scorers.shape == (1, 4, 6, 7)
        # the three scorers' maps, their weights and the tensions are the checkpoint's; the fourth weighs its prior
        got = probe(maps)
        torch.testing.assert_close(torch.tensor(got[:3] + got[5:]), torch.tensor(expected[:3] + expected[5:]),
                                   atol=1e-5, rtol=0, msg=name)  # as above
        assert abs(maps.weights[0, 3].item() - 0.4) < 1e-6
        textures = inputs(layer.config.hidden_size)["textures"]
        assert torch.equal(maps.brightness, textures[:, 0])


def test_a_layer_of_four_saves_and_loads_as_four(monkeypatch, tmp_path):
    monkeypatch.setattr(config, "SCORERS", (*config.SCORERS, BRIGHTNESS))
    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=64, prior_weights=[0.1, 0.2, 0.3, 0.9]))
    torch.nn.init.normal_(layer.brightness.residual.weight)  # as if trained
    layer.save_pretrained(tmp_path / "four")
    back = ARRCOCLayer.from_pretrained(tmp_path / "four")
    assert back.config.prior_weights == [0.1, 0.2, 0.3, 0.9]
    assert all(torch.equal(a, b) for a, b in zip(layer.state_dict().values(), back.state_dict().values()))
