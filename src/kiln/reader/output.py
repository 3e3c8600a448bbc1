"""What `load` hands a trainer, last step: image dtype and layout, label form, example weights.

`Output.apply` takes the finished element (``(image, label)``,
``(image, targets)``, the model-side ``({"image", "augment_seed"}, label)``,
or a features dict) and

1. computes each example's weight from its label (`ExampleWeights`), when
   asked, before smoothing (a smoothed label would spread the weight);
2. encodes labels (`LabelEncoding`: one-hot, multi-hot, smoothing);
3. casts the image (`ImageFormat`: float32, bfloat16, uint8) and moves its
   channels first (``channels_first``), masks alike.

With the defaults it returns its input unchanged, adding no op to the graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kiln.lazy_import import LazyModule
from kiln.reader.class_weights import ExampleWeights
from kiln.reader.labels import LabelEncoding

if TYPE_CHECKING:
    import tensorflow as tf

    from kiln.reader.augmenter import Augmenter
else:  # imported when a dtype is checked or an element shaped (`load` has imported it)
    tf = LazyModule("tensorflow")

DTYPES = ("float32", "bfloat16", "uint8")
DATA_FORMATS = ("channels_last", "channels_first")
# Targets laid out like the image: [..., H, W, 1] class ids or 0/1 masks.
_MASKS = ("mask", "instance_masks")


def dtype_name(dtype: Any) -> str:
    """The name in `DTYPES` of `dtype`: a name, a TensorFlow or a NumPy dtype.

    Raises:
      ValueError: naming `dtype`, for one `tf.as_dtype` does not take, one it
        takes that is not in `DTYPES` (``np.float64``), and for ints and bools
        (which `tf.as_dtype` reads as enum values: ``True`` is float32).
    """
    name = ""
    if not isinstance(dtype, int):
        try:
            name = tf.as_dtype(dtype).name
        except TypeError:
            pass
    if name not in DTYPES:
        shown = f"{dtype!r} ({name})" if name and name != dtype else repr(dtype)
        raise ValueError(
            f"dtype must be one of {DTYPES}, as a name or a TensorFlow or NumPy dtype "
            f"(tf.float32, np.float32), got {shown}"
        )
    return name


@dataclasses.dataclass(frozen=True)
class ImageFormat:
    """The image's dtype and channel layout.

    Attributes:
      dtype: ``float32`` (the reader's own: [0, 1], or standardized with
        ``normalize``), ``bfloat16`` (the same values rounded to bfloat16:
        half the bytes to the accelerator), or ``uint8`` (the 0..255 scale
        rounded to integers: a quarter of the bytes; exact for unaugmented
        images and those only cropped or flipped, rounded where an op
        interpolates or changes colours).
      data_format: ``channels_last`` (``[..., height, width, channels]``) or
        ``channels_first`` (``[..., channels, height, width]``). Masks
        (``mask``, ``instance_masks``) follow the image: their channel axis
        of 1 moves first too, so a mask lines up with its image; they stay
        uint8 whatever `dtype`.
    """

    dtype: str = "float32"
    data_format: str = "channels_last"

    @classmethod
    def checked(cls, dtype: Any, data_format: Any, *, normalize: bool, model_side: bool):
        """The format, after checking the options.

        `dtype` is anything `tf.as_dtype` takes that names one of `DTYPES`:
        a name (``"float32"``), a TensorFlow dtype (``tf.float32``) or a
        NumPy one (``np.float32``, ``np.dtype("float32")``).

        Raises:
          ValueError: for an unknown dtype or layout, uint8 with
            ``normalize`` (standardized pixels are not 0..255 integers), and
            anything but the defaults with `load_for_model` (the layer
            takes uint8 channels-last images), naming what was passed.
        """
        name = dtype_name(dtype)
        if data_format not in DATA_FORMATS:
            raise ValueError(f"data_format must be one of {DATA_FORMATS}, got {data_format!r}")
        if name == "uint8" and normalize:
            raise ValueError(
                "dtype='uint8' holds pixels on the 0..255 scale; normalize=True standardizes "
                "them to signed floats. Pass normalize=False and standardize on the accelerator "
                "(mean and std: kiln.reader.info(path).splits['train'].statistics), or use "
                "dtype='float32' or 'bfloat16'"
            )
        chosen = cls(name, data_format)
        if model_side and chosen != cls():
            default = cls()
            passed = [
                f"{field}={value!r}"
                for field, value, kept in (
                    ("dtype", dtype if isinstance(dtype, str) else name, default.dtype),
                    ("data_format", data_format, default.data_format),
                )
                if getattr(chosen, field) != kept
            ]
            raise ValueError(
                f"load_for_model takes no {' or '.join(passed)}: its dataset yields uint8 "
                f"channels-last images for its layer, which outputs float32 channels-last; "
                f"leave out {' and '.join(p.split('=')[0] for p in passed)} and cast or "
                f"transpose the layer's output inside the model"
            )
        return chosen

    def keeps_stored_pixels(self, augmenter: Augmenter) -> bool:
        """Whether the decoded uint8 pixels are already the output's values:
        uint8 output and nothing that computes in float (element or batch ops)."""
        return self.dtype == "uint8" and not augmenter.has_element_work and not augmenter.batch_ops

    def image(self, image: tf.Tensor) -> tf.Tensor:
        return self._laid_out(self.image_dtype(image))

    def image_dtype(self, image: tf.Tensor) -> tf.Tensor:
        """`image` (float32 in [0, 1], or already cast) in this dtype."""
        if self.dtype == "uint8" and image.dtype != tf.uint8:
            return tf.cast(tf.round(tf.clip_by_value(image * 255.0, 0.0, 255.0)), tf.uint8)
        if self.dtype == "bfloat16" and image.dtype != tf.bfloat16:
            return tf.cast(image, tf.bfloat16)
        return image

    def masks(self, targets: Mapping[str, Any]) -> dict[str, Any]:
        """`targets` with its masks in the image's layout."""
        out = dict(targets)
        for name in _MASKS:
            if name in out:
                out[name] = self._laid_out(out[name])
        return out

    def _laid_out(self, tensor):
        if self.data_format == "channels_last":
            return tensor
        if isinstance(tensor, tf.RaggedTensor):  # [batch, (objects), H, W, 1]
            return tf.ragged.map_flat_values(_channels_first, tensor)
        return _channels_first(tensor)


