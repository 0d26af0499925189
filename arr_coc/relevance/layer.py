"""
ARRCOCLayer: texture -> knowing -> balancing -> attending, the whole trainable ARR relevance layer.

A fresh layer is the hand-designed prior (zero residuals), built for any VLM hidden size, so it works
with no file. Checkpoints are data, never code: a folder of config.json + model.safetensors (+ a model
card), written and read with huggingface_hub's PyTorchModelHubMixin and loaded strictly.

    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=1536))
    textures = generate_texture_array(images, (32, 32))   # [B, 13, 32, 32], not learned
    maps = layer(textures, query_embeds)                  # -> ScoreMaps: the differentiable part (maps, relevance)
    maps.relevance, maps.weights                          # [B, 32, 32], [B, S]: S scorers (config.SCORERS)
    maps.scorers, maps.information                        # [B, S, 32, 32], [B, 32, 32]: every map, one by name
    out = layer.select(maps, (32, 32))                    # -> ARRCOCOutput
    out = layer.select(maps, (32, 32), "auto", settings=TensionSettings(explore=0.25))   # adaptive K, e fixed
    layer.save_pretrained("checkpoints/mine")
    layer = ARRCOCLayer.from_pretrained("checkpoints/mine", expect_hidden_size=1536)
    folder = choose_checkpoint(None, "qwen2_vl", 1536)   # none asked for: the first made for the model that passed
                                                         # the default rule (its evidence.json), else None: the prior
"""

import importlib
import json
import os
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch
import torch.nn as nn
from huggingface_hub import PyTorchModelHubMixin
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model

from arr_coc.checkpoints import CONFIG_FILE, PRIOR_NAMES, ROOT, WEIGHTS_FILE, evidence_passes, resolve_checkpoint
from arr_coc.runtime.graphs import CUDAGraphed
from arr_coc.relevance import balancing
from arr_coc.relevance.attending import FALLBACKS, KEPT, Allocation, TokenAllocator
from arr_coc.relevance.balancing import AdaptiveTensionBalancer
from arr_coc.relevance.concentration import image_structure
from arr_coc.relevance.config import (AUTO, LEGACY_SACCADE_ORDER, NO_SETTINGS, ARRCOCConfig, TensionSettings,
                                     scorer_names, scorers)
from arr_coc.relevance.knowing import ScoringInputs
from arr_coc.relevance.tensions import Tensions, budgets, gates, soft_budget, tension_values
from arr_coc.relevance.texture import INK_CHANNEL, is_flat

OPTIONAL_PREFIXES = ("balancer.tension_head.", "participatory.states.")  # newer than some checkpoints: missing
# there, they load at their fresh values (each one's last layer zero: the layer those checkpoints were)
CARD_FILE = "README.md"  # the model card; the one arr_coc.train writes names the model it trained for
CARD_MODEL = re.compile(r"trained for `([^`\n]{1,200})` \(")  # its line: "layer trained for `pocket` (qwen2_vl, ..."


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded; the message says what is wrong and what was expected."""


class NamedMaps:
    """ScoreMaps' and ARRCOCOutput's scorer maps: `scorers` [B, S, gh, gw] in config.SCORERS' order, and each one by
    its name as an attribute (maps.information: [B, gh, gw])."""

    def __getattr__(self, name: str):
        stacked = self.__dict__.get("scorers")  # only reached for names that are no field (copy, pickle: none yet)
        if stacked is not None and name in scorer_names():
            return stacked[:, scorer_names().index(name)]  # [B, gh, gw]
        raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")

    def scorer_maps(self) -> torch.Tensor:
        """[B, S, gh, gw] the scorer maps, in the weights' order, detached, in fp32."""
        return self.scorers.detach().float()


