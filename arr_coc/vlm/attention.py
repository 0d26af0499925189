"""
The vision tower's last-block attention, read out explicitly: what VisionZip scores its cells with.

VisionAttentionProbe stands in for one ViT block's attention call (QwenVision.block's `attend`, vision.py): it computes the
softmax attention itself, chunked over queries so that a 16384-patch view fits, returns the same output as
sdpa, and records what each patch receives (averaged over heads, summed over queries) and each patch's key
(averaged over heads). VLM.encode_view_attention runs the tower with it at the last block.

    probe = VisionAttentionProbe(scale=block.attn.scaling)
    x = vlm.vision.block(block, x, cos, sin, attend=probe)        # as the stock block, plus the readout
    probe.received, probe.keys                                       # [N], [N, hd]
"""

import torch

QUERY_CHUNK = 512  # queries per softmax: [heads, 512, 16384] fp32 scores are 512 MiB at 16 heads


class VisionAttentionProbe:
    """One block's full attention, computed explicitly, recording the attention received and the keys per patch."""

    def __init__(self, scale: float, chunk: int = QUERY_CHUNK):
        self.scale = scale  # the block's softmax scale (head_dim ** -0.5)
        self.chunk = chunk  # queries per chunk
        self.received: torch.Tensor | None = None  # [N] attention each patch receives: head mean, query sum
        self.keys: torch.Tensor | None = None  # [N, hd] each patch's key (post-rotary, as attention reads it), head mean

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v [1, heads, N, hd] -> the attention output [1, heads, N, hd]; records received and keys."""
        N = q.shape[2]
        out = torch.empty_like(q)
        received = torch.zeros(N, device=q.device, dtype=torch.float32)
        kf, vf = k.float(), v.float()
        for start in range(0, N, self.chunk):
            stop = min(start + self.chunk, N)
            scores = torch.matmul(q[:, :, start:stop].float(), kf.transpose(-1, -2)) * self.scale  # [1, H, c, N]
            attention = scores.softmax(dim=-1)  # [1, H, c, N]
            out[:, :, start:stop] = torch.matmul(attention, vf).to(q.dtype)  # [1, H, c, hd]
            received += attention[0].mean(0).sum(0)  # [N]
        self.received, self.keys = received, kf[0].mean(0)  # [N], [N, hd]
        return out

    def reorder(self, order: torch.Tensor) -> None:
        """The recordings are in sequence order, entry j being patch order[j]: put each back at its patch's index."""
        self.received = torch.empty_like(self.received).index_copy_(0, order, self.received)
        self.keys = torch.empty_like(self.keys).index_copy_(0, order, self.keys)

    def per_cell(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(received [K], keys [K, hd]) of each cell: the mean over its 4 patches (4 per cell, in the cells' order)."""
        return self.received.view(-1, 4).mean(1), self.keys.view(-1, 4, self.keys.shape[-1]).mean(1)
