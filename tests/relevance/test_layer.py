"""ARRCOCLayer end to end: the output, gradient flow through the straight-through estimator, checkpoints."""

import pickle

import pytest
import torch
from safetensors.torch import save_file

from arr_coc.runtime import graphs
from arr_coc.relevance.config import ARRCOCConfig
from arr_coc.relevance.layer import ARRCOCLayer, CheckpointError, ScoreMaps
from arr_coc.relevance.texture import generate_texture_array
from conftest import D, select_saccades, structured_images

def test_output_holds_everything_the_microscope_shows():
    out = select_saccades(ARRCOCLayer(ARRCOCConfig(hidden_size=D)), participatory_prior=torch.rand(2, 32, 32))
    assert out.indices.shape == (2, 273) and out.positions.shape == (2, 273, 2)
    assert out.textures.shape == (2, 13, 32, 32)
    for m in (out.relevance, out.information, out.perspectival, out.participatory, out.participatory_prior):
        assert m.shape == (2, 32, 32)
    torch.testing.assert_close(out.weights, torch.tensor([[0.2, 0.2, 0.6]] * 2))
    assert out.fallback == [None, None] and out.grid == (32, 32)


def test_a_graph_replay_hands_back_score_maps_of_its_own(monkeypatch):
    """graphed_score's replays return a ScoreMaps whose tensors are clones of the graph's static outputs, never the
    buffers the next replay overwrites. Off CUDA, with a stand-in graph: the first call captures (the forward into
    static buffers), each replay writes the forward of the new inputs into those same buffers."""
    def capture(self, args):
        static_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        static_out = self.fn(*static_args)

        class Graph:
            def replay(self_):
                fresh = self.fn(*static_args)
                for name, value in static_out.named():
                    if value is not None:
                        value.copy_(getattr(fresh, name))
        return Graph(), static_args, static_out

    monkeypatch.setattr(graphs, "runs_eagerly", lambda args: False)
    monkeypatch.setattr(graphs.CUDAGraphed, "_capture", capture)
    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=D))
    torch.manual_seed(0)
    inputs = [(generate_texture_array(structured_images(1) * scale, (32, 32)), torch.randn(1, 5, D), None,
               torch.randn(1, 16, D), torch.rand(1, 32, 32)) for scale in (1.0, 0.5)]
    with torch.no_grad():
        eager = [layer(*x) for x in inputs]
        first, second = (layer.graphed_score(*x) for x in inputs)
    assert isinstance(first, ScoreMaps) and len(layer.graphed_score.graphs) == 1  # one signature, one graph
    for replayed, expected in ((first, eager[0]), (second, eager[1])):  # the first not overwritten by the second
        for name, value in expected.named():
            assert torch.equal(getattr(replayed, name), value), name
    assert not torch.equal(first.relevance, second.relevance)


def test_budget_and_strategy_can_be_overridden_per_call():
    out = select_saccades(ARRCOCLayer(ARRCOCConfig(hidden_size=D)), budget=50, strategy="grid")
    assert out.indices.shape == (2, 50) and out.strategy == "grid"


def scored(layer, images, seed=0):
    torch.manual_seed(seed)
    textures = generate_texture_array(images, (32, 32))  # [n, 13, 32, 32]
    n = images.shape[0]
    with torch.no_grad():
        return layer(textures, torch.randn(n, 5, D), gestalt_embeds=torch.randn(n, 16, D))


