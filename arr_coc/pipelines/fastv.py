"""
fastv: FastV (Chen et al. 2024, "An Image is Worth 1/2 Tokens After Layer 2"), in-LLM attention pruning, as a
baseline at ARR's token count. Implemented from the paper's description:

    the native view (as `full` reads it) -> the vision tower -> layers 0..K-1 over every token
      -> at layer K-1, the last prompt token's attention to each image token (post-RoPE, averaged over heads)
      -> layers K.. over the top N image tokens, in their order and at their own M-RoPE positions -> generate

N is what ARR's LLM reads for the same image at the same budget (gestalt + saccades: 529 by default), capped at
the view's own tokens. Layers below K keep their full KV cache while decoding; layers from K on hold the
shortened one (arr_coc/vlm/decoder.py). Qwen3-VL's DeepStack features of the dropped tokens go with them.
It runs on the fast engine only: its layers read two sequence lengths, which stock generate() cannot do.

    request = Request(budget=273, options=(Options(fastv_layer=2),))   # its Options: pipelines/declared/fastv.py
    answer = finished(pipelines.answer_of("fastv")(parts, views, "What is here?", request))
    answer.kept                                          # [N, 2] the (row, col) of the kept tokens, native grid
"""

import torch

from arr_coc.errors import InputError
from arr_coc.pipelines.answer import TokenCounts
from arr_coc.pipelines.arr_scene import arr_visual_tokens
from arr_coc.pipelines.request import Parts, Request, setting
from arr_coc.pipelines.steps import finish, generate, start_watch
from arr_coc.vlm.views import Views

VIEW = "native"  # the view FastV prunes: the one `full` reads whole


def check_layer(parts: Parts, layer: int) -> int:
    """K must leave at least one layer below it (the statistic's) and one above it (the pruned ones)."""
    layers = parts.vlm.num_layers
    if not 1 <= int(layer) < layers:
        raise InputError(f"FastV's layer K must be between 1 and {layers - 1} for this model ({layers} LLM layers), "
                         f"got {layer}")
    return int(layer)


@torch.no_grad()
def answer(parts: Parts, views: Views, question: str, request: Request):
    """One FastV answer (the module docstring's diagram): its tokens as they come, then its Answer."""
    vlm = parts.vlm
    if vlm.engine != "fast":
        raise InputError("the fastv baseline runs on the fast engine only (its layers read two sequence lengths)")
    K = check_layer(parts, setting(request, "fastv_layer", parts.pipeline.fastv_layer))  # its Options' K, if given
    watch, start = start_watch(vlm.device)
    with watch.section("vision"):
        tokens = vlm.encode_view(views.tensor(VIEW))  # [M, D] raster order
    M = len(tokens)
    N = min(M, arr_visual_tokens(parts, views, request, question))
    prompt = vlm.prompt(question, [tokens])
    generation, new_tokens = yield from generate(vlm, prompt, watch, request, prune=(K, N))  # the selection runs in the prefill
    kept = tokens.positions[generation.kept.cpu()]  # [N, 2] (row, col) on the native grid, raster order
    read = prompt.length - M + N  # what layers >= K read
    gflops = vlm.gflops([M], read, pruned=(K, prompt.length))
    yield finish(vlm, "fastv", generation, new_tokens, TokenCounts.of_prompt(read, 0, 0, total_visual=N), watch, start,
                 views, gflops, kept=kept)
