"""
Decoder: an explicit forward of the Qwen-VL language model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) over a static KV
cache, for every pipeline, and the one training forward (teacher forcing).

Stock `generate` spends ~18 ms per token on an H100 in kernel launches and Python, 15x off what memory
bandwidth allows. This module owns the loop instead: one `forward` over the LLM's layers, whose arguments make
each pass the engine runs (the static cache it writes is `cache.KVCache`, one object for every layer):

- prefill (`cache`, `slots`): one forward over the whole prompt (embeddings + 3-row M-RoPE ids);
- decode (`masks`: each layer reads the whole cache through its own): one captured CUDA graph per cache size,
  replayed per token; the graph advances its own state (`cache.DecodeState`: token, cache slot, rope position,
  attention mask), so a step is one launch plus one read of the token.
  Before capture the step is compiled (torch.compile, Inductor: norms, rotary, SwiGLU, residual adds and
  cache writes fused into a few Triton kernels, eager's roundings kept by `emulate_precision_casts`), once for
  every cache size (the cache length is a dynamic dimension); the compile is paid when the first decode graph
  is captured, i.e. at warm-up. Where Inductor cannot run, the step is captured uncompiled, with a warning.
  On CUDA each layer's q/k/v projections, and its gate/up projections, run as one matmul each (`fuse`: the
  weights re-laid in place, no copy): at batch 1 the small k and v matmuls cost a launch each, as a large one;
- the prior (`stop`): the LLM up to one middle layer, reading the question's attention to the gestalt tokens there;
- FastV (Chen et al. 2024; `pruning`): layers < K prefill the whole prompt; at layer K - 1 the last prompt
  token's attention to every image token ranks them; layers >= K prefill only the top N (in their order, at
  their own M-RoPE positions and cache slots). Decoding goes on from that mixed cache: each layer's own mask
  (`KVCache.mask[i]`) hides the slots its prefill never wrote, so layers < K read the whole prompt and layers
  >= K the shortened one. A pruned prefill runs eagerly (unpadded); its decode steps are graphed.
- conversations, when a saved cache (`history`) is passed: a follow-up turn's tokens are prefilled after the
  earlier turns' keys and values (restored into the shared cache, each new token attending to them and causally
  to its own turn: `masks` again), graphed per turn-length bucket and cache size as the prefill is; decoding goes
  on as for any prompt. `keep=True` hands back a copy of the cache after the turn, which the conversation holds
  (the shared buffers serve every request in between);
- teacher forcing (no cache): the training forward, differentiable, logits at chosen positions (`at`).
- the teacher's probe (`probe`): answer rows' attention to the image tokens per head at chosen layers, in fp32.

Qwen3-VL's text model also runs here: its per-head q/k RMSNorms are applied when the attention has them, and
its DeepStack visual features come as one dense tensor `deepstack` [k, 1, L, D] (zeros outside image tokens),
added to the output of layer i < k in prefill and in the prior pass, as Qwen3VLTextModel does.

On CUDA, prompts are padded at the end to a bucket of BUCKET tokens (causal attention: padding after the
prompt changes nothing before it), so a handful of graphs cover every question. Off CUDA the same code runs
eagerly. At most MAX_CACHES cache sizes (each with its decode graph) are kept: the least recently used goes.

Every layer attends over the whole causal context: a config with sliding-window layers (`use_sliding_window`,
or `layer_types` other than "full_attention") is refused by name rather than run wrongly. The arithmetic is the
stock modules' own (norms, MLPs, rotary tables; the projections' weights, fused or not); only the attention call
and the fused matmuls are written here, and tests pin prefill logits, decode tokens and the prior to transformers.

generate is a generator, as nanochat's Engine.generate is: it yields each new token id as the loop makes it, and
returns its result, so the caller's own thread streams the tokens (the app's Stop closes it between two of them).

    decoder = Decoder(model)                        # model: e.g. Qwen2VLForConditionalGeneration
    tokens = decoder.generate(embeds, position_ids, max_new_tokens=64, eos_token_ids=[151645])
    for token in tokens: ...                        # each new token id as it is made
    ids, probs, safe_mode, _ = yield from decoder.generate(embeds, position_ids, 64, [151645])   # its result
    ids, probs, safe_mode, saved = yield from decoder.generate(embeds, position_ids, 64, [151645], keep=True)   # turn 1
    # saved: (keys, values, position); the VLM keeps it as History.cache (base.SavedCache), which turn 2 passes
    ids, probs, safe_mode, saved = yield from decoder.generate(more, more_ids, 64, [151645], history=cache, keep=True)
    logits = decoder.forward(embeds, position_ids, deepstack, at=positions)   # teacher forcing [B, P, V]
    weights, norms = decoder.answer_attention(embeds, position_ids, rows, keys, layers=[2, 3])  # [2, H, A, n], [2, n]
"""

import threading
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb

from arr_coc.runtime.graphs import CUDAGraphed, capture, cuda_graphs_allowed
from arr_coc.vlm.cache import DecodeState, KVCache

