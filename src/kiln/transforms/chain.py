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

Datasets with boxes, masks or keypoints need every transform to say how it
moves coordinates, so the targets follow the image (`Chain.apply`):
``@register("sepia", geometry="none")`` for a transform that moves no pixel,
or ``geometry=fn`` with ``fn(image, **params) -> CoordinateMap`` for one that
does (see `kiln.transforms.geometry`). A transform without a declaration
still works for label-only datasets.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable
from typing import Any, Literal

import numpy as np

from kiln.registry import ListError, Registered, Registry, Spec, import_plugin
from kiln.transforms.geometry import NO_GEOMETRY, CoordinateMap
from kiln.transforms.targets import Targets

TransformFn = Callable[..., np.ndarray]
GeometryFn = Callable[..., CoordinateMap]
Geometry = GeometryFn | Literal["none"] | None


class TransformConfigError(ListError):
    """A transform list is invalid; `problems` names each wrong entry and field."""


class TransformError(ValueError):
    """A transform cannot be applied to this image (e.g. smaller than the crop).

    A property of the data, not of the config: the build job drops the file
    with this message and carries on.
    """


@dataclasses.dataclass(frozen=True)
class RegisteredTransform(Registered):
    """A registered offline transform and how it moves coordinates.

    Attributes:
      geometry: ``"none"`` (`NO_GEOMETRY`: no pixel moves, the size is
        kept), a function ``geometry(image, **params) -> CoordinateMap``
        (the map for this input image), or None: not declared, so the
        transform cannot be used on datasets with geometric targets.
    """

    geometry: Geometry = None


TRANSFORMS: Registry[RegisteredTransform] = Registry(
    "offline transform",
    "transform",
    TransformConfigError,
    entry=RegisteredTransform,
    own="a transform of your own is registered with @kiln.transforms.register in a module "
    "the config names under plugins:",
)

GEOMETRIC_TARGETS = ("boxes", "mask", "instance_masks", "keypoints")
"""The target kinds that must follow the image: a dataset with any of them
refuses a transform that does not declare its geometry."""