def test_the_served_selection_is_the_maps_topk_most_relevant_first_without_the_allocators_loop(monkeypatch):
    """topk at a fixed K, nothing excluded, no fallback, no coverage or spacing: select takes its one-graph path
    (layer.graphed_topk), never the allocator's per-image loop, and picks the K highest cells in descending
    relevance, raster order on ties (the expectation sorted here in Python)."""
    from arr_coc.relevance.attending import TokenAllocator

    monkeypatch.setattr(TokenAllocator, "__call__", lambda *a, **k: pytest.fail("the allocator's loop ran"))
    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=D, saccade_order="relevance"))
    maps = scored(layer, structured_images(2))
    out = layer.select(maps, (32, 32), 40)
    for b in range(2):
        scores = maps.relevance[b].flatten().tolist()
        expected = sorted(range(32 * 32), key=lambda i: (-scores[i], i))[:40]
        assert out.indices[b].tolist() == expected
        assert out.positions[b].tolist() == [[i // 32, i % 32] for i in expected]
        assert out.scores[b].tolist() == [scores[i] for i in expected]
    assert out.fallback == [None, None] and out.kinds.eq(0).all() and out.gates.eq(1).all()


MAP_4X4 = [[0.10, 0.90, 0.20, 0.80],  # a hand-made relevance map: its top 6 are 0.95 (cell 13), 0.90 (1), 0.80 (3),
           [0.30, 0.05, 0.70, 0.00],  # 0.70 (6), 0.60 (8) and 0.50 (11)
           [0.60, 0.15, 0.40, 0.50],
           [0.25, 0.95, 0.35, 0.45]]


def test_a_fresh_layer_feeds_its_saccades_row_by_row():
    """Issue 61: raster order is the default. A fresh layer's 6 saccades of a 4x4 map come row by row; the
    relevance-order ablation gives the same cells most relevant first."""
    from dataclasses import replace

    from arr_coc.relevance.ablation import ABLATIONS

    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=D))
    assert layer.config.saccade_order == "raster"
    image = torch.zeros(1, 3, 112, 112)
    image[:, :, 28:56, 56:84] = 1.0  # one bright cell: a page with structure, not a busy one (no grid fallback)
    with torch.no_grad():
        maps = layer(generate_texture_array(image, (4, 4)), torch.randn(1, 5, D))
    maps = replace(maps, relevance=torch.tensor([MAP_4X4]))  # [1, 4, 4]
    out = layer.select(maps, (4, 4), 6)
    assert out.fallback == [None] and out.saccade_order == "raster"
    assert out.indices.tolist() == [[1, 3, 6, 8, 11, 13]]
    assert out.positions.tolist() == [[[0, 1], [0, 3], [1, 2], [2, 0], [2, 3], [3, 1]]]
    assert torch.equal(out.scores, torch.tensor([[0.90, 0.80, 0.70, 0.60, 0.50, 0.95]]))
    assert ABLATIONS["relevance-order"].feed(out).indices.tolist() == [[13, 1, 3, 6, 8, 11]]


def test_a_busy_page_kept_is_its_maps_topk_and_only_recorded_as_busy():
    """A busy image (uniform noise: no cells stand out) under busy_pages "keep", the default since issue 61: the
    served selection is the map's own top 6 of a hand-made 4x4 map (cells 1, 3, 6, 8, 11, 13 in raster order), its
    fallback "busy"; busy_pages "grid" swaps them for the even grid (cells 1, 4, 6, 9, 12, 14), "semantic_void"."""
    from dataclasses import replace

    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=D))
    assert layer.config.busy_pages == "keep"
    torch.manual_seed(0)
    with torch.no_grad():
        maps = layer(generate_texture_array(torch.rand(1, 3, 112, 112), (4, 4)), torch.randn(1, 5, D))
    maps = replace(maps, relevance=torch.tensor([MAP_4X4]))  # [1, 4, 4]
    assert float(layer.structure(maps.textures)[0]) < layer.config.void_structure  # busy
    kept = layer.select(maps, (4, 4), 6)
    assert kept.fallback == ["busy"] and kept.indices.tolist() == [[1, 3, 6, 8, 11, 13]]
    swapped = layer.select(maps, (4, 4), 6, busy_pages="grid")
    assert swapped.fallback == ["semantic_void"] and swapped.indices.tolist() == [[1, 4, 6, 9, 12, 14]]


