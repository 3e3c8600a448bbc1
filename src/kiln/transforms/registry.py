"""Offline transforms by name: registration, config validation, chaining.

An offline transform is a pure function ``fn(image, **params) -> image`` on a
uint8 ``HxWxC`` NumPy array (C is 1 or 3, RGB order), deterministic, without
randomness or side effects, safe to call from several threads at once. Its
parameters are keyword-only and type-annotated; the annotations (pydantic
types such as ``PositiveInt`` or ``Annotated[int, Field(ge=0)]``) are what
validates the YAML before the job starts.

Register your own::

    # my_project/kiln_transforms.py
    from kiln.transforms import register

    @register("sepia")
    def sepia(image, *, strength: float = 1.0):
        ...

and name the module in the config (``plugins: [my_project.kiln_transforms]``).
Only modules the config names are ever imported.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pydantic

TransformFn = Callable[..., np.ndarray]

_REGISTRY: dict[str, TransformFn] = {}
_PARAM_MODELS: dict[str, type[pydantic.BaseModel]] = {}
_CHECKS: dict[str, Callable[..., None]] = {}


class TransformConfigError(ValueError):
    """A transform spec is invalid; the message names the list entry and field."""


class TransformError(ValueError):
    """A transform cannot be applied to this image (e.g. smaller than the crop).

    A property of the data, not of the config: the build job drops the file
    with this message and carries on.
    """


def register(
    name: str | None = None, *, check: Callable[..., None] | None = None
) -> Callable[[TransformFn], TransformFn]:
    """Decorator: registers `fn` as the offline transform `name`.

    Args:
      name: The name the config uses; defaults to the function's name.
      check: Optional validation of rules that span several parameters
        (e.g. "exactly one of size and to_square"), which type annotations
        cannot express. Called by `parse` with the validated parameters as
        keyword arguments (defaults filled in); raises ValueError with a
        message naming the parameters. The kernel should call it too, so a
        direct call fails the same way.

    Raises:
      ValueError: if the name is taken or the signature is not
        ``fn(image, *, param: type = default, ...)``.
    """

    def decorator(fn: TransformFn) -> TransformFn:
        transform_name = name or fn.__name__
        if transform_name in _REGISTRY and _REGISTRY[transform_name] is not fn:
            raise ValueError(f"an offline transform named {transform_name!r} is already registered")
        _PARAM_MODELS[transform_name] = _param_model(transform_name, fn)
        if check is not None:
            _CHECKS[transform_name] = check
        _REGISTRY[transform_name] = fn
        return fn

    return decorator


def _param_model(name: str, fn: TransformFn) -> type[pydantic.BaseModel]:
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
    ):
        raise ValueError(f"transform {name!r}: the first parameter must be the image")
    fields = {}
    hints = _type_hints(fn)
    for param in params[1:]:
        if param.kind is not inspect.Parameter.KEYWORD_ONLY:
            raise ValueError(
                f"transform {name!r}: parameter {param.name!r} must be keyword-only "
                f"(put it after a bare '*')"
            )
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    return pydantic.create_model(
        f"{name}_params",
        __config__=pydantic.ConfigDict(extra="forbid", frozen=True),
        **fields,
    )


def _type_hints(fn: Callable) -> dict[str, Any]:
    import typing

    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:  # unresolvable forward references: fall back to no typing
        return {}


def names() -> list[str]:
    """Sorted names of the registered offline transforms."""
    _load_builtins()
    return sorted(_REGISTRY)


def get(name: str) -> TransformFn:
    _load_builtins()
    if name not in _REGISTRY:
        raise TransformConfigError(
            f"unknown offline transform {name!r}; known: {', '.join(sorted(_REGISTRY))}"
        )
    return _REGISTRY[name]


def import_plugins(modules: Iterable[str]) -> None:
    """Imports the user modules the config names, so their `@register` runs."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise TransformConfigError(f"plugins: cannot import module {module!r}: {e}") from e


@dataclasses.dataclass(frozen=True)
class Transform:
    """One configured transform: a registered name and validated parameters.

    Frozen and picklable (it holds the name, not the function), so it can be
    shipped to Beam workers; the function is looked up on first call.
    """

    name: str
    params: tuple[tuple[str, Any], ...] = ()

    def __call__(self, image: np.ndarray) -> np.ndarray:
        return get(self.name)(image, **dict(self.params))

    def to_json(self) -> dict[str, Any]:
        return {self.name: _jsonable(dict(self.params))}


@dataclasses.dataclass(frozen=True)
class Chain:
    """An ordered list of transforms applied one after the other.

    Attributes:
      transforms: The transforms, in order.
      plugins: The modules the config names in ``plugins:``. A chain is
        shipped to Beam workers by pickling, and a worker is a fresh process
        (``--direct_running_mode=multi_processing``, Dataflow) whose registry
        has only the built-ins: the chain imports these modules there before
        its first use, so user transforms resolve. No other module is imported.
    """

    transforms: tuple[Transform, ...] = ()
    plugins: tuple[str, ...] = ()

    def __call__(self, image: np.ndarray) -> np.ndarray:
        if self.plugins:
            import_plugins(self.plugins)  # after the first call, a sys.modules look-up each
        for transform in self.transforms:
            image = transform(image)
        return image

    def to_json(self) -> list[dict[str, Any]]:
        return [t.to_json() for t in self.transforms]


def parse(specs: Iterable[Any], field: str = "transforms") -> Chain:
    """Validates a YAML transform list and returns the chain.

    Each entry is a transform name (no parameters) or a one-key mapping
    ``{name: {param: value, ...}}``. Defaults are filled in, so the chain's
    `to_json` is the resolved config.

    Raises:
      TransformConfigError: naming the entry (``transforms[2].resize.size``)
        and what is wrong with it.
    """
    _load_builtins()
    transforms = []
    for index, spec in enumerate(specs or []):
        where = f"{field}[{index}]"
        if isinstance(spec, str):
            name, raw = spec, {}
        elif isinstance(spec, Mapping) and len(spec) == 1:
            name, raw = next(iter(spec.items()))
            raw = {} if raw is None else raw
        else:
            raise TransformConfigError(
                f"{where}: expected a transform name or a one-key mapping "
                f"{{name: {{params}}}}, got {spec!r}"
            )
        if name not in _REGISTRY:
            raise TransformConfigError(
                f"{where}: unknown offline transform {name!r}; "
                f"known: {', '.join(sorted(_REGISTRY))}"
            )
        if not isinstance(raw, Mapping):
            raise TransformConfigError(f"{where}.{name}: parameters must be a mapping, got {raw!r}")
        try:
            model = _PARAM_MODELS[name].model_validate(dict(raw))
        except pydantic.ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise TransformConfigError(f"{where}.{name}.{loc}: {first['msg']}") from None
        params = tuple(sorted(model.model_dump().items()))
        if name in _CHECKS:
            try:
                _CHECKS[name](**dict(params))
            except ValueError as e:
                raise TransformConfigError(f"{where}.{name}: {e}") from None
        transforms.append(Transform(name, params))
    return Chain(tuple(transforms))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


_BUILTINS_LOADED = False


def _load_builtins() -> None:
    # The built-in kernels register themselves on import; importing here
    # (not at module top) avoids a cycle between registry and kernels.
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        _BUILTINS_LOADED = True
        importlib.import_module("kiln.transforms.functional")
