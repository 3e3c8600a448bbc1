"""The built-in offline transforms: pure, deterministic NumPy/OpenCV kernels.

Every kernel takes a uint8 ``HxWxC`` RGB array (C is 1 or 3; the channel
axis is always kept, also for one channel) and returns a new array of the
same kind. Kernels never modify their input (they may return it unchanged
when there is nothing to do), hold no state and use no randomness, so they
are safe to call from several threads and give the same bytes for the same
input. Parameters are keyword-only and typed; `kiln.transforms.parse`
validates a YAML ``transforms:`` list against these signatures.

Sizes are ``[height, width]`` (or one int for a square), like everywhere
in kiln.

Each kernel declares how it moves coordinates (``geometry=`` of
`register`), so boxes, masks and keypoints follow the image: a function
returning its `CoordinateMap`, built from the same size and offset helpers
the kernel itself calls (so the two cannot drift), or ``"none"`` for the
colour kernels.
"""

from __future__ import annotations

from typing import Annotated, Any

import cv2
import numpy as np
from pydantic import Field, PlainValidator, StrictInt

from kiln.registry import Choice, Size
from kiln.transforms.chain import TransformError, register
from kiln.transforms.geometry import NO_GEOMETRY, CoordinateMap, resize_indices


def _validate_fill(value: Any) -> int | tuple[int, int, int]:
    def is_level(v: Any) -> bool:
        # bool is an int subclass, but ``value: true`` is a config mistake, not 1.
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 255

    if is_level(value):
        return value
    if isinstance(value, (list, tuple)) and len(value) == 3 and all(is_level(v) for v in value):
        return (value[0], value[1], value[2])
    raise ValueError(f"expected a level 0..255 or [r, g, b] of levels 0..255, got {value!r}")


# Strict ints: YAML ``shorter_side: "64"`` is a config mistake, not 64.
Length = Annotated[StrictInt, Field(gt=0)]
# One validator for the union, as for `Size`: one message saying what is expected.
FillValue = Annotated[int | tuple[int, int, int], PlainValidator(_validate_fill)]
Interpolation = Annotated[str, Choice(("auto", "area", "linear", "cubic", "nearest", "lanczos"))]

# The *_EXACT variant is bit-exact across CPUs and SIMD paths (the plain one
# may differ in the last bit between, say, AVX2 and AVX-512 workers).
# "nearest" is not OpenCV's: `resize_to` copies the input pixel under each
# output pixel's centre with the index arithmetic the masks are resampled
# with (`geometry.resize_indices`), exact on every machine. OpenCV's
# INTER_NEAREST_EXACT rounds its scale to 16-bit fixed point and picked a
# neighbour of that pixel at some rows and columns (one size pair in five),
# where the image then no longer lined up with its masks.
_INTERPOLATIONS = {
    "area": cv2.INTER_AREA,
    "linear": cv2.INTER_LINEAR_EXACT,
    "cubic": cv2.INTER_CUBIC,
    "lanczos": cv2.INTER_LANCZOS4,
}


def _check_image(image: np.ndarray, kernel: str) -> None:
    if (
        not isinstance(image, np.ndarray)
        or image.dtype != np.uint8
        or image.ndim != 3
        or image.shape[2] not in (1, 3)
    ):
        described = (
            f"{image.dtype} array of shape {image.shape}"
            if isinstance(image, np.ndarray)
            else type(image).__name__
        )
        raise ValueError(f"{kernel}: expected a uint8 HxWxC array with C 1 or 3, got {described}")