def test_a_checkpoint_that_names_no_order_keeps_relevance_order(tmp_path):
    """A config.json without saccade_order was written when relevance order was the default: it loads in the order
    it was trained in; one that names an order keeps it; the shipped folders say which they are."""
    import json

    from arr_coc.checkpoints import ROOT

    ARRCOCLayer(ARRCOCConfig(hidden_size=D)).save_pretrained(tmp_path / "ck")
    path = tmp_path / "ck" / "config.json"
    config = json.loads(path.read_text())
    assert config["saccade_order"] == "raster"  # a new checkpoint records the new default
    path.write_text(json.dumps({k: v for k, v in config.items() if k != "saccade_order"}))
    assert ARRCOCLayer.from_pretrained(tmp_path / "ck").config.saccade_order == "relevance"
    shipped = {name: json.loads((ROOT / name / "config.json").read_text()).get("saccade_order")
               for name in ("pocket-fineprint", "tiny-charts-documents", "tiny-text-vs-distractor")}
    assert shipped == {"pocket-fineprint": "raster", "tiny-charts-documents": "relevance",
                       "tiny-text-vs-distractor": "relevance"}


@pytest.mark.parametrize("case", ["plain", "raster order", "explore rounding to no coverage", "explore", "diversify",
                                  "busy image", "busy image kept"])
def test_the_served_selection_equals_the_allocators_in_every_case(case):
    """select's one-graph path (or, where an image is not plain, its hand-back to the allocator) against the
    allocator itself, made to run by an exclusion of no cells: every per-saccade field, the tensions, the
    structure and the fallback."""
    from arr_coc.relevance.config import TensionSettings
    from arr_coc.relevance.layer import PER_SACCADE

    K = 40
    settings = {"explore rounding to no coverage": TensionSettings(explore=0.45 / K),
                "explore": TensionSettings(explore=0.25), "diversify": TensionSettings(diversify=3.0)}.get(case)
    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=D, saccade_order="raster" if case == "raster order" else "relevance",
                                     busy_pages="keep" if case == "busy image kept" else "grid"))
    torch.manual_seed(5)  # noise whose two images are both busy (structure 2.11, 1.90: noise at 448² is near 2.15)
    images = torch.rand(2, 3, 448, 448) if case.startswith("busy image") else structured_images(2)
    maps = scored(layer, images)
    served = layer.select(maps, (32, 32), K, settings=settings)
    allocated = layer.select(maps, (32, 32), K, settings=settings, exclude=torch.zeros(2, 32, 32, dtype=torch.bool))
    for name in PER_SACCADE + ("explore", "diversify", "particularize", "structure"):
        assert torch.equal(getattr(served, name), getattr(allocated, name)), name
    fallback = {"busy image": ["semantic_void"] * 2, "busy image kept": ["busy"] * 2}.get(case, [None] * 2)
    assert served.fallback == allocated.fallback == fallback
    assert served.saccade_order == allocated.saccade_order and served.budgets == allocated.budgets == [K, K]
    coverage = {"explore": round(0.25 * K), "explore rounding to no coverage": 0}.get(case, 0)
    assert int(served.kinds.eq(2).sum()) == 2 * coverage
    assert bool(served.kinds.eq(1).any()) == (case == "diversify")  # the spacing brought in cells topk would not


def test_straight_through_gradient_reaches_every_parameter():
    """The selected scores and the tensions' gates (under the adaptive budget) reach every parameter, the
    tension head included, though every tension starts at its prior (one image: adaptive budgets differ)."""
    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=D, min_budget=200, max_budget=300))
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    for step in range(2):  # zero-initialised last layers block the layers below them until the first step
        out = select_saccades(layer, seed=step, budget="auto", n=1, participatory_prior=torch.rand(1, 32, 32),
                  gestalt_states=torch.randn(1, 4, 4, D), question_states=torch.randn(1, 6, D))  # the prior pass's
        K = out.indices.shape[1]
        target = torch.randn(1, K, D)
        tokens = torch.randn(1, K, D)  # stand-in for the frozen encoder's saccade tokens
        tokens = tokens * out.token_weights().unsqueeze(-1)
        loss = (tokens - target).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        if step == 0:
            optimizer.step()
    dead = [n for n, p in layer.named_parameters() if p.grad is None or p.grad.abs().max() == 0]
    assert not dead, f"no gradient reaches {dead}"


