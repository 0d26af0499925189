"""
The 13-channel texture array: cheap, query-agnostic image features at candidate-grid resolution.

Every channel is in [0, 1], computed batched on the images' device under no_grad, with no Python loop
over pixels or cells (docs/ARCHITECTURE.md §1). CHANNELS names each channel and says what it measures.

    from arr_coc.relevance.texture import generate_texture_array, CHANNELS
    tex = generate_texture_array(images, (32, 32))  # images [B,3,H,W] in [0,1] -> [B,13,32,32]
"""

import functools

import torch
import torch.nn.functional as F

# (name, meaning) in channel order; the app prints the meanings under the channel grid.
CHANNELS: tuple[tuple[str, str], ...] = (
    ("red", "mean red of the cell"),
    ("green", "mean green of the cell"),
    ("blue", "mean blue of the cell"),
    ("pos_y", "cell row: 0 at the top, 1 at the bottom"),
    ("pos_x", "cell column: 0 at the left, 1 at the right"),
    ("sobel_x", "horizontal gradient energy (vertical edges), sqrt-compressed"),
    ("sobel_y", "vertical gradient energy (horizontal edges), sqrt-compressed"),
    ("edge_magnitude", "gradient magnitude (edges of any orientation), sqrt-compressed"),
    ("spectral_saliency", "spectral-residual saliency: what the image's own spectrum does not predict"),
    ("colour_contrast", "centre-surround contrast of the cell's colour against its neighbourhood"),
    ("highpass_energy", "Laplacian energy: fine detail such as text strokes, sqrt-compressed"),
    ("colour_variance", "colour variance inside the cell: texture complexity, sqrt-compressed"),
    ("colour_rarity", "1 - share of cells in the cell's k-means colour cluster: how rare its colour is"),
)
CHANNEL_NAMES = tuple(name for name, _ in CHANNELS)
INK_CHANNEL = CHANNEL_NAMES.index("highpass_energy")  # the ink of a cell (text strokes): what the regions_ink
# strategy covers with the budget relevance does not need
CONTENT_CHANNELS = tuple(i for i, name in enumerate(CHANNEL_NAMES) if not name.startswith("pos_"))  # not position

DETAIL_PX = 14  # working pixels per cell side: edges are measured at one scale whatever the view size
SALIENCY_PX = 64  # side of the spectral-residual working image (the classic method uses 64x64)
KMEANS_K = 4  # colour clusters for colour_rarity
KMEANS_ITERS = 8  # Lloyd iterations, fixed so the cost is fixed


SOBEL_X = ((-1, 0, 1), (-2, 0, 2), (-1, 0, 1))
SOBEL_Y = ((-1, -2, -1), (0, 0, 0), (1, 2, 1))
LAPLACIAN = ((0, 1, 0), (1, -4, 1), (0, 1, 0))