def register(
    name: str | None = None,
    *,
    check: Callable[..., None] | None = None,
    geometry: Geometry = None,
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
      geometry: How the transform moves coordinates, so boxes, masks and
        keypoints follow the image (`Chain.apply`). ``"none"`` for a
        transform that moves no pixel and keeps the size (colour, tone,
        filters); otherwise a function with the transform's own signature,
        ``geometry(image, **params) -> CoordinateMap``, returning the map for
        that input image (a pure function of it and the parameters; raise
        `TransformError` where the transform would). Without it the
        transform is refused for datasets with boxes, masks or keypoints.

    Raises:
      ValueError: if the name is taken, the signature is not
        ``fn(image, *, param: type = default, ...)``, or `geometry` is
        neither None, ``"none"`` nor a callable.
    """
    if not (geometry is None or geometry == NO_GEOMETRY or callable(geometry)):
        raise ValueError(
            f"geometry must be None, {NO_GEOMETRY!r} or a function returning a "
            f"CoordinateMap, got {geometry!r}"
        )
    registering = TRANSFORMS.register(name, leading=("image",), check=check, geometry=geometry)
    if geometry is None or geometry == NO_GEOMETRY:
        return registering

    def checked(fn: TransformFn) -> TransformFn:
        registered = registering(fn)  # its own signature checked first
        # The geometry is called as the transform is: a signature that cannot
        # take its parameters would fail on every image, one by one.
        params = list(inspect.signature(fn).parameters.values())[1:]
        try:
            inspect.signature(geometry).bind(None, **{p.name: p.default for p in params})
        except (TypeError, ValueError) as e:
            TRANSFORMS.remove(name or fn.__name__)
            arguments = ", ".join(["image", *(f"{p.name}=..." for p in params)])
            raise ValueError(
                f"{name or fn.__name__}: its geometry must take the transform's arguments, "
                f"geometry({arguments}): {e}"
            ) from None
        return registered

    return checked


def names() -> list[str]:
    """Sorted names of the registered offline transforms."""
    return TRANSFORMS.names()


def get(name: str) -> TransformFn:
    """The function registered as `name`; raises TransformConfigError if there is none."""
    return TRANSFORMS.get(name).fn


def import_plugins(modules: Iterable[str]) -> None:
    """Imports the user modules the config names, so their `@register` runs:
    each once, in name order, whatever order they are listed in (the order
    the config stores them in, `BuildConfig.plugins`). Which module's import
    fails when two register one name is then the same for every order.

    Raises:
      TransformConfigError: naming every module that cannot be imported, by
        its index in `modules`.
    """
    listed = list(modules)
    position = {module: listed.index(module) for module in listed}
    problems = []
    for module in sorted(position):
        problem = import_plugin(module)
        if problem:
            problems.append((position[module], f"plugins[{position[module]}]: {problem}"))
    if problems:
        raise TransformConfigError(*(message for _, message in sorted(problems)))


class Transform(Spec):
    """One configured transform: a registered name and validated parameters.

    Frozen and picklable (it holds the name, not the function), so it can be
    shipped to Beam workers; the function is looked up on each call.
    """

    def __call__(self, image: np.ndarray) -> np.ndarray:
        return get(self.name)(image, **self.kwargs)

    @property
    def geometry(self) -> Geometry:
        """The registered declaration (see `register`)."""
        return TRANSFORMS.get(self.name).geometry

    def apply(
        self,
        image: np.ndarray,
        targets: Targets,
        *,
        min_visibility: float,
        mask_fill: int = 0,
        check: Callable[[Any], np.ndarray] | None = None,
    ) -> tuple[np.ndarray, Targets]:
        """The transformed image, and the targets moved with it (see `Chain.apply`).

        `check` refuses an output that is not an image (`Chain.apply` names
        the transform by its place in the list), before its size is read.

        Raises:
          TransformConfigError: if the transform declares no geometry.
          TransformError: if the image cannot be transformed, or the output's
            size contradicts the declaration.
        """
        geometry = self.geometry
        if geometry is None:
            raise TransformConfigError(_undeclared_message(self.name))
        run = self if check is None else (lambda image: check(self(image)))
        if geometry == NO_GEOMETRY:
            output = run(image)
            if output.shape[:2] != image.shape[:2]:
                raise TransformError(
                    f"{self.name}: declares geometry 'none' but changed the image size from "
                    f"{_hxw(image.shape)} to {_hxw(output.shape)}"
                )
            return output, targets
        if not callable(geometry):  # register accepts nothing else; for the type checker
            raise TransformConfigError(f"{self.name}: invalid geometry {geometry!r}")
        try:
            coordinate_map = geometry(image, **self.kwargs)
        except ValueError as e:  # CoordinateMap's refusals: not invertible, a size of 0
            raise TransformError(f"{self.name}: its geometry: {e}") from None
        if not isinstance(coordinate_map, CoordinateMap):
            raise TransformError(
                f"{self.name}: its geometry returned a {type(coordinate_map).__name__}, "
                f"not a CoordinateMap"
            )
        output = run(image)
        if output.shape[:2] != coordinate_map.size:
            raise TransformError(
                f"{self.name}: its geometry maps into {_hxw(coordinate_map.size)} but the "
                f"transform returned {_hxw(output.shape)}"
            )
        return output, targets.mapped(
            coordinate_map, min_visibility=min_visibility, mask_fill=mask_fill
        )


def _hxw(shape: tuple[int, ...]) -> str:
    return f"{shape[0]}x{shape[1]} (HxW)"


def _undeclared_message(name: str) -> str:
    return (
        f"offline transform {name!r} does not declare how it moves coordinates, so boxes, "
        f"masks and keypoints could not follow the image; register it with "
        f"@register(..., geometry=...) (geometry='none' if it moves no pixel), or remove it"
    )


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
        for index, transform in enumerate(self.transforms):
            image = _checked(transform(image), index, transform.name)
        return image

    def apply(
        self,
        image: np.ndarray,
        targets: Targets,
        *,
        min_visibility: float,
        mask_fill: int = 0,
        start: int = 0,
    ) -> tuple[np.ndarray, Targets]:
        """Transforms the image and moves its targets with it, transform by transform.

        The image is the same array `__call__` returns. The targets, in the
        input image's pixel coordinates, are first clipped to the input
        image (an object mostly outside it is dropped by the same rule),
        then mapped by each transform's declared geometry (`register`); see
        `kiln.transforms.targets` for the rules (enclosing boxes, clipping,
        visible fraction, keypoints leaving the image, nearest-neighbour
        masks).

        Args:
          image: uint8 HxWxC.
          targets: Its targets; masks must be ``H x W``.
          min_visibility: Objects keeping less than this fraction of their
            box after a step are dropped and counted
            (`Targets.dropped_objects`).
          mask_fill: Semantic-mask value for pixels a transform adds (pad,
            letterbox): the dataset's ignore value.
          start: Apply the transforms from this index on: the image and the
            targets are those the earlier ones made (`decode_scale` applies
            the first itself), and errors still name each by its index.

        Raises:
          TargetsError: if the masks are not the image's size.
          TransformConfigError: if a transform declares no geometry (the
            config refuses such chains first: `check_geometry`).
          TransformError: if the image cannot be transformed.
        """
        if self.plugins:
            import_plugins(self.plugins)
        targets.check_size(image.shape[0], image.shape[1])
        targets = targets.clipped(image.shape[0], image.shape[1], min_visibility=min_visibility)
        for index, transform in enumerate(self.transforms[start:], start):

            def checked(output, index=index, name=transform.name):
                return _checked(output, index, name)

            image, targets = transform.apply(
                image, targets, min_visibility=min_visibility, mask_fill=mask_fill, check=checked
            )
        return image, targets

    def undeclared_geometry(self) -> list[tuple[int, str]]:
        """``(index, name)`` of the transforms that declare no geometry."""
        return [
            (index, transform.name)
            for index, transform in enumerate(self.transforms)
            if transform.geometry is None
        ]

    def check_geometry(self, targets: Iterable[str], field: str = "transforms") -> None:
        """Refuses the chain for a dataset with geometric targets if a transform
        declares no geometry.

        Args:
          targets: The dataset's declared target kinds (``"label"``,
            ``"boxes"``, ...); only `GEOMETRIC_TARGETS` need declarations.
          field: Where the list is in the config, for the message.

        Raises:
          TransformConfigError: naming the first such transform and why
            (``transforms[1].sepia: offline transform 'sepia' does not
            declare ... (the dataset has boxes, mask)``).
        """
        geometric = [kind for kind in targets if kind in GEOMETRIC_TARGETS]
        undeclared = self.undeclared_geometry()
        if geometric and undeclared:
            index, name = undeclared[0]
            raise TransformConfigError(
                f"{field}[{index}].{name}: {_undeclared_message(name)} "
                f"(the dataset has {', '.join(geometric)})"
            )

    def to_json(self) -> list[dict[str, Any]]:
        return [t.to_json() for t in self.transforms]


def _checked(image: Any, index: int, name: str) -> np.ndarray:
    """`image` if it is what a transform must return (uint8 ``H x W x C``);
    else the file's `TransformError`, naming the transform, so a user's
    transform that returns floats is found where it is, not at the end."""
    if isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3:
        return image
    described = (
        f"a {image.dtype} array of shape {image.shape}"
        if isinstance(image, np.ndarray)
        else f"a {type(image).__name__}"
    )
    raise TransformError(
        f"transforms[{index}].{name} returned {described}; a transform returns a uint8 HxWxC array"
    )


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
