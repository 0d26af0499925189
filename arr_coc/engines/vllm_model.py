"""
ARR-COC inside vLLM: ArrCocQwen2VL, ArrCocQwen2_5_VL and ArrCocQwen3VL, the architectures
arr_coc/engines/vllm_plugin.py registers, run each image of an OpenAI chat request through the project's own ARR
(arr_coc.pipelines.arr on the project's VLM) and hand vLLM's language model of the family the gestalt and the
saccades; vLLM batches, schedules and generates over its paged KV cache.

One design for every family: the mixins ArrInfo, ArrDummyInputs, ArrProcessor and ArrCocModel hold everything ARR-COC
does, each placed before the family's vLLM class (arr_processor builds the processing classes; a family is its four
vLLM classes, named once at the end of this module). What differs by family is the project's (its adapter: chat
template, vision tower, Qwen2.5-VL's windows over the selected cells, Qwen3-VL's DeepStack features) or vLLM's
(its LLM; Qwen3-VL's takes each image token's DeepStack levels after its features on the last dim: ArrCocModel.packed).
The M-RoPE ids are laid out alike (Qwen3-VL interleaves the sections inside its rotary embedding).

    .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --model models/pocket-qwen2-vl --dtype float32 \\
        --enforce-eager --hf-overrides '{"architectures": ["ArrCocQwen2VLForConditionalGeneration"]}'

Where each step runs:
  the front end (ArrProcessor, vLLM's multimodal processor): the question (the text after the image in the chat
      prompt) joins the item's processor kwargs, so it is part of vLLM's multimodal hash: the processor cache, the
      encoder cache and the prefix cache never give one question's cells to another; the image's prompt slot
      becomes [gestalt pads] <|vision_end|><|vision_start|> [budget pads], ARR's own two blocks (vLLM sizes an
      image's tokens before encoding: ARR's fixed budget is what makes that possible).
  the model runner, when the request joins the batch (get_mrope_input_positions, vLLM's M-RoPE hook): the gestalt,
      the prior pass, the relevance layer and the selection of exactly the budget's cells (Looker.look), and the
      prompt's M-RoPE positions with the saccades at their true (row, col) (arr_coc.vlm.positions).
  vLLM's encoder step (embed_multimodal): the selected cells encoded at their true rotary places (sparse), after
      the gestalt tokens.
Positions are computed when the request is added, from the selection itself, rather than repaired after
embedding (SupportsMultiModalPruning.recompute_mrope_positions, as EVS does): that hook runs only where
--video-pruning-rate is set, and only for chunks that gather image embeddings, so a prompt whose image a prefix-cache
hit skipped would keep unrepaired positions; get_mrope_input_positions runs for every request, cached or not.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np
import torch
from transformers import BatchFeature
from vllm.model_executor.models.qwen2_5_vl import (Qwen2_5_VLDummyInputsBuilder, Qwen2_5_VLForConditionalGeneration,
                                                   Qwen2_5_VLMultiModalProcessor, Qwen2_5_VLProcessingInfo)
from vllm.model_executor.models.qwen2_vl import (Qwen2VLDummyInputsBuilder, Qwen2VLForConditionalGeneration,
                                                 Qwen2VLMultiModalProcessor, Qwen2VLProcessingInfo)
from vllm.model_executor.models.qwen3_vl import (Qwen3VLDummyInputsBuilder, Qwen3VLForConditionalGeneration,
                                                 Qwen3VLMultiModalProcessor, Qwen3VLProcessingInfo)
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.inputs import MultiModalFieldConfig
from vllm.multimodal.parse import ImageProcessorItems, ImageSize
from vllm.multimodal.processing.context import BaseProcessingInfo
from vllm.multimodal.processing.processor import PromptReplacement, PromptUpdateDetails

from arr_coc.pipelines.arr_layout import arr_positions, arr_slot
from arr_coc.engines.vllm_plugin import (STRATEGIES, ServerSettings, checkpoint_folder, default_budget, log_look,
                                         request_settings, server_settings)
from arr_coc.pipelines.request import checked_question
from arr_coc.settings import MAX_IMAGE_PIXELS, PipelineConfig
from arr_coc.vlm.families import adapter_class
from arr_coc.vlm.views import fit_grid, to_rgb

GESTALT = PipelineConfig().gestalt_max_tokens  # at most this many gestalt tokens (16 x 16 at 448 px)
VISION_END, VISION_START, IMAGE_PAD, END_OF_TURN = "<|vision_end|>", "<|vision_start|>", "<|image_pad|>", "<|im_end|>"
IMAGE_TAG = VISION_START + IMAGE_PAD + VISION_END  # an image in the chat template's prompt
FULL_LOOKS = 8  # looks kept whole (views, gestalt, selection) between a request's positions and its encoding
CELLS_KEPT = 65536  # selections kept (grids and cells: a few KB each) for a later request's positions


SERVERS: dict[int, tuple] = {}  # id(hf_config) -> server(hf_config): read once a process


def server(hf_config) -> tuple[ServerSettings, str | None, int]:
    """The server's settings, its checkpoint folder and its budget (the most saccades a request may ask for)."""
    if id(hf_config) not in SERVERS:
        settings = server_settings(hf_config)
        folder = checkpoint_folder(settings, hf_config.model_type, hf_config.text_config.hidden_size)
        SERVERS[id(hf_config)] = (settings, folder, default_budget(settings, folder))
    return SERVERS[id(hf_config)]


