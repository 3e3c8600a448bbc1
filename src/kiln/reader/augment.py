"""Online augmentation ops by name: registration, validation of YAML lists, safety checks.

An augmentation op is a function ``fn(image, seed, **params) -> image`` made
of TensorFlow ops. ``image`` is a float32 ``[height, width, channels]`` tensor
with values in [0, 1]; ``seed`` is a shape-[2] int32 tensor, different for
every element and every epoch. The op *samples* its random parameters from
`seed` with `tf.random.stateless_*` / `tf.image.stateless_random_*` and then
*applies* a deterministic kernel with them. Parameters are keyword-only;
parameters that are ranges end in ``_range`` and are ``[low, high]``.

Register your own::

    import tensorflow as tf
    from kiln.reader import register_augmentation

    @register_augmentation("random_invert")
    def random_invert(image, seed, *, probability: float = 0.5):
        flip = tf.random.stateless_uniform([], seed) < probability
        return tf.where(flip, 1.0 - image, image)

and name it in an augmentation list (``- random_invert: {probability: 0.2}``).
The function is traced once into the tf.data graph, so Python or NumPy
randomness in it would run once and become a constant: the first time an op
is used, kiln runs it with several seeds and rejects it if the seed changes
nothing (or if the same seed gives different results).

Batch ops (``mixup``, ``cutmix``) mix pairs of images and their labels; they
run on whole batches after the element ops and turn labels into one-hot
float vectors.

Standard library and TensorFlow only: `kiln.reader` must not import pydantic,
yaml, Beam or OpenCV.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import typing
from typing import Annotated, Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf

ElementFn = Callable[..., tf.Tensor]


class AugmentConfigError(ValueError):
    """An augmentation list is invalid; the message names the entry and parameter."""


class AugmentOpError(ValueError):
    """A registered op misbehaves (ignores its seed, uses Python values of tensors)."""


# --- parameter constraints (used inside typing.Annotated) ---------------------------


class Constraint:
    """Checks and normalizes one parameter value; raises ValueError with the reason."""

    def check(self, value: Any) -> Any:
        raise NotImplementedError


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class Number(Constraint):
    """A number within ``[minimum, maximum]`` (either bound optional)."""

    minimum: float | None = None
    maximum: float | None = None
    integer: bool = False

    def check(self, value: Any) -> Any:
        if not _is_number(value):
            raise ValueError(f"expected a number, got {value!r}")
        if self.integer and float(value) != int(value):
            raise ValueError(f"expected an integer, got {value!r}")
        self._check_bounds(value)
        return int(value) if self.integer else float(value)

    def _check_bounds(self, value: float) -> None:
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"must be >= {self.minimum}, got {value!r}")
        if self.maximum is not None and value > self.maximum:
            raise ValueError(f"must be <= {self.maximum}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Range(Constraint):
    """``[low, high]`` with ``low <= high``, both within ``[minimum, maximum]``."""

    minimum: float | None = None
    maximum: float | None = None
    positive: bool = False

    def check(self, value: Any) -> Any:
        if (not isinstance(value, (list, tuple)) or len(value) != 2
                or not all(_is_number(v) for v in value)):
            raise ValueError(f"expected two numbers [low, high], got {value!r}")
        low, high = float(value[0]), float(value[1])
        if low > high:
            raise ValueError(f"expected low <= high, got {list(value)!r}")
        for v in (low, high):
            Number(self.minimum, self.maximum).check(v)
            if self.positive and v <= 0:
                raise ValueError(f"both ends must be > 0, got {list(value)!r}")
        return (low, high)


@dataclasses.dataclass(frozen=True)
class Size(Constraint):
    """An output size: one positive integer (square) or ``[height, width]``."""

    def check(self, value: Any) -> Any:
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            value = [value, value]
        if (not isinstance(value, (list, tuple)) or len(value) != 2
                or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                           for v in value)
                or min(value) <= 0):
            raise ValueError(f"expected a positive integer or [height, width], got {value!r}")
        return (int(value[0]), int(value[1]))


@dataclasses.dataclass(frozen=True)
class Choice(Constraint):
    """One of a fixed set of strings."""

    options: tuple[str, ...]

    def check(self, value: Any) -> Any:
        if value not in self.options:
            raise ValueError(f"expected one of {list(self.options)}, got {value!r}")
        return value


Probability = Annotated[float, Number(0.0, 1.0)]


def _constraint_for(annotation: Any) -> Constraint | None:
    """The check for a parameter's annotation (plain types for user ops)."""
    if typing.get_origin(annotation) is Annotated:
        for extra in annotation.__metadata__:
            if isinstance(extra, Constraint):
                return extra
        annotation = typing.get_args(annotation)[0]
    if annotation is bool:
        return _Bool()
    if annotation is int:
        return Number(integer=True)
    if annotation is float:
        return Number()
    if annotation is str:
        return _String()
    if typing.get_origin(annotation) is typing.Literal:
        return Choice(tuple(typing.get_args(annotation)))
    return None


