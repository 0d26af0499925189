"""
pocket-qwen2-vl's architecture: the stock Qwen2VLConfig at a pocket size, its byte-level BPE tokenizer (Qwen's
special tokens and chat template), the stock image processor's settings, and the batched ViT attention that training
uses for pages of one size.

    tokenizer = build_tokenizer()
    model = Qwen2VLForConditionalGeneration._from_config(model_config(tokenizer, PocketConfig()))
    grow_vision(model, depth=8, mlp_ratio=8)  # a trained model, larger: every answer and logit unchanged
    model = grow_language(model, width=384)  # its LLM (and the merged tokens) wider, every logit unchanged
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from arr_coc.synth.fineprint import BOX_WORDS, COLOURS, FILLER, KEYS, SHAPES

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
SYSTEM_PROMPT = "You are a helpful assistant."


@dataclass
class PocketConfig:
    """The pocket model's architecture (stock Qwen2-VL at a pocket size)."""
    vision_depth: int = 6  # ViT blocks
    vision_dim: int = 256  # ViT width
    vision_heads: int = 4  # ViT attention heads
    hidden_size: int = 256  # LLM width (the merger projects the ViT to it)
    layers: int = 4  # LLM decoder layers
    heads: int = 4  # LLM query heads (head_dim 64)
    kv_heads: int = 2  # LLM key/value heads (GQA, as Qwen2-VL)
    intermediate: int = 1024  # LLM MLP width
    vocab: int = 1024  # BPE vocabulary incl. special tokens


# -----------------------------------------------------------------------------
# tokenizer and model


def tokenizer_corpus() -> list[str]:
    """The text the pocket tokenizer is fitted on: every question and answer form, the chat frame, filler."""
    lines = [SYSTEM_PROMPT, "system", "user", "assistant", "What is in this image?", "Describe the image."]
    lines += [f"What is the value of {k}?" for k in KEYS] + [f"{k}: " for k in KEYS]
    lines += [f"What word is in the {c} box?" for c in COLOURS] + list(BOX_WORDS)
    lines += [f"What colour is the {s}?" for s in SHAPES] + list(COLOURS)
    lines += [" ".join(FILLER), "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,:;!?'\"()-"]
    return lines * 4


def build_tokenizer(vocab: int = PocketConfig.vocab):
    """A byte-level BPE (digits split one by one, as Qwen2's) with Qwen's special tokens and chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from arr_coc.vlm.chat import CHAT_TEMPLATE

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(tokenizer_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   unk_token=None, model_max_length=32768)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def model_config(tokenizer, arch: PocketConfig = PocketConfig()):
    """The stock Qwen2VLConfig at pocket size; every special id comes from the pocket tokenizer."""
    from transformers import Qwen2VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    head_dim = arch.hidden_size // arch.heads
    section = [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16]  # t, h, w halves: as Qwen's 16/24/24 of 64
    return Qwen2VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=arch.hidden_size, intermediate_size=arch.intermediate,
                         num_hidden_layers=arch.layers, num_attention_heads=arch.heads,
                         num_key_value_heads=arch.kv_heads, max_position_embeddings=32768, rms_norm_eps=1e-6,
                         rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0, mrope_section=section),
                         tie_word_embeddings=True, bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                         pad_token_id=ids["<|endoftext|>"]),
        vision_config=dict(depth=arch.vision_depth, embed_dim=arch.vision_dim, num_heads=arch.vision_heads,
                           mlp_ratio=4, hidden_size=arch.hidden_size, hidden_act="quick_gelu", patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=True)


VISION_ATTENTION = "flash_same_size_pages"  # "flash" in the name: Qwen2-VL's ViT then hands over cu_seqlens whole


def same_size_pages_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0,
                              cu_seq_lens_q=None, **kwargs):
    """
    Qwen2-VL's vision attention for a batch of pages as one batched sdpa call per image size (one for a batch of
    same-size pages, two with their gestalt views): the same block-diagonal attention as the stock per-image loop
    (which launches 2 x images kernels per block), for training only. The stock ViT asks this of any attention
    whose name holds "flash"; registered under VISION_ATTENTION.
    """
    import torch.nn.functional as F

    _, heads, S, d = query.shape  # [1, H, S, d]: every image's patches, one image after another
    out = torch.empty_like(query)  # [1, H, S, d]
    for rows, n, size in _size_groups(cu_seq_lens_q):
        q, k, v = (t[0][:, rows].view(heads, n, size, d).transpose(0, 1) for t in (query, key, value))
        o = F.scaled_dot_product_attention(q, k, v, scale=scaling)  # [n, H, size, d]
        out[0][:, rows] = o.transpose(0, 1).reshape(heads, -1, d)
    return out.transpose(1, 2), None  # [1, S, H, d], as the interface returns


def _size_groups(cu_seqlens: torch.Tensor) -> list[tuple[torch.Tensor, int, int]]:
    """The images of cu_seqlens [n + 1] grouped by size: (their patch rows [n_size * size], n_size, size) per size."""
    bounds = cu_seqlens.tolist()
    starts, lengths = bounds[:-1], [b - a for a, b in zip(bounds, bounds[1:])]
    groups = []
    for size in sorted(set(lengths)):
        first = torch.tensor([a for a, n in zip(starts, lengths) if n == size], device=cu_seqlens.device)  # [n]
        groups.append(((first[:, None] + torch.arange(size, device=first.device)).flatten(), len(first), size))
    return groups


def use_same_size_pages_attention(model):
    """Switch the model's ViT to same_size_pages_attention (every batch must hold pages of one size)."""
    from transformers import AttentionInterface

    AttentionInterface.register(VISION_ATTENTION, same_size_pages_attention)
    model.config.vision_config._attn_implementation = VISION_ATTENTION
    return model