def test_token_weights_keep_the_tokens_and_pass_them_as_the_scores_gradient():
    """ARRCOCOutput.token_weights, training's straight-through product: forward exactly the gates (1 from the
    layer); backward, d(sum(tokens * w * v))/ds = the row sums of tokens * v, and the gate's own gradient too."""
    out = select_saccades(ARRCOCLayer(ARRCOCConfig(hidden_size=D, budget=4)), n=1)
    s = torch.tensor([[0.3, -1.2, 2.0, 0.7]], requires_grad=True)  # selected scores
    gates = torch.tensor([[1.0, 1.0, 1.0, 1.0]], requires_grad=True)
    out.selected_scores, out.gates = s, gates
    weights = out.token_weights()
    assert weights.tolist() == [[1.0, 1.0, 1.0, 1.0]]  # forward: the tokens unchanged, whatever the scores
    tokens = torch.tensor([[[1.0, 2.0], [0.0, -1.0], [3.0, 3.0], [-2.0, 0.5]]])  # [1, K, 2]
    (tokens * weights.unsqueeze(-1)).sum().backward()
    assert s.grad.tolist() == [[3.0, -1.0, 6.0, -1.5]]  # each token's own sum, written out
    assert gates.grad.tolist() == [[3.0, -1.0, 6.0, -1.5]]


def test_checkpoint_round_trip(tmp_path):
    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=D, budget=100))
    for p in layer.parameters():
        torch.nn.init.normal_(p)
    layer.save_pretrained(tmp_path / "ck")
    assert {f.name for f in (tmp_path / "ck").iterdir()} >= {"config.json", "model.safetensors", "README.md"}
    loaded = ARRCOCLayer.from_pretrained(tmp_path / "ck", expect_hidden_size=D, expect_family="qwen2_vl")
    assert loaded.config == layer.config
    for (n, a), (_, b) in zip(layer.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), n
    torch.testing.assert_close(select_saccades(loaded).relevance, select_saccades(layer).relevance)


def test_wrong_model_is_refused_naming_both(tmp_path):
    ARRCOCLayer(ARRCOCConfig(hidden_size=D)).save_pretrained(tmp_path / "ck")
    with pytest.raises(CheckpointError, match="hidden size 64.*hidden size 1536"):
        ARRCOCLayer.from_pretrained(tmp_path / "ck", expect_hidden_size=1536)
    with pytest.raises(CheckpointError, match="'qwen2_vl'.*'qwen3_vl'"):
        ARRCOCLayer.from_pretrained(tmp_path / "ck", expect_family="qwen3_vl")


def test_wrong_shape_file_names_expected_and_found_shapes(tmp_path):
    ARRCOCLayer(ARRCOCConfig(hidden_size=D)).save_pretrained(tmp_path / "ck")
    state = ARRCOCLayer(ARRCOCConfig(hidden_size=D, info_hidden=8)).state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "ck" / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"information.residual.0.weight: expected \(16, 13, 3, 3\), found \(8, 13, 3, 3\)"):
        ARRCOCLayer.from_pretrained(tmp_path / "ck")


def test_pickle_renamed_to_safetensors_is_never_unpickled(tmp_path):
    ARRCOCLayer(ARRCOCConfig(hidden_size=D)).save_pretrained(tmp_path / "ck")

    class Boom:
        def __reduce__(self):
            return (open, (str(tmp_path / "pwned"), "w"))

    (tmp_path / "ck" / "model.safetensors").write_bytes(pickle.dumps({"w": Boom()}))
    with pytest.raises(CheckpointError, match="pickle"):
        ARRCOCLayer.from_pretrained(tmp_path / "ck")
    torch.save(ARRCOCLayer(ARRCOCConfig(hidden_size=D)).state_dict(), tmp_path / "ck" / "model.safetensors")
    with pytest.raises(CheckpointError, match="pickle"):
        ARRCOCLayer.from_pretrained(tmp_path / "ck")
    assert not (tmp_path / "pwned").exists()