def _channels_first(tensor: tf.Tensor) -> tf.Tensor:
    """``[..., H, W, C]`` -> ``[..., C, H, W]``."""
    rank = tensor.shape.rank
    return tf.transpose(tensor, [*range(rank - 3), rank - 1, rank - 3, rank - 2])


@dataclasses.dataclass(frozen=True)
class Output:
    """The last step of `load` (see the module docstring)."""

    image_format: ImageFormat
    labels: LabelEncoding
    weights: ExampleWeights | None = None

    def apply(self, element):
        """``(inputs, label or targets)`` -> the same, or with a third member,
        the float32 example weights; a features dict -> the same dict."""
        if isinstance(element, Mapping):
            out = self.labels.targets(element) if self.labels.changes_labels else dict(element)
            out["image"] = self.image_format.image(out["image"])
            return self.image_format.masks(out)
        inputs, targets = element
        is_dict = isinstance(targets, Mapping)
        weights = None
        if self.weights is not None:
            weights = self.weights.of(targets["label"] if is_dict else targets)
        if self.labels.changes_labels:
            targets = self.labels.targets(targets) if is_dict else self.labels.label(targets)
        if is_dict:
            targets = self.image_format.masks(targets)
        if not isinstance(inputs, Mapping):  # the model-side inputs keep their form
            inputs = self.image_format.image(inputs)
        return (inputs, targets) if weights is None else (inputs, targets, weights)
