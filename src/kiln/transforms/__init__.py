"""Offline, deterministic image work: pure NumPy/OpenCV kernels.

Used only by the build job (`kiln.pipeline`); never imported by the reader.
Images are uint8 ``HxWxC`` NumPy arrays in RGB order (C is 1 or 3).

- `decode`: bytes -> RGB (or grayscale) uint8 array, EXIF orientation applied.
- `decode_scale`: how much smaller a JPEG may be decoded when the chain's
  first resize shrinks it anyway (``image.jpeg_scaled_decode``).
- `functional`: the built-in kernels (resize, center_crop, pad, letterbox,
  to_grayscale, equalize).
- `chain`: transforms by name, validated from the YAML `transforms:` list
  (with `kiln.registry`, which the reader's augmentations share).
- `encode`: array -> stored bytes (jpeg, png or raw).
- `targets`: boxes, keypoints and masks of an image (`Targets`), moved with
  it by `Chain.apply` along each transform's `geometry.CoordinateMap`.
- `masks`: COCO polygons and RLE to masks.
- `mask_file`: a mask file's bytes to the class ids written in it.
- `threads`: how many threads OpenCV may use inside one call.
- `opencv_log`: how much OpenCV logs to stderr.
"""

from kiln.transforms.chain import (
    GEOMETRIC_TARGETS,
    Chain,
    Transform,
    TransformConfigError,
    TransformError,
    get,
    import_plugins,
    names,
    parse,
    register,
)
from kiln.transforms.decode import (
    DecodedImage,
    DecodeError,
    decode_image,
    decode_with_orientation,
    orient,
    oriented,
)
from kiln.transforms.encode import EncodeError, encode_image
from kiln.transforms.geometry import NO_GEOMETRY, CoordinateMap
from kiln.transforms.mask_file import MaskFileError, decode_mask_file
from kiln.transforms.masks import (
    SegmentationError,
    polygons_to_mask,
    rle_to_mask,
    segmentation_to_mask,
)
from kiln.transforms.opencv_log import set_opencv_log_level
from kiln.transforms.targets import Targets, TargetsError, orient_targets
from kiln.transforms.threads import set_opencv_threads

# Importing the package registers the built-in kernels, so `parse` and
# `names` know them without a lazy import.
from kiln.transforms import functional  # noqa: F401  isort: skip
from kiln.transforms import decode_scale  # isort: skip

__all__ = [
    "GEOMETRIC_TARGETS",
    "NO_GEOMETRY",
    "Chain",
    "CoordinateMap",
    "DecodeError",
    "DecodedImage",
    "EncodeError",
    "MaskFileError",
    "SegmentationError",
    "Targets",
    "TargetsError",
    "Transform",
    "TransformConfigError",
    "TransformError",
    "decode_image",
    "decode_mask_file",
    "decode_scale",
    "decode_with_orientation",
    "encode_image",
    "get",
    "import_plugins",
    "names",
    "orient",
    "oriented",
    "orient_targets",
    "parse",
    "polygons_to_mask",
    "register",
    "rle_to_mask",
    "segmentation_to_mask",
    "set_opencv_log_level",
    "set_opencv_threads",
]
