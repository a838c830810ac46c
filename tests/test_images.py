"""vlrl.base.images: every image form a data set uses -> RGB PIL, and every bad image -> a BadItem with its reason."""

import base64
import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from vlrl.base.images import BadItem, fit_image, image_hash, load_image

RED = (255, 0, 0)


def encoded(image: Image.Image, fmt: str = "PNG", **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height pixels but carries almost no data: what a decompression bomb looks like
    to the decoder before it allocates anything."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit grayscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def reason(value, **kwargs) -> str:
    with pytest.raises(BadItem) as caught:
        load_image(value, **kwargs)
    return caught.value.reason


@pytest.fixture
def red_png() -> bytes:
    return encoded(Image.new("RGB", (6, 4), RED))


# Every input form -----------------------------------------------------------------------------------------------


def test_pil_image_passes_through_as_rgb():
    image = load_image(Image.new("RGB", (6, 4), RED))
    assert image.mode == "RGB" and image.size == (6, 4) and image.getpixel((0, 0)) == RED


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview], ids=["bytes", "bytearray", "memoryview"])
def test_bytes(red_png, wrap):
    image = load_image(wrap(red_png))
    assert image.size == (6, 4) and image.getpixel((5, 3)) == RED


def test_datasets_image_dict_with_bytes(red_png):
    assert load_image({"bytes": red_png, "path": "ignored.png"}).getpixel((0, 0)) == RED


def test_datasets_image_dict_with_path(tmp_path, red_png):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "1.png").write_bytes(red_png)
    assert load_image({"bytes": None, "path": "images/1.png"}, root=tmp_path).getpixel((0, 0)) == RED


def test_relative_and_pathlike_paths(tmp_path, red_png):
    (tmp_path / "a.png").write_bytes(red_png)
    assert load_image("a.png", root=tmp_path).size == (6, 4)
    assert load_image(tmp_path / "a.png", root=tmp_path).size == (6, 4)  # absolute, but inside the root
    assert load_image(str(tmp_path / "a.png"), root=tmp_path).size == (6, 4)


def test_base64_and_data_url(red_png):
    text = base64.b64encode(red_png).decode()
    assert load_image(text).getpixel((0, 0)) == RED
    assert load_image(f"data:image/png;base64,{text}").getpixel((0, 0)) == RED
    wrapped = "\n".join(text[i:i + 60] for i in range(0, len(text), 60))  # MIME line breaks are fine
    assert load_image(wrapped).size == (6, 4)


@pytest.mark.parametrize("array,pixel", [
    (np.full((4, 6, 3), 200, dtype=np.uint8), (200, 200, 200)),  # HWC uint8
    (np.full((3, 4, 6), 200, dtype=np.uint8), (200, 200, 200)),  # CHW (torch layout)
    (np.full((4, 6), 7, dtype=np.uint8), (7, 7, 7)),  # grayscale
    (np.full((4, 6, 1), 7, dtype=np.uint8), (7, 7, 7)),  # one channel
    (np.ones((4, 6, 3), dtype=np.float32), (255, 255, 255)),  # float in [0, 1]
    (np.ones((4, 6), dtype=bool), (255, 255, 255)),  # mask
    (np.zeros((4, 6, 4), dtype=np.uint8), (255, 255, 255)),  # fully transparent RGBA -> white
], ids=["hwc", "chw", "gray", "one-channel", "float", "bool", "rgba"])
def test_numpy_arrays(array, pixel):
    image = load_image(array)
    assert image.mode == "RGB" and image.size == (6, 4) and image.getpixel((0, 0)) == pixel


def test_nested_lists_from_arrow_are_one_image():
    assert load_image(np.full((4, 6, 3), 9, dtype=np.uint8).tolist()).getpixel((2, 2)) == (9, 9, 9)


def test_sixteen_bit_array_is_stretched_not_clipped():
    array = np.zeros((2, 2), dtype=np.uint16)
    array[0, 0] = 4095  # a 12-bit scan stored in 16 bits
    image = load_image(array)
    assert image.getpixel((0, 0)) == (255, 255, 255) and image.getpixel((1, 1)) == (0, 0, 0)


# Modes ----------------------------------------------------------------------------------------------------------


def test_cmyk_jpeg_converts():
    data = encoded(Image.new("CMYK", (8, 8), (0, 255, 255, 0)), "JPEG", quality=95)
    r, g, b = load_image(data).getpixel((4, 4))
    assert r > 230 and g < 30 and b < 30


def test_palette_png_converts_and_is_counted():
    palette = Image.new("RGB", (4, 4), RED).quantize(colors=2)
    modes = {}
    assert load_image(encoded(palette), modes=modes).getpixel((0, 0)) == RED
    assert modes == {"P": 1}


def test_palette_transparency_and_la_composite_on_white():
    transparent = Image.new("P", (4, 4), 0)
    transparent.putpalette([0, 0, 0] * 256)
    transparent.info["transparency"] = 0
    assert load_image(encoded(transparent)).getpixel((0, 0)) == (255, 255, 255)
    la = Image.new("LA", (4, 4), (0, 0))  # black, fully transparent
    assert load_image(encoded(la)).getpixel((0, 0)) == (255, 255, 255)
    half = Image.new("LA", (4, 4), (0, 255))  # black, opaque
    assert load_image(encoded(half)).getpixel((0, 0)) == (0, 0, 0)


