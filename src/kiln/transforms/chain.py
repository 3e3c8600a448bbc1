"""Offline transforms by name: registering a kernel, validating a YAML list into a `Chain`.

An offline transform is a pure function ``fn(image, **params) -> image`` on a
uint8 ``HxWxC`` NumPy array (C is 1 or 3, RGB order), deterministic, without
randomness or side effects, safe to call from several threads at once. Its
parameters are keyword-only and type-annotated; the annotations (pydantic
types such as ``PositiveInt`` or ``Annotated[int, Field(ge=0)]``, and the
shared types of `kiln.registry`) are what validates the YAML before the job
starts.

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
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from kiln.registry import ListError, Registered, Registry, Spec

TransformFn = Callable[..., np.ndarray]


class TransformConfigError(ListError):
    """A transform list is invalid; `problems` names each wrong entry and field."""


class TransformError(ValueError):
    """A transform cannot be applied to this image (e.g. smaller than the crop).

    A property of the data, not of the config: the build job drops the file
    with this message and carries on.
    """


TRANSFORMS: Registry[Registered] = Registry(
    "offline transform", "transform", TransformConfigError, entry=Registered
)


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
    return TRANSFORMS.register(name, leading=("image",), check=check)


def names() -> list[str]:
    """Sorted names of the registered offline transforms."""
    return TRANSFORMS.names()


def get(name: str) -> TransformFn:
    """The function registered as `name`; raises TransformConfigError if there is none."""
    return TRANSFORMS.get(name).fn


def import_plugins(modules: Iterable[str]) -> None:
    """Imports the user modules the config names, so their `@register` runs.

    Raises:
      TransformConfigError: naming every module that cannot be imported.
    """
    problems = []
    for index, module in enumerate(modules):
        try:
            importlib.import_module(module)
        except ImportError as e:
            problems.append(f"plugins[{index}]: cannot import module {module!r}: {e}")
    if problems:
        raise TransformConfigError(*problems)


class Transform(Spec):
    """One configured transform: a registered name and validated parameters.

    Frozen and picklable (it holds the name, not the function), so it can be
    shipped to Beam workers; the function is looked up on each call.
    """

    def __call__(self, image: np.ndarray) -> np.ndarray:
        return get(self.name)(image, **self.kwargs)


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


def parse(specs: Iterable[Any] | None, field: str = "transforms") -> Chain:
    """Validates a YAML transform list and returns the chain.

    Each entry is a transform name (no parameters) or a one-key mapping
    ``{name: {param: value, ...}}``. Defaults are filled in, so the chain's
    `to_json` is the resolved config.

    Raises:
      TransformConfigError: naming the entry (``transforms[2].resize.size``)
        and what is wrong with it.
    """
    return Chain(tuple(TRANSFORMS.parse(specs, field, make=Transform)))
