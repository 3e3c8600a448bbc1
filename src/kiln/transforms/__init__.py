"""Offline, deterministic image work: pure NumPy/OpenCV kernels.

Used only by the build job (`kiln.pipeline`); never imported by the reader.
Images are uint8 ``HxWxC`` NumPy arrays in RGB order (C is 1 or 3).

- `decode`: bytes -> RGB (or grayscale) uint8 array, EXIF orientation applied.
- `functional`: the built-in kernels (resize, center_crop, pad, letterbox,
  to_grayscale, equalize).
- `chain`: transforms by name, validated from the YAML `transforms:` list
  (with `kiln.registry`, which the reader's augmentations share).
- `encode`: array -> stored bytes (jpeg, png or raw).
- `threads`: how many threads OpenCV may use inside one call.
"""

from kiln.transforms.chain import (
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
from kiln.transforms.decode import DecodeError, decode_image
from kiln.transforms.encode import encode_image
from kiln.transforms.threads import set_opencv_threads

# Importing the package registers the built-in kernels, so `parse` and
# `names` know them without a lazy import.
from kiln.transforms import functional  # noqa: F401  isort: skip

__all__ = [
    "Chain",
    "DecodeError",
    "Transform",
    "TransformConfigError",
    "TransformError",
    "decode_image",
    "encode_image",
    "get",
    "import_plugins",
    "names",
    "parse",
    "register",
    "set_opencv_threads",
]
