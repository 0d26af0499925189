"""
Images and views: every image a pipeline reads, as the family's cells see it (one cell = one merged visual token,
28 px for Qwen2-VL and Qwen2.5-VL, 32 px for Qwen3-VL).

The upload is checked and converted once (any mode, animated, 16-bit) and sent to the device as uint8; each
view is resized there when first asked for. The candidate grid is the image at its native resolution (the
image processor's own smart_resize, capped at max_cells), bounded below by twice the gestalt grid per side.

    views = make_views(pil_image, max_cells=4096, device="cuda", cell=vlm.cell, min_pixels=vlm.min_pixels)
    views.tensor("gestalt")      # [1, 3, 448, 448] in [0, 1]
    views.candidate_grid         # (64, 64) for a 1792 px square
"""

import ctypes
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageSequence

from arr_coc.settings import PipelineConfig
from arr_coc.errors import InputError

PATCH = 14  # ViT patch side in px (Qwen2-VL, Qwen2.5-VL)
MERGE = 2  # 2x2 patches merge into one LLM token
CELL = PATCH * MERGE  # 28 px: one merged token = one candidate cell
PIPELINE = PipelineConfig()  # the default settings: views' sizes and caps
MAX_ASPECT = 32.0  # wider or taller images are squeezed to this aspect ratio (Qwen refuses > 200)
MIN_CELLS = 4  # without the image processor's own bound, a view is at least 4 cells (Qwen2-VL's 56 x 56 px)


def to_rgb(image) -> Image.Image:
    """Any PIL image (grayscale, RGBA, palette, 16-bit, float, CMYK, animated) -> 8-bit RGB, first frame; an RGB
    still image is returned as it is (no copy: callers only read it)."""
    if image is None:
        raise InputError("no image: upload an image first")
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    if not isinstance(image, Image.Image):
        raise InputError(f"expected a PIL image, got {type(image).__name__}")
    if getattr(image, "is_animated", False):
        image = next(ImageSequence.Iterator(image)).copy()  # animated: the first frame
    if image.width < 1 or image.height < 1:
        raise InputError(f"the image is empty ({image.width}x{image.height})")
    if image.mode == "RGB":
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):  # 16-bit or float: rescale its range to 8 bits
        image = Image.fromarray(rescaled(np.asarray(image, dtype=np.float64)), mode="L")
    if image.mode == "P":
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):  # transparency: composite on white, as a viewer shows it
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, rgba)
    return image.convert("RGB")