BUCKET = 64  # prompts are padded to a multiple of this on CUDA: one prefill graph per bucket
CACHE_STEP = 1024  # cache sizes are multiples of this: one decode graph per size
MAX_CACHES = 2  # cache sizes kept at once, LRU (ARR's and `full`'s): Qwen2-VL-2B's K/V is 29 MB per 1024 slots in bf16
NON_FINITE = -1  # the token a step reports when its logits were NaN or inf (fp16 overflow)
SAFE_LOGIT_SCALE = 1024.0  # safe mode computes logits / this in fp16 (greedy argmax is unchanged by the scale)
GQA_IN_SDPA = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 5)  # enable_gqa arrived in 2.5
PRIOR_CHUNK = 256  # query rows per softmax in the prior pass: its scores are [H, 256, L] fp32, linear in L (12 heads
# at 16384 tokens: 192 MiB; the whole [H, L, L] was 12 GiB)
LOGIT_ROW = 128  # greedy() and probability() reduce the vocabulary as rows of this many logits, then the rows' results


def _attend(q, k, v, scale, causal=False, mask=None):
    """sdpa with grouped KV heads: [1, H, Lq, hd] x [1, Hkv, Lk, hd] -> [1, H, Lq, hd]."""
    if not GQA_IN_SDPA:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


def _weighted_attention(q, k, scale: float, weights, chunk: int = PRIOR_CHUNK, heads=None):
    """
    Causal softmax attention q [1, H, L, hd] to k [1, H, L, hd], weighted over heads by heads [H] (None: their
    mean) and over query rows by weights [L] -> [L] attention mass per key. The rows go `chunk` at a time, so
    memory grows with L, not L².
    """
    L = q.shape[2]
    keys = torch.arange(L, device=q.device)
    mass = torch.zeros(L, dtype=torch.float32, device=q.device)
    for start in range(0, L, chunk):
        rows = keys[start:start + chunk]  # [c]
        scores = (q[:, :, start:start + chunk] @ k.transpose(-1, -2)) * scale  # [1, H, c, L]
        scores = scores.masked_fill(keys > rows[:, None], float("-inf"))  # causal: row r reads keys <= r
        probs = scores.softmax(-1)[0]  # [H, c, L]
        per_row = probs.mean(0) if heads is None else torch.einsum("h,hcl->cl", heads, probs)  # [c, L]
        mass += weights[start:start + chunk] @ per_row  # [c] @ [c, L]
    return mass


def rows_attention(q, k, rows: torch.Tensor, keys: torch.Tensor, chunk: int = PRIOR_CHUNK) -> torch.Tensor:
    """
    Causal softmax attention of the query rows `rows` [A] over every key, read at the keys `keys` [n]: q and k
    [1, H, L, hd] fp32 (scaled already) -> [H, A, n]. Row r reads keys <= r, as the causal prefill does; the rows go
    `chunk` at a time, so the scores held are [H, chunk, L].
    """
    positions = torch.arange(k.shape[2], device=k.device)  # [L]
    out = []
    for start in range(0, len(rows), chunk):
        at = rows[start:start + chunk]  # [c]
        scores = q[0][:, at] @ k[0].transpose(-1, -2)  # [H, c, L]
        scores = scores.masked_fill(positions > at[:, None], float("-inf"))
        out.append(scores.softmax(-1)[..., keys])  # [H, c, n]
    return torch.cat(out, dim=1)


@dataclass
class AttentionProbe:
    """What the one loop reads on its way (Decoder.forward's `probe`): at each of `layers`, the attention of the query
    rows `rows` to the keys `keys`, per head, recomputed in fp32 (whatever kernel the layer runs) -> `read`, and the
    norm of each key's hidden state entering the layer -> `norms` (massive activations mark attention sinks)."""
    layers: tuple[int, ...]  # the layers to read, ascending
    rows: torch.Tensor  # [A] sequence indices of the query rows
    keys: torch.Tensor  # [n] sequence indices of the keys read
    read: list[torch.Tensor] = field(default_factory=list)  # one [H, A, n] per layer of `layers`, filled in order
    norms: list[torch.Tensor] = field(default_factory=list)  # one [n] per layer: |x| of the keys entering it (fp32)


def _rows(logits: torch.Tensor) -> torch.Tensor:
    """logits [1, V] -> [R, LOGIT_ROW], padded with -inf to whole rows."""
    pad = -logits.shape[-1] % LOGIT_ROW
    return (F.pad(logits, (0, pad), value=float("-inf")) if pad else logits).view(-1, LOGIT_ROW)