@dataclass
class ScoreMaps(NamedMaps):
    """What the layer's forward scores (everything but the selection): select reads it, the app keeps it on the CPU
    to re-select without the VLM, and an ablation re-mixes it (Ablation.mix). Its fields are ARRCOCOutput's too."""
    textures: torch.Tensor  # [B, 13, gh, gw] the texture array, on the layer's device and dtype
    scorers: torch.Tensor  # [B, S, gh, gw] the scorers' maps, in config.SCORERS' order (maps.information: one)
    participatory_prior: torch.Tensor | None  # [B, gh, gw] the gestalt attention prior the participatory scorer read
    relevance: torch.Tensor  # [B, gh, gw] balanced relevance map
    weights: torch.Tensor  # [B, S] balancer weights, in config.SCORERS' order
    tension_residuals: torch.Tensor  # [B, 3] the balancer's tension_head (explore, diversify, particularize)

    def to(self, device) -> "ScoreMaps":
        """The maps detached, on `device` (the app keeps them on the CPU between requests)."""
        return replace(self, **{name: None if value is None else value.detach().to(device)
                                for name, value in self.named()})

    def named(self) -> list[tuple[str, torch.Tensor | None]]:
        """(field name, value) of every map, in field order: what ARRCOCOutput takes of them."""
        return [(f.name, getattr(self, f.name)) for f in fields(self)]


@dataclass
class ARRCOCOutput(NamedMaps):
    indices: torch.Tensor  # [B, K] selected cells (row * gw + col), in the order fed to the LLM (in_order)
    positions: torch.Tensor  # [B, K, 2] (row, col) of each saccade on the candidate grid
    scores: torch.Tensor  # [B, K] relevance of each saccade (detached)
    selected_scores: torch.Tensor  # [B, K] the same scores with gradient, for the straight-through estimator
    relevance: torch.Tensor  # [B, gh, gw] balanced relevance map
    textures: torch.Tensor  # [B, 13, gh, gw] texture array
    scorers: torch.Tensor  # [B, S, gh, gw] the scorers' maps, in config.SCORERS' order (out.information: one)
    participatory_prior: torch.Tensor | None  # [B, gh, gw] gestalt attention prior, if given
    weights: torch.Tensor  # [B, S] balancer weights, in config.SCORERS' order
    tension_residuals: torch.Tensor  # [B, 3] the balancer's tension_head (explore, diversify, particularize)
    explore: torch.Tensor  # [B] e in [0, 0.5]: the share of the budget spent on coverage (with grad)
    diversify: torch.Tensor  # [B] lambda >= 0: topk's spacing penalty (with grad)
    particularize: torch.Tensor  # [B] f in [0, 1]: where the adaptive K falls between its bounds (with grad)
    budgets: list[int]  # per image: K, the saccades selected
    auto_budget: bool  # whether K was the adaptive budget (--budget auto) rather than a fixed one
    structure: torch.Tensor  # [B] the image's content structure (below config.void_structure: a busy image)
    kinds: torch.Tensor  # [B, K] what picked each saccade (tensions.RELEVANCE, SPACED, COVERAGE)
    gates: torch.Tensor  # [B, K] straight-through gates to the tensions: exactly 1 forward (tensions.gates)
    fallback: list[str | None]  # per image: one of attending.FALLBACKS (None: the map was trusted; "busy": kept)
    strategy: str  # strategy that was asked for
    grid: tuple[int, int]  # (gh, gw) candidate grid
    saccade_order: str = "raster"  # the order of the per-saccade fields: "raster" or "relevance" (in_order)

    def token_weights(self) -> torch.Tensor:
        """[B, K] what training multiplies the saccades' tokens by: (1 + (s - s.detach())) * gates, the straight-through
        estimator. Forward exactly 1 (the frozen tokens unchanged); backward, d/ds of a token is the token itself,
        and the gates carry the tensions' gradients."""
        s = self.selected_scores  # [B, K] with gradient
        return (1 + (s - s.detach())) * self.gates.to(s.dtype)  # s - s.detach() is exactly 0: the forward is 1

    def in_order(self, order: str) -> "ARRCOCOutput":
        """The same saccades in the order fed to the LLM: "relevance" (most relevant first, raster order on ties,
        as the allocator returns them) or "raster" (row by row). Either is exact from the other."""
        return replace(self, saccade_order=order,
                       **saccades_in_order({name: getattr(self, name) for name in PER_SACCADE}, order))

    def shares(self) -> torch.Tensor:
        """[B, S] each scorer map's share of the selected saccades' relevance (balancing.shares): what tells the
        scorers apart when the balancer's weights are equal."""
        return balancing.shares(self.scorer_maps(), self.weights.detach().float(), self.indices)

    def agreement(self) -> torch.Tensor:
        """[B] the scorer maps' mean pairwise correlation (balancing.agreement): near 1, they are one map."""
        return balancing.agreement(self.scorer_maps())


