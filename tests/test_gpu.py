"""CUDA-only behaviour: half precision, timing on the device, and a real out-of-memory that the model survives."""

import numpy as np
import pytest
import torch
from PIL import Image
from conftest import answers_by_engine, scene_image

from arr_coc.errors import OutOfMemory
from arr_coc.model import WARMUP_QUESTION, ARRCOCQwen
from arr_coc.pipelines import arr_scene
from arr_coc.pipelines.request import Request
from arr_coc.pipelines.arr_layout import arr_prompt, encode_saccades

pytestmark = pytest.mark.gpu
QUESTION = "What does the gray text say?"


def image():  # 32x32 native cells, more than ARR reads (16x16 + 273): it chooses (a 448 px image it reads whole)
    return Image.fromarray(np.random.default_rng(0).integers(0, 255, (896, 896, 3), dtype=np.uint8))


def test_pinned_uploads_back_to_back_each_keep_their_own_bytes():
    """The upload goes through page-locked memory and returns before the copy ends: images uploaded one after
    another each arrive as their bytes (the host allocator reuses a buffer only after its copy is done)."""
    from arr_coc.vlm.views import upload

    rng = np.random.default_rng(1)
    images = [Image.fromarray(rng.integers(0, 255, (900, 700, 3), dtype=np.uint8)) for _ in range(4)]
    on_gpu = [upload(im, "cuda") for im in images]
    for im, pixels in zip(images, on_gpu):
        assert torch.equal(pixels.cpu(), torch.from_numpy(np.array(im)).permute(2, 0, 1).unsqueeze(0))


@pytest.fixture(scope="module", params=[torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def cuda_model(request):
    return ARRCOCQwen.from_pretrained("tiny", device="cuda", dtype=request.param)


def test_arr_runs_in_half_precision_on_cuda(cuda_model):
    # a scene with structure, not noise: noise is a busy image, which falls back to grid (ARRCOCConfig.void_structure)
    a = cuda_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=4)
    assert a.tokens.saccade == 273 and a.arr.fallback == [None]  # ARR's own selection, no fallback
    assert torch.isfinite(a.arr.relevance).all() and torch.isfinite(a.arr.weights).all()
    assert a.peak_memory_mb > 0 and all(getattr(a.timings, k) > 0 for k in ("vision", "selection", "prefill"))


def test_an_attention_guided_second_look_runs_in_half_precision_on_cuda(cuda_model):
    """The first answer's attention (read in fp32 from half-precision states) points 32 new cells beside the 64
    read; the final answer reads both rounds."""
    a = cuda_model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=3, budget=64, refixate=1.0,
                          refixate_budget=32, refixate_guide="attention")
    first, second = a.arr.indices[0].tolist(), a.fixations[1].arr.indices[0].tolist()
    assert a.refixated and len(set(second)) == 32 and not set(first) & set(second) and a.tokens.saccade == 96
    guide = a.fixations[1].arr.relevance
    assert guide.is_cuda and torch.isfinite(guide).all() and guide.max() > 0


def test_zero_saccades_match_the_stock_gestalt_answer_on_cuda(cuda_model):
    arr = cuda_model.answer(image(), QUESTION, "arr", max_new_tokens=6, budget=0)
    stock = cuda_model.answer(image(), QUESTION, "gestalt", max_new_tokens=6)
    assert arr.text == stock.text


def test_a_real_cuda_oom_is_reported_freed_and_survived(cuda_model, monkeypatch):
    vlm = cuda_model.vlm
    real = vlm.encode_cells
    before = torch.cuda.memory_allocated()

    def greedy(*args, **kwargs):
        torch.empty(1 << 45, dtype=torch.uint8, device="cuda")  # 32 TiB: a real allocator failure
        return real(*args, **kwargs)

    monkeypatch.setattr(vlm, "encode_cells", greedy)
    with pytest.raises(OutOfMemory, match="memory was freed"):
        cuda_model.answer(image(), QUESTION, "arr", max_new_tokens=2)
    monkeypatch.setattr(vlm, "encode_cells", real)
    assert torch.cuda.memory_allocated() <= before + (64 << 20)
    assert cuda_model.answer(image(), QUESTION, "arr", max_new_tokens=2).tokens.saccade == 273


