"""
The decoder's static KV cache (gpt-fast's `KVCache`, for every layer in one object): pre-allocated key and value
buffers of one size, which slots each layer has written (an additive mask per layer: FastV's pruned layers hold
fewer), and the slot the next token goes to. `DecodeState` adds what a captured decode step reads and advances in
place (the last token, its M-RoPE position, the logit bias), so a CUDA graph can replay it per token.

    state = DecodeState.allocate(text_config, size=2048, dtype=torch.bfloat16, device="cuda", vocab=151936)
    keys, values = state.write(layer=3, slots=torch.arange(L), k=k, v=v)   # [1, Hkv, 2048, hd] each
    state.written(L)                                  # slots 0..L-1 read by every layer; the next token at L
    keys, values = state.saved()                      # copies of slots 0..slot-1 (a conversation's context)
"""

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    """Every layer's keys and values at one size, and which slots each layer holds."""
    keys: list[torch.Tensor]  # per layer [1, Hkv, size, hd]
    values: list[torch.Tensor]  # per layer [1, Hkv, size, hd]
    mask: torch.Tensor  # [layers, 1, 1, 1, size] additive, per layer: 0 for the slots it wrote, -inf for the rest
    slot: torch.Tensor  # [1] the slot the next token is written to

    @property
    def size(self) -> int:
        return self.keys[0].shape[2]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """k, v [1, Hkv, L, hd] into layer's buffers at slots [L] -> the layer's whole buffers (what a step reads)."""
        keys, values = self.keys[layer], self.values[layer]
        keys.index_copy_(2, slots, k)
        values.index_copy_(2, slots, v)
        return keys, values

    def written(self, n: int, from_layer: int | None = None, kept: torch.Tensor | None = None) -> None:
        """Slots 0..n-1 hold a prompt (every layer's), the next token goes to slot n; layers >= from_layer hold only
        the slots `kept` [L'] of it (FastV's pruned layers)."""
        self.slot.fill_(n)
        self.mask.fill_(float("-inf"))
        self.mask[..., :n] = 0.0
        if from_layer is not None:
            self.mask[from_layer:, ..., :n] = float("-inf")
            self.mask[from_layer:, ..., kept] = 0.0

    def restore(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Saved keys and values (per layer [1, Hkv, n, hd]) back into slots 0..n-1."""
        n = keys[0].shape[2]
        for buffer, saved in zip(self.keys + self.values, keys + values):
            buffer[:, :, :n].copy_(saved)

    def saved(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of every slot before the next token's -> (keys, values), per layer [1, Hkv, slot, hd]."""
        n = int(self.slot)
        return [t[:, :, :n].clone() for t in self.keys], [t[:, :, :n].clone() for t in self.values]

    def wipe(self) -> None:
        """Zero every buffer (an overflowed run's inf/NaN would enter later attention as 0 x value)."""
        for t in self.keys + self.values:
            t.zero_()


@dataclass
class DecodeState(KVCache):
    """A cache and the inputs one decode graph reads and advances in place (one set per cache size)."""
    token: torch.Tensor  # [1, 1] the last token, input of the next step
    rope: torch.Tensor  # [1] M-RoPE position of the next token (t = h = w for text)
    logit_bias: torch.Tensor  # [V] added before argmax: -inf on EOS while min_new_tokens is not reached

    @classmethod
    def allocate(cls, config, size: int, dtype: torch.dtype, device: torch.device, vocab: int) -> "DecodeState":
        """Empty buffers of `size` slots for a text config's layers, KV heads and head width."""
        hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape, layers = (1, config.num_key_value_heads, size, hd), config.num_hidden_layers
        return cls(keys=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
                   values=[torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)],
                   mask=torch.full((layers, 1, 1, 1, size), float("-inf"), dtype=dtype, device=device),
                   slot=torch.zeros(1, dtype=torch.long, device=device),
                   token=torch.zeros(1, 1, dtype=torch.long, device=device),
                   rope=torch.zeros(1, dtype=torch.long, device=device),
                   logit_bias=torch.zeros(vocab, device=device))