PER_SACCADE = ("indices", "positions", "scores", "selected_scores", "kinds", "gates")  # ARRCOCOutput's [B, K, ...]


def saccades_in_order(saccades: dict[str, torch.Tensor], order: str) -> dict[str, torch.Tensor]:
    """PER_SACCADE's tensors (by name) in `order`: "raster" (row by row) or "relevance" (descending scores, raster
    order on ties)."""
    by_cell = saccades["indices"].argsort(dim=1)  # [B, K]: raster indices are row * gw + col
    by_order = by_cell if order == "raster" else by_cell.gather(  # then stable by descending relevance
        1, reorder(saccades["scores"], by_cell).argsort(dim=1, descending=True, stable=True))
    return {name: reorder(values, by_order) for name, values in saccades.items()}


def reorder(values: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """[B, K, ...] values taken in `order` [B, K] along K (gather keeps the gradient of selected_scores)."""
    return values.gather(1, order.view(*order.shape, *[1] * (values.dim() - 2)).expand_as(values))


class ARRCOCLayer(nn.Module, PyTorchModelHubMixin, library_name="arr-coc", tags=["arr-coc", "qwen2-vl"]):
    def __init__(self, config: ARRCOCConfig | None = None):
        super().__init__()
        self.config = config = config or ARRCOCConfig()
        for scorer in scorers():  # each a submodule named by its entry: its checkpoint keys' prefix
            self.add_module(scorer.name, scorer_class(scorer.module).from_config(config))
        self.balancer = AdaptiveTensionBalancer(config.hidden_size, config.balancer_hidden, config.prior_weights)
        self.graphed_score = CUDAGraphed(self.forward)  # inference on CUDA: one graph replay per input shape
        self.graphed_topk = CUDAGraphed(self._topk)  # select's served case (topk, a fixed K): one replay, one sync

    @property
    def scorer_modules(self) -> dict[str, nn.Module]:
        """The scorers keyed by name, in config.SCORERS' order."""
        return {name: getattr(self, name) for name in scorer_names()}

    def _apply(self, *args, **kwargs):
        """Moving or casting the layer makes new tensors: graphs captured on the old ones must go."""
        out = super()._apply(*args, **kwargs)
        self.graphed_score, self.graphed_topk = CUDAGraphed(self.forward), CUDAGraphed(self._topk)
        return out

    def allocator(self, budget: int | None = None, strategy: str | None = None,
                  busy_pages: str | None = None) -> TokenAllocator:
        c = self.config
        return TokenAllocator(c.budget if budget is None else budget, strategy or c.strategy, c.seed,
                              c.logpolar_rho, c.logpolar_theta, c.void_tolerance, c.spacing_radius,
                              busy_pages or c.busy_pages)

    def forward(
        self,
        textures: torch.Tensor,  # [B, 13, gh, gw] from generate_texture_array
        query_embeds: torch.Tensor,  # [B, L, D] question token embeddings
        query_mask: torch.Tensor | None = None,  # [B, L]
        gestalt_embeds: torch.Tensor | None = None,  # [B, Ng, D]
        participatory_prior: torch.Tensor | None = None,  # [B, gh, gw]
        gestalt_states: torch.Tensor | None = None,  # [B, ggh, ggw, D] the prior pass's gestalt states
        question_states: torch.Tensor | None = None,  # [B, Lq, D] the prior pass's question rows' states
    ) -> ScoreMaps:
        """
        Everything but the selection: the scorers' maps, the weights and the relevance map. It is the module's
        forward because it is the differentiable part that uses every parameter: what DDP wraps in training.
        """
        param = next(self.parameters())
        textures = textures.to(param.device, param.dtype)
        inputs = ScoringInputs(query_embeds, query_mask, participatory_prior, gestalt_states, question_states)
        maps = torch.stack([scorer.score(textures, inputs) for scorer in self.scorer_modules.values()],
                           dim=1)  # [B, S, gh, gw]
        relevance, weights, tension_residuals = self.balancer(maps, query_embeds, query_mask, gestalt_embeds)
        return ScoreMaps(textures=textures, scorers=maps, participatory_prior=participatory_prior,
                         relevance=relevance, weights=weights, tension_residuals=tension_residuals)

    def budget_bounds(self, grid: tuple[int, int], settings: TensionSettings = NO_SETTINGS) -> tuple[int, int]:
        """The adaptive budget's (min, max) on a (gh, gw) grid: the settings', else the config's, within its cells."""
        c, cells = self.config, grid[0] * grid[1]
        hi = min(settings.max_budget or c.max_budget, cells)
        return min(settings.min_budget or c.min_budget, hi), hi

    def select(self, maps: ScoreMaps, grid: tuple[int, int], budget: int | str | None = None,
               strategy: str | None = None, settings: TensionSettings | None = None,
               exclude: torch.Tensor | None = None, include: torch.Tensor | None = None,
               busy_pages: str | None = None) -> ARRCOCOutput:
        """
        Run the allocator over scored maps; cheap, so the app re-selects without re-scoring. budget: a fixed K,
        "auto" (tensions.AUTO: K from the map's concentration) or None (the config's); settings fix tensions by hand;
        exclude [B, gh, gw] bool: cells never to select (those a first fixation read); include [B, gh, gw] bool:
        cells always selected, the most relevant K of them where they are more (evaluate's oracle: the asked box);
        busy_pages: what a busy image's selection becomes, "grid" or "keep" (None: the config's; an ablation's).
        """
        c, settings, grid = self.config, settings or NO_SETTINGS, tuple(grid)
        strategy, auto, busy_pages = strategy or c.strategy, budget == AUTO, busy_pages or c.busy_pages
        K = c.budget if budget is None or auto else budget
        tensions = structure = None
        served = exclude is None and include is None  # nothing excluded or forced in
        if strategy == "topk" and not auto and served and K <= grid[0] * grid[1]:  # as served: one graph
            saccades, tensions, structure, codes, plain = self.graphed_topk(  # replay and one host sync
                maps.relevance, maps.textures, maps.tension_residuals, grid, K, settings, busy_pages)
            if bool(plain.all()):  # no fallback but "busy", coverage or spacing: what the allocator below would pick
                fallback = [FALLBACKS[code] for code in codes.tolist()]
                return self._output(maps, grid, saccades, tensions, structure, False, fallback, strategy)
        if tensions is None:  # not read off the graph above (the allocator takes its tensions and structure too)
            tensions = tension_values(maps.tension_residuals, maps.relevance, c.budget_temperature, settings)
            structure = self.structure(maps.textures)  # [B]
        bounds = self.budget_bounds(grid, settings)
        allocator = self.allocator(None if auto else budget, strategy, busy_pages)
        allocation = allocator(maps.relevance, empty_images=is_flat(maps.textures),
                               busy_images=structure < c.void_structure,
                               budgets=budgets(tensions.particularize, bounds) if auto else None,
                               explore=tensions.explore.tolist(), diversify=tensions.diversify.tolist(),
                               exclude=exclude, include=include, ink=maps.textures[:, INK_CHANNEL])
        soft_k = soft_budget(tensions.particularize, bounds) if auto else None  # [B]
        saccades = self._saccades(maps.relevance, allocation, tensions, soft_k)
        return self._output(maps, grid, saccades, tensions, structure, auto, allocation.fallback, allocator.strategy)

    def structure(self, textures: torch.Tensor) -> torch.Tensor:
        """[B, 13, gh, gw] -> [B] the image's content structure from the scorers' priors, not their trained maps:
        every checkpoint agrees on busyness (below config.void_structure: a busy image; config.busy_pages says what its
        selection becomes)."""
        return image_structure(self.information.prior(textures), self.perspectival.prior(textures),
                               self.config.void_top_fraction)

    def _topk(self, relevance: torch.Tensor, textures: torch.Tensor, tension_residuals: torch.Tensor,
              grid: tuple[int, int], budget: int, settings: TensionSettings, busy_pages: str):
        """select's served case (topk, a fixed budget, nothing excluded) with no host sync, so that it replays as one
        CUDA graph -> (the saccades in order, the tensions, the structure, [B] fallback codes, [B] bool plain): where
        an image is not plain (its map falls back to a grid, or its tensions bring coverage or spacing), select runs
        the allocator instead; a busy image whose picks are kept ("busy") is plain."""
        c = self.config
        tensions = tension_values(tension_residuals, relevance, c.budget_temperature, settings)
        structure = self.structure(textures)  # [B]
        allocator = self.allocator(budget, "topk", busy_pages)
        flat = relevance.detach().flatten(1).float()  # [B, N]
        codes = allocator.fallback_codes(flat, is_flat(textures), structure < c.void_structure)  # [B]
        kept = torch.zeros_like(codes, dtype=torch.bool)
        for reason in KEPT:
            kept = kept | (codes == FALLBACKS.index(reason))
        coverage = (tensions.explore.double() * budget).round()  # [B] the allocator's round(e * K)
        plain = kept & (coverage == 0) & (tensions.diversify == 0)  # [B]
        saccades = self._saccades(relevance, allocator.topk(flat, grid), tensions, None)
        return saccades, tensions, structure, codes, plain

    def _saccades(self, relevance: torch.Tensor, allocation: Allocation, tensions: Tensions,
                  soft_k: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """An allocation's PER_SACCADE tensors, in the config's saccade order; selected_scores keep the gradient."""
        a = allocation
        return saccades_in_order(dict(
            indices=a.indices, positions=a.positions, scores=a.scores,
            selected_scores=relevance.flatten(1).gather(1, a.indices),  # [B, K] with grad
            kinds=a.kinds, gates=gates(tensions, a.kinds, a.positions, soft_k, self.config.spacing_radius),
        ), self.config.saccade_order)

    def _output(self, maps: ScoreMaps, grid: tuple[int, int], saccades: dict[str, torch.Tensor], tensions: Tensions,
                structure: torch.Tensor, auto: bool, fallback: list[str | None], strategy: str) -> ARRCOCOutput:
        """The selection beside the maps it was made from."""
        B, K = saccades["indices"].shape
        return ARRCOCOutput(**saccades, **dict(maps.named()), explore=tensions.explore, diversify=tensions.diversify,
                            particularize=tensions.particularize, budgets=[K] * B, auto_budget=auto,
                            structure=structure, fallback=fallback, strategy=strategy, grid=grid,
                            saccade_order=self.config.saccade_order)

    # --- checkpoints: safetensors + JSON only ---

    @classmethod
    def from_pretrained(cls, checkpoint: str | os.PathLike, *, expect_family: str | None = None,
                        expect_hidden_size: int | None = None, expect_model: str | None = None,
                        map_location: str = "cpu") -> "ARRCOCLayer":
        """
        Load a checkpoint folder (or a hub repo holding one) strictly, never unpickling anything.
        expect_* name the loaded VLM: a checkpoint made for another model raises CheckpointError naming both (the
        checkpoint's model as its model card names it, card_model; expect_model, the loaded model's name).
        Nothing is allocated before config.json has passed ARRCOCConfig's type and range checks and the
        safetensors header's names and shapes match the layer it describes: an upload cannot size the layer.
        """
        folder = Path(checkpoint)
        if not folder.is_dir():
            folder = _download(str(checkpoint))
        config = read_checkpoint_config(folder)
        if ((expect_family is not None and config.base_model_family != expect_family)
                or (expect_hidden_size is not None and config.hidden_size != expect_hidden_size)):
            made_for = model_text(card_model(folder) or "an unnamed model", config.base_model_family,
                                  config.hidden_size)
            loaded = model_text(expect_model or "another", expect_family, expect_hidden_size)
            raise CheckpointError(f"checkpoint {folder.name} was made for {made_for}, but the loaded model is {loaded}")
        saved = saved_scorers(folder / WEIGHTS_FILE)  # how many of SCORERS the file holds (the first ones)
        with torch.device("meta"):  # the layer's names and shapes, no memory: the file's header must match them
            check_weights(folder / WEIGHTS_FILE, as_saved(cls(config).state_dict(), saved))
        layer = cls(config)  # only now allocated: its sizes are those of the file
        if saved == len(scorers()):
            # strict but for the newer heads an older checkpoint lacks (check_weights allows only those): they stay zero
            load_model(layer, str(folder / WEIGHTS_FILE), strict=False, device=map_location)
        else:  # fewer scorers: the newer ones and their balancer rows stay at their priors (balancing.grown)
            layer.load_state_dict(with_newer_scorers(folder / WEIGHTS_FILE, layer.state_dict(), saved), strict=False)
            layer.to(map_location)
        return layer


def scorer_class(path: str) -> type[nn.Module]:
    """A Scorer entry's module, "package.module.Class" -> the class."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def saved_scorers(path: Path) -> int:
    """How many of config.SCORERS a checkpoint's weights hold, from their names: a file saved before the newer
    entries holds the first ones (an unreadable file: all of them, and check_weights says what is wrong)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            names = list(f.keys())
    except (SafetensorError, OSError, ValueError):
        return len(scorers())
    held = [any(n.startswith(s + ".") for n in names) for s in scorer_names()]
    count = held.index(False) if False in held else len(held)
    return count if count > 0 and not any(held[count:]) else len(held)


def as_saved(state: dict[str, torch.Tensor], saved: int) -> dict[str, torch.Tensor]:
    """A layer's state dict as a checkpoint of its first `saved` scorers holds it: the newer scorers' tensors left
    out, the balancer's SIZED tensors at the smaller size (meta tensors: names and shapes only)."""
    total = len(scorers())
    if saved == total:
        return state
    newer = tuple(s + "." for s in scorer_names()[saved:])
    out = {}
    for name, tensor in state.items():
        part = name.removeprefix("balancer.")
        shape = balancing.saved_part(part, tuple(tensor.shape), saved, total) if part in balancing.SIZED else None
        if not name.startswith(newer):
            out[name] = tensor if shape is None else torch.empty(shape, device="meta")
    return out


def with_newer_scorers(path: Path, fresh: dict[str, torch.Tensor], saved: int) -> dict[str, torch.Tensor]:
    """The state dict of a checkpoint of the first `saved` scorers, grown to every scorer's: the newer scorers at
    their fresh (prior) values, the balancer's SIZED tensors grown (balancing.grown)."""
    state = dict(fresh)
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            part = name.removeprefix("balancer.")
            value = f.get_tensor(name)
            state[name] = balancing.grown(part, value, fresh[name], saved) if part in balancing.SIZED else value
    return state


def _download(repo_id: str) -> Path:
    """A hub repo id -> local folder with only the two data files (no code, no pickles)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=[CONFIG_FILE, WEIGHTS_FILE]))
    except Exception as e:
        raise CheckpointError(f"checkpoint {repo_id!r} is not a folder with {CONFIG_FILE} and {WEIGHTS_FILE}, "
                              f"and could not be fetched from the hub ({type(e).__name__})") from None


def model_text(name: str, family: str | None, hidden_size: int | None) -> str:
    """A model as a mismatch message names it, with what is known of it: "pocket ('qwen2_vl', hidden size 256)"."""
    known = [repr(family)] * (family is not None) + [f"hidden size {hidden_size}"] * (hidden_size is not None)
    return f"{name} ({', '.join(known)})"


def card_model(folder: Path) -> str | None:
    """The model a checkpoint was trained for, as its model card names it (arr_coc.train writes the line); None
    without a card or the line (an upload, a card written by hand)."""
    try:
        match = CARD_MODEL.search((folder / CARD_FILE).read_text(encoding="utf-8", errors="replace")[:100_000])
    except OSError:
        return None
    return match.group(1) if match else None


def read_checkpoint_config(folder: Path) -> ARRCOCConfig:
    """config.json -> ARRCOCConfig, with a clear error for a missing, malformed or foreign file."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{folder.name}: no {CONFIG_FILE}; a checkpoint is {CONFIG_FILE} + {WEIGHTS_FILE}")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:  # e.g. 100,000 nested [
        raise CheckpointError(f"{folder.name}/{CONFIG_FILE} is not a usable config: its JSON nests too deep") from None
    except ValueError as e:  # not JSON, not UTF-8, or a number past Python's 4300 digits
        raise CheckpointError(f"{folder.name}/{CONFIG_FILE} is not valid JSON: {str(e).split('; use ')[0]}") from None
    raw = raw.get("config", raw) if isinstance(raw, dict) else raw  # the mixin may nest the dataclass
    known = {f.name for f in fields(ARRCOCConfig)}
    if not isinstance(raw, dict) or not {"base_model_family", "hidden_size"} <= raw.keys():
        raise CheckpointError(f"{folder.name}/{CONFIG_FILE} is not an ARR-COC config "
                              f"(expected keys base_model_family, hidden_size, ...)")
    raw = with_newer_priors(raw)
    order = {} if "saccade_order" in raw else {"saccade_order": LEGACY_SACCADE_ORDER}  # trained before raster was
    try:  # the default: it keeps the order it was trained in
        return ARRCOCConfig(**{**order, **{k: v for k, v in raw.items() if k in known}})
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{folder.name}/{CONFIG_FILE}: {e}") from None


def with_newer_priors(raw: dict) -> dict:
    """A config.json saved with fewer scorers than config.SCORERS: its prior_weights completed with the newer
    scorers' priors (anything else is left for ARRCOCConfig's checks)."""
    weights = raw.get("prior_weights")
    if isinstance(weights, list) and 0 < len(weights) < len(scorers()):
        return {**raw, "prior_weights": weights + [s.prior_weight for s in scorers()[len(weights):]]}
    return raw


def check_weights(path: Path, expected: dict[str, torch.Tensor]) -> None:
    """Compare a safetensors file's names and shapes with the layer's, without loading or unpickling anything."""
    if not path.is_file():
        raise CheckpointError(f"{path.parent.name}: no {WEIGHTS_FILE}")
    with open(path, "rb") as f:
        head = f.read(9)  # a safetensors file: its header's length (8 bytes, little-endian), then the JSON header
    header_length = int.from_bytes(head[:8], "little")
    safetensors = len(head) == 9 and head[8:] == b"{" and header_length <= path.stat().st_size - 8
    if not safetensors and (head[:2] == b"PK" or head[:1] == b"\x80"):  # a zip (torch.save) or a pickle (protocol 2+)
        raise CheckpointError(f"{path.parent.name}/{WEIGHTS_FILE} is a pickle/torch.save file, not safetensors; "
                              "pickles can run code and are never loaded")
    try:
        with safe_open(str(path), framework="pt") as f:
            found = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path.parent.name}/{WEIGHTS_FILE} is not a readable safetensors file ({e})") from None
    want = {name: tuple(t.shape) for name, t in expected.items()}
    missing = sorted(n for n in want.keys() - found.keys() if not n.startswith(OPTIONAL_PREFIXES))
    unexpected = sorted(found.keys() - want.keys())
    wrong = [f"{n}: expected {want[n]}, found {found[n]}" for n in sorted(want.keys() & found.keys()) if want[n] != found[n]]
    if missing or unexpected or wrong:
        parts = []
        if wrong:
            parts.append("wrong shapes: " + "; ".join(wrong[:5]) + (" ..." if len(wrong) > 5 else ""))
        if missing:
            parts.append(f"missing {len(missing)} tensors (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected tensors (e.g. {unexpected[0]})")
        raise CheckpointError(f"{path.parent.name}/{WEIGHTS_FILE} does not fit an ARR-COC layer: " + ", ".join(parts))