def test_graph_replay_equals_eager_and_follows_new_inputs(cuda_model):
    from arr_coc.relevance.texture import generate_texture_array

    layer = cuda_model.layer
    for seed in (0, 1):  # the second image replays the graph captured for the first
        rng = np.random.default_rng(seed)
        pil = Image.fromarray(rng.integers(0, 255, (448, 448, 3), dtype=np.uint8))
        o = arr_scene.observe(cuda_model.parts, cuda_model.views(pil), QUESTION)
        eager_textures = generate_texture_array(o.highres, o.views.candidate_grid)
        torch.testing.assert_close(o.textures, eager_textures, atol=1e-5, rtol=1e-5)
        with torch.no_grad():
            replayed = arr_scene.score(o, cuda_model.layer.graphed_score)
        with torch.enable_grad():  # gradients on: the eager path
            eager = layer(o.textures, o.question_embeds, None, o.gestalt.features.unsqueeze(0), o.prior)
        torch.testing.assert_close(replayed.relevance, eager.relevance.detach(), atol=1e-4, rtol=1e-4)
    assert len(layer.graphed_score.graphs) == 1 and len(cuda_model.texture.graphs) == 1


def test_the_served_selection_replays_one_graph_and_picks_as_the_eager_one(cuda_model):
    """select's served case (topk, a fixed K) replays layer.graphed_topk: the same saccades, tensions and structure
    as its eager run on the same device (gradients on), for two scenes through one captured graph."""
    from arr_coc.relevance.layer import PER_SACCADE

    layer = cuda_model.layer
    layer.graphed_topk.graphs.clear()
    scenes = (scene_image(), scene_image().transpose(Image.Transpose.FLIP_LEFT_RIGHT))
    for scene in scenes:  # two scenes of one candidate grid: the second replays the graph the first captured
        o = arr_scene.observe(cuda_model.parts, cuda_model.views(scene), QUESTION)
        grid = o.views.candidate_grid
        with torch.no_grad():
            maps = arr_scene.score(o, cuda_model.layer.graphed_score)
            replayed = layer.select(maps, grid)
        with torch.enable_grad():  # gradients on: _topk runs eagerly
            eager = layer.select(maps, grid)
        assert replayed.fallback == eager.fallback == [None]
        for name in PER_SACCADE + ("explore", "diversify", "particularize", "structure"):
            assert torch.equal(getattr(replayed, name), getattr(eager, name)), name
    assert len(layer.graphed_topk.graphs) == 1


@pytest.fixture(scope="module")
def fp32_cuda_model():
    """fp32 on the GPU: graphed and eager paths, and stock generate, agree to the token."""
    return ARRCOCQwen.from_pretrained("tiny", device="cuda", dtype=torch.float32)


def big_image(w=1792, h=1344, seed=3):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


@pytest.mark.parametrize("pipeline", ["arr", "full", "gestalt", "budget"])
def test_graphed_decode_equals_stock_generate(fp32_cuda_model, pipeline):
    vlm = fp32_cuda_model.vlm
    answers = answers_by_engine(fp32_cuda_model, big_image(), QUESTION, pipeline, max_new_tokens=16)
    assert answers["fast"].text == answers["hf"].text and answers["fast"].new_tokens == answers["hf"].new_tokens
    assert vlm.decoder.decode_graphs  # the fast answer replayed a captured decode step
    assert vlm.decoder.compile_step and vlm.decoder.compiled_step is not None  # ... compiled, not the fallback
    assert vlm.vision.graphed.compile and vlm.vision.graphed.compiled is not None  # the vision tower too