def question_in(prompt: str) -> str:
    """The question of a chat prompt (vLLM's rendering, decoded): the text after the image's tag, up to the end of
    the user's turn (the prompt's last <|im_end|>). Special tokens typed in it stay in it, as text."""
    if IMAGE_TAG not in prompt:
        raise ValueError("ARR-COC reads one image and the question after it; this prompt has no image")
    question = prompt.split(IMAGE_TAG, 1)[1]
    question = question.rsplit(END_OF_TURN, 1)[0] if END_OF_TURN in question else question
    if not question.strip():
        raise ValueError("ARR-COC chooses its cells for a question: put the question after the image")
    return question.strip()


def checked_image(image) -> np.ndarray:
    """An item's image as ARR reads it -> [H, W, 3] uint8; ValueError in one line for one that is empty or no
    image (to_rgb) or past the app's MAX_IMAGE_PIXELS."""
    rgb = to_rgb(image)
    if rgb.width * rgb.height > MAX_IMAGE_PIXELS:
        raise ValueError(f"the image is {rgb.width}x{rgb.height} pixels; the limit is {MAX_IMAGE_PIXELS // 10**6} "
                         "megapixels, as in the app: downscale it first")
    return np.asarray(rgb)


class ArrInfo:
    """A family's processing info (mixed in before it), for ARR's fixed token count: gestalt + 2 + budget tokens an
    image, one image."""

    def get_supported_mm_limits(self):
        return {"image": 1}

    def get_supported_mm_processor_kwargs(self):
        """The HF processor's kwarg scopes, for an image only (vLLM's own rule): Qwen3-VL's adds video ones, which a
        server without video has no scope for."""
        return BaseProcessingInfo.get_supported_mm_processor_kwargs(self)

    def get_mm_max_tokens_per_item(self, seq_len, mm_counts):
        return {"image": GESTALT + 2 + server(self.get_hf_config())[2]}

    def get_image_size_with_most_features(self) -> ImageSize:
        return ImageSize(width=448, height=448)  # any image gives at most GESTALT + budget tokens


class ArrDummyInputs:
    """A family's profiling inputs (mixed in before them): an image and a question after it, as a chat prompt has
    them."""

    def get_dummy_text(self, mm_counts) -> str:
        return f"{VISION_START}{IMAGE_PAD}{VISION_END}What is shown?" * mm_counts.get("image", 0)

    def get_dummy_mm_data(self, seq_len, mm_counts, mm_options):
        return {"image": self._get_dummy_images(width=448, height=448, num_images=mm_counts.get("image", 0),
                                                overrides=mm_options.get("image"))}