# -----------------------------------------------------------------------------
# growing the ViT, every output kept

FRESH_STD = 0.02  # new weights that read (as a fresh model's): random, so the loss reaches what grown units hold


@torch.no_grad()
def grow_vision(model, depth: int | None = None, mlp_ratio: int | None = None):
    """
    A trained model's ViT made deeper (`depth` blocks) and its blocks' MLPs wider (`mlp_ratio` x the width), with
    every output unchanged, so that training goes on from where it was with more capacity. The blocks are pre-norm
    residual (x + attn(norm1(x)), then x + mlp(norm2(x))): a new block is a copy of the last whose two output
    projections (attn.proj, mlp.fc2) are zero, the identity; a wider MLP keeps its units and adds units whose
    fc2 columns are zero. Growing to the current size, or smaller, changes nothing. Returns the model.
    """
    vision, config = model.model.visual, model.config.vision_config
    blocks = vision.blocks
    if mlp_ratio is not None and mlp_ratio * config.embed_dim > blocks[0].mlp.fc1.out_features:
        for block in blocks:
            block.mlp.fc1, block.mlp.fc2 = _wider(block.mlp.fc1, block.mlp.fc2, mlp_ratio * config.embed_dim)
        config.mlp_ratio = mlp_ratio
    while depth is not None and len(blocks) < depth:
        block = copy.deepcopy(blocks[-1], memo={id(config): config})  # the config stays shared (attention's choice)
        for projection in (block.attn.proj, block.mlp.fc2):
            projection.weight.zero_()
            projection.bias.zero_()
        blocks.append(block)
    config.depth = len(blocks)
    return model


def _wider(fc1: torch.nn.Linear, fc2: torch.nn.Linear, hidden: int) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    """fc1 [h, d] and fc2 [d, h] with `hidden` units: the old ones first, the new ones read like fresh weights
    (normal, std FRESH_STD) and write nothing (fc2's new columns are zero)."""
    old = fc1.out_features
    wide1 = torch.nn.Linear(fc1.in_features, hidden).to(fc1.weight)
    wide2 = torch.nn.Linear(hidden, fc2.out_features).to(fc2.weight)
    wide1.weight.normal_(0.0, FRESH_STD)
    wide1.bias.zero_()
    wide1.weight[:old], wide1.bias[:old] = fc1.weight, fc1.bias  # [hidden, d]
    wide2.weight.zero_()
    wide2.weight[:, :old], wide2.bias[:] = fc2.weight, fc2.bias  # [d, hidden]
    return wide1, wide2


# -----------------------------------------------------------------------------
# growing the LLM's width, every output kept