def _hw(size: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    if isinstance(size, (int, np.integer)):
        return int(size), int(size)
    height, width = size
    return int(height), int(width)


def _with_channel_axis(result: np.ndarray) -> np.ndarray:
    # OpenCV returns HxW for one-channel input; kiln always keeps the axis.
    return result[:, :, np.newaxis] if result.ndim == 2 else result


def _scale_length(length: int, target: int, reference: int) -> int:
    """``round(length * target / reference)``, halves up, at least 1.

    Integer arithmetic, so the result is exact and the same on every machine.
    """
    return max(1, (2 * length * target + reference) // (2 * reference))


def _only_one_size(**sizes: object) -> None:
    given = [name for name, value in sizes.items() if value is not None]
    if len(given) != 1:
        names = ", ".join(sizes)
        found = " and ".join(given) if given else "none"
        raise ValueError(f"give exactly one of {names} (got {found})")


def _fit_side(in_height: int, in_width: int, side: int, reference: int) -> tuple[int, int]:
    """(height, width): the side that measures `reference` becomes `side`, the aspect ratio kept."""
    if in_height == reference:
        return side, _scale_length(in_width, side, in_height)
    return _scale_length(in_height, side, in_width), side


def _check_resize(*, shorter_side=None, longer_side=None, size=None, interpolation="auto") -> None:
    _only_one_size(shorter_side=shorter_side, longer_side=longer_side, size=size)


def resize_to(
    image: np.ndarray, height: int, width: int, interpolation: str = "auto"
) -> np.ndarray:
    """Resamples `image` to exactly ``height x width``; the work behind `resize`.

    ``"auto"`` picks INTER_AREA when neither side grows: it averages every
    source pixel under a destination pixel, so shrinking does not alias.
    Otherwise it picks bicubic: sharper than bilinear when enlarging, and
    the extra cost does not matter offline where it is paid once.
    """
    in_height, in_width = image.shape[:2]
    if (height, width) == (in_height, in_width):
        return image
    if interpolation == "auto":
        shrinking = height <= in_height and width <= in_width
        interpolation = "area" if shrinking else "cubic"
    if interpolation == "nearest":
        rows, cols = resize_indices(height, in_height), resize_indices(width, in_width)
        return np.ascontiguousarray(image.take(rows, axis=0).take(cols, axis=1))
    if interpolation not in _INTERPOLATIONS:
        raise ValueError(
            f"unknown interpolation {interpolation!r}; "
            f"expected auto or one of {sorted([*_INTERPOLATIONS, 'nearest'])}"
        )
    result = cv2.resize(image, (width, height), interpolation=_INTERPOLATIONS[interpolation])
    return _with_channel_axis(result)


def _resize_size(
    image: np.ndarray,
    shorter_side: int | None,
    longer_side: int | None,
    size: int | tuple[int, int] | None,
) -> tuple[int, int]:
    """The (height, width) `resize` produces."""
    in_height, in_width = image.shape[:2]
    return resize_output_size(
        in_height, in_width, shorter_side=shorter_side, longer_side=longer_side, size=size
    )


def resize_output_size(
    in_height: int,
    in_width: int,
    *,
    shorter_side: int | None = None,
    longer_side: int | None = None,
    size: int | tuple[int, int] | None = None,
    interpolation: str = "auto",
) -> tuple[int, int]:
    """The (height, width) `resize` makes of an ``in_height x in_width``
    image, without the image (takes `resize`'s parameters; `interpolation`
    changes nothing here)."""
    _only_one_size(shorter_side=shorter_side, longer_side=longer_side, size=size)
    if size is not None:
        return _hw(size)
    if shorter_side is not None:
        return _fit_side(in_height, in_width, shorter_side, min(in_height, in_width))
    if longer_side is not None:
        return _fit_side(in_height, in_width, longer_side, max(in_height, in_width))
    raise AssertionError("unreachable: _only_one_size checked that one size is given")


def _scaled_to(image: np.ndarray, height: int, width: int) -> CoordinateMap:
    """The map of `resize_to`: each axis scaled by output / input length.

    ``cv2.resize`` samples output pixel ``i`` at input index
    ``(i + 0.5) * in / out - 0.5``, which in continuous coordinates is
    exactly ``x_out = x_in * out / in``.
    """
    in_height, in_width = image.shape[:2]
    return CoordinateMap.scale_translate(
        height=height, width=width, scale_x=width / in_width, scale_y=height / in_height
    )


def _resize_geometry(
    image: np.ndarray, *, shorter_side=None, longer_side=None, size=None, interpolation="auto"
) -> CoordinateMap:
    return _scaled_to(image, *_resize_size(image, shorter_side, longer_side, size))


@register(check=_check_resize, geometry=_resize_geometry)
def resize(
    image: np.ndarray,
    *,
    shorter_side: Length | None = None,
    longer_side: Length | None = None,
    size: Size | None = None,
    interpolation: Interpolation = "auto",
) -> np.ndarray:
    """Resizes to a shorter side, a longer side, or an exact size.

    Args:
      image: uint8 HxWxC.
      shorter_side: The shorter side becomes this; the aspect ratio is kept.
      longer_side: The longer side becomes this; the aspect ratio is kept.
      size: Exact ``[height, width]`` (or one int for a square); the aspect
        ratio may change.
      interpolation: ``"auto"`` (area when shrinking, bicubic when
        enlarging), ``"area"``, ``"linear"``, ``"cubic"``, ``"nearest"`` or
        ``"lanczos"``.

    Exactly one of `shorter_side`, `longer_side`, `size` must be given. With
    a side, the other side is ``round(other * side / this)`` with halves
    rounded up, computed in integers (exact, the same on every machine),
    and at least 1. A square image gets both sides equal.

    Raises:
      ValueError: if not exactly one of the three sizes is given.
    """
    _check_image(image, "resize")
    height, width = _resize_size(image, shorter_side, longer_side, size)
    return resize_to(image, height, width, interpolation)


def _crop_window(image: np.ndarray, size: int | tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, left, height, width) of `center_crop`'s window."""
    height, width = _hw(size)
    in_height, in_width = image.shape[:2]
    if height > in_height or width > in_width:
        raise TransformError(
            f"center_crop: image is {in_height}x{in_width} (HxW), smaller than "
            f"the crop {height}x{width}"
        )
    return (in_height - height) // 2, (in_width - width) // 2, height, width


def _center_crop_geometry(image: np.ndarray, *, size) -> CoordinateMap:
    top, left, height, width = _crop_window(image, size)
    return CoordinateMap.scale_translate(height=height, width=width, shift_x=-left, shift_y=-top)


@register(geometry=_center_crop_geometry)
def center_crop(image: np.ndarray, *, size: Size) -> np.ndarray:
    """Cuts the central ``[height, width]`` window (one int: a square).

    When the margin is odd, the extra row or column is cut from the bottom
    or right: the window starts at ``(H - height) // 2, (W - width) // 2``.

    Raises:
      TransformError: if the image is smaller than the crop in either side.
    """
    _check_image(image, "center_crop")
    top, left, height, width = _crop_window(image, size)
    return np.ascontiguousarray(image[top : top + height, left : left + width])


def _fill_for(image: np.ndarray, value: int | tuple[int, int, int] | list[int]) -> np.ndarray:
    """The fill colour as a length-C uint8 vector matching the image's channels."""
    if isinstance(value, (int, np.integer)):
        return np.full(image.shape[2], value, np.uint8)
    colour = np.asarray(value, np.uint8).reshape(1, 1, 3)
    if image.shape[2] == 1:
        # A colour on a grayscale image means its gray level, by the same
        # weights as to_grayscale, so a config works before or after it.
        return to_grayscale(colour).reshape(1)
    return colour.reshape(3)


def _pad_offsets(
    in_height: int, in_width: int, height: int, width: int, kernel: str
) -> tuple[int, int]:
    """(top, left): where `_pad_centred` puts the image in the ``height x width`` canvas."""
    if height < in_height or width < in_width:
        raise TransformError(
            f"{kernel}: image is {in_height}x{in_width} (HxW), larger than the "
            f"padded size {height}x{width}; resize or crop it first"
        )
    # Odd margins put the extra row/column at the bottom/right, as center_crop does.
    return (height - in_height) // 2, (width - in_width) // 2


def _pad_centred(image: np.ndarray, height: int, width: int, value, kernel: str) -> np.ndarray:
    in_height, in_width, channels = image.shape
    top, left = _pad_offsets(in_height, in_width, height, width, kernel)
    result = np.empty((height, width, channels), np.uint8)
    result[...] = _fill_for(image, value)
    result[top : top + in_height, left : left + in_width] = image
    return result


def _check_pad(*, size=None, to_square=False, value=0) -> None:
    if (size is None) == (not to_square):
        raise ValueError(
            "give exactly one of size and to_square: true "
            f"(got size={size!r}, to_square={to_square!r})"
        )


def _pad_size(image: np.ndarray, size, to_square: bool) -> tuple[int, int]:
    """The (height, width) `pad` produces."""
    if size is not None:
        return _hw(size)
    side = max(image.shape[:2])  # to_square, as _check_pad made sure
    return side, side


def _pad_geometry(image: np.ndarray, *, size=None, to_square=False, value=0) -> CoordinateMap:
    _check_pad(size=size, to_square=to_square, value=value)
    height, width = _pad_size(image, size, to_square)
    top, left = _pad_offsets(image.shape[0], image.shape[1], height, width, "pad")
    return CoordinateMap.scale_translate(height=height, width=width, shift_x=left, shift_y=top)


@register(check=_check_pad, geometry=_pad_geometry)
def pad(
    image: np.ndarray,
    *,
    size: Size | None = None,
    to_square: bool = False,
    value: FillValue = 0,
) -> np.ndarray:
    """Pads the image, centred, to ``[height, width]`` or to a square.

    Args:
      image: uint8 HxWxC.
      size: Target ``[height, width]`` (or one int); never smaller than the
        image.
      to_square: Pad the shorter side up to the longer one.
      value: Fill: one level for every channel, or ``[r, g, b]`` (on a
        one-channel image, its ITU-R 601 gray level).

    Exactly one of `size` and ``to_square: true``. Odd margins put the
    extra row or column at the bottom or right.

    Raises:
      ValueError: if not exactly one of `size` and `to_square` is given.
      TransformError: if the image is larger than `size`.
    """
    _check_image(image, "pad")
    _check_pad(size=size, to_square=to_square, value=value)
    height, width = _pad_size(image, size, to_square)
    return _pad_centred(image, height, width, value, "pad")


def _letterbox_fit(image: np.ndarray, height: int, width: int) -> tuple[int, int]:
    """The (height, width) `letterbox` resizes the image to before padding."""
    in_height, in_width = image.shape[:2]
    # Compare height/in_height with width/in_width without floats.
    if height * in_width <= width * in_height:
        return height, min(width, _scale_length(in_width, height, in_height))
    return min(height, _scale_length(in_height, width, in_width)), width


def _letterbox_geometry(image: np.ndarray, *, size, value=0, interpolation="auto") -> CoordinateMap:
    height, width = _hw(size)
    fit_height, fit_width = _letterbox_fit(image, height, width)
    top, left = _pad_offsets(fit_height, fit_width, height, width, "letterbox")
    return _scaled_to(image, fit_height, fit_width).then(
        CoordinateMap.scale_translate(height=height, width=width, shift_x=left, shift_y=top)
    )


@register(geometry=_letterbox_geometry)
def letterbox(
    image: np.ndarray,
    *,
    size: Size,
    value: FillValue = 0,
    interpolation: Interpolation = "auto",
) -> np.ndarray:
    """Fits the image inside ``[height, width]`` keeping its aspect ratio, then pads centred.

    The limiting side becomes exactly the target; the other is scaled with
    the same integer rounding as `resize` (halves up, at least 1). The image
    is enlarged too when it is smaller than the box.

    Args:
      image: uint8 HxWxC.
      size: The box ``[height, width]`` (or one int for a square).
      value: Fill for the bars, as in `pad`.
      interpolation: As in `resize`.
    """
    _check_image(image, "letterbox")
    height, width = _hw(size)
    fit_height, fit_width = _letterbox_fit(image, height, width)
    fitted = resize_to(image, fit_height, fit_width, interpolation)
    return _pad_centred(fitted, height, width, value, "letterbox")


@register(geometry=NO_GEOMETRY)
def to_grayscale(image: np.ndarray, *, keep_channels: bool = False) -> np.ndarray:
    """Converts RGB to ITU-R BT.601 luma: ``0.299 R + 0.587 G + 0.114 B``.

    OpenCV's fixed-point conversion, rounded to the nearest level. A
    one-channel image is already gray and passes through.

    Args:
      image: uint8 HxWxC.
      keep_channels: Return three equal channels instead of one, for models
        that expect RGB input.
    """
    _check_image(image, "to_grayscale")
    gray = (
        image
        if image.shape[2] == 1
        else _with_channel_axis(cv2.cvtColor(image, cv2.COLOR_RGB2GRAY))
    )
    if keep_channels:
        return np.repeat(gray, 3, axis=2)
    return gray


@register(geometry=NO_GEOMETRY)
def equalize(image: np.ndarray) -> np.ndarray:
    """Spreads the brightness histogram over 0..255 (histogram equalisation).

    Equalises the luma (Y of YCrCb) and keeps the chroma, so colours keep
    their hue; a one-channel image is equalised directly. For low-contrast
    sources such as scans or X-rays. OpenCV's ``equalizeHist``: levels map
    through the cumulative histogram, the darkest present level to 0.
    """
    _check_image(image, "equalize")
    if image.shape[2] == 1:
        return _with_channel_axis(cv2.equalizeHist(image[:, :, 0]))
    ycrcb = cv2.cvtColor(image, cv2.COLOR_RGB2YCrCb)
    ycrcb[:, :, 0] = cv2.equalizeHist(np.ascontiguousarray(ycrcb[:, :, 0]))
    return cv2.cvtColor(ycrcb, cv2.COLOR_YCrCb2RGB)