def test_the_compiled_decode_graph_steps_as_the_uncompiled_one(cuda_model):
    """Half precision: teacher-forced steps of the captured compiled step and of the captured uncompiled one give
    the same logits, within half precision's tolerance (Inductor keeps eager's roundings, not its reduction order)."""
    compiled_and_uncompiled_steps_agree(cuda_model)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", ["tiny-qwen2.5-vl", "tiny-qwen3-vl"])
def test_every_family_answers_in_half_precision_through_fused_compiled_graphs(name, dtype):
    """Qwen2.5-VL and Qwen3-VL (Qwen2-VL: cuda_model's tests) in fp16 and bf16: ARR answers with 273 saccades and
    finite maps through the fused projections and the captured graphs, and the compiled decode graph steps as the
    uncompiled one."""
    model = ARRCOCQwen.from_pretrained(name, device="cuda", dtype=dtype)
    a = model.answer(scene_image(896, 896), QUESTION, "arr", max_new_tokens=4)
    assert a.tokens.saccade == 273 and torch.isfinite(a.arr.relevance).all()
    vlm = model.vlm
    assert vlm.decoder.fused is not None and vlm.decoder.decode_graphs and vlm.vision.graphed.graphs
    compiled_and_uncompiled_steps_agree(model)


def compiled_and_uncompiled_steps_agree(model):
    vlm, decoder = model.vlm, model.vlm.decoder
    prompt = vlm.prompt(QUESTION, [])
    forced = vlm.tokenizer("The sign says: STOP here, then turn left at the mill.",
                           add_special_tokens=False)["input_ids"]
    logits = {}
    try:
        for compiled in (False, True):
            decoder.compile_step = compiled
            decoder.decode_graphs.clear()
            with torch.no_grad():
                cap, _ = decoder.start(prompt.embeds, prompt.position_ids, len(forced) + 1)
                steps = []
                for token in forced:
                    decoder.states[cap].token.fill_(token)
                    steps.append(decoder._decode_step(cap)[1][0].float().clone())  # [V]
            logits[compiled] = torch.stack(steps)  # [n, V]
    finally:
        decoder.compile_step = True
        decoder.decode_graphs.clear()
    assert decoder.compiled_step is not None and len(forced) >= 12
    torch.testing.assert_close(logits[True], logits[False], atol=5e-2, rtol=5e-2)