def greedy(logits: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """
    argmax(logits + bias) -> [1, 1], as torch.argmax (the first of equal maxima), in two passes: each row's max,
    then the best row. One reduction over 151936 logits runs on one SM: 42 µs of a 2.6 ms decode step (H100).
    """
    best, at = _rows(logits + bias).max(-1)  # [R], [R]: each row's max and its first place
    row = best.argmax().view(1)  # [1]: the first row holding the max
    return (row * LOGIT_ROW + at.gather(0, row)).view(1, 1)  # gather, not at[row]: that would read row to the host


def probability(logits: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """softmax(logits [1, V])[token [1, 1]] -> [1], its sums in two passes as greedy's (NaN where logits are)."""
    rows = _rows(logits)  # [R, LOGIT_ROW]
    top = rows.amax(-1).amax()  # []
    total = (rows - top).exp().sum(-1).sum()  # []
    return (logits.gather(-1, token.clamp(min=0)) - top).exp().view(1) / total


@dataclass
class FusedProjections:
    """One layer's projections that read the same input, each set as one weight: the stock modules' own weights
    are views into it (Decoder.fuse), so nothing is copied and the stock forward reads the same numbers."""
    qkv: torch.Tensor  # [H * hd + 2 * Hkv * hd, D] q_proj's, k_proj's and v_proj's weights, stacked
    qkv_bias: torch.Tensor | None  # [H * hd + 2 * Hkv * hd] their biases (Qwen2/2.5-VL); None without (Qwen3-VL)
    qkv_split: tuple[int, int, int]  # H * hd, Hkv * hd, Hkv * hd: where the output splits into q, k, v
    gate_up: torch.Tensor  # [2 * I, D] the MLP's gate_proj's and up_proj's weights, stacked (Qwen's MLPs have no bias)


def share_weights(modules: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Linear layers of one input -> (their weights stacked, their biases stacked or None): the modules' weights
    and biases become views into the stacked tensors (their old storage is freed: no copy is kept)."""
    sizes = [m.out_features for m in modules]
    weight = torch.cat([m.weight.detach() for m in modules])  # [sum out, in]
    for m, w in zip(modules, weight.split(sizes)):
        m.weight.data = w
    if modules[0].bias is None:
        return weight, None
    bias = torch.cat([m.bias.detach() for m in modules])  # [sum out]
    for m, b in zip(modules, bias.split(sizes)):
        m.bias.data = b
    return weight, bias


@dataclass
class Pruning:
    """FastV's pruning of one prefill. The prefill fills in `kept`."""
    layer: int  # K: layers < K read the whole prompt, layer K - 1's attention ranks the candidates
    candidates: torch.Tensor  # [M] sequence indices of the tokens that may be dropped (the image tokens), ascending
    keep: int  # N: how many candidates layers >= K read (the top N by attention, in sequence order)
    kept: torch.Tensor | None = None  # [L'] after the prefill: the sequence indices layers >= K hold, ascending

    def choose(self, attention: torch.Tensor) -> torch.Tensor:
        """Layer K - 1's statistic [L] -> the sequence indices layers >= K read [L'] ascending (the original order):
        every token but the candidates, and the top `keep` of those. Sets `kept`."""
        top = attention[self.candidates].topk(self.keep).indices  # [N] into the candidates
        keep = torch.ones(attention.shape[0], dtype=torch.bool, device=attention.device)  # [L]
        keep[self.candidates] = False
        keep[self.candidates[top]] = True
        self.kept = keep.nonzero()[:, 0]
        return self.kept

    def kept_candidates(self) -> torch.Tensor:
        """After the prefill: which candidates were kept, as indices into `candidates` -> [N] ascending."""
        kept = self.kept[torch.isin(self.kept, self.candidates)]  # [N] sequence indices
        return torch.searchsorted(self.candidates, kept)


def check_full_attention(config) -> None:
    """Refuse, by name, a text config whose layers do not all attend over the whole causal context."""
    if getattr(config, "use_sliding_window", False):
        raise ValueError(f"use_sliding_window=True (sliding_window={getattr(config, 'sliding_window', None)}): "
                         "the Decoder implements full causal attention only")
    other = sorted(set(getattr(config, "layer_types", None) or ()) - {"full_attention"})
    if other:
        raise ValueError(f"layer_types {other}: the Decoder implements full_attention layers only")


class Decoder:
    def __init__(self, model):
        self.model = model
        self.lm = model.model.language_model
        self.config = self.lm.config
        check_full_attention(self.config)
        self.graphs_enabled = True  # off: the same arithmetic, eagerly (the GPU tests compare the two)
        self.fused: list[FusedProjections] | None = None  # per layer, after fuse(): q/k/v and gate/up as one matmul each
        self.safe = False  # safe mode: an fp32 residual stream, eagerly (a redo after fp16 overflow)
        self.states: OrderedDict[int, DecodeState] = OrderedDict()  # cache size -> its buffers, least recent first
        self.decode_graphs: dict[int, tuple] = {}  # cache size -> its captured decode step
        self.check = None  # called before each layer when set (the app's Stop raises there); not inside a compiled step
        self.compile_step = True  # compile the decode step before capturing it (off: ~40 kernels a layer)
        self.compiled_step = None  # torch.compile(self._step), made at the first capture
        self.compile_seconds = 0.0  # time spent capturing compiled decode steps (the compile is paid by the first)
        # all graphs run one at a time on one stream, so they share one memory pool
        self.pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None
        self.graphed_prefill = CUDAGraphed(self._prefill, pool=self.pool)
        self.graphed_extend = CUDAGraphed(self._extend, pool=self.pool)
        self.graphed_prior = CUDAGraphed(self._prior, pool=self.pool)
        # the caches and graphs above are shared by every caller: two generations at once would write into one
        # cache (and one decode state), so they take turns
        self.lock = threading.Lock()
        if self.device.type == "cuda" and cuda_graphs_allowed():
            self.fuse()

    def fuse(self) -> None:
        """
        Each layer's q/k/v projections and its MLP's gate/up projections become one matmul each (FusedProjections):
        at batch 1 a decode step is launch-bound, and k and v are small matmuls that take as long to launch as a
        large one. The weights are re-laid in place (the modules' become views, no memory is added), so call it
        where the model will stay: the Decoder does on CUDA (not on ZeroGPU, where nothing is captured).
        """
        self.fused = []
        for layer in self.lm.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv, bias = share_weights([attn.q_proj, attn.k_proj, attn.v_proj])
            gate_up, _ = share_weights([mlp.gate_proj, mlp.up_proj])
            split = (attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features)
            self.fused.append(FusedProjections(qkv, bias, split, gate_up))

    @property
    def device(self) -> torch.device:
        return self.lm.embed_tokens.weight.device

    @property
    def use_graphs(self) -> bool:
        return self.graphs_enabled and not self.safe and self.device.type == "cuda" and cuda_graphs_allowed()

    # ----------------------------------------------------------------------------- the explicit forward

    @property
    def dtype(self) -> torch.dtype:
        return self.lm.embed_tokens.weight.dtype

    def _rope(self, x, position_ids):
        """The stock M-RoPE tables (cos, sin) [1, L, hd], in the weights' dtype even when x is an fp32 stream."""
        return self.lm.rotary_emb(x[..., :1].to(self.dtype), position_ids)

    def forward(self, x, position_ids, deepstack=None, at=None, *, cache: KVCache | None = None, slots=None,
                masks=None, stop: int | None = None, pruning: Pruning | None = None,
                probe: AttentionProbe | None = None) -> torch.Tensor:
        """
        The one loop over the LLM's layers, for every pass the engine runs: x [B, L, D] embeddings at M-RoPE
        position_ids [3, B, L] -> fp32 logits [B, L, V], or at `at` [B, P] only [B, P, V] (a 150k vocabulary makes
        all L of them costly). With no cache it is the training forward (teacher forcing), differentiable.
        - deepstack: Qwen3-VL's features [k, B, L, D] (zeros outside image tokens), added after layers 0..k-1.
        - cache, slots [L]: each layer writes its keys and values there. masks None: attention is causal over x
          itself (a prompt's prefill); masks [layers, 1, 1, L, size]: each layer reads the whole cache through its
          own (a decode step, a follow-up turn's prefill).
        - stop = i: the prior pass, which returns the hidden state entering layer i [B, L, D] (no logits); i = the
          number of layers: the last layer's output, before the final norm.
        - probe: attention rows to read at some layers (an AttentionProbe; B = 1, no cache): the teacher's.
        - pruning: FastV. Layer K - 1's input ranks the candidates (last_token_attention of the last token); layers
          >= K read only the kept tokens, at their own positions and cache slots (pruning.kept is set).
        Before each layer `check` runs, if set (the app's Stop), except inside a compiled step.
        """
        cos, sin = self._rope(x, position_ids)
        x = x.float() if self.safe else x
        for i, layer in enumerate(self.lm.layers):
            if not torch.compiler.is_compiling() and self.check is not None:
                self.check()
            if i == stop:
                return x
            if pruning is not None and i == pruning.layer - 1:
                attention = self.last_token_attention(layer, x, cos, sin, x.shape[1] - 1)  # [L]
            if probe is not None and i in probe.layers:
                q, k = self._fp32_heads(layer, x, cos, sin)  # [1, H, L, hd] each
                probe.read.append(rows_attention(q * layer.self_attn.scaling, k, probe.rows, probe.keys))  # [H, A, n]
                probe.norms.append(x[0, probe.keys].float().norm(dim=-1))  # [n]
            x = self._layer(layer, x, cos, sin, cache, slots, None if masks is None else masks[i])
            x = self._add_deepstack(x, deepstack, i)
            if pruning is not None and i == pruning.layer - 1:
                kept = pruning.choose(attention)  # [L'] ascending: the original order
                x, cos, sin, slots = x[:, kept], cos[..., kept, :], sin[..., kept, :], slots[kept]  # [1, L', ...]
                deepstack = None if deepstack is None else deepstack[:, :, kept]  # [k, 1, L', D]
        if stop is not None:  # stop = the number of layers: every layer ran
            return x
        if at is not None:
            x = x.gather(1, at.unsqueeze(-1).expand(-1, -1, x.shape[-1]))  # [B, P, D]
        return self._logits(x)

    def _layer(self, layer, x, cos, sin, cache: KVCache | None = None, slots=None, mask=None):
        """
        One decoder layer, x [1, L, D] (in the weights' dtype, or fp32 in safe mode: the residual stream then
        never overflows fp16). With a cache, K/V are written at `slots` and attention reads it: causally over
        the L tokens themselves (mask None), or over the whole cache through `mask`.
        """
        attn = layer.self_attn
        h = layer.input_layernorm(x).to(self.dtype)
        B, L, _ = h.shape
        hd = attn.head_dim
        if self.fused is None:
            q, k = self._qk(attn, h)  # [1, H, L, hd], [1, Hkv, L, hd]
            v = attn.v_proj(h)  # [1, L, Hkv * hd]
        else:  # one matmul for the three
            fused = self.fused[attn.layer_idx]
            q, k, v = F.linear(h, fused.qkv, fused.qkv_bias).split(fused.qkv_split, -1)  # [1, L, H*hd], [1, L, Hkv*hd] x2
            q, k = self._heads(attn, q, k)
        v = v.view(B, L, -1, hd).transpose(1, 2)  # [1, Hkv, L, hd]
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None:  # prefill: attends over its own K/V (written at `slots`); decode: over the cache
            keys, values = cache.write(attn.layer_idx, slots, k, v)
            if mask is not None:
                k, v = keys, values
        o = _attend(q, k, v, attn.scaling, causal=mask is None, mask=mask)  # [1, H, L, hd]
        x = x + attn.o_proj(o.transpose(1, 2).reshape(B, L, -1))
        x = x + self._mlp(layer, layer.post_attention_layernorm(x).to(self.dtype))
        return x

    def _mlp(self, layer, h):
        """The layer's SwiGLU MLP, its gate and up projections one matmul when fused."""
        if self.fused is None:
            return layer.mlp(h)
        gate_up = self.fused[layer.self_attn.layer_idx].gate_up
        gate, up = F.linear(h, gate_up).chunk(2, -1)  # [1, L, I] x 2
        return layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)

    @classmethod
    def _qk(cls, attn, h):
        """Queries [1, H, L, hd] and keys [1, Hkv, L, hd] of h [1, L, D] through the stock projections."""
        return cls._heads(attn, attn.q_proj(h), attn.k_proj(h))

    @staticmethod
    def _heads(attn, q, k):
        """Projected queries [1, L, H * hd] and keys [1, L, Hkv * hd] as heads [1, H, L, hd], [1, Hkv, L, hd],
        per-head RMSNormed first where the model does it (Qwen3: q_norm/k_norm on [.., hd], before rotary)."""
        B, L, _ = q.shape
        q, k = q.view(B, L, -1, attn.head_dim), k.view(B, L, -1, attn.head_dim)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2)

    @staticmethod
    def _add_deepstack(x, deepstack, i: int):
        """After layer i < k: add its DeepStack features (zeros outside image tokens) in x's dtype, as stock does."""
        if deepstack is None or i >= deepstack.shape[0]:
            return x
        return x + deepstack[i].to(x.dtype)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        h = self.lm.norm(hidden)
        if self.safe:  # fp16 logits can overflow too (tied embeddings): compute them scaled down, then scale up
            return self.model.lm_head((h / SAFE_LOGIT_SCALE).to(self.dtype)).float() * SAFE_LOGIT_SCALE
        return self.model.lm_head(h.to(self.dtype)).float()

    def _fp32_heads(self, layer, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer's queries and keys of its input x [1, L, D], post-RoPE, recomputed in fp32 (whatever attention
        kernel the layer runs), grouped KV heads repeated -> [1, H, L, hd] each."""
        q, k = self._qk(layer.self_attn, layer.input_layernorm(x).to(self.dtype))  # [1, H, L, hd], [1, Hkv, L, hd]
        q, k = apply_rotary_pos_emb(q.float(), k.float(), cos.float(), sin.float())
        return q, k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)

    def last_token_attention(self, layer, x, cos, sin, last: int) -> torch.Tensor:
        """
        FastV's statistic: the attention of token `last` to every token 0..last in `layer` (x [1, L, D] its input),
        averaged over heads -> [last + 1], sums to 1.
        """
        q, k = self._fp32_heads(layer, x[:, :last + 1], cos[..., :last + 1, :], sin[..., :last + 1, :])
        every = torch.arange(last + 1, device=x.device)  # [L]: the last row sees all
        return rows_attention(q * layer.self_attn.scaling, k, every[-1:], every)[:, 0].mean(0)  # [L]

    # ----------------------------------------------------------------------------- the passes (forward's callers)

    def _prefill(self, embeds, position_ids, last, cap: int, deepstack=None):
        """A prompt into the cache of size cap: embeds [1, L, D], position_ids [3, 1, L], last [1] index of the
        prompt's last real token, deepstack None or [k, 1, L, D] -> its logits [1, V]. Tensors only: graphed."""
        slots = torch.arange(embeds.shape[1], device=embeds.device)
        return self.forward(embeds, position_ids, deepstack, last.view(1, 1), cache=self.states[cap], slots=slots)[:, 0]

    def _extend(self, embeds, position_ids, start, last, cap: int, deepstack=None):
        """
        A follow-up turn's prefill: embeds [1, L, D] at cache slots start..start + L - 1 (start [1]), each token
        attending to the slots before `start` (the earlier turns, already in the cache) and causally to its own
        turn -> logits of the token at `last` [1] [1, V]. Tensors only, so it can be captured as a graph.
        """
        L, layers = embeds.shape[1], len(self.lm.layers)
        slots = start + torch.arange(L, device=embeds.device)  # [L]
        seen = torch.arange(cap, device=embeds.device) <= slots.unsqueeze(1)  # [L, cap]: earlier turns and causal
        mask = torch.zeros(L, cap, dtype=self.dtype, device=embeds.device).masked_fill(~seen, float("-inf"))
        masks = mask.expand(layers, 1, 1, L, cap)  # the same for every layer
        return self.forward(embeds, position_ids, deepstack, last.view(1, 1), cache=self.states[cap], slots=slots,
                            masks=masks)[:, 0]

    def _prefill_pruned(self, embeds, position_ids, cap: int, pruning: Pruning, deepstack=None):
        """FastV's prefill (unpadded, eager): forward's `pruning` over embeds [1, L, D] -> the logits of the last
        prompt token (text: always kept) [1, V]. Sets pruning.kept; start() masks the dropped slots in layers >= K."""
        L = embeds.shape[1]
        last = torch.tensor([[L - len(pruning.candidates) + pruning.keep - 1]], device=embeds.device)  # in [L']
        return self.forward(embeds, position_ids, deepstack, last, cache=self.states[cap],
                            slots=torch.arange(L, device=embeds.device), pruning=pruning)[:, 0]

    def _step(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """
        One decode step that advances its own state, so a captured graph can be replayed per token -> (the next
        token [1, 1], this step's logits [1, V], the next token's probability [1]). It reads state.token: the
        previous token (or one forced in). Each layer its own mask: a pruned prefill left slots empty in some.
        """
        state.mask.index_fill_(-1, state.slot, 0.0)
        x = self.lm.embed_tokens(state.token)  # [1, 1, D]
        position_ids = state.rope.view(1, 1, 1).expand(3, 1, 1)
        logits = self.forward(x, position_ids, cache=state, slots=state.slot, masks=state.mask)[:, -1]  # [1, V]
        token = greedy(logits, state.logit_bias)  # [1, 1]
        state.token.copy_(torch.where(torch.isfinite(logits).all(), token, NON_FINITE))  # -1: the step overflowed
        state.slot.add_(1)
        state.rope.add_(1)
        return state.token, logits, probability(logits, token)

    def _prior(self, embeds, position_ids, query_weights, head_weights, index: int, deepstack=None):
        """
        The LLM up to layer `index` over [prompt + gestalt + question] (plus DeepStack, if any), then that layer's
        attention, recomputed in fp32, weighted over heads [H] and over query rows [L] -> ([L] attention mass per
        key, [L, D] the hidden states entering layer `index`).
        """
        x = self.forward(embeds, position_ids, deepstack, stop=index)  # [1, L, D] entering layer `index`
        cos, sin = self._rope(embeds, position_ids)
        layer = self.lm.layers[index]
        q, k = self._fp32_heads(layer, x, cos, sin)  # [1, H, L, hd] each
        return _weighted_attention(q, k, layer.self_attn.scaling, query_weights.float(),
                                   heads=head_weights.float()), x[0]  # [L], [L, D]

    # ----------------------------------------------------------------------------- entry points

    def _pad(self, embeds, position_ids, deepstack=None):
        """Pad at the end to the bucket (CUDA only); padded tokens continue the text positions (no DeepStack)."""
        L = embeds.shape[1]
        Lb = -(-L // BUCKET) * BUCKET if self.use_graphs else L
        if Lb == L:
            return embeds, position_ids, deepstack
        extra = Lb - L
        embeds = torch.cat([embeds, embeds.new_zeros(1, extra, embeds.shape[2])], dim=1)
        tail = position_ids[:, :, -1:] + torch.arange(1, extra + 1, device=position_ids.device)
        if deepstack is not None:
            deepstack = torch.cat([deepstack, deepstack.new_zeros(*deepstack.shape[:2], extra, deepstack.shape[3])], dim=2)
        return embeds, torch.cat([position_ids, tail], dim=2), deepstack

    @torch.no_grad()
    def answer_attention(self, embeds, position_ids, rows: torch.Tensor, keys: torch.Tensor, layers: list[int],
                         deepstack=None) -> tuple[torch.Tensor, torch.Tensor]:
        """
        The attention of the query rows `rows` [A] to the keys `keys` [n], per head, at each of `layers` (a forward
        up to the highest of them, none above, eager) -> ([len(layers), H, A, n] fp32, the keys' hidden-state norms
        entering each layer [len(layers), n]), in the order `layers` is given.
        """
        order = sorted(set(layers))
        if not order or order[0] < 0 or order[-1] >= len(self.lm.layers):
            raise ValueError(f"layers must be in 0..{len(self.lm.layers) - 1}, got {list(layers)}")
        probe = AttentionProbe(tuple(order), rows, keys)
        with self.lock:  # the check and the weights are shared with generation: one pass at a time
            self.forward(embeds, position_ids, deepstack, stop=order[-1] + 1, probe=probe)
        asked = [order.index(layer) for layer in layers]
        return torch.stack(probe.read)[asked], torch.stack(probe.norms)[asked]  # [len(layers), H, A, n], [.., n]

    @torch.no_grad()
    def prior_attention(self, embeds, position_ids, rows: torch.Tensor, heads: torch.Tensor, index: int,
                        deepstack=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of the query rows, weighted by rows [L], and the heads, weighted by heads [H] (both sum to 1:
        arr_coc.vlm.readout), to every token at layer `index` -> ([L], sums to 1; the hidden states entering that
        layer [L, D])."""
        L = embeds.shape[1]
        if not 0 <= index < len(self.lm.layers):
            raise ValueError(f"the prior's layer must be in 0..{len(self.lm.layers) - 1}, got {index}")
        embeds, position_ids, deepstack = self._pad(embeds, position_ids, deepstack)
        weights = torch.zeros(embeds.shape[1], device=embeds.device)
        weights[:L] = rows.to(embeds.device)
        run = self.graphed_prior if self.use_graphs else self._prior
        with self.lock:  # a graph's static inputs are shared: one caller replays it at a time
            attention, states = run(embeds, position_ids, weights, heads.to(embeds.device), index, deepstack)
        return attention[:L], states[:L]

    def _state(self, cap: int, dtype: torch.dtype) -> DecodeState:
        """The buffers of cache size `cap`, made on first use; beyond MAX_CACHES sizes the least recent is freed."""
        if cap in self.states:
            self.states.move_to_end(cap)
        else:
            while len(self.states) >= MAX_CACHES:
                old, _ = self.states.popitem(last=False)
                self.decode_graphs.pop(old, None)
                # the prefill graphs of that size write into its buffers: they go with it (cap is argument 3)
                for key in [key for key in self.graphed_prefill.graphs if key[3] == old]:
                    del self.graphed_prefill.graphs[key]
                for key in [key for key in self.graphed_extend.graphs if key[4] == old]:  # cap is argument 4
                    del self.graphed_extend.graphs[key]
            self.states[cap] = DecodeState.allocate(self.config, cap, dtype, self.device,
                                                    self.model.lm_head.out_features)
        return self.states[cap]

    def _decode_step(self, cap: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step on the cache of size cap (a graph replay on CUDA) -> _step's (token, logits, probability)."""
        state = self.states[cap]
        if not self.use_graphs:
            return self._step(state)
        if cap not in self.decode_graphs:
            self.decode_graphs[cap] = self._capture_step(state)
        graph, _, out = self.decode_graphs[cap]
        graph.replay()
        return out

    def _capture_step(self, state: DecodeState) -> tuple:
        """Capture the decode step of one cache size as a graph (compiled first, if compile_step) -> capture()'s
        (graph, args, out). The warm-up steps capture() runs move the state: it is put back after."""
        moved = (state.token, state.slot, state.rope, state.mask)
        saved = [t.clone() for t in moved]

        def restore():
            for t, s in zip(moved, saved):
                t.copy_(s)

        try:
            if self.compile_step:
                start = time.perf_counter()
                try:
                    return capture(self._compiled(state), (state,), self.pool)
                except Exception as e:  # no Triton or C compiler, an op Inductor cannot lower: run it uncompiled
                    warnings.warn(f"decode step not compiled ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                                  "capturing it as it is")
                    self.compile_step = False
                    restore()
                finally:
                    self.compile_seconds += time.perf_counter() - start
            return capture(self._step, (state,), self.pool)
        finally:
            restore()

    def _compiled(self, state: DecodeState):
        """The decode step compiled by Inductor, the cache length marked dynamic so one compile serves every size."""
        for t in state.keys + state.values:
            torch._dynamo.maybe_mark_dynamic(t, 2)  # [1, Hkv, cap, hd]
        torch._dynamo.maybe_mark_dynamic(state.mask, 4)  # [layers, 1, 1, 1, cap]
        if self.compiled_step is None:
            self.compiled_step = torch.compile(self._step, fullgraph=True, options={"emulate_precision_casts": True})
        return self.compiled_step

    @torch.no_grad()
    def generate(self, embeds: torch.Tensor, position_ids: torch.Tensor, max_new_tokens: int, eos_token_ids: list[int],
                 min_new_tokens: int = 0, deepstack=None, pruning: Pruning | None = None, history=None,
                 keep: bool = False):
        """
        Greedy decoding, as generate(do_sample=False) does it, a token at a time: a generator that yields each new
        token id as it is made -> (new ids [1, T] with EOS if reached, each new token's probability [T] under the
        model's softmax, safe_mode, if `keep` the cache after it as (keys, values, the next token's M-RoPE
        position): every token so far but the last generated one, not yet read) as its value.
        deepstack: None, or Qwen3-VL's DeepStack features over the prompt [k, 1, L, D] (zeros outside image tokens).
        pruning: None, or FastV's (the prefill sets pruning.kept).
        history: a conversation's saved cache after its earlier turns (its keys, values, length: base.SavedCache);
        the prompt is then the next turn's tokens only, at positions after them. keep: return a copy of the cache
        after this turn (the next turn's history).
        If a step's logits are not finite (fp16 overflow), the request is redone in safe mode, and only the tokens
        after those already yielded are yielded, so a caller never sees garbage. One generation at a time
        (self.lock, held from the first token asked for to the last); closing the generator (the app's Stop) ends
        the loop at the token it yielded last and lets go of the engine.
        """
        if (history is not None or keep) and pruning is not None:
            raise ValueError("FastV's pruned prefill cannot be part of a conversation: its layers read two lengths")
        args = (embeds, position_ids, max_new_tokens, eos_token_ids, min_new_tokens, deepstack, pruning, history, keep)
        with self.lock:
            try:
                ids, probs, kept = yield from self._generate(*args)
                return ids, probs, False, kept
            except NonFiniteLogits as overflow:
                # masked slots still enter attention as 0 x value: inf/NaN left in the cache would poison every
                # later step (and request), so the overflowed run's cache is wiped before the redo
                for state in self.states.values():
                    state.wipe()
                self.safe = True
                try:  # the tokens yielded before the overflow were finite: yield only what comes after them
                    ids, probs, kept = yield from self._generate(*args, yielded=overflow.yielded)
                    return ids, probs, True, kept
                finally:
                    self.safe = False

    def start(self, embeds, position_ids, max_new_tokens: int, deepstack=None, suppress: list[int] = (),
              pruning: Pruning | None = None, history=None):
        """
        Prefill a prompt into a cache big enough for max_new_tokens more and set the decode state to continue
        after it -> (cache size, logits of the prompt's last token [1, V]). `suppress`: token ids kept off the
        argmax (EOS under min_new_tokens) until state.logit_bias is cleared. `pruning`: FastV's prefill instead.
        `history`: a conversation's earlier turns, restored into the cache first; the prompt follows them.
        """
        H = 0 if history is None else history.length
        L = H + embeds.shape[1]  # the cache's tokens after this prefill
        cap = -(-(L + BUCKET + max_new_tokens) // CACHE_STEP) * CACHE_STEP
        state = self._state(cap, embeds.dtype)
        padded, padded_ids, padded_deepstack = self._pad(embeds, position_ids, deepstack)
        last = torch.tensor([L - H - 1], device=self.device)  # the prompt's last real token, in the prompt
        run = self.graphed_prefill if self.use_graphs else self._prefill
        state.logit_bias.zero_()
        state.logit_bias[torch.tensor(list(suppress), dtype=torch.long, device=self.device)] = float("-inf")
        if history is not None:
            state.restore(history.keys, history.values)
            extend = self.graphed_extend if self.use_graphs else self._extend
            start = torch.tensor([H], device=self.device)
            logits = extend(padded, padded_ids, start, last, cap, padded_deepstack)  # [1, V]
        elif pruning is None:
            logits = run(padded, padded_ids, last, cap, padded_deepstack)  # [1, V]
        else:
            logits = self._prefill_pruned(embeds, position_ids, cap, pruning, deepstack)  # [1, V]
        token = greedy(logits, state.logit_bias)  # [1, 1]
        # the decode state starts after the real prompt: padded slots are masked out and overwritten
        state.token.copy_(torch.where(torch.isfinite(logits).all(), token, NON_FINITE))
        state.rope.copy_(position_ids[:, 0, -1].max().view(1) + 1)
        if pruning is None:
            state.written(L)
        else:  # layers >= K wrote only the prompt slots the pruning kept
            state.written(L, pruning.layer, pruning.kept)
        return cap, logits

    def _generate(self, embeds, position_ids, max_new_tokens, eos_token_ids, min_new_tokens, deepstack, pruning,
                  history, keep, yielded=0):
        """The decode loop (generate's): the prefill's token, then one step per token, each yielded as it is made
        (but the first `yielded`: a run before a safe-mode redo yielded them) -> (ids, probs, kept) as its value."""
        cap, logits = self.start(embeds, position_ids, max_new_tokens, deepstack,
                                 eos_token_ids if min_new_tokens > 0 else (), pruning, history)
        state = self.states[cap]
        token = state.token.clone()
        prob = probability(logits, token)  # [1]
        new, probs = [], []
        for i in range(max_new_tokens):
            t = int(token)
            if t == NON_FINITE:
                raise NonFiniteLogits(f"non-finite logits at new token {i}", yielded=max(yielded, i))
            new.append(t)
            probs.append(prob.clone())  # copied before the next step overwrites a graph's output
            if i >= yielded:
                yield t
            if t in eos_token_ids or i + 1 == max_new_tokens:
                break
            if i + 1 == min_new_tokens:
                state.logit_bias.zero_()
            token, _, prob = self._decode_step(cap)
        kept = (*state.saved(), int(state.rope)) if keep else None  # the prompt and every new token but the last
        return torch.tensor([new], device=self.device), torch.cat(probs).float(), kept


class NonFiniteLogits(RuntimeError):
    """A forward produced NaN or inf logits (fp16 overflow): the request is redone in safe mode."""

    def __init__(self, message: str, yielded: int):
        super().__init__(message)
        self.yielded = yielded  # tokens already yielded to the caller