def test_safetensors_whose_header_length_begins_with_0x80_loads(tmp_path):
    """A header length of 0x1480 = 5248 bytes starts the file with byte 0x80, a pickle's first byte: the file is
    still safetensors (8-byte length, then a JSON header starting with '{') and loads; a real pickle still does not."""
    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=D))
    layer.save_pretrained(tmp_path / "ck")
    state = {k: v.contiguous() for k, v in layer.state_dict().items()}
    weights = tmp_path / "ck" / "model.safetensors"
    for pad in range(512):  # the header grows 8 bytes at a time (safetensors aligns it): one of these is 5248
        save_file(state, weights, metadata={"pad": "x" * pad})
        if weights.read_bytes()[:9] == b"\x80\x14\x00\x00\x00\x00\x00\x00{":
            break
    assert weights.read_bytes()[:9] == b"\x80\x14\x00\x00\x00\x00\x00\x00{"
    loaded = ARRCOCLayer.from_pretrained(tmp_path / "ck")
    for name, value in layer.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value)
    weights.write_bytes(pickle.dumps({"w": 1}, protocol=2))  # b"\x80\x02...": a pickle is still refused
    with pytest.raises(CheckpointError, match="is a pickle/torch.save file"):
        ARRCOCLayer.from_pretrained(tmp_path / "ck")


@pytest.mark.parametrize("config_text, message", [
    ("{not json", "not valid JSON"),
    ('{"model_type": "bert"}', "not an ARR-COC config"),
    ('{"base_model_family": "qwen2_vl", "hidden_size": 64, "strategy": "nope"}', "strategy"),
])
def test_foreign_or_corrupt_config_is_refused(tmp_path, config_text, message):
    ARRCOCLayer(ARRCOCConfig(hidden_size=D)).save_pretrained(tmp_path / "ck")
    (tmp_path / "ck" / "config.json").write_text(config_text)
    with pytest.raises(CheckpointError, match=message):
        ARRCOCLayer.from_pretrained(tmp_path / "ck")