@functools.lru_cache(maxsize=None)
def _kernels(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The three 3x3 filters as one [3, 1, 3, 3] weight, made once per device (CUDA graphs need no uploads)."""
    return torch.tensor([SOBEL_X, SOBEL_Y, LAPLACIAN], dtype=dtype, device=device).unsqueeze(1)


def _filters(gray: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sobel x, Sobel y and Laplacian of a [B,1,H,W] map in one conv, replicate-padded so borders are not edges."""
    out = F.conv2d(F.pad(gray, (1, 1, 1, 1), mode="replicate"), _kernels(gray.dtype, gray.device))
    return out[:, 0:1], out[:, 1:2], out[:, 2:3]


def _pool(x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Area-average a [B,C,H,W] map onto the [gh, gw] grid. Where the grid divides the map (the working image is
    DETAIL_PX a cell; Qwen2-VL's native view is twice that) the windows are avg_pool2d's, one thread an output;
    CUDA's adaptive pooling runs one block row per plane, 15 blocks for an RGB image."""
    (H, W), (gh, gw) = x.shape[-2:], grid
    if H % gh == 0 and W % gw == 0:
        return F.avg_pool2d(x, (H // gh, W // gw))
    return F.adaptive_avg_pool2d(x, grid)


def minmax(x: torch.Tensor, floor: float = 1e-4) -> torch.Tensor:
    """
    Per-image ([B, ...]) min-max to [0, 1], the one scaler of every map in the package. A span below `floor`
    counts as rounding (texture inputs are O(1)), so a flat map becomes zeros, not amplified noise; floor=0
    scales any span. NaN/inf are left out of the range and become 0.
    """
    finite = x.isfinite()
    shape = (-1, *[1] * (x.dim() - 1))
    lo = x.masked_fill(~finite, float("inf")).flatten(1).amin(1).view(shape)
    hi = x.masked_fill(~finite, float("-inf")).flatten(1).amax(1).view(shape)
    span = (hi - lo).clamp_min(max(floor, torch.finfo(x.dtype).tiny))  # tiny: a flat map is 0 / tiny = 0
    return torch.where(finite, (x - lo) / span, torch.zeros((), dtype=x.dtype, device=x.device))


def _spectral_residual(gray: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Hou & Zhang (2007): the log-amplitude spectrum minus its local mean marks the unexpected parts."""
    g = F.interpolate(gray, size=(SALIENCY_PX, SALIENCY_PX), mode="bilinear", antialias=True, align_corners=False)
    spectrum = torch.fft.fft2(g.squeeze(1))  # [B, S, S] complex
    log_amp = torch.log(spectrum.abs() + 1e-8)
    smooth = F.avg_pool2d(F.pad(log_amp.unsqueeze(1), (1, 1, 1, 1), mode="replicate"), 3, stride=1).squeeze(1)
    residual = torch.exp((log_amp - smooth) + 1j * torch.angle(spectrum))
    saliency = (torch.fft.ifft2(residual).abs() * SALIENCY_PX).pow(2).unsqueeze(1)  # [B, 1, S, S], O(1) values
    saliency = F.avg_pool2d(F.pad(saliency, (2, 2, 2, 2), mode="replicate"), 5, stride=1)  # the method's blur
    has_content = g.flatten(1).std(1) > 1e-3  # a flat image's spectrum is all rounding: no saliency
    return minmax(_pool(saliency, grid)) * has_content.view(-1, 1, 1, 1)


def _colour_contrast(rgb: torch.Tensor) -> torch.Tensor:
    """Distance of each cell's opponent colour from the mean of its neighbourhood (about a quarter of the grid)."""
    r, g, b = rgb.unbind(1)
    opponent = torch.stack([(r + g + b) / 3, r - g, (r + g) / 2 - b], dim=1)  # [B, 3, gh, gw]
    k = max(3, (min(rgb.shape[-2:]) // 4) | 1)  # odd window
    surround = F.avg_pool2d(opponent, k, stride=1, padding=k // 2, count_include_pad=False)
    return minmax((opponent - surround).norm(dim=1, keepdim=True))


def _colour_rarity(rgb: torch.Tensor) -> torch.Tensor:
    """k-means over cell colours (batched Lloyd), then 1 - the share of cells in each cell's cluster."""
    B, _, gh, gw = rgb.shape
    points = rgb.flatten(2).transpose(1, 2)  # [B, N, 3]
    N = points.shape[1]
    # deterministic init: the cells at evenly spaced luminance quantiles
    order = points.mean(-1).argsort(dim=1)  # [B, N]
    picks = order[:, ((torch.arange(KMEANS_K, device=rgb.device) + 0.5) * N / KMEANS_K).long()]  # [B, k]
    centroids = torch.gather(points, 1, picks.unsqueeze(-1).expand(-1, -1, 3))  # [B, k, 3]
    clusters = torch.arange(KMEANS_K, device=rgb.device)
    for _ in range(KMEANS_ITERS):
        assign = torch.cdist(points, centroids).argmin(-1)  # [B, N]
        onehot = (assign.unsqueeze(-1) == clusters).to(points.dtype)  # [B, N, k]; F.one_hot would sync to check
        counts = onehot.sum(1)  # [B, k]
        sums = onehot.transpose(1, 2) @ points  # [B, k, 3]
        centroids = torch.where(counts.unsqueeze(-1) > 0, sums / counts.clamp_min(1).unsqueeze(-1), centroids)
    share = torch.gather(counts, 1, assign) / N  # [B, N]
    return (1 - share).view(B, 1, gh, gw)


@torch.no_grad()
def generate_texture_array(images: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """images [B,3,H,W] in [0,1] -> textures [B,13,gh,gw] in [0,1], in CHANNELS order."""
    if images.dim() != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be [B,3,H,W], got {tuple(images.shape)}")
    gh, gw = grid
    B = images.shape[0]
    size = (gh * DETAIL_PX, gw * DETAIL_PX)
    shrinking = images.shape[-2] >= size[0] and images.shape[-1] >= size[1]
    # area (the mean of each output pixel's window) where shrinking, else bilinear
    work = _pool(images.float(), size) if shrinking else F.interpolate(images.float(), size=size, mode="bilinear")
    work = torch.nan_to_num(work, nan=0.0).clamp(0, 1)  # [B, 3, h, w], sanitised after shrinking: fewer pixels
    gray = (0.299 * work[:, 0:1] + 0.587 * work[:, 1:2] + 0.114 * work[:, 2:3])  # [B, 1, h, w]
    # Sobel normalised so a 0->1 step gives 1; sqrt spreads the small energies of natural images
    gx, gy, lap = _filters(gray)
    gx, gy = gx / 4, gy / 4
    energy = torch.cat([work, work.pow(2), gx.abs(), gy.abs(), (gx.pow(2) + gy.pow(2)).sqrt() / 2**0.5,
                        lap.abs() / 4], dim=1)  # [B, 10, h, w]: every map that is averaged per cell, in one pass
    rgb, square, sobel_x, sobel_y, edges, laplacian = _pool(energy, grid).split((3, 3, 1, 1, 1, 1), dim=1)
    sobel_x, sobel_y, edges, laplacian = sobel_x.sqrt(), sobel_y.sqrt(), edges.sqrt(), laplacian.sqrt()
    variance = (square - rgb.pow(2)).clamp_min(0).mean(1, keepdim=True)  # [B, 1, gh, gw]
    variance = (4 * variance).clamp(0, 1).sqrt()  # max variance of a [0,1] signal is 1/4

    pos_y = torch.linspace(0, 1, gh, device=work.device).view(1, 1, gh, 1).expand(B, 1, gh, gw)
    pos_x = torch.linspace(0, 1, gw, device=work.device).view(1, 1, 1, gw).expand(B, 1, gh, gw)

    textures = torch.cat([
        rgb, pos_y, pos_x, sobel_x, sobel_y, edges,
        _spectral_residual(gray, grid), _colour_contrast(rgb), laplacian, variance, _colour_rarity(rgb),
    ], dim=1)  # [B, 13, gh, gw]
    return torch.nan_to_num(textures, nan=0.0).clamp(0, 1)


def is_flat(textures: torch.Tensor, tolerance: float = 1e-3) -> torch.Tensor:
    """[B, 13, gh, gw] -> [B] bool: no channel but position varies across cells (an image with nothing in it)."""
    content = torch.stack([textures[:, i] for i in CONTENT_CHANNELS], 1)  # plain slices: a CUDA graph captures them
    return content.flatten(2).std(-1, unbiased=False).amax(-1) < tolerance  # (a list index uploads its indices)
