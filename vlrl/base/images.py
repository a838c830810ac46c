"""Images in any form a data set uses -> RGB PIL images, safely; resizing; content hashes.

`load_image` reads PIL images, bytes, `{"bytes", "path"}` dicts, file paths (confined to the data set's directory),
numpy arrays, base64 strings and `data:image/...;base64,` URLs. Anything it cannot use safely (a truncated or corrupt
file, a decompression bomb, a path escaping the data set, a URL) is a `BadItem` with a reason, which the loaders in
`vlrl.data` count as a skip instead of crashing.

    >>> from PIL import Image
    >>> load_image({"bytes": None, "path": "../../etc/passwd"}, root="data")
    Traceback (most recent call last):
    ...
    vlrl.base.images.BadItem: image_path_outside_dataset: '../../etc/passwd' resolves outside ...
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import re
import warnings
from pathlib import Path

MAX_IMAGE_BYTES = 32 * 2**20  # an encoded image (file, bytes, base64) larger than this is refused unread


class BadItem(ValueError):
    """One unusable image or row: `reason` is a key of `vlrl.data.SKIP_REASONS`, `detail` says what exactly."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


def load_image(value, *, root: str | Path | None = None, max_bytes: int = MAX_IMAGE_BYTES,
               max_pixels: int | None = None, draft_size: int | None = None, modes: dict | None = None):
    """Any image a data set holds -> an RGB `PIL.Image`, or `BadItem` saying why not.

    Reads PIL images, raw bytes, `{"bytes", "path"}` dicts (datasets' Image feature), file paths (confined to
    `root`: `../`, absolute paths and symlinks leading outside it are refused), numpy arrays (HW, HWC, CHW; any
    dtype), base64 strings and `data:image/...;base64,` URLs. Transparent images are composited on white, CMYK / P /
    16-bit / float modes are converted, EXIF rotation is applied.

    Args:
        value: the image, in any of the forms above.
        root: the directory file paths are relative to and confined to (default: the current directory).
        max_bytes: encoded images larger than this are refused without decoding.
        max_pixels: images with more pixels are refused before decoding (default: Pillow's MAX_IMAGE_PIXELS, its
            decompression-bomb limit).
        draft_size: lets JPEG decoding scale down on the fly towards this side (fast for large photos).
        modes: a dict that counts the source modes converted to RGB (for the DataReport).

    Raises:
        BadItem: with a reason of SKIP_REASONS (image_not_found, image_too_large, image_truncated, ...).

    >>> import numpy as np
    >>> load_image(np.zeros((4, 6), dtype=np.uint16)).size
    (6, 4)
    >>> load_image("../secret.png", root=".")
    Traceback (most recent call last):
    ...
    vlrl.base.images.BadItem: image_path_outside_dataset: '../secret.png' resolves outside ...
    """
    from PIL import Image

    max_pixels = max_pixels or Image.MAX_IMAGE_PIXELS or 89_478_485
    if value is None:
        raise BadItem("missing_image", "the image is None")
    if isinstance(value, Image.Image):
        image = _decode(lambda: value, max_pixels, None)  # no draft: never change the caller's image in place
    elif isinstance(value, (bytes, bytearray, memoryview)):
        image = _decode_bytes(bytes(value), max_bytes, max_pixels, draft_size)
    elif isinstance(value, dict):
        if value.get("bytes"):
            image = _decode_bytes(bytes(value["bytes"]), max_bytes, max_pixels, draft_size)
        elif value.get("path"):
            image = _decode_path(value["path"], root, max_bytes, max_pixels, draft_size)
        else:
            raise BadItem("missing_image", f"an image dict with neither bytes nor path (keys {sorted(value)})")
    elif isinstance(value, os.PathLike):
        image = _decode_path(os.fspath(value), root, max_bytes, max_pixels, draft_size)
    elif isinstance(value, str):
        image = _decode_string(value, root, max_bytes, max_pixels, draft_size)
    elif hasattr(value, "__array__") or (isinstance(value, list) and value and isinstance(value[0], list)):
        image = _from_array(value, max_pixels)
    else:
        raise BadItem("unsupported_image", f"an image of type {type(value).__name__}")
    return _to_rgb(image, modes)