class ArrProcessor:
    """A family's multimodal processor (mixed in before it): each image -> its pixels, its question and its layout
    (gestalt grid, budget, strategy, max cells), and a prompt slot of ARR's two blocks. The question is a processor
    kwarg, so it is hashed with the image."""

    def apply(self, inputs, timing_ctx):
        """The request's prompt laid out anew by the project's own ChatLayout over its question, checked as the app
        checks one (checked_question): a special token typed in the question is plain text, as in the app, so no
        request adds an image pad or a turn. Every refusal here is one line (HTTP 400): nothing reaches the engine."""
        chat = self.chat()
        prompt = self.info.get_tokenizer().decode(inputs.prompt, skip_special_tokens=False)
        question = checked_question(question_in(prompt), chat.question_ids)
        ids = chat.prompt_ids(question, [1])[0].tolist()  # one image pad: the slot _get_prompt_updates fills
        kwargs = {**inputs.hf_processor_mm_kwargs, "arr_question": question}
        return super().apply(replace(inputs, prompt=ids, hf_processor_mm_kwargs=kwargs), timing_ctx)

    def chat(self):
        """The family's ChatLayout over vLLM's tokenizer (the project's template rule: its adapter's chat_layout)."""
        if not hasattr(self, "_chat"):
            tokenizer, adapter = self.info.get_tokenizer(), adapter_class(self.info.get_hf_config().model_type)
            self._chat = adapter.chat_layout(tokenizer, tokenizer.convert_tokens_to_ids(IMAGE_PAD), [])
        return self._chat

    def _apply_hf_processor_main(self, mm_items, hf_kwargs) -> BatchFeature:
        settings, _, server_budget = server(self.info.get_hf_config())
        budget, strategy = request_settings(settings, server_budget, hf_kwargs)
        max_cells = settings.max_cells
        question = str(hf_kwargs["arr_question"]).encode()
        out = {"arr_image": [], "arr_layout": [], "arr_question": [], "arr_key": []}
        items = mm_items.get_items("image", ImageProcessorItems) if "image" in mm_items else []
        for i in range(len(items)):
            rgb = checked_image(items.get(i))  # [H, W, 3] uint8
            gh, gw = fit_grid(rgb.shape[1], rgb.shape[0], GESTALT)
            layout = torch.tensor([gh, gw, budget, STRATEGIES.index(strategy) if strategy else -1, max_cells])
            key = hashlib.sha256(rgb.tobytes() + question + str(layout.tolist()).encode()).digest()
            out["arr_image"].append(torch.from_numpy(rgb.copy()))
            out["arr_layout"].append(layout)
            out["arr_question"].append(torch.frombuffer(bytearray(question), dtype=torch.uint8))
            out["arr_key"].append(torch.frombuffer(bytearray(key), dtype=torch.uint8))
        return BatchFeature(out)

    def _get_mm_fields_config(self, hf_inputs, hf_processor_mm_kwargs):
        return {name: MultiModalFieldConfig.batched("image", keep_on_cpu=True)
                for name in ("arr_image", "arr_layout", "arr_question", "arr_key")}

    def _get_prompt_updates(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs):
        chat = self.chat()
        pad = chat.image_token_id

        def slot(item_idx: int):  # ARR's two blocks, as the pipelines lay them out (arr_slot: ChatLayout.prompt_ids)
            gh, gw, budget = out_mm_kwargs["image"][item_idx]["arr_layout"].data[:3].tolist()
            return PromptUpdateDetails.select_token_id(arr_slot(chat, gh * gw, budget), pad)

        return [PromptReplacement(modality="image", target=[pad], replacement=slot)]


@dataclass
class Look:
    """ARR's look at one image for one question: its scene (views, gestalt, prior, maps) and its selection."""
    scene: object  # arr_coc.pipelines.arr_scene.Scene
    out: object  # arr_coc.relevance.layer.ARRCOCOutput: the cells, in the order the LLM reads them


@dataclass
class Cells:
    """What positions need of a look: the two blocks' grids and the saccades' cells."""
    gestalt_grid: tuple[int, int]  # (gh, gw)
    candidate_grid: tuple[int, int]  # (GH, GW)
    cells: torch.Tensor  # [K, 2] (row, col) on the candidate grid, in feed order


def field(item, name: str) -> torch.Tensor:
    """One field of an item (a MultiModalKwargsItem's element, or the tensor itself)."""
    value = item[name]
    return getattr(value, "data", value)


