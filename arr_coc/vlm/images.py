"""
An image file as every reader of one sees it (the app's uploads, `run`, the dataset loaders, lmms-eval's tasks):
decoded once, upright by its EXIF orientation, refused in one line where it is too big or not an image. PIL only,
no torch, so the commands that read it still answer --help and bad flags at once.

    image = open_image("assets/chelsea.png")                       # a path, or a binary file object
    image = open_image(upload, max_pixels=MAX_IMAGE_PIXELS)        # refused from its header past the app's limit
"""

from pathlib import Path
from typing import IO

from PIL import Image, ImageOps, PngImagePlugin

from arr_coc.settings import IMAGE_FORMATS


def open_image(path: str | Path | IO[bytes], max_pixels: int | None = None) -> Image.Image:
    """
    An image file as the app receives an upload: decoded now, its first frame, turned upright by its EXIF
    orientation (a phone photo stored sideways with orientation 6 comes out portrait). The CLI, the dataset
    loader and the app all read images through here, so they see the same.

    The header is read first (size, mode, EXIF; no pixels): more than `max_pixels` is refused from it, with
    Image.DecompressionBombError("WxH pixels"), before anything decodes or turns the image (one past twice PIL's own
    Image.MAX_IMAGE_PIXELS, which PIL refuses while reading the header, as "over N megapixels"). A compressed PNG
    text or colour-profile chunk that inflates past PIL's limit (PngImagePlugin.MAX_TEXT_CHUNK, a zip bomb in the
    metadata) is an OSError saying so, as every unreadable file is, never PIL's ValueError.
    """
    try:
        with Image.open(path, formats=IMAGE_FORMATS) as image:  # the header only (PIL refuses more than twice its
            # MAX_IMAGE_PIXELS here); another format (EPS: Ghostscript) is no image to us: UnidentifiedImageError
            if max_pixels is not None and image.width * image.height > max_pixels:
                raise Image.DecompressionBombError(f"{image.width}x{image.height} pixels")
            image.load()  # decode now, so a truncated file fails here
            return ImageOps.exif_transpose(image)  # a transposed copy, or a plain copy: valid after the file closes
    except Image.DecompressionBombError as e:
        if str(e).startswith("Image size"):  # PIL's own words, with its DOS-attack warning: ours instead
            raise Image.DecompressionBombError(f"over {2 * Image.MAX_IMAGE_PIXELS // 10**6} megapixels") from None
        raise
    except ValueError as e:
        if "MAX_TEXT" in str(e):  # PngImagePlugin's MAX_TEXT_CHUNK or MAX_TEXT_MEMORY
            raise OSError(f"a compressed metadata chunk inflates past the {PngImagePlugin.MAX_TEXT_CHUNK >> 20} MB "
                          "PIL reads: a decompression bomb") from None
        raise OSError(str(e)) from None  # PIL's other refusals of a broken file