def _decode(open_image, max_pixels: int, draft_size: int | None):
    """Opens (lazily), checks the size against the pixel cap, then decodes; maps Pillow's errors to reasons."""
    from PIL import Image

    with warnings.catch_warnings():
        # Pillow only warns between its limit and twice its limit; a bomb is refused at the limit.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = open_image()
            width, height = image.size
            if width * height > max_pixels:
                raise BadItem("image_too_large", f"{width}x{height} pixels is over the limit of {max_pixels}")
            if width == 0 or height == 0:
                raise BadItem("image_empty", f"{width}x{height} pixels")
            if draft_size and image.format == "JPEG":
                image.draft("RGB", (draft_size, draft_size))  # DCT scaling: decodes a 4000 px photo ~8x faster
            image.load()
            if image.getexif().get(0x0112, 1) != 1:  # phone photos store their rotation as an EXIF tag
                from PIL import ImageOps

                image = ImageOps.exif_transpose(image)
        except BadItem:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
            raise BadItem("image_too_large", str(err)) from None
        except Image.UnidentifiedImageError as err:
            raise BadItem("image_unreadable", str(err)) from None
        except MemoryError:
            raise BadItem("image_too_large", "decoding ran out of memory") from None
        except OSError as err:
            truncated = "truncated" in str(err) or "broken data stream" in str(err)
            reason = "image_truncated" if truncated else "image_unreadable"
            raise BadItem(reason, str(err)) from None
        except Exception as err:  # noqa: BLE001 -- Pillow decoders raise assorted errors (SyntaxError, ...)
            raise BadItem("image_unreadable", f"{type(err).__name__}: {err}") from None
    return image


def _decode_bytes(data: bytes, max_bytes: int, max_pixels: int, draft_size: int | None):
    from PIL import Image

    if len(data) > max_bytes:
        raise BadItem("image_too_large", f"{len(data)} bytes is over the cap of {max_bytes} (max_image_bytes)")
    if not data:
        raise BadItem("image_empty", "zero bytes")
    return _decode(lambda: Image.open(io.BytesIO(data)), max_pixels, draft_size)


def _decode_path(path: str, root, max_bytes: int, max_pixels: int, draft_size: int | None):
    return _decode_bytes(_read_confined(path, root, max_bytes), max_bytes, max_pixels, draft_size)


def _read_confined(path: str, root, max_bytes: int) -> bytes:
    """Reads a file that must lie inside `root` once resolved (no `../`, absolute path or symlink escape)."""
    base = Path(root if root is not None else os.getcwd()).resolve()
    target = (base / path).resolve()  # an absolute `path` replaces base here, and is then checked like any other
    if not target.is_relative_to(base):
        raise BadItem("image_path_outside_dataset",
                      f"{path!r} resolves outside {str(base)!r}; image paths must stay inside the data set's "
                      "directory (pass image_root= to widen it)")
    if not target.is_file():
        raise BadItem("image_not_found", f"{path!r} does not exist under {str(base)!r}")
    size = target.stat().st_size
    if size > max_bytes:
        raise BadItem("image_too_large", f"{path!r} is {size} bytes, over the cap of {max_bytes} (max_image_bytes)")
    return target.read_bytes()


_BASE64 = re.compile(r"[A-Za-z0-9+/\s]+={0,2}\s*")
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def _decode_string(value: str, root, max_bytes: int, max_pixels: int, draft_size: int | None):
    """A string is a data URL, a URL (refused: nothing is downloaded), a file path, or bare base64."""
    text = value.strip()
    if text.startswith("data:"):
        header, _, payload = text.partition(",")
        if ";base64" not in header or not header[5:].startswith("image/"):
            raise BadItem("unsupported_image", f"a data URL that is not base64 image data ({header[:40]!r})")
        return _decode_bytes(_b64(payload, max_bytes), max_bytes, max_pixels, draft_size)
    if re.match(r"^[a-z][a-z0-9+.-]*://", text, re.IGNORECASE):
        raise BadItem("unsupported_image", f"{text[:60]!r} is a URL; vlrl does not download images: fetch them "
                                           "into the data set's directory first")
    if not text:
        raise BadItem("missing_image", "an empty image string")
    # Paths carry a dot (the extension) or a backslash; base64 never does. Long dotless strings are base64.
    if len(text) >= 64 and "." not in text and "\\" not in text and _BASE64.fullmatch(text):
        return _decode_bytes(_b64(text, max_bytes), max_bytes, max_pixels, draft_size)
    return _decode_path(text, root, max_bytes, max_pixels, draft_size)


def _b64(payload: str, max_bytes: int) -> bytes:
    if len(payload) * 3 // 4 > max_bytes:  # checked before decoding: a huge string never becomes huge bytes
        raise BadItem("image_too_large", f"base64 of about {len(payload) * 3 // 4} bytes is over the cap of {max_bytes}")
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError) as err:
        raise BadItem("image_unreadable", f"invalid base64: {err}") from None