LLM_HEAD_DIM = 64  # the pocket LLM's head size: growing adds heads of it (M-RoPE's sections stay as they are)
WRITERS = ("self_attn.o_proj.", "mlp.down_proj.", "visual.merger.mlp.2.")  # write to the residual stream
READERS = ("self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj.", "mlp.gate_proj.", "mlp.up_proj.")


@torch.no_grad()
def grow_language(model, width: int | None = None):
    """
    A trained model with its LLM `width` wide (more heads of the same size, more MLP units in the same ratio, the
    merger's output as wide: the visual tokens the LLM reads), every output unchanged; returns the grown model (a new
    one: the modules' sizes are the config's), or the model itself at its width or wider. The residual stream gains
    dimensions that start at zero and stay there: what writes to it (the embeddings, o_proj, down_proj, the merger's
    output layer) writes nothing to them, and the new heads and units write nothing at all. What reads the stream
    (q/k/v, gate/up) reads the new dimensions through fresh random weights, so the loss reaches the writers. An RMS
    norm over the wider stream divides by an RMS smaller by sqrt(old / width): its weights are scaled by that, and
    its epsilon by old / width.
    """
    text = model.config.text_config
    old = text.hidden_size
    if width is None or width <= old:
        return model
    groups = text.num_attention_heads // text.num_key_value_heads  # query heads a key/value head serves
    if old != text.num_attention_heads * LLM_HEAD_DIM:
        raise ValueError(f"the LLM's heads are {old // text.num_attention_heads} wide, not {LLM_HEAD_DIM}")
    if width % (LLM_HEAD_DIM * groups):
        raise ValueError(f"the LLM grows by whole groups of {groups} heads of {LLM_HEAD_DIM}: width {width} is not a "
                         f"multiple of {LLM_HEAD_DIM * groups}")
    config = copy.deepcopy(model.config)
    config.text_config.hidden_size = config.vision_config.hidden_size = width
    config.text_config.intermediate_size = text.intermediate_size * width // old
    config.text_config.num_attention_heads = width // LLM_HEAD_DIM
    config.text_config.num_key_value_heads = width // LLM_HEAD_DIM // groups
    config.text_config.rms_norm_eps = text.rms_norm_eps * old / width  # sqrt(mean + eps) shrinks as the mean does
    dtype = next(model.parameters()).dtype
    grown = type(model)._from_config(config, dtype=dtype)
    before, state = model.state_dict(), grown.state_dict()
    for name, target in state.items():  # every tensor the trained one, widened where its shape grew
        source = before[name]
        target.copy_(source if source.shape == target.shape else _widened(name, source, target.shape,
                                                                           (old / width) ** 0.5))
    grown.load_state_dict(state)
    grown.generation_config = model.generation_config
    return grown.train(model.training)


def _widened(name: str, source: torch.Tensor, shape: torch.Size, norm_scale: float) -> torch.Tensor:
    """One tensor of the grown model: `source` in its leading corner; around it zeros where it writes to the stream
    (and in the embeddings), fresh random weights where it reads the stream, a scaled RMS norm's weights."""
    corner = tuple(slice(0, n) for n in source.shape)
    if name.endswith("norm.weight") and source.dim() == 1:  # an RMS norm over the stream (layernorms and the last)
        out = torch.full(shape, norm_scale, dtype=source.dtype)
        out[corner] = source * norm_scale
        return out
    if name.endswith(".weight") and any(r in name for r in READERS):
        out = torch.empty(shape, dtype=source.dtype).normal_(0.0, FRESH_STD)
    elif any(w in name for w in WRITERS) or "embed_tokens" in name or name == "lm_head.weight" or name.endswith(".bias"):
        out = torch.zeros(shape, dtype=source.dtype)
    else:
        raise ValueError(f"grow_language: no rule for {name} {tuple(source.shape)} -> {tuple(shape)}")
    out[corner] = source
    return out


def image_processor():
    """Qwen2-VL's stock image processor (the PIL one: no torchvision needed), capped like the hub's at 16384 tokens."""
    from arr_coc.vlm.tiny import qwen2_vl_image_processor

    return qwen2_vl_image_processor(max_tokens=16384)