def test_the_compiled_vision_graph_encodes_as_the_uncompiled_one(cuda_model):
    """Half precision: the captured compiled vision tower and the captured uncompiled one give the same tokens for
    a gestalt and for 273 saccades (two patch counts, one compile), within half precision's tolerance."""
    vlm, graphed = cuda_model.vlm, cuda_model.vlm.vision.graphed
    view = cuda_model.views(big_image()).tensor("highres")
    cells = torch.randperm(64 * 48, generator=torch.Generator().manual_seed(0))[:273]
    cells = torch.stack([cells // 64, cells % 64], dim=1)  # [273, 2] (row, col) of the 48 x 64 cell grid
    tokens = {}
    try:
        for compiled in (False, True):
            graphed.compile = compiled
            graphed.graphs.clear()
            with torch.no_grad():
                tokens[compiled] = [vlm.encode_view(cuda_model.views(image()).tensor("gestalt")).features.float(),
                                    vlm.encode_cells(view, cells).features.float()]
            assert len(graphed.graphs) == 2
    finally:
        graphed.compile = True
        graphed.graphs.clear()
    assert graphed.compiled is not None
    for ours, eager in zip(tokens[True], tokens[False]):
        assert eager.std() > 1e-3
        torch.testing.assert_close(ours, eager, atol=5e-2, rtol=5e-2)


def test_graphed_fastv_decode_equals_eager(fp32_cuda_model):
    """FastV's pruned prefill (eager) then decode steps over the mixed cache: graphed as eager, token for token."""
    vlm, answers = fp32_cuda_model.vlm, {}
    try:
        for graphs in (False, True):
            vlm.decoder.graphs_enabled = graphs
            answers[graphs] = fp32_cuda_model.answer(big_image(), QUESTION, "fastv", max_new_tokens=16)
    finally:
        vlm.decoder.graphs_enabled = True
    assert answers[True].text == answers[False].text and answers[True].new_tokens == answers[False].new_tokens
    assert torch.equal(answers[True].kept, answers[False].kept) and len(answers[True].kept) == 14 * 18 + 273  # ARR's count
    assert vlm.decoder.decode_graphs  # the graphed answer replayed a captured decode step


def test_graphed_arr_equals_eager(cuda_model):
    """Same saccades, and first-token logits within bf16/fp16 tolerance, with and without CUDA graphs (the vision
    graph uncompiled: Inductor's fused roundings may swap near-tied saccades in half precision; the compiled graph
    has its own test above)."""
    vlm = cuda_model.vlm
    vlm.vision.graphed.compile = False
    vlm.vision.graphed.graphs.clear()
    outputs = {}
    for graphs in (False, True):
        vlm.decoder.graphs_enabled = graphs
        views = cuda_model.views(scene_image(1792, 1344))  # a scene, not noise: noise falls back to grid
        scene = arr_scene.prepare(cuda_model.parts, views, QUESTION, Request())
        out = scene.select(cuda_model.layer)
        assert out.fallback == [None]  # ARR's own selection is what is compared
        with torch.no_grad():
            saccades = encode_saccades(vlm, scene.observation, out.positions[0])
            prompt = arr_prompt(vlm, scene.observation, saccades)
            embeds, positions = prompt.embeds, prompt.position_ids
            L = prompt.ids.shape[1]
            state = vlm.decoder._state(2048, embeds.dtype)
            padded, padded_ids, _ = vlm.decoder._pad(embeds, positions)
            run = vlm.decoder.graphed_prefill if graphs else vlm.decoder._prefill
            logits = run(padded, padded_ids, torch.tensor([L - 1], device="cuda"), 2048)
        outputs[graphs] = (out.indices.cpu(), scene.observation.prior.float().cpu(), logits.float().cpu(), state)
    vlm.decoder.graphs_enabled = vlm.vision.graphed.compile = True
    vlm.vision.graphed.graphs.clear()
    assert scene.views.candidate_grid == (48, 64)  # native resolution, not twice the gestalt
    assert torch.equal(outputs[False][0], outputs[True][0])
    torch.testing.assert_close(outputs[True][1], outputs[False][1], atol=2e-2, rtol=0)
    torch.testing.assert_close(outputs[True][2], outputs[False][2], atol=5e-2, rtol=5e-2)


def test_a_graphed_conversation_equals_the_eager_one_and_replays_its_follow_up_graph(fp32_cuda_model):
    """Three ARR turns and three `full` turns, graphed and eager: the same answers to the token, the same
    saccades up to near-tied cells; a second conversation replays the follow-up prefill graphs the first captured.
    The graphed prior pass runs the compiled decoder's kernels, which round differently from the eager ones (fp32,
    ~1e-6): on this noise image a follow-up turn's saccades fill the cells earlier turns read with the best of
    ~3800 near-equal others (the grid fallback), where such rounding may swap two of them. Swapped cells tie: the
    saccades' sorted relevance agrees to 1e-4 (H100, d61a759: turn 2's saccades differed, the answers did not; on
    the CPU, the prior scaled by 1 + 1e-5 noise reorders every turn's saccades, sorted relevance within 7e-5)."""
    from arr_coc.pipelines.conversation import Conversation

    model, decoder = fp32_cuda_model, fp32_cuda_model.vlm.decoder
    questions = [QUESTION, "And the colour?", "Where is it?"]

    def converse(pipeline):
        chat = Conversation(pipeline, big_image())
        answers = [model.answer(None, q, conversation=chat, max_new_tokens=12) for q in questions]
        return [(a.text, a.new_tokens, [(s.row, s.col) for s in a.saccades], sorted(s.score for s in a.saccades))
                for a in answers]

    runs = {}
    try:
        for graphs in (False, True):
            decoder.graphs_enabled = graphs
            runs[graphs] = [converse("arr"), converse("full")]
    finally:
        decoder.graphs_enabled = True
    for pipeline, graphed, eager in zip(("arr", "full"), runs[True], runs[False]):
        for turn, (g, e) in enumerate(zip(graphed, eager), 1):  # (text, new tokens, saccades, their scores)
            assert g[:2] == e[:2], f"{pipeline} turn {turn}: graphed {g[:2]} against eager {e[:2]}"
            assert len(g[2]) == len(e[2]), f"{pipeline} turn {turn}: {len(g[2])} saccades against {len(e[2])}"
            if g[2] != e[2]:  # near-tied cells swapped: their relevance ties
                torch.testing.assert_close(g[3], e[3], atol=1e-4, rtol=0,
                                           msg=lambda m: f"{pipeline} turn {turn}, the saccades' relevance: {m}")
    captured = len(decoder.graphed_extend.graphs)
    assert captured >= 1
    converse("arr")
    assert len(decoder.graphed_extend.graphs) == captured, "a second conversation recaptured a follow-up graph"


def test_back_to_back_lengths_reuse_the_captured_graphs(fp32_cuda_model):
    model = fp32_cuda_model
    decoder = model.vlm.decoder
    questions = ["Why?", QUESTION + " Please answer in full detail, naming every object you can see here.", "Why?"]
    texts = [model.answer(image(), q, "arr", max_new_tokens=8).text for q in questions]
    graphs = len(decoder.graphed_prefill.graphs), len(decoder.decode_graphs)
    again = [model.answer(image(), q, "arr", max_new_tokens=8).text for q in questions]
    assert again == texts  # replays give the same answers
    assert (len(decoder.graphed_prefill.graphs), len(decoder.decode_graphs)) == graphs  # nothing recaptured
    model.vlm.engine = "hf"
    try:
        assert [model.answer(image(), q, "arr", max_new_tokens=8).text for q in questions] == texts
    finally:
        model.vlm.engine = "fast"


def test_fp16_overflow_is_detected_and_redone_in_safe_mode():
    """On the GPU the first attempt runs from CUDA graphs: the overflow check is captured with them."""
    from conftest import overflowing_fp16_model

    model = overflowing_fp16_model("cuda")
    vlm = model.vlm
    prompt = vlm.prompt(QUESTION, [])
    with torch.no_grad():  # the stock forward does overflow: its logits are NaN
        stock = vlm.model(inputs_embeds=prompt.embeds, position_ids=prompt.position_ids).logits
    assert not torch.isfinite(stock).all()
    answer = model.answer(image(), QUESTION, "gestalt", max_new_tokens=8)
    assert answer.safe_mode and answer.new_tokens >= 1 and answer.to_json()["safe_mode"] is True
    chunks = list(model.stream(image(), QUESTION, "arr", max_new_tokens=8))
    assert chunks[-1].safe_mode and chunks[-2].strip() == chunks[-1].text  # streamed once, no duplicate text
    normal = ARRCOCQwen.from_pretrained("tiny", device="cuda", dtype=torch.float16)
    assert not normal.answer(image(), QUESTION, "gestalt", max_new_tokens=4).safe_mode


def test_warmup_captures_the_app_shapes_so_a_first_request_captures_nothing():
    model = ARRCOCQwen.from_pretrained("tiny", device="cuda", dtype=torch.bfloat16)
    assert model.warmup() > 0
    decoder = model.vlm.decoder
    counts = lambda: (len(decoder.graphed_prefill.graphs), len(decoder.graphed_prior.graphs),
                      len(decoder.decode_graphs), len(model.vlm.vision.graphed.graphs))
    before = counts()
    model.answer(image(), WARMUP_QUESTION, "arr", max_new_tokens=4)  # a new image, the bucket of short questions
    assert counts() == before