def rescaled(a: np.ndarray) -> np.ndarray:
    """
    A 16-bit or float image's values -> uint8 over the range of its finite values: one +inf pixel (or NaN) in a float
    TIFF leaves the others' contrast as it is (it once made the whole image black); +inf shows white, -inf and NaN
    black. A flat or wholly non-finite image is black.
    """
    finite = a[np.isfinite(a)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    scaled = (a - lo) / (hi - lo) if hi > lo else np.where(a == np.inf, 1.0, 0.0)
    return (np.clip(np.nan_to_num(scaled, nan=0.0, posinf=1.0, neginf=0.0), 0, 1) * 255).round().astype(np.uint8)


def fit_grid(width: int, height: int, max_tokens: int) -> tuple[int, int]:
    """The (rows, cols) token grid with at most max_tokens tokens closest to the image's aspect ratio."""
    aspect = min(max(width / height, 1 / MAX_ASPECT), MAX_ASPECT)
    rows = max(1, round(math.sqrt(max_tokens / aspect)))
    cols = max(1, min(max_tokens // rows, round(rows * aspect)))
    return rows, cols


def native_grid(width: int, height: int, max_cells: int, cell: int = CELL,
                min_pixels: int | None = None) -> tuple[int, int]:
    """
    The (rows, cols) grid of cells (one merged token each: 28 px for Qwen2-VL, 32 px for Qwen3-VL) that stock
    Qwen reads this image at: the image processor's own smart_resize with its min_pixels (the family's: 56^2
    for Qwen2-VL, 256^2 for Qwen3-VL; default MIN_CELLS cells) and max_pixels = max_cells cells (aspect kept;
    beyond MAX_ASPECT squeezed to it).
    """
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    width, height = min(width, round(height * MAX_ASPECT)), min(height, round(width * MAX_ASPECT))
    min_pixels = MIN_CELLS * cell**2 if min_pixels is None else min_pixels
    h, w = smart_resize(max(height, 1), max(width, 1), factor=cell, min_pixels=min_pixels, max_pixels=max_cells * cell**2)
    return h // cell, w // cell


@dataclass(eq=False)
class Views:
    """
    Every pipeline's view of one image. The original is uploaded once (uint8) and each view is resized on
    the model's device when first asked for: `tensor(name)` -> [1, 3, h, w] in [0, 1]; the PIL attributes
    (`gestalt`, `native`, `highres`, `budget`) are for drawing only.
    """
    image: Image.Image  # the original image, RGB
    pixels: torch.Tensor  # [1, 3, H, W] uint8, the original on the device
    gestalt_grid: tuple[int, int]  # (gh, gw) gestalt tokens: the low-res view
    native_grid: tuple[int, int]  # (nh, nw) tokens of the native view: what the stock model reads (`full`)
    candidate_grid: tuple[int, int]  # (GH, GW) candidate cells of the high-res view: native, >= 2x the gestalt per side
    budget_grid: tuple[int, int]  # (bh, bw) tokens of the same-budget baseline view (PipelineConfig.budget_tokens)
    cell: int = CELL  # px per cell side: one merged token (28 for Qwen2-VL's 14 px patches merged 2x2, 32 for Qwen3-VL)
    made_at: tuple = ()  # the settings a caller made them at (pipelines.answer.views_for: reused only at the same ones)
    _cache: dict = field(default_factory=dict, repr=False)

    def grid(self, name: str) -> tuple[int, int]:
        return {"gestalt": self.gestalt_grid, "native": self.native_grid, "highres": self.candidate_grid,
                "budget": self.budget_grid}[name]

    def tensor(self, name: str) -> torch.Tensor:
        """The view `name` as [1, 3, grid * cell px] in [0, 1] on the device, resized once (views of one size are one)."""
        rows, cols = self.grid(name)
        key = (rows * self.cell, cols * self.cell)
        if key not in self._cache:
            self._cache[key] = resize(self.pixels, (rows, cols), self.cell)
        return self._cache[key]

    def pil(self, name: str) -> Image.Image:
        key = ("pil", name)
        if key not in self._cache:
            rgb = self.tensor(name)[0].permute(1, 2, 0).mul(255).round().to(torch.uint8).cpu().numpy()
            self._cache[key] = Image.fromarray(rgb)
        return self._cache[key]

    gestalt = property(lambda self: self.pil("gestalt"))
    native = property(lambda self: self.pil("native"))
    highres = property(lambda self: self.pil("highres"))
    budget = property(lambda self: self.pil("budget"))

    def cell_box(self, row: int, col: int) -> list[int]:
        """Pixel box [x0, y0, x1, y1] of a candidate cell in the original image."""
        gh, gw = self.candidate_grid
        sx, sy = self.image.width / gw, self.image.height / gh
        return [round(col * sx), round(row * sy), round((col + 1) * sx), round((row + 1) * sy)]

    def box_coverage(self, box, grid: tuple[int, int] | None = None) -> torch.Tensor:
        """Fraction of each candidate cell (or each cell of `grid`, e.g. the native grid) inside a pixel box
        [x0, y0, x1, y1] of the original image -> [GH, GW]."""
        return box_coverage(box, self.image.size, grid or self.candidate_grid)


def box_coverage(box, image_size: tuple[int, int], grid: tuple[int, int]) -> torch.Tensor:
    """Fraction of each cell of `grid`, laid over an image of image_size (width, height), inside a pixel box
    [x0, y0, x1, y1] of it -> [gh, gw]."""
    gh, gw = grid
    sx, sy = image_size[0] / gw, image_size[1] / gh
    x0, y0, x1, y1 = (float(v) for v in box)
    cols, rows = torch.arange(gw, dtype=torch.float), torch.arange(gh, dtype=torch.float)
    cover_x = ((cols + 1) * sx).clamp(max=x1).sub((cols * sx).clamp(min=x0)).clamp(min=0) / sx  # [gw]
    cover_y = ((rows + 1) * sy).clamp(max=y1).sub((rows * sy).clamp(min=y0)).clamp(min=0) / sy  # [gh]
    return cover_y[:, None] * cover_x[None, :]


def resize(pixels: torch.Tensor, grid: tuple[int, int], cell: int = CELL) -> torch.Tensor:
    """
    The one resize path of every pipeline: [1, 3, H, W] (uint8 or [0, 1]) -> [1, 3, grid * cell px] in [0, 1],
    bicubic with antialiasing (as the image processors do), on the tensor's device; no resampling at the same size.
    """
    x = pixels.float() / 255.0 if pixels.dtype == torch.uint8 else pixels.float()
    size = (grid[0] * cell, grid[1] * cell)
    if tuple(x.shape[-2:]) == size:
        return x
    return F.interpolate(x, size=size, mode="bicubic", antialias=True, align_corners=False).clamp(0, 1)


def make_views(image, gestalt_tokens: int = PIPELINE.gestalt_max_tokens, budget_tokens: int = PIPELINE.budget_tokens,
               max_cells: int = PIPELINE.max_cells, device: torch.device | str = "cpu", cell: int = CELL,
               min_pixels: int | None = None) -> Views:
    """
    All views of one image (defaults: PipelineConfig's; cell and min_pixels: the VLM's). The candidate grid is
    the native grid (at most max_cells cells), bounded below by twice the gestalt grid per side, so even a
    tiny image offers well over a budget's worth of candidates.
    """
    rgb = to_rgb(image)
    gh, gw = fit_grid(rgb.width, rgb.height, gestalt_tokens)
    bh, bw = fit_grid(rgb.width, rgb.height, budget_tokens)
    nh, nw = native_grid(rgb.width, rgb.height, max_cells, cell, min_pixels)
    ch, cw = max(nh, 2 * gh), max(nw, 2 * gw)
    if ch * cw > max_cells:  # the two grids round the aspect differently: keep the cap strict
        ch, cw = 2 * gh, 2 * gw
    return Views(rgb, upload(rgb, device), (gh, gw), (nh, nw), (ch, cw), (bh, bw), cell)


def upload(rgb: Image.Image, device: torch.device | str) -> torch.Tensor:
    """An RGB image -> [1, 3, H, W] uint8 on `device`. To a GPU through page-locked memory (PyTorch's caching host
    allocator keeps the buffer until the copy is done): at 1792 px a pageable copy cost ~5 ms more (H100)."""
    device = torch.device(device)
    host = host_pixels(rgb, pin=device.type == "cuda")  # [H, W, 4 or 3]
    return host.to(device, non_blocking=True)[..., :3].permute(2, 0, 1).unsqueeze(0)  # [1, 3, H, W]


def host_pixels(rgb: Image.Image, pin: bool = False) -> torch.Tensor:
    """
    An RGB image's pixels in one host copy: [H, W, 4] uint8 (R, G, B, padding) where Pillow lends its own memory
    through the Arrow C data interface (an image in one memory block: up to 16 MiB of pixels, 2048 px square),
    else [H, W, 3] by np.array. Pillow keeps RGB as 4 bytes a pixel, and np.array packs them to 3 in two more
    copies: ~3 ms at 1792 px on a 2-core CPU against ~0.2 ms at 448 px, host work that grew with the image.
    The one copy is torch's, on its intra-op threads: at 1792 px 0.11 ms on 16 cores against 1.22 ms for numpy's
    one thread (the H100 machine's host), which was most of what ARR's vision time grew by from 448 px to 1792 px.
    """
    try:
        _, lent = rgb.__arrow_c_array__()  # (schema, array) capsules: the memory stays lent while `lent` lives
        pixels = _arrow_pixels(lent, rgb.height, rgb.width)  # [H, W, 4]
    except (AttributeError, ValueError):  # Pillow < 11.2, or an image in several blocks
        pixels = np.array(rgb)  # [H, W, 3], writable (torch.from_numpy warns on a read-only array)
    host = torch.empty(pixels.shape, dtype=torch.uint8, pin_memory=pin)
    return host.copy_(torch.from_numpy(pixels))


class _ArrowArray(ctypes.Structure):
    """struct ArrowArray of the Arrow C data interface (a stable ABI): one column's buffers and children."""


_ArrowArray._fields_ = [("length", ctypes.c_int64), ("null_count", ctypes.c_int64), ("offset", ctypes.c_int64),
                        ("n_buffers", ctypes.c_int64), ("n_children", ctypes.c_int64),
                        ("buffers", ctypes.POINTER(ctypes.c_void_p)),
                        ("children", ctypes.POINTER(ctypes.POINTER(_ArrowArray))),
                        ("dictionary", ctypes.POINTER(_ArrowArray)), ("release", ctypes.c_void_p),
                        ("private_data", ctypes.c_void_p)]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def _arrow_pixels(capsule, height: int, width: int) -> np.ndarray:
    """[H, W, 4] uint8 view of the memory an "arrow_array" capsule lends: Pillow's RGB column, a 4-wide list of
    uint8 per pixel. ValueError if the column is laid out otherwise."""
    pixels = _ArrowArray.from_address(_capsule_pointer(capsule, b"arrow_array"))  # fixed_size_list<uint8>[4]
    values = pixels.children[0].contents if pixels.n_children == 1 else None  # uint8, 4 a pixel
    if pixels.length != height * width or values is None or values.n_buffers != 2 or \
            values.length < 4 * (pixels.offset + pixels.length):
        raise ValueError("not a 4-byte list per pixel")
    start = values.buffers[1] + values.offset + 4 * pixels.offset  # the first pixel's first byte
    return np.ctypeslib.as_array((ctypes.c_uint8 * (4 * height * width)).from_address(start)).reshape(height, width, 4)


def view_tensor(view: Image.Image, device: torch.device | str = "cpu") -> torch.Tensor:
    """PIL RGB -> [1, 3, H, W] float in [0, 1] on `device` (uploaded as uint8, converted there)."""
    return torch.from_numpy(np.array(view, dtype=np.uint8)).to(device).permute(2, 0, 1).unsqueeze(0).float() / 255.0
