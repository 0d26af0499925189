"""
The Qwen-VL families ARR-COC runs, and how a model is loaded: the config's model_type picks the adapter (one
class per family, behind the VLM interface of base.py), which names its transformers class.

    vlm = load_vlm("Qwen/Qwen2-VL-2B-Instruct")     # a hub id, a folder, or a tiny offline model ("tiny", ...)
    vlm = random_vlm(qwen2_vl_2b_config(), "cuda", torch.bfloat16)   # full size, random weights (benchmarks)

Unsupported families are refused with the list of supported ones.
"""

import importlib
import json
from pathlib import Path

import torch
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import EntryNotFoundError

from arr_coc.settings import DEFAULT_MODEL
from arr_coc.checkpoints import POCKET, POCKET_FOLDER
from arr_coc.vlm.readout import DEFAULT, PriorReadout, prior_file
from arr_coc.vlm.tiny import TINY_MODELS, tiny_model_path, tokenizer_folder
from arr_coc.errors import InputError


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on Ampere or newer, fp16 on older GPUs (T4), fp32 on CPU."""
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.get_device_capability(device)[0] >= 8 else torch.float16


FAMILY_NAMES = {"qwen2_vl": "Qwen2-VL", "qwen2_5_vl": "Qwen2.5-VL", "qwen3_vl": "Qwen3-VL"}  # for people
FAMILIES = {  # model_type -> "module:Adapter" (imported when first loaded); each adapter names its transformers class
    "qwen2_vl": "arr_coc.vlm.qwen2_vl:QwenVL",
    "qwen2_5_vl": "arr_coc.vlm.qwen2_5_vl:Qwen25VL",
    "qwen3_vl": "arr_coc.vlm.qwen3_vl:Qwen3VL",
}


def adapter_class(model_type: str) -> type:
    """The adapter for a config's model_type; an unsupported one is a clear error naming the supported families."""
    if model_type not in FAMILIES:
        raise InputError(f"unsupported model_type {model_type!r}: ARR-COC supports {', '.join(sorted(FAMILIES))}")
    module, name = FAMILIES[model_type].split(":")
    return getattr(importlib.import_module(module), name)


def load_vlm(name: str = DEFAULT_MODEL, device: str | None = None, dtype: torch.dtype | None = None,
             engine: str = "fast"):
    """
    Load a Qwen-VL from a hub id (downloaded or cached; HF_HUB_OFFLINE=1 for cache only), a folder laid out as
    the hub ships it, a tiny offline model's name (TINY_MODELS) or "pocket" (the shipped pocket-qwen2-vl), with
    the adapter of its family. The chat
    template and image processor settings come from the folder, and the prior's calibrated readout from its
    prior.json (a hub id's from checkpoints/priors/: arr_coc.vlm.readout.prior_file), else today's.
    """
    import transformers

    path = model_path(name)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or default_dtype(device)
    adapter = adapter_class(transformers.AutoConfig.from_pretrained(path).model_type)
    model = getattr(transformers, adapter.hf_class).from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    model = model.to(device).eval().requires_grad_(False)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = tokenizer.chat_template or shipped_chat_template(path)
    image_processor = transformers.AutoImageProcessor.from_pretrained(path)
    vlm = adapter(model, tokenizer, image_processor, name, engine)
    vlm.prior_readout = PriorReadout.load(prior_file(path)) or DEFAULT  # the calibrated prior, where it has one
    return vlm


def model_path(name: str) -> str:
    """What load_vlm loads a name from: a tiny model's or the pocket model's folder, else the name (folder, hub id)."""
    return str(tiny_model_path(name)) if name in TINY_MODELS else str(POCKET_FOLDER) if name == POCKET else name


def shipped_chat_template(path: str) -> str | None:
    """
    The chat template a model folder or hub repo ships beside its tokenizer (chat_template.jinja, or the
    processor's chat_template.json), which the tokenizer alone does not read; None if there is none.
    """
    for filename in ("chat_template.jinja", "chat_template.json"):
        if Path(path).is_dir():
            file = Path(path) / filename
        else:
            try:
                file = Path(hf_hub_download(path, filename))
            except EntryNotFoundError:  # not in the repo, or not in the offline cache: try the next name
                continue
        if file.is_file():
            text = file.read_text(encoding="utf-8")
            return json.loads(text)["chat_template"] if filename.endswith(".json") else text
    return None


def random_vlm(config, device: str, dtype: torch.dtype, name: str = "random Qwen2-VL", engine: str = "fast"):
    """
    A Qwen-VL of the config's family (its adapter, transformers class, chat template and image processor, as its
    tiny recipe has them) with random weights, built on the device (no download, no disk).
    """
    import transformers

    adapter = adapter_class(config.model_type)
    recipe = next(r for r in TINY_MODELS.values() if r.hf_class == adapter.hf_class)
    config.text_config._attn_implementation = config.vision_config._attn_implementation = "sdpa"
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = getattr(transformers, adapter.hf_class)(config).to(dtype).eval().requires_grad_(False)
    model.generation_config = transformers.GenerationConfig(eos_token_id=[151645, 151643], pad_token_id=151643,
                                                            do_sample=False)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_folder())
    tokenizer.chat_template = recipe.chat_template
    return adapter(model, tokenizer, recipe.image_processor(), name, engine)