def test_i16_png_converts():
    image = Image.fromarray(np.array([[0, 1000], [2000, 4000]], dtype=np.uint16))
    assert image.mode.startswith("I;16")
    rgb = load_image(encoded(image))
    assert rgb.getpixel((0, 0)) == (0, 0, 0) and rgb.getpixel((1, 1)) == (255, 255, 255)
    assert 0 < rgb.getpixel((1, 0))[0] < rgb.getpixel((0, 1))[0] < 255


def test_exif_rotation_applied():
    image = Image.new("RGB", (8, 4), RED)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    assert load_image(encoded(image, "JPEG", exif=exif.tobytes())).size == (4, 8)


# Bad images -> reasons ------------------------------------------------------------------------------------------


def test_truncated_files(red_png):
    big = encoded(Image.effect_noise((64, 64), 50).convert("RGB"), "JPEG", quality=90)
    assert reason(big[: len(big) // 2]) == "image_truncated"
    noisy = encoded(Image.effect_noise((64, 64), 50).convert("RGB"))
    assert reason(noisy[: len(noisy) // 2]) in ("image_truncated", "image_unreadable")


@pytest.mark.parametrize("value", [b"definitely not an image", "data:image/png;base64,!!!notbase64!!!",
                                   base64.b64encode(b"x" * 60).decode()], ids=["bytes", "data-url", "base64"])
def test_corrupt(value):
    assert reason(value) == "image_unreadable"


@pytest.mark.parametrize("width,height", [(20_000, 20_000), (10_000, 10_000)], ids=["over-2x", "over-1x"])
def test_decompression_bombs_refused_before_decoding(width, height):
    # Pillow errors past twice its limit and only warns between 1x and 2x; both are refused here.
    assert width * height > Image.MAX_IMAGE_PIXELS
    assert reason(png_header_only(width, height)) == "image_too_large"


def test_pixel_and_byte_caps(red_png):
    assert reason(red_png, max_pixels=10) == "image_too_large"
    assert reason(red_png, max_bytes=10) == "image_too_large"
    assert reason(np.zeros((10, 10), dtype=np.uint8), max_pixels=50) == "image_too_large"
    huge_b64 = "A" * 400
    assert reason(f"data:image/png;base64,{huge_b64}", max_bytes=100) == "image_too_large"


def test_file_over_byte_cap(tmp_path, red_png):
    (tmp_path / "a.png").write_bytes(red_png)
    assert reason("a.png", root=tmp_path, max_bytes=10) == "image_too_large"


@pytest.mark.parametrize("value", [Image.new("RGB", (0, 0)), np.zeros((0, 5, 3), dtype=np.uint8), b""],
                         ids=["pil", "array", "bytes"])
def test_zero_size(value):
    assert reason(value) == "image_empty"


def test_path_escapes_refused(tmp_path, red_png):
    root = tmp_path / "dataset"
    root.mkdir()
    (tmp_path / "secret.png").write_bytes(red_png)
    assert reason("../secret.png", root=root) == "image_path_outside_dataset"
    assert reason(str(tmp_path / "secret.png"), root=root) == "image_path_outside_dataset"
    assert reason({"bytes": None, "path": "images/../../secret.png"}, root=root) == "image_path_outside_dataset"
    (root / "link.png").symlink_to(tmp_path / "secret.png")
    assert reason("link.png", root=root) == "image_path_outside_dataset"


def test_missing_and_unsupported(tmp_path):
    assert reason("images/404.png", root=tmp_path) == "image_not_found"
    assert reason(None) == "missing_image"
    assert reason({"bytes": None, "path": None}) == "missing_image"
    assert reason("https://example.com/a.png") == "unsupported_image"
    assert reason("data:text/plain;base64,aGk=") == "unsupported_image"
    assert reason(42) == "unsupported_image"
    assert reason(np.zeros((2, 2, 7), dtype=np.uint8)) == "unsupported_image"


# Resizing and hashing -------------------------------------------------------------------------------------------


def test_fit_image_stretch_and_pad():
    wide = Image.new("RGB", (200, 100), RED)
    assert fit_image(wide, 64).size == (64, 64) and fit_image(wide, 64).getpixel((0, 0)) == RED
    padded = fit_image(wide, 64, keep_aspect=True)
    assert padded.size == (64, 64) and padded.getpixel((0, 0)) == (255, 255, 255) and padded.getpixel((32, 32)) == RED
    assert fit_image(wide, None) is wide


def test_image_hash_is_by_pixels():
    a, b = Image.new("RGB", (4, 4), RED), Image.new("RGB", (4, 4), RED)
    assert image_hash(a) == image_hash(b) == image_hash({"bytes": encoded(a), "path": None})
    assert image_hash(a) != image_hash(Image.new("RGB", (4, 4), (254, 0, 0)))
    assert image_hash(Image.new("RGB", (2, 8), RED)) != image_hash(a)  # same bytes, other shape