def _from_array(value, max_pixels: int):
    """numpy-like -> PIL: HW, HWC or CHW with 1, 3 or 4 channels; bool, integer and float dtypes."""
    import numpy as np
    from PIL import Image

    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as err:  # ragged nested lists, objects numpy cannot hold
        raise BadItem("unsupported_image", f"not an array: {err}") from None
    if array.dtype == object or array.ndim not in (2, 3):
        raise BadItem("unsupported_image", f"an array of shape {array.shape} and dtype {array.dtype}; "
                                           "expected HxW, HxWxC or CxHxW")
    if array.ndim == 3 and array.shape[-1] not in (1, 3, 4) and array.shape[0] in (1, 3, 4):
        array = np.moveaxis(array, 0, -1)  # CHW (torch layout) -> HWC
    if array.ndim == 3 and array.shape[-1] not in (1, 3, 4):
        raise BadItem("unsupported_image", f"an array with {array.shape[-1]} channels (shape {array.shape})")
    if array.size == 0:
        raise BadItem("image_empty", f"an array of shape {array.shape}")
    if array.shape[0] * array.shape[1] > max_pixels:
        raise BadItem("image_too_large", f"{array.shape[1]}x{array.shape[0]} pixels is over the limit of {max_pixels}")
    array = _to_uint8(array)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    mode = {2: "L"}.get(array.ndim) or {3: "RGB", 4: "RGBA"}[array.shape[-1]]
    return Image.fromarray(np.ascontiguousarray(array), mode=mode)


def _to_uint8(array):
    """Any dtype -> uint8: bool as 0/255, floats in [0, 1] scaled, wider integers stretched to their own range.

    Stretching (rather than dividing by 257) keeps a 12-bit scan stored in 16 bits from coming out black.
    """
    import numpy as np

    if array.dtype == np.uint8:
        return array
    if array.dtype == bool:
        return array.astype(np.uint8) * 255
    values = np.nan_to_num(array.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    low, high = float(values.min()), float(values.max())
    if np.issubdtype(array.dtype, np.floating) and low >= 0.0 and high <= 1.0:
        values = values * 255.0
    elif low < 0.0 or high > 255.0:
        values = (values - low) * (255.0 / (high - low or 1.0))
    return np.clip(np.rint(values), 0, 255).astype(np.uint8)


def _to_rgb(image, modes: dict | None = None):
    """Any Pillow mode -> RGB. Transparency is composited on white (a chart's background), not on black."""
    from PIL import Image

    mode = image.mode
    if mode == "RGB":
        return image
    if modes is not None:
        modes[mode] = modes.get(mode, 0) + 1
    if mode in ("I", "I;16", "I;16L", "I;16B", "I;16N", "F"):
        import numpy as np

        return Image.fromarray(_to_uint8(np.asarray(image)), mode="L").convert("RGB")
    if (mode == "P" and "transparency" in image.info) or mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    try:
        return image.convert("RGB")  # CMYK, YCbCr, P, L, 1, ...
    except (ValueError, OSError) as err:
        raise BadItem("image_unreadable", f"mode {mode} does not convert to RGB: {err}") from None


def fit_image(image, size: int | None, *, keep_aspect: bool = False, fill=(255, 255, 255)):
    """Resizes to `size` x `size` (stretching), or with `keep_aspect`, scales to fit and pads with `fill`.

    >>> from PIL import Image
    >>> fit_image(Image.new("RGB", (200, 100)), 64, keep_aspect=True).size
    (64, 64)
    """
    from PIL import Image, ImageOps

    if not size or image.size == (size, size):
        return image
    if keep_aspect:
        return ImageOps.pad(image, (size, size), method=Image.Resampling.BICUBIC, color=fill)
    return image.resize((size, size), Image.Resampling.BICUBIC, reducing_gap=3.0)


def undecoded(dataset):
    """Casts image columns to undecoded `{"bytes", "path"}` values, so a corrupt image is a counted skip in our
    decoder rather than an exception inside datasets' own."""
    import datasets

    for name, feature in dataset.features.items():
        if isinstance(feature, datasets.Image):
            dataset = dataset.cast_column(name, datasets.Image(decode=False))
        elif isinstance(feature, (datasets.List, datasets.Sequence)) and isinstance(feature.feature, datasets.Image):
            dataset = dataset.cast_column(name, datasets.List(datasets.Image(decode=False)))
    return dataset


def image_hash(image) -> str:
    """A content hash of an image's pixels (and size), so the same picture under two ids is still recognized.

    >>> from PIL import Image
    >>> image_hash(Image.new("RGB", (2, 2), "red")) == image_hash(Image.new("RGB", (2, 2), (255, 0, 0)))
    True
    """
    if isinstance(image, dict):  # an undecoded datasets Image value
        image = load_image(image)
    if hasattr(image, "tobytes"):
        rgb = image.convert("RGB")
        data = f"{rgb.size}".encode() + rgb.tobytes()
    else:
        data = io.BytesIO(image).getvalue()
    return hashlib.sha256(data).hexdigest()[:16]