class _Bool(Constraint):
    def check(self, value: Any) -> Any:
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value


class _String(Constraint):
    def check(self, value: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {value!r}")
        return value


# --- the registry ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Window:
    """How a cropping op splits into "choose a window" and "finish the crop".

    Lets the reader decode only the window of a JPEG
    (`tf.io.decode_and_crop_jpeg`) instead of the whole image. The op itself
    must equal ``finish(crop(image, sample(shape, seed)), **params)``.

    Attributes:
      sample: ``sample(shape, seed, **params) -> (offset, size)``; `shape` is
        the int32 ``[height, width]`` of the image, `offset` and `size` int32
        ``[2]`` tensors.
      finish: ``finish(window_image, **params) -> image``.
    """

    sample: Callable[..., tuple[tf.Tensor, tf.Tensor]]
    finish: Callable[..., tf.Tensor]


@dataclasses.dataclass(frozen=True)
class OpDefinition:
    """A registered op: its function and what the reader needs to know about it.

    Attributes:
      name: Registered name (what augmentation lists use).
      fn: ``fn(image, seed, **params) -> image`` (element ops) or
        ``fn(images, labels, seed, **params) -> (images, labels)`` (batch ops).
      kind: ``"element"`` or ``"batch"``.
      params: Parameter name -> (constraint or None, default or `REQUIRED`).
      inference: ``inference(image, **params) -> image``: what the op does
        where no random augmentation runs (non-train splits, the Keras layer
        with ``training=False``), e.g. a crop's deterministic center crop to
        the same output size. None means "leave the image as it is".
      window: Set for cropping ops that can be fused into JPEG decoding.
      inference_window: Same, for `inference`.
      check: Optional ``check(**params)`` for constraints between parameters;
        raises ValueError with the reason.
      builtin: True for kiln's own ops, which skip the first-use check.
      mirror: The op only mirrors the image (or not, at random): it commutes
        with cropping and resizing, so the reader applies it to the uint8
        crop window, before the window is resized (kiln's own flips).
      pixelwise: The op maps every pixel's colour alike, by at most an
        image-wide statistic (brightness, contrast, saturation, hue): the
        reader may apply it to the crop window before resizing it, where
        there are fewer pixels (kiln's own colour ops).
    """

    name: str
    fn: Callable[..., Any]
    kind: str
    params: Mapping[str, tuple[Constraint | None, Any]]
    inference: Callable[..., tf.Tensor] | None = None
    window: Window | None = None
    inference_window: Window | None = None
    check: Callable[..., None] | None = None
    builtin: bool = False
    mirror: bool = False
    pixelwise: bool = False


REQUIRED = inspect.Parameter.empty

_REGISTRY: dict[str, OpDefinition] = {}


def register_augmentation(
    name: str | None = None,
    *,
    inference: Callable[..., tf.Tensor] | None = None,
    check: Callable[..., None] | None = None,
) -> Callable[[ElementFn], ElementFn]:
    """Decorator: registers ``fn(image, seed, *, param=default, ...)`` as an element op.

    Args:
      name: Name used in augmentation lists; defaults to the function's name.
      inference: Optional ``inference(image, **params)``: the op's
        deterministic counterpart where no random augmentation runs (must keep
        the output size the op produces, if it changes it).
      check: Optional ``check(**params)`` for constraints between parameters;
        raise ValueError with the reason (reported with the list entry).

    Raises:
      ValueError: if the name is taken by another function or the signature is
        not ``fn(image, seed, *, keyword_only_params)``.
    """

    def decorator(fn: ElementFn) -> ElementFn:
        _register(OpDefinition(
            name=name or fn.__name__,
            fn=fn,
            kind="element",
            params=_signature_params(name or fn.__name__, fn, leading=("image", "seed")),
            inference=inference,
            check=check,
        ))
        return fn

    return decorator


def _register(definition: OpDefinition) -> None:
    existing = _REGISTRY.get(definition.name)
    if existing is not None and existing.fn is not definition.fn:
        raise ValueError(f"an augmentation op named {definition.name!r} is already registered")
    _REGISTRY[definition.name] = definition
    # A new function under a known name must be checked again.
    for checked in [c for c in _CHECKED if c[0].name == definition.name]:
        _CHECKED.discard(checked)


def _signature_params(name: str, fn: Callable, leading: Sequence[str]) -> dict:
    params = list(inspect.signature(fn).parameters.values())
    positional = [p for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) > len(leading):
        raise ValueError(
            f"augmentation op {name!r}: parameter {positional[len(leading)].name!r} must be "
            f"keyword-only (put it after a bare '*')"
        )
    if len(positional) < len(leading):
        raise ValueError(
            f"augmentation op {name!r}: expected the signature "
            f"fn({', '.join(leading)}, *, param=default, ...); "
            f"got {len(positional)} positional parameter(s)"
        )
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # unresolvable forward references: no type checks
        hints = {}
    out = {}
    for param in params[len(leading):]:
        if param.kind is not param.KEYWORD_ONLY:
            raise ValueError(
                f"augmentation op {name!r}: parameter {param.name!r} must be "
                f"keyword-only (put it after a bare '*')"
            )
        out[param.name] = (_constraint_for(hints.get(param.name, Any)), param.default)
    return out


def names() -> list[str]:
    """Sorted names of all registered ops (element and batch)."""
    _load_builtins()
    return sorted(_REGISTRY)


def get(name: str) -> OpDefinition:
    _load_builtins()
    if name not in _REGISTRY:
        raise AugmentConfigError(
            f"unknown augmentation op {name!r}; known: {', '.join(sorted(_REGISTRY))}"
        )
    return _REGISTRY[name]


# --- configured lists -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """One configured op: a registered name and validated, normalized parameters.

    Frozen and hashable; looks the function up by name, so it survives being
    rebuilt in another process from `to_json`.
    """

    name: str
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def definition(self) -> OpDefinition:
        return get(self.name)

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)

    def to_json(self) -> dict[str, Any]:
        return {self.name: {k: list(v) if isinstance(v, tuple) else v for k, v in self.params}}


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
    _load_builtins()
    if specs is None:
        return []
    if isinstance(specs, (str, Mapping)) or not isinstance(specs, Iterable):
        raise AugmentConfigError(f"{field}: expected a list of ops, got {specs!r}")
    resolved = []
    seen_batch = False
    for index, spec in enumerate(specs):
        where = f"{field}[{index}]"
        if isinstance(spec, str):
            name, raw = spec, {}
        elif isinstance(spec, Mapping) and len(spec) == 1:
            name, raw = next(iter(spec.items()))
            raw = {} if raw is None else raw
        else:
            raise AugmentConfigError(
                f"{where}: expected an op name or a one-key mapping {{name: {{params}}}}, "
                f"got {spec!r}"
            )
        if name not in _REGISTRY:
            raise AugmentConfigError(
                f"{where}: unknown augmentation op {name!r}; known: "
                f"{', '.join(sorted(_REGISTRY))}"
            )
        definition = _REGISTRY[name]
        if not isinstance(raw, Mapping):
            raise AugmentConfigError(f"{where}.{name}: parameters must be a mapping, got {raw!r}")
        if definition.kind == "batch":
            seen_batch = True
        elif seen_batch:
            raise AugmentConfigError(
                f"{where}.{name}: element ops must come before batch ops "
                f"(mixup, cutmix), which run on whole batches at the end"
            )
        resolved.append(Augmentation(name, _check_params(where, definition, raw)))
    return resolved


def _check_params(where: str, definition: OpDefinition, raw: Mapping) -> tuple:
    unknown = sorted(set(raw) - set(definition.params))
    if unknown:
        known = ", ".join(definition.params) or "none"
        raise AugmentConfigError(
            f"{where}.{definition.name}.{unknown[0]}: unknown parameter; known: {known}"
        )
    params = {}
    for param, (constraint, default) in definition.params.items():
        if param not in raw:
            if default is REQUIRED:
                raise AugmentConfigError(
                    f"{where}.{definition.name}.{param}: required parameter is missing"
                )
            params[param] = default
            continue
        value = raw[param]
        if constraint is not None:
            try:
                value = constraint.check(value)
            except ValueError as e:
                raise AugmentConfigError(f"{where}.{definition.name}.{param}: {e}") from None
        params[param] = value
    if definition.check is not None:
        try:
            definition.check(**params)
        except ValueError as e:
            raise AugmentConfigError(f"{where}.{definition.name}: {e}") from None
    return tuple(sorted(params.items()))


def element_ops(augmentations: Sequence[Augmentation]) -> list[Augmentation]:
    return [a for a in augmentations if a.definition.kind == "element"]


def batch_ops(augmentations: Sequence[Augmentation]) -> list[Augmentation]:
    return [a for a in augmentations if a.definition.kind == "batch"]


# --- first-use checks of user ops -----------------------------------------------------

_CHECKED: set = set()
_CHECK_SEEDS = 64

_TRACE_PITFALL = (
    "Dataset.map traces an op once into a graph; Python and NumPy code in it "
    "(random.random(), np.random.*, .numpy(), if on a tensor) runs once, while "
    "tracing, and its result is baked into the graph as a constant."
)


def check_op(augmentation: Augmentation, shape: Sequence[int]) -> None:
    """Rejects a user op that ignores its seed or needs Python values of tensors.

    Traces the op once, like `tf.data` does, and runs the trace on one input
    image with `_CHECK_SEEDS` different seeds. kiln's own ops are trusted and
    skipped; results are cached per (name, params).

    Args:
      augmentation: The configured op.
      shape: ``[height, width, channels]`` of the test image (the dataset's
        image size when known).

    Raises:
      AugmentOpError: if every seed gives the same output (the randomness is
        not coming from the seed), if the same seed gives different outputs
        (stateful randomness), or if tracing fails because the op converts a
        tensor to a Python/NumPy value.
    """
    definition = augmentation.definition
    if definition.builtin or definition.kind != "element":
        return
    cache_key = (augmentation, tuple(shape))
    if cache_key in _CHECKED:
        return
    name = augmentation.name
    kwargs = augmentation.kwargs
    # A fixed, asymmetric image, so flips and crops visibly change it.
    image = tf.constant(
        np.random.default_rng(0).random(tuple(shape), dtype=np.float32)
    )
    # autograph=False: the reader does not convert ops either (see dataset.py).
    traced = tf.function(lambda img, seed: definition.fn(img, seed, **kwargs), autograph=False)
    try:
        concrete = traced.get_concrete_function(
            tf.TensorSpec(image.shape, tf.float32), tf.TensorSpec([2], tf.int32)
        )
    except Exception as e:  # the message depends on what the op did; explain all alike
        raise trace_error(name, e) from e
    seeds = tf.random.experimental.stateless_split(tf.constant([20240, 7], tf.int32),
                                                   _CHECK_SEEDS)
    outputs = [concrete(image, seeds[i]).numpy() for i in range(_CHECK_SEEDS)]
    if all(np.array_equal(outputs[0], out) for out in outputs[1:]):
        raise AugmentOpError(
            f"augmentation op {name!r} ignores its seed: {_CHECK_SEEDS} different seeds gave "
            f"identical outputs. {_TRACE_PITFALL} Draw random values from the `seed` argument "
            f"with tf.random.stateless_uniform / tf.random.stateless_* or "
            f"tf.image.stateless_random_* (split it with tf.random.split for several "
            f"draws). If the op is deterministic with these parameters {kwargs}, it is not an "
            f"augmentation: do it once, offline, as a kiln.transforms transform."
        )
    again = concrete(image, seeds[1]).numpy()
    if not np.array_equal(outputs[1], again):
        raise AugmentOpError(
            f"augmentation op {name!r} gave different outputs for the same seed: it uses "
            f"stateful randomness (tf.random.uniform, tf.random.Generator, a Keras random "
            f"layer), which is not reproducible under a parallel tf.data map. Draw random "
            f"values from the `seed` argument with tf.random.stateless_* or "
            f"tf.image.stateless_random_* instead."
        )
    _CHECKED.add(cache_key)


def trace_error(name: str, error: Exception) -> AugmentOpError:
    """Explains why op `name` could not be traced into a graph."""
    text = f"{type(error).__name__}: {error}"
    if "numpy" in str(error) or isinstance(error, NotImplementedError):
        hint = (
            "It converts a tensor to a NumPy/Python value (.numpy(), np.asarray, float(t)), "
            "which only exists in eager mode: inside tf.data the image is a symbolic "
            "tensor with no value yet. Write the op with TensorFlow ops on tensors "
            "(tf.*, tf.image.*, tf.random.stateless_*); use tf.cond or tf.where instead "
            "of `if` on a tensor. If the work needs NumPy or OpenCV and is deterministic, "
            "it belongs offline in a kiln.transforms transform."
        )
    elif isinstance(error, (tf.errors.OperatorNotAllowedInGraphError, TypeError)):
        hint = (
            "It uses a tensor as a Python value (`if tensor:`, `bool(tensor)`, a Python "
            "loop over a tensor). Use tf.cond / tf.where for data-dependent choices."
        )
    else:
        hint = "Write it with TensorFlow ops only."
    return AugmentOpError(
        f"augmentation op {name!r} cannot run inside tf.data: tracing it failed with {text}. "
        f"{_TRACE_PITFALL} {hint}"
    )


_BUILTINS_LOADED = False


def _load_builtins() -> None:
    # The built-in ops register themselves on import; importing here (not at
    # module top) avoids a cycle between this registry and the op modules.
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        importlib.import_module("kiln.reader.ops")
        importlib.import_module("kiln.reader.mixing")


def register_builtin(definition: OpDefinition) -> None:
    """Registers one of kiln's own ops (used by `kiln.reader.ops` and `.mixing`)."""
    _register(dataclasses.replace(definition, builtin=True))


def signature_params(name: str, fn: Callable, leading: Sequence[str]) -> dict:
    """Parameter table of an op function (see `OpDefinition.params`)."""
    return _signature_params(name, fn, leading)