def test_corrupt_weights_and_missing_files_are_refused(tmp_path):
    ARRCOCLayer(ARRCOCConfig(hidden_size=D)).save_pretrained(tmp_path / "ck")
    (tmp_path / "ck" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        ARRCOCLayer.from_pretrained(tmp_path / "ck")
    (tmp_path / "ck" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        ARRCOCLayer.from_pretrained(tmp_path / "ck")
    with pytest.raises(CheckpointError, match="not a folder with config.json"):
        ARRCOCLayer.from_pretrained(tmp_path / "nowhere")


@pytest.mark.parametrize("field, value, message", [
    ("balancer_hidden", 15_000_000, "balancer_hidden must be in [1, 1024], got 15000000"),
    ("prior_weights", "x", "prior_weights must be a list of 3 numbers in [0, 1], got 'x'"),
    ("prior_weights", "xyz", "prior_weights must be a list of 3 numbers in [0, 1], got 'xyz'"),
    ("prior_weights", [0.2, 0.2, float("nan")], "prior_weights must be a list of 3 numbers in [0, 1]"),
    ("hidden_size", "64", "hidden_size must be an integer in [1, 16384], got '64'"),
    ("budget", 2.5, "budget must be an integer in [0, 65536], got 2.5"),
    ("min_budget", True, "min_budget must be an integer in [1, 65536], got True"),
    ("void_tolerance", float("inf"), "void_tolerance must be in [0.0, 1.0], got inf"),
    ("texture_channels", 12, "texture_channels must be in [13, 13], got 12"),
    ("strategy", ["topk"], "strategy must be a string, got ['topk']"),
    ("info_hidden", "x" * 1000, "info_hidden must be an integer in [1, 1024], got 'xxxxx"),
])
def test_every_config_field_is_checked_for_type_and_range_naming_it(tmp_path, field, value, message):
    """A checkpoint's config.json (an upload, in the app) gets a CheckpointError naming the field, never a
    ValueError from deep in torch; a long value is cut short in the message."""
    import json

    ARRCOCLayer(ARRCOCConfig(hidden_size=D)).save_pretrained(tmp_path / "ck")
    config = json.loads((tmp_path / "ck" / "config.json").read_text())
    (tmp_path / "ck" / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(CheckpointError, match=r"^ck/config\.json: ") as refused:
        ARRCOCLayer.from_pretrained(tmp_path / "ck")
    assert message in str(refused.value) and len(str(refused.value)) < 200


def test_sizes_are_checked_against_the_safetensors_header_before_anything_is_allocated(tmp_path, monkeypatch):
    """A config within its ranges whose sizes the weights do not have: refused from the safetensors header, with
    the layer it describes built only on the meta device (no memory), never for real."""
    import json

    ARRCOCLayer(ARRCOCConfig(hidden_size=D)).save_pretrained(tmp_path / "ck")
    config = json.loads((tmp_path / "ck" / "config.json").read_text())
    (tmp_path / "ck" / "config.json").write_text(json.dumps({**config, "balancer_hidden": 1024}))
    built, init = [], ARRCOCLayer.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(next(self.parameters()).device.type)

    monkeypatch.setattr(ARRCOCLayer, "__init__", recording)
    with pytest.raises(CheckpointError, match=r"wrong shapes: balancer.*expected \(1024, .*found \(32, "):
        ARRCOCLayer.from_pretrained(tmp_path / "ck")
    assert built == ["meta"]
    (tmp_path / "ck" / "config.json").write_text(json.dumps(config))
    assert ARRCOCLayer.from_pretrained(tmp_path / "ck").config.balancer_hidden == 32 and built[1:] == ["meta", "cpu"]


@pytest.mark.parametrize("order, expected", [("relevance", [677, 5, 103, 644, 645, 676]),
                                             ("raster", [5, 103, 644, 645, 676, 677])])
def test_included_cells_are_selected_and_fed_in_the_layers_saccade_order(order, expected):
    """A relevance map of zeros but for (0, 5) .90, (3, 7) .80, (10, 10) .70 and (21, 5) .95 on a 32 x 32 grid, the
    2 x 2 box over rows 20-21, columns 4-5 (cells 644, 645, 676, 677) forced into 6: the box's four and the two best
    cells outside it (5, 103), fed most relevant first or row by row, as the layer feeds; the served one-graph path
    is not taken (it knows nothing of included cells)."""
    from dataclasses import replace

    from arr_coc.relevance.tensions import FORCED, RELEVANCE

    layer = ARRCOCLayer(ARRCOCConfig(hidden_size=D, saccade_order=order))
    relevance = torch.zeros(1, 32, 32)
    for (row, col), value in {(0, 5): 0.90, (3, 7): 0.80, (10, 10): 0.70, (21, 5): 0.95}.items():
        relevance[0, row, col] = value
    maps = replace(scored(layer, structured_images(1)), relevance=relevance)  # a structured page: no fallback
    box = torch.zeros(1, 32, 32, dtype=torch.bool)
    box[0, 20:22, 4:6] = True
    out = layer.select(maps, (32, 32), 6, include=box)
    assert out.indices[0].tolist() == expected and out.fallback == [None] and out.saccade_order == order
    assert out.positions[0].tolist() == [[i // 32, i % 32] for i in expected]
    assert out.kinds[0].tolist() == [FORCED if i in (644, 645, 676, 677) else RELEVANCE for i in expected]
