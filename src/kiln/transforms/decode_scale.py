"""How much smaller a JPEG may be decoded when the first transform shrinks it anyway.

libjpeg can decode a JPEG at 1/2, 1/4 or 1/8 of its size for a fraction of
the work: it leaves out the high frequencies of each 8x8 block instead of
decoding every pixel (what Pillow's ``Image.draft``, TensorFlow's
``decode_jpeg(ratio=)`` and OpenCV's ``IMREAD_REDUCED_COLOR_*`` do). A
chain that starts by shrinking the image with `resize` then resizes far
fewer pixels too. The opt-in ``image.jpeg_scaled_decode`` build option
(`kiln.pipeline.images`) uses it:

- `jpeg_reduction`: the factor to decode a JPEG of a stored size at, for
  `decode_with_orientation`'s ``jpeg_reduction``; 1 (a full decode)
  unless the chain starts with a `resize` that shrinks the image at least
  that much in both sides.
- `with_resize_to`: the chain with that first resize told the size it
  makes of the full image, so the reduced image is resized to exactly the
  size a full decode gets (computed from the reduced size, its rounding
  could differ by a pixel).
- `apply_reduced`: `Chain.apply` for a reduced image whose boxes,
  keypoints and masks are annotated on the stored pixels.

A reduced decode is ``ceil(height / f) x ceil(width / f)``
(`decode.reduced_size`) and maps coordinates by exactly ``1 / f``: each
8x8 block becomes an ``8/f x 8/f`` block, the last one cut where the image
ends. So the content of a reduced image resized to the full path's size
may sit up to ``(f - 1) / f`` of an output pixel off where the full path
puts it, towards the sides where libjpeg cut the last blocks; its targets
follow the reduced pixels, not the full ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.transforms.chain import Chain, Transform
from kiln.transforms.decode import DecodedImage, reduced_size
from kiln.transforms.functional import resize_output_size
from kiln.transforms.geometry import CoordinateMap
from kiln.transforms.targets import Targets, orient_targets

REDUCTIONS = (8, 4, 2)
"""The factors libjpeg decodes at (besides 1), largest first."""


def _leading_resize(chain: Chain) -> dict[str, Any] | None:
    """The parameters of the chain's first transform if it is a `resize` a
    reduced image may be given to: not ``nearest``, which picks source
    pixels (a reduced decode averages them)."""
    if not chain.transforms or chain.transforms[0].name != "resize":
        return None
    params = chain.transforms[0].kwargs
    return None if params["interpolation"] == "nearest" else params


def jpeg_reduction(chain: Chain, height: int, width: int) -> int:
    """The largest of `REDUCTIONS` at which a JPEG of stored ``height x
    width`` still decodes to at least what the chain's first `resize` makes
    of it, in both sides; 1 when none does, or the chain does not start
    with a `resize` (see `_leading_resize`).

    The EXIF orientation is not known before decoding: a factor is taken
    only if it suits the image upright either way (transposed or not). For
    a ``shorter_side`` or ``longer_side`` both ways give the same factor;
    an exact ``size`` that is not square may get a smaller one.
    """
    params = _leading_resize(chain)
    if params is None:
        return 1
    # What the resize makes of the image upright as stored, and transposed
    # (orientations 5 to 8), each in the stored pixels' axes.
    targets = (
        resize_output_size(height, width, **params),
        resize_output_size(width, height, **params)[::-1],
    )
    for reduction in REDUCTIONS:
        reduced_height, reduced_width = reduced_size(height, width, reduction)
        if all(
            reduced_height >= target_height and reduced_width >= target_width
            for target_height, target_width in targets
        ):
            return reduction
    return 1


def upright_size(decoded: DecodedImage) -> tuple[int, int]:
    """``(height, width)`` of the full image upright: what a full decode gives."""
    height, width = decoded.stored_size
    return (width, height) if decoded.orientation in (5, 6, 7, 8) else (height, width)


def with_resize_to(chain: Chain, height: int, width: int) -> Chain:
    """The chain with its first transform, a `resize`, replaced by one to
    exactly the size it makes of a ``height x width`` image (upright, as a
    full decode gives it), the interpolation kept: the reduced image then
    ends up the size the full one would.

    Raises:
      ValueError: if the chain does not start with a `resize` a reduced
        image may be given to (`jpeg_reduction` gives 1 for such a chain).
    """
    params = _leading_resize(chain)
    if params is None:
        raise ValueError("the chain does not start with a resize a reduced decode may feed")
    target = resize_output_size(height, width, **params)
    exact = dict(params, shorter_side=None, longer_side=None, size=target)
    first = Transform("resize", tuple(sorted(exact.items())))
    return Chain((first, *chain.transforms[1:]), chain.plugins)


def apply_reduced(
    chain: Chain,
    decoded: DecodedImage,
    targets: Targets,
    *,
    min_visibility: float,
    mask_fill: int = 0,
) -> tuple[np.ndarray, Targets]:
    """`Chain.apply` for an image decoded reduced, with targets annotated on
    its stored pixels: the image goes through `with_resize_to`'s chain, and
    the targets, clipped to the stored image as `Chain.apply` clips, are
    turned upright pixel for pixel (`orient_targets`, as on the full path),
    then move onto the first resize's output in one map (the reduction, the
    EXIF orientation and the resize, less the turn already made), so a mask
    is resampled once there, as on the full path, not once onto the reduced
    pixels and again by the resize (two nearest-neighbour steps, each off by
    up to a pixel). Turning first keeps the full path's choice where an
    output pixel's centre falls exactly between two stored pixels (a 4x
    reduction puts every centre on such an edge): resampled through a
    mirroring map, the tie went to the other pixel, and a mask edge came
    out a pixel off the full path's. The rest of the chain moves them as
    `Chain.apply` does.

    Raises:
      TargetsError: if the masks are not the stored size.
      TransformError: as `Chain.apply`.
    """
    exact = with_resize_to(chain, *upright_size(decoded))
    height, width = decoded.stored_size
    targets.check_size(height, width)
    targets = targets.clipped(height, width, min_visibility=min_visibility)
    turn = CoordinateMap.for_orientation(decoded.orientation, height, width)
    targets = orient_targets(targets, decoded.orientation, height, width)
    reduced_height, reduced_width = reduced_size(height, width, decoded.reduction)
    upright_height, upright_width = decoded.image.shape[:2]
    image = exact.transforms[0](decoded.image)
    out_height, out_width = image.shape[:2]
    # Orientations 6 and 8 undo each other; the others undo themselves.
    unturn = CoordinateMap.for_orientation(
        {6: 8, 8: 6}.get(decoded.orientation, decoded.orientation), turn.height, turn.width
    )
    moves = unturn.then(
        CoordinateMap.scale_translate(
            height=reduced_height,
            width=reduced_width,
            scale_x=1 / decoded.reduction,
            scale_y=1 / decoded.reduction,
        )
        .then(CoordinateMap.for_orientation(decoded.orientation, reduced_height, reduced_width))
        .then(
            CoordinateMap.scale_translate(
                height=out_height,
                width=out_width,
                scale_x=out_width / upright_width,
                scale_y=out_height / upright_height,
            )
        )
    )
    targets = targets.mapped(moves, min_visibility=min_visibility, mask_fill=mask_fill)
    return exact.apply(image, targets, min_visibility=min_visibility, mask_fill=mask_fill, start=1)
