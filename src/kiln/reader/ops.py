"""Augmentation ops: declaring one, validating lists of them, and kiln's built-in element ops.

An element op is a function ``fn(image, seed, **params) -> image`` made of
TensorFlow ops. ``image`` is a float32 ``[height, width, channels]`` tensor
with values in [0, 1]; ``seed`` is a shape-[2] int32 tensor, different for
every element and every epoch. The op *samples* its random parameters from
`seed` with `tf.random.stateless_*` / `tf.image.stateless_random_*` and then
*applies* a deterministic kernel with them. Parameters are keyword-only and
annotated like offline transforms' (pydantic types and the shared types of
`kiln.registry`: `Probability`, `HeightWidth`, `Range`, `Choice`);
parameters that are ranges end in ``_range`` and are ``[low, high]``.

Register your own::

    import tensorflow as tf
    from kiln.reader import register_augmentation

    @register_augmentation("random_invert")
    def random_invert(image, seed, *, probability: float = 0.5):
        flip = tf.random.stateless_uniform([], seed) < probability
        return tf.where(flip, 1.0 - image, image)

and name it in an augmentation list (``- random_invert: {probability: 0.2}``).
`validate` checks a list against the registered ops (`kiln.registry` does
the parsing); `kiln.reader.augmenter.Augmenter` applies a validated list,
and checks a user op the first time it runs.

kiln's own element ops are below: each is declared in one place, with
`builtin_op`, which also says what the reader may do with it. Every op takes
a float32 ``[height, width, channels]`` image in [0, 1] and a shape-[2]
int32 seed, draws its random parameters with stateless TF ops (identical
for identical seeds, on any thread, in any process), then applies a
deterministic TF kernel. Colour ops clip back to [0, 1].

Cropping ops are defined by a `Window` (choose the window, then finish it), so
the reader can decode only that window of a JPEG, and crop the uint8 image
before converting it; the result is bit-identical to cropping the decoded
image (`Window.crop`). Colour ops are one affine map per pixel
(`color_twist`). The reader hands the flips (`OpDefinition.mirror`) and the
colour ops (`OpDefinition.pixelwise`) the uint8 crop window too, so they
accept uint8 images as well; colour ops return float32 in [0, 1]. The batch
ops (mixup, cutmix) are in `kiln.reader.mixing`.

Targets: an op that may move pixels (``geometric``, the default for user
ops) must move a dataset's boxes, masks and keypoints too, through a
``with_targets(image, targets, seed, **params) -> (image, targets)`` form
that draws the same values from the same seed (kiln's flips, rotation,
zoom and erasing have one; crops move targets through their `Window`).
`supports` says which target kinds it moves; the reader refuses an op that
cannot move a dataset's targets before reading any data.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
from pydantic import Field

from kiln.lazy_import import LazyModule
from kiln.reader.targets import GEOMETRIC_KINDS, ElementTargets
from kiln.reader.targets import cond as targets_cond
from kiln.registry import (
    Choice,
    HeightWidth,
    ListError,
    Probability,
    Range,
    Registered,
    Registry,
    Spec,
)

if TYPE_CHECKING:
    import tensorflow as tf
else:  # imported when an op runs: validating a list of ops needs only the declarations
    tf = LazyModule("tensorflow")

logger = logging.getLogger(__name__)

ElementFn = Callable[..., "tf.Tensor"]

_RESIZE_METHODS = ("bilinear", "bicubic", "area", "nearest", "lanczos3", "mitchellcubic")
_FILL_MODES = ("constant", "reflect", "wrap", "nearest")


class AugmentConfigError(ListError):
    """An augmentation list is invalid; `problems` names each wrong entry and parameter."""


# --- declaring ops --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Window:
    """How a cropping op splits into "choose a window" and "finish the crop".

    Lets the reader decode only the window of a JPEG
    (`tf.io.decode_and_crop_jpeg`) instead of the whole image. The op itself
    must equal `crop`: ``finish(slice_window(image, *sample(shape, seed)), **params)``.

    Attributes:
      sample: ``sample(shape, seed, **params) -> (offset, size)``; `shape` is
        the int32 ``[height, width]`` of the image, `offset` and `size` int32
        ``[2]`` tensors.
      finish: ``finish(window_image, **params) -> image``.
    """

    sample: Callable[..., tuple[tf.Tensor, tf.Tensor]]
    finish: Callable[..., tf.Tensor]
    finish_uint8: Callable[..., tf.Tensor | None] | None = None
    """Optional: `finish` with uint8 output, ``round(255 * finish(window))``
    computed on the 0..255 scale (cheaper than converting the float
    result); returns None for parameters it does not cover. A resize there
    rounds other float values than the float path's: where the exact value
    is a half level the two can round apart, by one level
    (docs/reader.md)."""
    finish_levels: Callable[..., tf.Tensor] | None = None
    """Optional: `finish_uint8` of a window given as levels (``255 * x +
    0.5``, float32 in [0.5, 255.5]: an `OpDefinition.levels` op's output),
    where a linear finish (a resize) keeps the half and a truncating cast
    rounds: the same values as `finish_uint8`, but for halves (rounded up)
    and float error, with no pass over the window before the resize and
    none after it but the cast."""

    def crop(self, image: tf.Tensor, seed: tf.Tensor | None, **params: Any) -> tf.Tensor:
        """The cropping op on a decoded image: sample the window, slice, finish.

        `image` may be uint8 (the op then runs before the image is converted) or
        float in [0, 1]; the result is float32 in [0, 1] either way.
        """
        offset, size = self.sample(tf.shape(image)[:2], seed, **params)
        return self.finish(slice_window(image, offset, size), **params)


def slice_window(image: tf.Tensor, offset: tf.Tensor, size: tf.Tensor) -> tf.Tensor:
    """The ``size`` window of an ``[height, width, channels]`` image at ``offset``."""
    cropped = tf.slice(image, tf.concat([offset, [0]], 0), tf.concat([size, [-1]], 0))
    cropped.set_shape([None, None, image.shape[-1]])
    return cropped


@dataclasses.dataclass(frozen=True)
class OpDefinition(Registered):
    """A registered op: its function and what the reader needs to know about it.

    Attributes (besides `Registered`'s name, fn, parameters and check):
      kind: ``"element"``: ``fn(image, seed, **params) -> image``, or
        ``"batch"``: ``fn(images, labels, seed, **params) -> (images, labels)``.
      inference: ``inference(image, **params) -> image``: what the op does
        where no random augmentation runs (non-train splits, the Keras layer
        with ``training=False``), e.g. a crop's deterministic center crop to
        the same output size. None means "leave the image as it is".
      inference_with_targets: ``inference_with_targets(image, targets,
        **params) -> (image, targets)``: `inference` moving the image's
        `kiln.reader.targets.ElementTargets` too (a user op whose inference
        form crops or resizes, on a dataset with boxes, masks or keypoints).
      window: Set for cropping ops that can be fused into JPEG decoding.
      inference_window: Same, for `inference`.
      builtin: True for kiln's own ops, which skip the first-use check.
      mirror: The op only mirrors the image (or not, at random): it commutes
        with cropping and resizing, so the reader applies it to the uint8
        crop window, before the window is resized (kiln's own flips).
      pixelwise: The op maps every pixel's colour alike, by at most an
        image-wide statistic (brightness, contrast, saturation, hue): the
        reader may apply it to the crop window before resizing it, where
        there are fewer pixels (kiln's own colour ops).
      geometric: The op may move pixels, so boxes, masks and keypoints must
        move with them. False: it only changes pixel values (colour ops), and
        targets pass through it untouched.
      with_targets: ``with_targets(image, targets, seed, **params) ->
        (image, targets)``: the op on an image and its
        `kiln.reader.targets.ElementTargets`, drawing the same random
        parameters from `seed` as `fn` (so the image equals ``fn``'s).
        Cropping ops with a `window` need none: the reader crops the targets
        with the window. A batch op's form is ``with_targets(images,
        targets, seed, **params)`` on `kiln.reader.targets.BatchTargets`.
      supports: The target kinds `with_targets` moves (``boxes``, ``mask``,
        ``instance_masks``, ``keypoints``); a dataset with a geometric kind
        outside it is refused.
      smallest_input: ``smallest_input(**params) -> (height, width)``: the
        smallest image the op (and its inference form) accepts, e.g. a
        crop's size; `load` checks it against the stored size up front.
      output_size: ``output_size(**params) -> (height, width)`` for ops that
        set their output's size (crops). None: kiln's own ops keep the size;
        a user's op leaves it unknown (so later ops are not checked).
      needs_rgb: ``needs_rgb(**params) -> bool``: whether the op, with these
        parameters, needs 3-channel (RGB) images (saturation, hue);
        checked against the dataset's channels before any data is read.
      targets_problem: ``targets_problem(kinds, **params) -> str | None``:
        why the op, with these parameters, cannot keep a dataset's targets
        of `kinds` consistent with its pixels (None: it can), for limits
        that `supports` cannot say (a fill mode that copies objects).
      doubt: ``doubt(**params) -> str | None``: what in valid parameters is
        probably not what was meant (a rotation of a tenth of a degree:
        Keras' turns written as kiln's degrees), as
        ``<parameter>: <why>``; `validate` logs it as a warning, once.
      levels: ``levels(image, seed, **params)``: a pixelwise op's output
        ``x`` as levels, ``255 * x + 0.5`` (float32 in [0.5, 255.5]), from
        the same draws: for uint8 output, the reader hands the last colour
        op before a crop's resize this form (`Window.finish_levels`), so the
        scale and the rounding cost no passes of their own.
    """

    kind: str = "element"
    inference: Callable[..., tf.Tensor] | None = None
    inference_with_targets: Callable[..., tuple[tf.Tensor, ElementTargets]] | None = None
    window: Window | None = None
    inference_window: Window | None = None
    builtin: bool = False
    mirror: bool = False
    pixelwise: bool = False
    geometric: bool = True
    # Element ops move ElementTargets; batch ops, BatchTargets.
    with_targets: Callable[..., tuple[tf.Tensor, Any]] | None = None
    supports: tuple[str, ...] | None = None
    smallest_input: Callable[..., tuple[int, int]] | None = None
    output_size: Callable[..., tuple[int, int]] | None = None
    needs_rgb: Callable[..., bool] | None = None
    targets_problem: Callable[..., str | None] | None = None
    doubt: Callable[..., str | None] | None = None
    levels: Callable[..., tf.Tensor] | None = None


AUGMENTATIONS: Registry[OpDefinition] = Registry(
    "augmentation op",
    "op",
    AugmentConfigError,
    entry=OpDefinition,
    own="an op of your own is registered with @kiln.reader.register_augmentation in a module "
    "that a build config names under plugins:, and training code imports before loading",
    elsewhere={
        # Keras preprocessing layers whose work is not random: done once, in
        # the build (docs/migrating.md), or not at all.
        **dict.fromkeys(
            ("resizing", "resize"),
            "resizing is not random, so kiln does it once, in the build: the config's "
            "transforms: [resize: {size: [height, width]}] (random_crop and random_resized_crop "
            "take a size online)",
        ),
        "centercrop": "a centre crop is not random, so kiln does it once, in the build: the "
        "config's transforms: [center_crop: {size: [height, width]}] (random_crop becomes a "
        "centre crop of its size outside training)",
        "rescaling": "not needed: kiln.reader's images are float32 in [0, 1] already "
        "(normalize=True standardizes them, dtype='uint8' gives 0..255)",
        "randomflip": "Keras' RandomFlip('horizontal') is random_flip_left_right, 'vertical' "
        "random_flip_up_down",
        "normalization": "not random, and not an op: load(..., normalize=True) standardizes "
        "with the train split's per-channel mean and std that the build stored (Keras' "
        "Normalization(mean=mean, variance=std ** 2) on 0..255)",
        **dict.fromkeys(
            ("randomtranslation", "translation", "randomshift"),
            "kiln has no translation op: register one with @kiln.reader.register_augmentation "
            "(docs/migrating.md has random_translation, with Keras' RandomTranslation pixels)",
        ),
    },
)

# The data each kind of op gets before its configurable parameters.
_LEADING = {"element": ("image", "seed"), "batch": ("images", "labels", "seed")}


def register_augmentation(
    name: str | None = None,
    *,
    inference: Callable[..., tf.Tensor] | None = None,
    check: Callable[..., None] | None = None,
    geometric: bool = True,
    with_targets: Callable[..., tuple[tf.Tensor, ElementTargets]] | None = None,
    supports: Iterable[str] | None = None,
    needs_rgb: bool | Callable[..., bool] = False,
    inference_with_targets: Callable[..., tuple[tf.Tensor, ElementTargets]] | None = None,
) -> Callable[[ElementFn], ElementFn]:
    """Decorator: registers ``fn(image, seed, *, param=default, ...)`` as an element op.

    Args:
      name: Name used in augmentation lists; defaults to the function's name.
      inference: Optional ``inference(image, **params)``: the op's
        deterministic counterpart where no random augmentation runs (must keep
        the output size the op produces, if it changes it).
      check: Optional ``check(**params)`` for constraints between parameters;
        raise ValueError with the reason (reported with the list entry).
      geometric: Whether the op may move pixels (the default, the safe
        assumption). A geometric op without `with_targets` is refused for
        datasets with boxes, masks or keypoints: they would no longer match
        the image. Say False for an op that only changes pixel values.
      with_targets: ``with_targets(image, targets, seed, *, params) ->
        (image, targets)``: the op moving the image and its
        `kiln.reader.targets.ElementTargets` with the same random draw
        (``targets.crop``, ``flip_left_right``, ``warp``... do the moves).
      supports: The target kinds `with_targets` handles, e.g.
        ``["boxes", "keypoints"]``; required with `with_targets`.
      inference_with_targets: ``inference_with_targets(image, targets, *,
        params) -> (image, targets)``: `inference` moving the targets too,
        for a geometric op whose inference form moves pixels (a centre
        crop), so that other splits of datasets with boxes, masks or
        keypoints can run it; needs `inference` (which it must equal on the
        image) and `with_targets`, and handles the kinds of `supports`.
      needs_rgb: True if the op needs 3-channel (RGB) images (a hue or
        saturation change), or ``needs_rgb(**params) -> bool`` when that
        depends on its parameters: `load`, `load_for_model`, the
        `AugmentationLayer` and ``kiln build`` then refuse it, naming it, for
        grayscale images, before any data is read (not when first traced).

    Raises:
      ValueError: if the name is taken by another function, the signature is
        not ``fn(image, seed, *, keyword_only_params)``, or `with_targets` is
        given without `supports` (or names an unknown kind).
    """
    if with_targets is not None and supports is None:
        raise ValueError(
            "register_augmentation: with_targets needs supports=[...], the target kinds it "
            f"moves (of {list(GEOMETRIC_KINDS)})"
        )
    if inference_with_targets is not None and (inference is None or with_targets is None):
        raise ValueError(
            "register_augmentation: inference_with_targets is the targets' form of "
            "inference=, next to with_targets=: give all three"
        )
    kinds = None if supports is None else tuple(supports)
    unknown = sorted(set(kinds or ()) - set(GEOMETRIC_KINDS))
    if unknown:
        raise ValueError(
            f"register_augmentation: supports names unknown target kind(s) {unknown}; "
            f"expected some of {list(GEOMETRIC_KINDS)}"
        )
    if isinstance(needs_rgb, bool):
        needs_rgb = _always if needs_rgb else _never
    return AUGMENTATIONS.register(
        name,
        leading=_LEADING["element"],
        inference=inference,
        check=check,
        geometric=geometric,
        with_targets=with_targets,
        supports=kinds,
        needs_rgb=needs_rgb,
        inference_with_targets=inference_with_targets,
    )


def _never(**_: Any) -> bool:
    return False


def builtin_op(name: str, *, kind: str = "element", **details: Any) -> Callable:
    """Decorator for kiln's own ops: trusted (no first-use check), and free to
    declare what the reader may do with them (`OpDefinition`'s window,
    inference_window, mirror, pixelwise, with_targets, smallest_input,
    output_size, needs_rgb, targets_problem, doubt). Colour ops
    (pixelwise) are not geometric, and have a levels form (the op run with
    `_LEVELS` set: its `color_twist` and unchanged images give levels);
    element ops move every target kind."""
    details.setdefault("geometric", not details.get("pixelwise", False))
    if kind == "element":
        details.setdefault("supports", GEOMETRIC_KINDS)

    def decorator(fn: ElementFn) -> ElementFn:
        if details.get("pixelwise"):
            details["levels"] = _levels_form(fn)
        return AUGMENTATIONS.register(
            name, leading=_LEADING[kind], kind=kind, builtin=True, **details
        )(fn)

    return decorator


def _levels_form(fn: ElementFn) -> ElementFn:
    """A colour op's `OpDefinition.levels` form: the op run with `_LEVELS` set."""

    def levels(image: tf.Tensor, seed: tf.Tensor, **params: Any) -> tf.Tensor:
        token = _LEVELS.set(True)
        try:
            return fn(image, seed, **params)
        finally:
            _LEVELS.reset(token)

    return levels


def names() -> list[str]:
    """Sorted names of all registered ops (element and batch)."""
    return AUGMENTATIONS.names()


def get(name: str) -> OpDefinition:
    """The op registered as `name`; raises AugmentConfigError if there is none."""
    return AUGMENTATIONS.get(name)


class Augmentation(Spec):
    """One configured op: a registered name and validated, normalized parameters.

    Frozen and hashable; looks the function up by name, so it survives being
    rebuilt in another process from `to_json`.
    """

    @property
    def definition(self) -> OpDefinition:
        return AUGMENTATIONS.get(self.name)


def validate(specs: Iterable[Any] | None, field: str = "augment") -> list[Augmentation]:
    """Checks an augmentation list in YAML form and returns it resolved.

    Each entry is an op name (``- random_flip_left_right``) or a one-key
    mapping ``{name: {param: value, ...}}``. Defaults are filled in and
    values normalized (a size ``56`` becomes ``(56, 56)``), so
    ``[a.to_json() for a in validate(x)]`` is the resolved list.

    Args:
      specs: The list (None or empty means no augmentation).
      field: Name of the list in error messages (e.g. ``"augment"``).

    Raises:
      AugmentConfigError: naming the entry and parameter, e.g.
        ``augment[0].random_resized_crop.scale_range: expected low <= high``.
    """
    resolved = AUGMENTATIONS.parse(specs, field, make=Augmentation)
    kinds = [augmentation.definition.kind for augmentation in resolved]
    for index, augmentation in enumerate(resolved):
        if kinds[index] == "element" and "batch" in kinds[:index]:
            raise AugmentConfigError(
                f"{field}[{index}].{augmentation.name}: element ops must come before batch ops "
                f"(mixup, cutmix), which run on whole batches at the end"
            )
    for index, augmentation in enumerate(resolved):
        _warn_doubt(augmentation, f"{field}[{index}]")
    return resolved


# The ops and parameters `_warn_doubt` has warned about in this process.
_doubted: set[Augmentation] = set()


def _warn_doubt(augmentation: Augmentation, where: str) -> None:
    """Logs the op's `OpDefinition.doubt` about its parameters, if any, as a
    warning naming the entry: once per process for each op and parameters
    (a training script's `load` per epoch, or the build's and the reader's
    checks of one list, say it once)."""
    doubt = augmentation.definition.doubt
    message = None if doubt is None else doubt(**augmentation.kwargs)
    if message is None or augmentation in _doubted:
        return
    _doubted.add(augmentation)
    logger.warning("%s.%s.%s", where, augmentation.name, message)


# --- kiln's element ops ---------------------------------------------------------------

# Parameter types of kiln's own ops, beside the shared ones of kiln.registry.
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]  # a level or an amount on the [0, 1] scale
HueTurns = Annotated[float, Field(ge=0.0, le=0.5)]  # a hue amount in turns, half a turn at most
AreaRange = Annotated[tuple[float, float], Range(0.0, 1.0)]  # fractions of the image area
RatioRange = Annotated[tuple[float, float], Range(positive=True)]  # aspect ratios
FactorRange = Annotated[tuple[float, float], Range(minimum=0.0)]  # scale factors

# What a Keras user's parameter is in kiln's terms, said after an error about
# it (docs/migrating.md checks each conversion against Keras).
_KERAS_ROTATION = (
    "angle_range is in degrees, counter-clockwise: Keras' RandomRotation(factor=f), "
    "in turns, is angle_range [-360 f, 360 f]"
)
_KERAS_ZOOM = (
    "factor_range is a scale factor, above 1 zooming in: Keras' RandomZoom(h), whose "
    "positive h zooms out, is factor_range [1 / (1 + h), 1 / (1 - h)], "
    "[0.909, 1.111] for h = 0.1"
)
_KERAS_CONTRAST = "Keras' RandomContrast(f) is factor_range [1 - f, 1 + f]"
_KERAS_BRIGHTNESS = (
    "max_delta is on kiln's [0, 1] scale: Keras' RandomBrightness(f), a fraction of its "
    "value_range, is max_delta f"
)
_KERAS_CROP = "Keras' RandomCrop(height, width) is size [height, width]"


def _uniform(seed: tf.Tensor, low: float = 0.0, high: float = 1.0) -> tf.Tensor:
    return tf.random.stateless_uniform([], seed=seed, minval=low, maxval=high)


def _with_probability(
    probability: float,
    seed: tf.Tensor,
    apply: Callable[[], tf.Tensor],
    image: tf.Tensor,
    otherwise: Callable[[], tf.Tensor] | None = None,
) -> tf.Tensor:
    """``apply()`` with `probability`, else ``otherwise()`` (default: `image` itself)."""
    # A per-element tf.cond runs only the chosen branch; for probability 1 the
    # condition is left out of the graph entirely.
    if probability >= 1.0:
        return apply()
    return tf.cond(_uniform(seed) < probability, apply, otherwise or (lambda: image))


def _targets_with_probability(
    probability: float,
    seed: tf.Tensor,
    apply: Callable[[], tuple[tf.Tensor, ElementTargets]],
    image: tf.Tensor,
    targets: ElementTargets,
) -> tuple[tf.Tensor, ElementTargets]:
    """`_with_probability` for an image and its targets: the same draw decides both."""
    if probability >= 1.0:
        return apply()
    return targets_cond(_uniform(seed) < probability, apply, lambda: (image, targets), targets)


def _always(**_: Any) -> bool:
    return True


def _jitters_colour(*, saturation: float, hue: float, **_: Any) -> bool:
    return bool(saturation or hue)


def _require_rgb(name: str, image: tf.Tensor) -> None:
    if image.shape[-1] is not None and image.shape[-1] != 3:
        raise ValueError(
            f"augmentation op {name!r} needs 3-channel (RGB) images; this dataset's images "
            f"have {image.shape[-1]} channel(s)"
        )


def to_float(image: tf.Tensor) -> tf.Tensor:
    """float32 in [0, 1] from uint8 (scaled) or any float image (cast)."""
    if image.dtype == tf.uint8:
        return tf.cast(image, tf.float32) * (1.0 / 255.0)
    return tf.cast(image, tf.float32)


# Set while a colour op runs as its levels form (`OpDefinition.levels`):
# read by `color_twist` and `_unchanged`, the two ways a colour op makes
# its output, so each op is written once.
_LEVELS: contextvars.ContextVar[bool] = contextvars.ContextVar("kiln_levels", default=False)


def _unchanged(image: tf.Tensor) -> tf.Tensor:
    """A colour op's output where it changes nothing: float, or levels."""
    return to_levels(image) if _LEVELS.get() else to_float(image)


def to_levels(image: tf.Tensor) -> tf.Tensor:
    """`to_float`'s image as levels, ``255 * x + 0.5`` (see `OpDefinition.levels`)."""
    if image.dtype == tf.uint8:
        return tf.cast(image, tf.float32) + 0.5
    return tf.cast(image, tf.float32) * 255.0 + 0.5


# --- windows (crops) ------------------------------------------------------------------


def _check_fits(shape: tf.Tensor, size: tuple[int, int], name: str) -> list:
    return [
        tf.debugging.assert_greater_equal(
            shape,
            tf.constant(size, tf.int32),
            message=f"{name}: the image is smaller than the crop size {list(size)} (height, width)",
        )
    ]


def _random_crop_window(shape, seed, *, size):
    with tf.control_dependencies(_check_fits(shape, size, "random_crop")):
        room = shape - tf.constant(size, tf.int32) + 1
    draws = tf.random.stateless_uniform([2], seed=seed)
    offset = tf.minimum(tf.cast(draws * tf.cast(room, tf.float32), tf.int32), room - 1)
    return offset, tf.constant(size, tf.int32)


def _center_crop_window(shape, seed, *, size):
    del seed  # deterministic
    with tf.control_dependencies(_check_fits(shape, size, "random_crop")):
        offset = (shape - tf.constant(size, tf.int32)) // 2
    return offset, tf.constant(size, tf.int32)


def _finish_crop(image, *, size):
    return tf.ensure_shape(to_float(image), [size[0], size[1], image.shape[-1]])


def _finish_crop_uint8(image, *, size):
    if image.dtype != tf.uint8:
        image = tf.cast(tf.round(image * 255.0), tf.uint8)
    return tf.ensure_shape(image, [size[0], size[1], image.shape[-1]])


_RANDOM_CROP = Window(_random_crop_window, _finish_crop, _finish_crop_uint8)
_CENTER_CROP = Window(_center_crop_window, _finish_crop, _finish_crop_uint8)


def _center_crop(image, *, size):
    return _CENTER_CROP.crop(image, None, size=size)


def _crop_size(*, size, **_):
    return tuple(size)


@builtin_op(
    "random_crop",
    inference=_center_crop,
    window=_RANDOM_CROP,
    inference_window=_CENTER_CROP,
    smallest_input=_crop_size,
    output_size=_crop_size,
    notes=dict.fromkeys(("size", "height", "width"), _KERAS_CROP),
)
def random_crop(image, seed, *, size: HeightWidth):
    """A uniformly placed ``size`` window (``[height, width]``); where no
    augmentation runs, the centre window of the same size."""
    return _RANDOM_CROP.crop(image, seed, size=size)


def _resized_crop_window(shape, seed, *, size, scale_range, ratio_range, method, antialias):
    del size, method, antialias  # used by the finish step
    begin, extent, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.concat([shape, [1]], 0),
        bounding_boxes=tf.zeros([1, 0, 4], tf.float32),
        seed=seed,
        min_object_covered=0.0,
        aspect_ratio_range=ratio_range,
        area_range=scale_range,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,  # falls back to the whole image
    )
    return begin[:2], extent[:2]


def _central_aspect_window(shape, seed, *, size, scale_range, ratio_range, method, antialias):
    # The largest centred window with the output's aspect ratio: the whole
    # view the random crops sample from, without distorting it.
    del seed, scale_range, ratio_range, method, antialias
    height, width = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
    aspect = size[1] / size[0]
    crop_h = tf.minimum(height, width / aspect)
    crop_w = tf.minimum(width, height * aspect)
    extent = tf.maximum(tf.cast(tf.round(tf.stack([crop_h, crop_w])), tf.int32), 1)
    return (shape - extent) // 2, extent


# Resize kernels with negative lobes, whose output can leave the input's range.
_OVERSHOOTING_METHODS = ("bicubic", "lanczos3", "mitchellcubic")


def _finish_resized_crop(image, *, size, scale_range, ratio_range, method, antialias):
    del scale_range, ratio_range
    # Float first: TF's resize is faster on float input than on uint8 (see
    # BENCHMARKS.md), and converting the (usually smaller) window costs little.
    resized = tf.image.resize(to_float(image), size, method=method, antialias=antialias)
    if method in _OVERSHOOTING_METHODS:
        resized = tf.clip_by_value(resized, 0.0, 1.0)
    # Bilinear, area and nearest average pixels with non-negative weights:
    # the result stays in [0, 1] without clipping.
    return tf.ensure_shape(resized, [size[0], size[1], image.shape[-1]])


def _finish_resized_crop_uint8(image, *, size, scale_range, ratio_range, method, antialias):
    del scale_range, ratio_range
    if method in _OVERSHOOTING_METHODS:
        return None  # would need a clip: the float path's cast does it
    # The window on the 0..255 scale (one pass over the window, usually
    # smaller than the output), then only a rounding pass over the output:
    # the resize is linear and keeps [0, 255] (see _finish_resized_crop).
    scaled = tf.cast(image, tf.float32) if image.dtype == tf.uint8 else image * 255.0
    resized = tf.image.resize(scaled, size, method=method, antialias=antialias)
    out = tf.cast(tf.round(resized), tf.uint8)
    return tf.ensure_shape(out, [size[0], size[1], image.shape[-1]])


def _finish_resized_crop_levels(image, *, size, scale_range, ratio_range, method, antialias):
    del scale_range, ratio_range
    resized = tf.image.resize(image, size, method=method, antialias=antialias)
    if method in _OVERSHOOTING_METHODS:
        resized = tf.clip_by_value(resized, 0.5, 255.5)
    # Levels hold the half: the cast's truncation rounds.
    return tf.ensure_shape(tf.cast(resized, tf.uint8), [size[0], size[1], image.shape[-1]])


_RESIZED_CROP = Window(
    _resized_crop_window,
    _finish_resized_crop,
    _finish_resized_crop_uint8,
    _finish_resized_crop_levels,
)
_CENTRAL_RESIZED_CROP = Window(
    _central_aspect_window,
    _finish_resized_crop,
    _finish_resized_crop_uint8,
    _finish_resized_crop_levels,
)


def _central_resized_crop(image, **params):
    return _CENTRAL_RESIZED_CROP.crop(image, None, **params)


def _check_resized_crop(*, size, scale_range, ratio_range, method, antialias):
    del size, ratio_range, method, antialias
    if scale_range[1] > 1.0 or scale_range[0] <= 0.0:
        raise ValueError(
            f"scale_range: fractions of the image area must be in (0, 1], got {list(scale_range)}"
        )


@builtin_op(
    "random_resized_crop",
    inference=_central_resized_crop,
    window=_RESIZED_CROP,
    inference_window=_CENTRAL_RESIZED_CROP,
    check=_check_resized_crop,
    output_size=_crop_size,
)
def random_resized_crop(
    image,
    seed,
    *,
    size: HeightWidth,
    scale_range: AreaRange = (0.08, 1.0),
    ratio_range: RatioRange = (3 / 4, 4 / 3),
    method: Annotated[str, Choice(_RESIZE_METHODS)] = "bilinear",
    antialias: bool = False,
):
    """A window covering a `scale_range` fraction of the area with a width/height
    ratio in `ratio_range`, resized to ``size``. Windows are sampled with
    `tf.image.stateless_sample_distorted_bounding_box` (10 attempts, then the
    whole image). Where no augmentation runs: the largest centred window with
    the output's aspect ratio, resized to ``size``."""
    return _RESIZED_CROP.crop(
        image,
        seed,
        size=size,
        scale_range=scale_range,
        ratio_range=ratio_range,
        method=method,
        antialias=antialias,
    )


# --- flips ----------------------------------------------------------------------------


def _mirror_with_targets(image, targets, seed, probability, axis):
    """A random flip of the image (as the op without targets: a `tf.cond`) and
    of its targets, selected by the same draw: the targets' flip is a few
    small ops (or a change of the deferred mask grid), cheaper than passing
    every target tensor through the `tf.cond`."""
    mirror = targets.flip_left_right if axis == 1 else targets.flip_up_down
    if probability >= 1.0:
        return tf.reverse(image, axis=[axis]), mirror()
    flips = _uniform(seed) < probability
    image = tf.cond(flips, lambda: tf.reverse(image, axis=[axis]), lambda: image)
    return image, mirror(when=flips)


def _flip_left_right_targets(image, targets, seed, *, probability):
    return _mirror_with_targets(image, targets, seed, probability, axis=1)


def _flip_up_down_targets(image, targets, seed, *, probability):
    return _mirror_with_targets(image, targets, seed, probability, axis=0)


@builtin_op("random_flip_left_right", mirror=True, with_targets=_flip_left_right_targets)
def random_flip_left_right(image, seed, *, probability: Probability = 0.5):
    """Mirrors the image horizontally with `probability`. Keypoints of each
    `flip_pairs` pair swap (left eye becomes right eye)."""
    return _with_probability(probability, seed, lambda: tf.reverse(image, axis=[1]), image)


@builtin_op("random_flip_up_down", mirror=True, with_targets=_flip_up_down_targets)
def random_flip_up_down(image, seed, *, probability: Probability = 0.5):
    """Mirrors the image vertically with `probability`. Keypoints of each
    `flip_pairs` pair swap too: any mirror image swaps the subject's left and right."""
    return _with_probability(probability, seed, lambda: tf.reverse(image, axis=[0]), image)


# --- colour ---------------------------------------------------------------------------
#
# All colour ops are one affine map per pixel, a "colour twist" (as in NVIDIA
# DALI): brightness adds a delta, contrast scales about the mean luma,
# saturation blends with the pixel's luma, hue rotates the chroma plane of YIQ.
# Composed, they are ``clip(M @ pixel + offset)`` with one 3x3 matrix per
# image: a single matmul instead of one RGB-HSV-RGB round trip per op (a
# branchy per-pixel conversion each way).

_LUMA = np.array([0.299, 0.587, 0.114])
_RGB_TO_YIQ = np.array(
    [[0.299, 0.587, 0.114], [0.595716, -0.274453, -0.321263], [0.211456, -0.522591, 0.311135]]
)
_YIQ_TO_RGB = np.linalg.inv(_RGB_TO_YIQ)
# Rotating YIQ's chroma plane by angle a, in RGB: FIXED + cos(a) COS + sin(a) SIN
# (precomputed in float64). Built from scalars times constant matrices, not a
# chain of small matmuls, whose rounding graph optimizers may reorder
# differently in tf.data and in a model.
_HUE_FIXED, _HUE_COS, _HUE_SIN = (
    _YIQ_TO_RGB @ part @ _RGB_TO_YIQ
    for part in (
        np.diag([1.0, 0.0, 0.0]),
        np.diag([0.0, 1.0, 1.0]),
        np.array([[0.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]]),
    )
)
_GREY = np.outer(np.ones(3), _LUMA)  # pixel -> its luma in every channel
_COLOR_BASIS = np.stack([_HUE_FIXED, _HUE_COS, _HUE_SIN, _GREY]).reshape(4, 9)


def color_twist(
    image: tf.Tensor,
    *,
    brightness: tf.Tensor | None = None,
    contrast: tf.Tensor | None = None,
    saturation: tf.Tensor | None = None,
    hue: tf.Tensor | None = None,
    levels: bool | None = None,
) -> tf.Tensor:
    """Brightness, contrast, saturation and hue changes, in that order, in one pass.

    Args:
      image: float32 ``[height, width, channels]`` in [0, 1], or uint8, read
        as ``pixel / 255`` with the division folded into the colour matrix
        (the reader hands colour ops the uint8 crop window: one pass fewer).
      brightness: Delta added to every channel.
      contrast: Factor scaling each pixel's distance from the image's mean
        luma (computed before any change but brightness).
      saturation: Factor scaling each pixel's distance from its own luma
        (0 gives grey, 1 leaves it). RGB only.
      hue: Rotation of the chroma (I, Q) plane of YIQ, in turns (1 = 360°).
        RGB only.
      levels: Return ``255 * out + 0.5`` (`OpDefinition.levels`), the
        scale and the half folded into the matrix, the offset and the clip.
        None: whether the calling op runs as its levels form.

    Returns:
      float32 ``clip(c * H S pixel + brightness + (1 - c) * mean_luma, 0, 1)``.
      The parts left as None are skipped; luma (grey) pixels are fixed
      points of S and H, which is what lets the offset be one scalar.
    """
    rgb = saturation is not None or hue is not None
    if rgb:
        _require_rgb("color_twist (saturation, hue)", image)
    if levels is None:
        levels = _LEVELS.get()
    scale = 1.0 / 255.0 if image.dtype == tf.uint8 else 1.0
    # Levels: the output is 255 times larger; the input's mean keeps its scale.
    gain = 255.0 if levels else 1.0
    if rgb:
        # Padded for `_mix_channels` before the cast (in uint8: a quarter of
        # the bytes); `pixels` is the padding's prefix (a slice at offset 0,
        # no copy).
        padded = tf.cast(_pad_to_rows(image), tf.float32)
        pixels = tf.ensure_shape(tf.reshape(padded[: tf.size(image)], tf.shape(image)), image.shape)
    else:
        pixels = tf.cast(image, tf.float32)
    offsets = []
    if brightness is not None:
        offsets.append(brightness)
    if contrast is not None:
        # Per-channel means, then their luma: three multiplies, where weighting
        # every pixel first would be a broadcast multiply over the image.
        channel_means = _channel_means(pixels)
        if pixels.shape[-1] == 3:
            mean = tf.tensordot(channel_means, tf.constant(_LUMA * scale, tf.float32), 1)
        else:
            mean = tf.reduce_mean(channel_means)
            mean = mean * scale if scale != 1.0 else mean
        offsets.append((1.0 - contrast) * mean)
    if rgb:
        # c H S = c s H + c (1 - s) GREY (H leaves grey pixels unchanged), and
        # H = FIXED + cos COS + sin SIN: four scalar weights of four constant
        # matrices, combined by one matmul (whose rounding no graph rewrite
        # reorders, so tf.data and a model compute the same matrix).
        factor = contrast if contrast is not None else tf.constant(1.0)
        chroma = factor * saturation if saturation is not None else factor
        grey = factor * (1.0 - saturation) if saturation is not None else tf.constant(0.0)
        if hue is not None:
            angle = hue * (2.0 * math.pi)
            turn = [chroma, chroma * tf.cos(angle), chroma * tf.sin(angle)]
        else:
            turn = [chroma, chroma, tf.constant(0.0)]  # FIXED + COS is the identity
        weights = tf.stack(turn + [grey])[None]
        basis = tf.constant(_COLOR_BASIS * (scale * gain), tf.float32)
        matrix = tf.reshape(tf.matmul(weights, basis), [3, 3])
        out = _mix_channels(padded, matrix, tf.shape(pixels))
    elif contrast is not None:
        # One channel: no matrix.
        out = (contrast * (scale * gain) if scale * gain != 1.0 else contrast) * pixels
    else:
        out = pixels * (scale * gain) if scale * gain != 1.0 else pixels
    if levels:
        offsets = [tf.reduce_sum(tf.stack(offsets)) * gain + 0.5] if offsets else [0.5]
    if offsets:
        # One Add: Grappler rewrites chains of Adds into AddN in its own order,
        # which would round differently here and in the Keras layer.
        out += offsets[0] if len(offsets) == 1 else tf.reduce_sum(tf.stack(offsets))
    low, high = (0.5, 255.5) if levels else (0.0, 1.0)
    return tf.ensure_shape(tf.clip_by_value(out, low, high), image.shape)


# Pixels per row of `_mix_channels`' matmul.
_PIXELS_PER_ROW = 8


def _pad_to_rows(image: tf.Tensor) -> tf.Tensor:
    """The flat ``[height, width, 3]`` image, zero-padded to whole rows of `_PIXELS_PER_ROW`."""
    flat = tf.reshape(image, [-1])
    return tf.pad(flat, [[0, tf.math.floormod(-tf.size(flat), 3 * _PIXELS_PER_ROW)]])


def _mix_channels(padded: tf.Tensor, matrix: tf.Tensor, shape: tf.Tensor) -> tf.Tensor:
    """``matrix @ pixel`` for every pixel of a `_pad_to_rows` image, reshaped to `shape`.

    A ``[pixels, 3] x [3, 3]`` matmul runs TF's general contraction with an
    inner dimension of 3, far below its speed on wider operands (see
    BENCHMARKS.md). Rows of 8 pixels against the ``[24, 24]`` block diagonal
    of 8 copies of the matrix give the same sums up to float rounding (the
    other terms are exact zeros) in half the time on a crop window.
    """
    rows = _PIXELS_PER_ROW
    blocks = tf.eye(rows)[:, None, :, None] * tf.transpose(matrix)[None, :, None, :]
    mixed = tf.matmul(tf.reshape(padded, [-1, 3 * rows]), tf.reshape(blocks, [3 * rows, 3 * rows]))
    return tf.reshape(tf.reshape(mixed, [-1])[: tf.reduce_prod(shape)], shape)


def _channel_means(pixels: tf.Tensor) -> tf.Tensor:
    """Per-channel means of a float ``[height, width, channels]`` image.

    The rows are averaged first (a reduction over the outer dimension, which
    TF vectorizes along the row), then the pixels of the mean row: one
    reduction over axes [0, 1] would keep only the channels as its inner
    axis, too short to vectorize. Means,
    not sums and a division: a division by the pixel count, a constant
    where the shape is static (in a model), is one that graph optimizers
    rewrite, rounding differently in the model and in tf.data.
    """
    shape = tf.shape(pixels)
    channels = pixels.shape[-1] if pixels.shape[-1] is not None else shape[2]
    row = tf.reduce_mean(tf.reshape(pixels, [shape[0], -1]), 0)  # [width * channels]
    return tf.reduce_mean(tf.reshape(row, [-1, channels]), 0)  # [channels]


@builtin_op(
    "random_brightness",
    pixelwise=True,
    notes=dict.fromkeys(("max_delta", "factor", "value_range"), _KERAS_BRIGHTNESS),
)
def random_brightness(image, seed, *, max_delta: Fraction = 0.2):
    """Adds one delta drawn from ``[-max_delta, max_delta]`` to every pixel."""
    return color_twist(image, brightness=_uniform(seed, -max_delta, max_delta))


@builtin_op(
    "random_contrast",
    pixelwise=True,
    notes={"factor_range": _KERAS_CONTRAST, "factor": _KERAS_CONTRAST},
)
def random_contrast(image, seed, *, factor_range: FactorRange = (0.8, 1.2)):
    """Scales each pixel's distance from the image's mean luma by a factor from
    `factor_range`."""
    return color_twist(image, contrast=_uniform(seed, *factor_range))


@builtin_op("random_saturation", pixelwise=True, needs_rgb=_always)
def random_saturation(image, seed, *, factor_range: FactorRange = (0.8, 1.2)):
    """Scales each pixel's distance from its luma by a factor from `factor_range`. RGB only."""
    _require_rgb("random_saturation", image)
    return color_twist(image, saturation=_uniform(seed, *factor_range))


@builtin_op("random_hue", pixelwise=True, needs_rgb=_always)
def random_hue(image, seed, *, max_delta: HueTurns = 0.05):
    """Rotates hue (the YIQ chroma plane) by a delta from ``[-max_delta, max_delta]``
    turns. RGB only."""
    _require_rgb("random_hue", image)
    return color_twist(image, hue=_uniform(seed, -max_delta, max_delta))


@builtin_op("color_jitter", pixelwise=True, needs_rgb=_jitters_colour)
def color_jitter(
    image,
    seed,
    *,
    brightness: Fraction = 0.4,
    contrast: Fraction = 0.4,
    saturation: Fraction = 0.4,
    hue: HueTurns = 0.1,
    probability: Probability = 1.0,
):
    """Brightness, contrast, saturation and hue jitter, composed into one `color_twist`.

    Draws a delta from ``[-brightness, brightness]``, factors from
    ``[1 - x, 1 + x]`` for contrast and saturation, and a hue rotation from
    ``[-hue, hue]`` turns; a zero turns that part off. The whole jitter
    happens with `probability`. Saturation and hue need RGB images.
    """
    if saturation or hue:
        _require_rgb("color_jitter (saturation, hue)", image)
    # All five draws in one op: per-element scalar ops cost about as much as
    # a pass over a small image.
    draws = tf.unstack(tf.random.stateless_uniform([5], seed))

    def between(index, low, high):
        return low + (high - low) * draws[index]

    def factor(index, amount):
        return between(index, max(0.0, 1.0 - amount), 1.0 + amount) if amount else None

    def jitter():
        return color_twist(
            image,
            brightness=between(0, -brightness, brightness) if brightness else None,
            contrast=factor(1, contrast),
            saturation=factor(2, saturation),
            hue=between(3, -hue, hue) if hue else None,
        )

    if probability >= 1.0:
        return jitter()
    return tf.cond(draws[4] < probability, jitter, lambda: _unchanged(image))


@builtin_op("random_grayscale", pixelwise=True, needs_rgb=_always)
def random_grayscale(image, seed, *, probability: Probability = 0.1):
    """Replaces the image by its luma (kept as 3 channels) with `probability`. RGB only."""
    _require_rgb("random_grayscale", image)
    return _with_probability(
        probability,
        seed,
        lambda: color_twist(image, saturation=tf.constant(0.0)),
        image,
        otherwise=lambda: _unchanged(image),
    )


# --- geometry -------------------------------------------------------------------------


def rotation_transform(shape: tf.Tensor, angle: tf.Tensor) -> tf.Tensor:
    """The float32 ``[8]`` `ImageProjectiveTransformV3` transform rotating an
    image of int32 ``shape`` (height, width, ...) by `angle` radians about its centre."""
    cos, sin = tf.cos(angle), tf.sin(angle)
    # The transform maps output pixel (x, y) to input R (x, y) + offset, and
    # keeps the centre c in place: offset = c - R c. A matvec, not a chain
    # of scalar adds, so graph optimizers (constant folding, which pushes
    # known sizes through such chains) cannot reorder the rounding.
    center = (tf.cast(tf.reverse(shape[:2], [0]), tf.float32) - 1.0) * 0.5
    rotation = tf.stack([tf.stack([cos, -sin]), tf.stack([sin, cos])])
    offset = center - tf.linalg.matvec(rotation, center)
    return tf.stack([cos, -sin, offset[0], sin, cos, offset[1], 0.0, 0.0])


def project(
    image: tf.Tensor, transform: tf.Tensor, *, fill_mode: str, fill_value: float, interpolation: str
) -> tf.Tensor:
    """`image` through an ``[8]`` transform that maps output pixels to input points."""
    projected = tf.raw_ops.ImageProjectiveTransformV3(
        images=image[None],
        transforms=transform[None],
        output_shape=tf.shape(image)[:2],
        fill_value=tf.constant(fill_value, tf.float32),
        interpolation=interpolation.upper(),
        fill_mode=fill_mode.upper(),
    )[0]
    return tf.ensure_shape(projected, image.shape)


def rotate(
    image: tf.Tensor, angle: tf.Tensor, *, fill_mode: str, fill_value: float, interpolation: str
) -> tf.Tensor:
    """Rotates `image` by `angle` radians (counter-clockwise) about its centre."""
    transform = rotation_transform(tf.shape(image), angle)
    return project(
        image, transform, fill_mode=fill_mode, fill_value=fill_value, interpolation=interpolation
    )


def _warp_targets(image, targets, transform, *, fill_mode, fill_value, interpolation):
    shape = tf.shape(image)
    warped = project(
        image, transform, fill_mode=fill_mode, fill_value=fill_value, interpolation=interpolation
    )
    return warped, targets.warp(transform, shape[:2], fill_mode=fill_mode)


def _fill_mode_problem(kinds: Iterable[str], fill_mode: str) -> str | None:
    """Refuses fill modes that copy image content on a dataset with objects:
    ``wrap`` and ``reflect`` fill the uncovered border with copies of the
    image, objects included, and a copy gets no box, instance mask or
    keypoints (the semantic mask, warped with the same fill, shows it)."""
    if fill_mode in ("wrap", "reflect") and "boxes" in kinds:
        return (
            f"fill_mode {fill_mode!r} fills the uncovered border with copies of the image, "
            f"and a copied object gets no box (nor instance mask, nor keypoints): use "
            f"fill_mode 'constant' on a dataset with boxes"
        )
    return None


def _rotation_targets_problem(kinds, *, angle_range, fill_mode, **_: Any) -> str | None:
    return None if tuple(angle_range) == (0.0, 0.0) else _fill_mode_problem(kinds, fill_mode)


def _zoom_targets_problem(kinds, *, factor_range, fill_mode, **_: Any) -> str | None:
    # Zooming in covers the whole image: nothing is filled.
    return _fill_mode_problem(kinds, fill_mode) if factor_range[0] < 1.0 else None


def _rotation_doubt(*, angle_range, **_: Any) -> str | None:
    """A range of sub-degree angles, none of them 0: Keras' RandomRotation
    factor (in turns) written as kiln's angle_range (in degrees)."""
    if not all(0 < abs(angle) < 1 for angle in angle_range):
        return None
    written = ", ".join(f"{angle:g}" for angle in angle_range)
    largest = max(abs(angle) for angle in angle_range)
    return (
        f"angle_range: [{written}] rotates by {largest:g} degree at most; {_KERAS_ROTATION} "
        f"(docs/migrating.md)"
    )


def _rotation_targets(image, targets, seed, *, angle_range, **params):
    low, high = (a * math.pi / 180.0 for a in angle_range)
    transform = rotation_transform(tf.shape(image), _uniform(seed, low, high))
    return _warp_targets(image, targets, transform, **params)


@builtin_op(
    "random_rotation",
    with_targets=_rotation_targets,
    targets_problem=_rotation_targets_problem,
    notes={"angle_range": _KERAS_ROTATION, "factor": _KERAS_ROTATION},
    doubt=_rotation_doubt,
)
def random_rotation(
    image,
    seed,
    *,
    angle_range: Annotated[tuple[float, float], Range(-180.0, 180.0)] = (-15.0, 15.0),
    fill_mode: Annotated[str, Choice(_FILL_MODES)] = "constant",
    fill_value: Fraction = 0.0,
    interpolation: Annotated[str, Choice(("bilinear", "nearest"))] = "bilinear",
):
    """Rotates by an angle (degrees, counter-clockwise) from `angle_range`,
    keeping the size; uncovered pixels follow `fill_mode`. Boxes become the
    enclosing box of their rotated corners, or, when the dataset has instance
    masks, the tight box of the rotated mask. On a dataset with boxes only
    ``constant`` keeps boxes and pixels consistent: ``wrap`` and ``reflect``
    (copies of objects that get no box) are refused, ``nearest`` smears an
    object at the border beyond its box."""
    low, high = (a * math.pi / 180.0 for a in angle_range)
    return rotate(
        image,
        _uniform(seed, low, high),
        fill_mode=fill_mode,
        fill_value=fill_value,
        interpolation=interpolation,
    )


def _erased_region(image, seed, *, scale_range, ratio_range):
    """The bool ``[height, width]`` rectangle random_erasing erases, and the
    seed of its probability draw.

    Its sides are rounded and at least one pixel, except for a drawn area of
    0 (``scale_range: [0, 0]``), which erases nothing.
    """
    seeds = tf.random.split(seed, 5)
    shape = tf.shape(image)
    height, width = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
    area = _uniform(seeds[0], *scale_range) * (height * width)
    ratio = tf.exp(_uniform(seeds[1], math.log(ratio_range[0]), math.log(ratio_range[1])))
    box_h = tf.clip_by_value(tf.round(tf.sqrt(area * ratio)), 1.0, height)
    box_w = tf.clip_by_value(tf.round(tf.sqrt(area / ratio)), 1.0, width)
    top = tf.floor(_uniform(seeds[2]) * (height - box_h + 1.0))
    left = tf.floor(_uniform(seeds[3]) * (width - box_w + 1.0))
    rows = tf.range(height)[:, None]
    cols = tf.range(width)[None, :]
    inside = (rows >= top) & (rows < top + box_h) & (cols >= left) & (cols < left + box_w)
    # After the draws, not in them: every other area keeps its rectangle.
    inside &= area > 0.0
    return inside, seeds[4]


def _erasing_targets(
    image, targets, seed, *, probability, scale_range, ratio_range, value, erase_targets
):
    inside, draw = _erased_region(image, seed, scale_range=scale_range, ratio_range=ratio_range)

    def erase():
        erased = tf.where(inside[:, :, None], tf.constant(value, image.dtype), image)
        return erased, (targets.erase(inside) if erase_targets else targets)

    return _targets_with_probability(probability, draw, erase, image, targets)


# What `ElementTargets.erase` changes: the others (labels, extras) are of the
# whole image.
_ERASABLE = ("mask", "instance_masks", "keypoints", "boxes")


def _erasing_targets_problem(kinds, *, erase_targets, **_: Any) -> str | None:
    if not erase_targets or any(kind in _ERASABLE for kind in kinds):
        return None
    return (
        f"erase_targets: true erases masks, keypoints and objects under the rectangle, and "
        f"this dataset has none (its targets: {list(kinds)}); drop erase_targets"
    )


@builtin_op(
    "random_erasing",
    geometric=False,
    with_targets=_erasing_targets,
    targets_problem=_erasing_targets_problem,
)
def random_erasing(
    image,
    seed,
    *,
    probability: Probability = 0.5,
    scale_range: AreaRange = (0.02, 0.33),
    ratio_range: RatioRange = (0.3, 3.3),
    value: Fraction = 0.0,
    erase_targets: bool = False,
):
    """With `probability`, sets one rectangle to `value` (Zhong et al. 2017).

    The rectangle covers a `scale_range` fraction of the area with a
    height/width ratio from `ratio_range` (drawn log-uniformly), clipped to
    the image, at a uniform position; it has at least one pixel, unless the
    fraction drawn is 0 (``scale_range: [0, 0]`` erases nothing). Targets
    are left alone (the object is still there, only hidden), unless
    `erase_targets`: then the mask gets its ignore value under the
    rectangle, instance masks 0, keypoints under it visibility 0, and
    objects keeping less than ``min_visibility`` of their instance mask (or
    box) are dropped.
    """
    del erase_targets  # targets only
    inside, draw = _erased_region(image, seed, scale_range=scale_range, ratio_range=ratio_range)

    def erase():
        return tf.where(inside[:, :, None], tf.constant(value, image.dtype), image)

    return _with_probability(probability, draw, erase, image)


# --- zoom -----------------------------------------------------------------------------


def zoom_transform(shape: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
    """The ``[8]`` transform scaling an image of int32 `shape` by `factor` about its centre."""
    inverse = 1.0 / factor
    center = (tf.cast(tf.reverse(shape[:2], [0]), tf.float32) - 1.0) * 0.5
    offset = center * (1.0 - inverse)
    zero = tf.constant(0.0)
    return tf.stack([inverse, zero, offset[0], zero, inverse, offset[1], zero, zero])


def _zoom_targets(image, targets, seed, *, factor_range, **params):
    transform = zoom_transform(tf.shape(image), _uniform(seed, *factor_range))
    return _warp_targets(image, targets, transform, **params)


@builtin_op(
    "random_zoom",
    with_targets=_zoom_targets,
    targets_problem=_zoom_targets_problem,
    notes={
        name: _KERAS_ZOOM for name in ("factor_range", "factor", "height_factor", "width_factor")
    },
)
def random_zoom(
    image,
    seed,
    *,
    factor_range: Annotated[tuple[float, float], Range(positive=True)] = (0.8, 1.25),
    fill_mode: Annotated[str, Choice(_FILL_MODES)] = "constant",
    fill_value: Fraction = 0.0,
    interpolation: Annotated[str, Choice(("bilinear", "nearest"))] = "bilinear",
):
    """Scales the image about its centre by a factor from `factor_range`,
    keeping the size: above 1 zooms in (the border leaves the image), below
    1 zooms out (uncovered pixels follow `fill_mode`). Objects that leave
    the image are filtered by ``min_visibility``. On a dataset with boxes,
    ``wrap`` and ``reflect`` are refused when the factor can be below 1, as
    for `random_rotation`."""
    transform = zoom_transform(tf.shape(image), _uniform(seed, *factor_range))
    return project(
        image, transform, fill_mode=fill_mode, fill_value=fill_value, interpolation=interpolation
    )