class Looker:
    """The project's own ARR (its façade, VLM and checkpoint, loaded on first use) looking at items."""

    def __init__(self, model_path: str, settings: ServerSettings, device: str):
        self.model_path, self.settings, self.device = model_path, settings, device
        self.model = None
        self.looks: OrderedDict[bytes, Look] = OrderedDict()
        self.cells: OrderedDict[bytes, Cells] = OrderedDict()

    def load(self):
        if self.model is None:
            from arr_coc.commands.cli import load_model

            self.model, _ = load_model(self.model_path, self.settings.checkpoint, self.device, quiet=True)
        return self.model

    def look(self, item) -> Look:
        """The item's look: kept, or made now (gestalt, prior pass, relevance, the budget's cells)."""
        from arr_coc.pipelines import arr_scene
        from arr_coc.pipelines.arr_options import Options
        from arr_coc.pipelines.request import Request

        key = bytes(field(item, "arr_key").tolist())
        if key in self.looks:
            self.looks.move_to_end(key)
            return self.looks[key]
        model = self.load()
        gh, gw, budget, strategy, max_cells = field(item, "arr_layout").tolist()
        strategy = STRATEGIES[strategy] if strategy >= 0 else None
        question = model.check_question(bytes(field(item, "arr_question").tolist()).decode())
        views = model.views(field(item, "arr_image").numpy(), max_cells)
        if views.gestalt_grid != (gh, gw):
            raise RuntimeError(f"the front end sized a {gh}x{gw} gestalt; the model's views make {views.gestalt_grid}")
        request = Request(budget=budget, max_cells=max_cells, options=(Options(strategy=strategy),))
        with torch.no_grad():
            scene = arr_scene.prepare(model.parts, views, question, request)
            out = scene.select(model.layer, budget, strategy)
        look = self.looks[key] = Look(scene, out)
        self.looks.popitem(last=False) if len(self.looks) > FULL_LOOKS else None
        self.cells[key] = Cells((gh, gw), views.candidate_grid, out.positions[0].cpu().long())
        self.cells.popitem(last=False) if len(self.cells) > CELLS_KEPT else None
        log_look({"question": question, "budget": budget, "strategy": strategy, "gestalt_grid": [gh, gw],
                  "candidate_grid": list(views.candidate_grid), "cells": out.positions[0].tolist(),
                  "scores": out.scores[0].tolist()})
        return look

    def cells_of(self, item) -> Cells:
        key = bytes(field(item, "arr_key").tolist())
        if key not in self.cells:
            self.look(item)
        self.cells.move_to_end(key)
        return self.cells[key]

    def tokens(self, item):
        """The LLM's visual tokens of an item (VisualTokens: features [Ng + K, D], Qwen3-VL's DeepStack features
        [k, Ng + K, D] or None): the gestalt's, then the selected cells' encoded at their true places."""
        from arr_coc.pipelines import arr_layout

        look = self.look(item)
        observation = look.scene.observation
        with torch.no_grad():
            saccades = arr_layout.encode_saccades(self.model.vlm, observation, look.out.positions[0])  # K tokens
        gestalt = observation.gestalt
        deepstack = None if gestalt.deepstack is None else torch.cat([gestalt.deepstack, saccades.deepstack], dim=1)
        return replace(saccades, features=torch.cat([gestalt.features, saccades.features]), deepstack=deepstack)


