"""
Qwen2.5-VL behind the adapter, on the offline tiny-qwen2.5-vl: what only this family does, the window attention
for sparse cells, and hub-shaped folders (the equivalences every family has: tests/vlm/test_families.py).
"""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from conftest import answers_by_engine, tiny_arr_model

from arr_coc.vlm import qwen2_5_vl
from arr_coc.vlm.families import load_vlm
from arr_coc.vlm.positions import raster_block
from arr_coc.vlm.views import make_views

TINY = "tiny-qwen2.5-vl"
QUESTION = "What is written on the sign?"


def photo(w=400, h=300, seed=0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def model():
    return tiny_arr_model(TINY)  # shared with the family tests


def stock_windows(cells: list[tuple[int, int]], w: int = 4):
    """
    The test's own window grouping, written independently of the adapter: the full grid's windows (r // w, c // w)
    restricted to `cells`, in the stock order -> window_index [K] (into cells) and cu_window_seqlens (in patches).
    """
    by_window = {}
    for i, (r, c) in sorted(enumerate(cells), key=lambda t: (t[1][0] // w, t[1][1] // w, t[1][0], t[1][1])):
        by_window.setdefault((r // w, c // w), []).append(i)
    window_index = [i for members in by_window.values() for i in members]
    cu = np.cumsum([0] + [4 * len(members) for members in by_window.values()])
    return torch.tensor(window_index), torch.tensor(cu, dtype=torch.int32)


def stock_tower_on_cells(vlm, pixels, grid, cells, window_index, cu_window_seqlens):
    """The stock tower over a subset of cells, fed their true positions and the given windows -> [K, D]."""
    rows = torch.tensor([[(r * grid[1] + c) * 4 + j for j in range(4)] for r, c in cells]).flatten()
    positions = torch.tensor([[2 * r + i, 2 * c + j] for r, c in cells for i in (0, 1) for j in (0, 1)])
    n = len(rows)
    return vlm.visual(pixels[rows], grid_thw=torch.tensor([[1, 2, n // 2]]), position_ids=positions,
                      cu_seqlens=torch.tensor([0, n], dtype=torch.int32), window_index=window_index,
                      cu_window_seqlens=cu_window_seqlens).pooler_output


# ----------------------------------------------------------------------------- loading


def test_the_tiny_has_the_families_windows(model):
    """(its class, cell and chat template, as every family's: tests/vlm/test_families.py)"""
    vlm = model.vlm
    assert vlm.vision.window_cells == 4 and list(vlm.visual.fullatt_block_indexes) == [1, 3]


def test_a_hub_shaped_folder_loads_with_its_own_files(tmp_path):
    """A folder laid out as Qwen/Qwen2.5-VL-3B-Instruct ships it (flat config with the legacy rope_scaling), at toy sizes."""
    import transformers

    from arr_coc.vlm.chat import CHAT_TEMPLATE
    from arr_coc.vlm.tiny import tiny_qwen2_5_vl_config, tokenizer_folder

    torch.manual_seed(0)
    transformers.Qwen2_5_VLForConditionalGeneration(tiny_qwen2_5_vl_config()).save_pretrained(tmp_path)
    config = {  # the hub's config.json format: text fields at the top level, vision_config nested
        "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "vision_start_token_id": 151652,
        "vision_end_token_id": 151653, "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656,
        "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128,
        "max_position_embeddings": 128000, "max_window_layers": 70, "num_attention_heads": 4, "num_hidden_layers": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
        "tie_word_embeddings": True, "torch_dtype": "float32", "transformers_version": "4.41.2", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936,
        "vision_config": {"depth": 4, "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 48, "num_heads": 2,
                          "in_chans": 3, "out_hidden_size": 64, "patch_size": 14, "spatial_merge_size": 2,
                          "spatial_patch_size": 14, "window_size": 112, "fullatt_block_indexes": [1, 3],
                          "tokens_per_second": 2, "temporal_patch_size": 2},
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({
        "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor"}))
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_folder())
    own = CHAT_TEMPLATE.replace("You are a helpful assistant.", "You are a folder's own assistant.")
    tokenizer.chat_template = own  # the hub ships the template in tokenizer_config.json (and chat_template.json)
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": own}))
    vlm = load_vlm(str(tmp_path), device="cpu")
    assert type(vlm) is qwen2_5_vl.Qwen25VL and vlm.chat_template == own
    text = vlm.tokenizer.decode(vlm.chat.prompt_ids("Why?", [3])[0])
    assert text.startswith("<|im_start|>system\nYou are a folder's own assistant.<|im_end|>")
    assert vlm.model.config.text_config.rope_parameters["mrope_section"] == [2, 3, 3]
    assert vlm.image_processor.patch_size == 14 and vlm.image_processor.merge_size == 2
    # a folder whose template sits only in chat_template.json (as processor repos ship it) still gets its own
    tokenizer.chat_template = None
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    assert load_vlm(str(tmp_path), device="cpu").chat_template == own


def test_the_full_size_architecture_is_the_3b():
    from arr_coc.vlm.tiny import FULL_SIZE

    name, config = FULL_SIZE["qwen2_5_vl"]
    c = config()  # the 3B architecture, as on the hub
    assert (c.text_config.hidden_size, c.text_config.num_hidden_layers, c.vision_config.out_hidden_size) == (2048, 36, 2048)
    assert list(c.vision_config.fullatt_block_indexes) == [7, 15, 23, 31] and c.vision_config.window_size == 112


# ----------------------------------------------------------------------------- exact equivalences


@pytest.mark.parametrize("attention", ["mask", "loop"])
def test_sparse_encoder_on_every_cell_equals_the_stock_tower(model, monkeypatch, attention):
    """A native non-square grid whose sides are not multiples of 4 cells: the edge windows are partial."""
    vlm = model.vlm
    views = make_views(photo(1200, 700))
    assert views.candidate_grid == views.native_grid == (25, 43)
    monkeypatch.setattr(qwen2_5_vl, "MASKED_PATCHES", 10**9 if attention == "mask" else 0)
    pixels, grid = vlm.vision.image_inputs(views.tensor("highres"))
    with torch.no_grad():
        stock = vlm.visual(pixels, grid_thw=grid).pooler_output
        sparse = vlm.vision.encode_patches(pixels, views.candidate_grid, raster_block(views.candidate_grid).positions).features
    torch.testing.assert_close(sparse, stock, atol=1e-5, rtol=0)
    assert stock.std() > 1e-3  # not a vacuous comparison


CELLS = [(5, 6), (4, 7), (9, 1), (24, 42), (0, 0), (3, 3), (6, 5), (21, 40)]  # windows (1,1) x3, (2,0), (6,10) x2, (0,0) x2


def test_a_sparse_set_is_encoded_with_the_full_grids_windows_in_any_order(model):
    vlm = model.vlm
    views = make_views(photo(1200, 700))
    pixels, _ = vlm.vision.image_inputs(views.tensor("highres"))
    grid = views.candidate_grid
    cells = torch.tensor(CELLS)
    shuffle = torch.randperm(len(CELLS), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = vlm.vision.encode_patches(pixels, grid, cells).features  # [K, D]
        shuffled = vlm.vision.encode_patches(pixels, grid, cells[shuffle]).features
        window_index, cu = stock_windows(CELLS)
        stock = stock_tower_on_cells(vlm, pixels, grid, CELLS, window_index, cu)
        # wrong windows: the same cells, all in one window (plain global attention everywhere)
        one_window = torch.tensor([0, 4 * len(CELLS)], dtype=torch.int32)
        one = stock_tower_on_cells(vlm, pixels, grid, CELLS, window_index, one_window)
    torch.testing.assert_close(ours, stock, atol=1e-5, rtol=0)  # the stock tower, told the full grid's windows
    torch.testing.assert_close(shuffled, ours[shuffle], atol=1e-5, rtol=0)  # a set, at its positions
    assert (one - stock).abs().max() > 20 * 1e-5  # the windows matter: one window is a different encoding


def test_windowed_blocks_see_only_their_window(model, monkeypatch):
    """With every block windowed, a cell's token changes when a cell of its window goes, and not when another does."""
    vlm = model.vlm
    monkeypatch.setattr(vlm.visual, "fullatt_block_indexes", [])
    views = make_views(photo(1200, 700))
    pixels, _ = vlm.vision.image_inputs(views.tensor("highres"))
    grid = views.candidate_grid
    a, same, other = [5, 6], [4, 7], [9, 1]  # windows (1, 1), (1, 1), (2, 0)
    with torch.no_grad():
        encode = lambda cells: vlm.vision.encode_patches(pixels, grid, torch.tensor(cells)).features[0]  # the token of a
        both, without_same, without_other = encode([a, same, other]), encode([a, other]), encode([a, same])
    torch.testing.assert_close(without_other, both, atol=1e-6, rtol=0)
    assert (without_same - both).abs().max() > 1e-4


# ---------------------------------------------- the pipelines (the Decoder for this family: tests/vlm/test_decoder.py)


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_graphed_vision_equals_eager_on_cuda(dtype):
    vlm = load_vlm(TINY, device="cuda", dtype=dtype)
    views = make_views(photo(1200, 700), device="cuda")
    pixels, _ = vlm.vision.image_inputs(views.tensor("highres"))
    grid = views.candidate_grid
    generator = torch.Generator().manual_seed(0)
    for _ in range(2):  # the second set replays the graph captured for the first (273 cells: one shape)
        cells = torch.randperm(grid[0] * grid[1], generator=generator)[:273]
        positions = torch.stack([cells // grid[1], cells % grid[1]], dim=-1).cuda()  # [273, 2]
        with torch.no_grad():
            vlm.decoder.graphs_enabled = False
            eager = vlm.vision.encode_patches(pixels, grid, positions).features
            vlm.decoder.graphs_enabled = True
            graphed = vlm.vision.encode_patches(pixels, grid, positions).features
        torch.testing.assert_close(graphed, eager, atol=1e-5 if dtype == torch.float32 else 1e-2, rtol=0)
    assert len(vlm.vision.graphed.graphs) == 1
    with torch.no_grad():  # and the graphed gestalt is the stock tower's encoding
        pixels, thw = vlm.vision.image_inputs(views.tensor("gestalt"))
        stock = vlm.visual(pixels, grid_thw=thw).pooler_output
        ours = vlm.encode_view(views.tensor("gestalt")).features
    scale = float(stock.abs().max())
    torch.testing.assert_close(ours, stock, atol=(1e-4 if dtype == torch.float32 else 3e-2) * scale, rtol=0)


@pytest.mark.gpu
def test_graphed_arr_answer_equals_stock_generate_on_cuda():
    from arr_coc.model import ARRCOCQwen

    model = ARRCOCQwen.from_pretrained(TINY, device="cuda", dtype=torch.float32)
    answers = answers_by_engine(model, photo(1400, 1000), QUESTION, "arr")  # larger than gestalt + 273: ARR selects
    assert answers["fast"].text == answers["hf"].text and answers["fast"].tokens.saccade == 273
    assert model.vlm.vision.graphed.graphs and model.vlm.decoder.decode_graphs  # the fast answer replayed graphs