def list_checkpoints(root: str | os.PathLike = "checkpoints") -> list[str]:
    """Names of the checkpoint folders under root (those with a config.json)."""
    root = Path(root)
    return sorted(p.name for p in root.iterdir() if (p / CONFIG_FILE).is_file()) if root.is_dir() else []


def default_checkpoint(model_family: str, hidden_size: int, root: Path = ROOT) -> str | None:
    """The first checkpoint under root whose config.json was made for this model and whose evidence.json says it
    beats the untrained prior (arr_coc.checkpoints.evidence_passes; issue 61) (its folder), else None: the prior."""
    for name in list_checkpoints(root):
        try:
            config = read_checkpoint_config(Path(root) / name)
        except CheckpointError:
            continue  # unreadable: not a candidate for the default
        if (config.base_model_family == model_family and config.hidden_size == hidden_size
                and evidence_passes(Path(root) / name)):
            return str(Path(root) / name)
    return None


def choose_checkpoint(requested: str | None, model_family: str, hidden_size: int, root: Path = ROOT) -> str | None:
    """The checkpoint to load (folder or hub id), or None for the untrained prior: the one rule of the app and every
    command. Asked for by name, it is resolved (arr_coc.checkpoints.resolve_checkpoint); else the default: a
    checkpoint made for the model whose evidence shows it beats the prior, else the prior."""
    if requested in PRIOR_NAMES:
        return None
    if requested:
        return resolve_checkpoint(requested, root)
    return default_checkpoint(model_family, hidden_size, root)