class ArrCocModel:
    """A family's vLLM model (mixed in before it) with ARR-COC's eyes: images read as gestalt + the budget's
    saccades at their true places, by the project's own ARR (Looker); vLLM's LLM of the family generates."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        settings = server(self.config)[0]
        device = str(vllm_config.device_config.device or "cpu")
        self.looker = Looker(vllm_config.model_config.model, settings, device)
        self.llm_dtype = vllm_config.model_config.dtype

    def get_mrope_input_positions(self, input_tokens, mm_features):
        """The prompt's M-RoPE positions, as the project's ARR prompt has them: the gestalt block in raster order and
        the saccade block at the selected cells' true places (the selection is made here, when the request joins).
        Every family's layout of an image block is Qwen2-VL's (Qwen3-VL interleaves the sections in its rotary
        embedding, not in the ids)."""
        ids = torch.tensor([list(input_tokens)], dtype=torch.long)
        images = [feature for feature in mm_features if feature.modality == "image"]  # one at most (ArrInfo)
        if not images:  # a text-only prompt is all text, whatever ids it holds (an <|image_pad|> typed in a chat)
            positions = arr_positions(None, ids, None, None, None)  # [3, L]
        else:
            cells = self.looker.cells_of(images[0].data)
            positions = arr_positions(self.looker.load().vlm.chat, ids, cells.gestalt_grid, cells.candidate_grid,
                                      cells.cells)  # [3, L], as arr_prompt lays them out
            log_look({"prompt_ids": ids[0].tolist(), "positions": positions.tolist()})
        return positions, int(positions.max()) + 1 - len(input_tokens)

    def embed_multimodal(self, **kwargs):
        """Each image's visual tokens [Ng + K, D], in the order of its prompt slot's pads (with DeepStack:
        [Ng + K, D * (1 + k)], as vLLM's Qwen3-VL takes them)."""
        if kwargs.get("arr_key") is None:
            return []
        names = ("arr_image", "arr_layout", "arr_question", "arr_key")
        items = [{name: kwargs[name][i] for name in names} for i in range(len(kwargs["arr_key"]))]
        return tuple(self.packed(self.looker.tokens(item)).to(self.llm_dtype) for item in items)

    def packed(self, tokens) -> torch.Tensor:
        """VisualTokens -> what vLLM's LLM of the family reads at the image pads: the features [N, D], with DeepStack
        (vLLM's Qwen3-VL: use_deepstack) each level after them on the last dim -> [N, D * (1 + k)], the order
        vLLM's _compute_deepstack_embeds splits them in (level i added after LLM layer i, as the project's Decoder
        adds it)."""
        wants = getattr(self, "use_deepstack", False)
        if wants != (tokens.deepstack is not None):
            raise RuntimeError(f"{type(self).__name__}: vLLM's LLM {'takes' if wants else 'has no'} DeepStack "
                               f"features; the project's VLM encoded the cells {'without' if wants else 'with'} them")
        if tokens.deepstack is None:
            return tokens.features  # [N, D]
        return torch.cat([tokens.features, *tokens.deepstack.unbind(0)], dim=-1)  # [N, D * (1 + k)]


def arr_processor(info: type, processor: type, dummy_inputs: type):
    """A class decorator: ARR-COC's processor over a family's vLLM processing classes (each mixin before the
    family's class), registered for the decorated model class in vLLM's multimodal registry."""
    def named(mixin: type, base: type) -> type:
        return type(f"{mixin.__name__}{base.__name__}", (mixin, base), {"__module__": __name__})

    return MULTIMODAL_REGISTRY.register_processor(named(ArrProcessor, processor), info=named(ArrInfo, info),
                                                  dummy_inputs=named(ArrDummyInputs, dummy_inputs))


# One class per family: the family's vLLM classes, named once here; everything else is ARR-COC's, shared.
@arr_processor(Qwen2VLProcessingInfo, Qwen2VLMultiModalProcessor, Qwen2VLDummyInputsBuilder)
class ArrCocQwen2VL(ArrCocModel, Qwen2VLForConditionalGeneration):
    """Qwen2-VL in vLLM with ARR-COC's eyes."""


@arr_processor(Qwen2_5_VLProcessingInfo, Qwen2_5_VLMultiModalProcessor, Qwen2_5_VLDummyInputsBuilder)
class ArrCocQwen2_5_VL(ArrCocModel, Qwen2_5_VLForConditionalGeneration):
    """Qwen2.5-VL in vLLM with ARR-COC's eyes (the window attention over the selected cells is the project's VLM's)."""


@arr_processor(Qwen3VLProcessingInfo, Qwen3VLMultiModalProcessor, Qwen3VLDummyInputsBuilder)
class ArrCocQwen3VL(ArrCocModel, Qwen3VLForConditionalGeneration):
    """Qwen3-VL in vLLM with ARR-COC's eyes, DeepStack features of the gestalt and the saccades included."""
