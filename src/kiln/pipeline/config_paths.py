"""The config's path keys: marked once, resolved against the config file's folder.

A relative path in a config file is relative to the folder that holds the
file, as in docker compose, GitHub Actions or tsconfig: a config and the
data beside it move together, and ``kiln build --config`` gives the same
build from any directory. (Paths given on the command line, such as
``--output``, stay relative to the current directory, and a config passed
as a mapping has no folder: its paths are relative to the current
directory too.)

Every field of the config models that holds a path, or a list of paths, is
annotated `ConfigPath`; `rebase` finds them in any model, however nested,
so a new path key is one annotation and resolves like the others.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, Field

from kiln.pipeline import storage


@dataclasses.dataclass(frozen=True)
class _PathKey:
    """The marker `ConfigPath` carries (pydantic keeps it in the field's metadata)."""


_PATH_KEY = _PathKey()

# `$NAME` or `${NAME}`, as a shell (or docker compose) would expand it.
_VARIABLE = re.compile(r"\$(?:\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def _no_variables(path: str) -> str:
    """Refuses an environment variable in a path (``output: $HOME/datasets``).

    kiln does not expand them (``~`` it does), so such a path named a folder
    called ``$HOME`` beside the config: the build published there, without
    a word, and training that followed the real path read the old version.
    """
    found = _VARIABLE.search(path)
    if found is not None:
        raise ValueError(
            f"{path!r} holds {found.group(0)}, an environment variable, which kiln does not "
            f"expand (it would be a folder named {found.group(0)!r}); write the path out "
            f"(~ is expanded), or write the config from a template"
        )
    return path


ConfigPath = Annotated[str, Field(min_length=1), AfterValidator(_no_variables), _PATH_KEY]
"""A non-empty local path or URI; relative local paths resolve against the config's folder."""


@dataclasses.dataclass(frozen=True)
class Rebased:
    """A path key whose relative value was resolved against the config's folder.

    Attributes:
      key: The key, e.g. ``source.root``.
      written: The value as the config writes it.
      resolved: The path it stands for.
    """

    key: str
    written: str
    resolved: str


M = TypeVar("M", bound=BaseModel)


def rebase(model: M, folder: str, prefix: str = "") -> tuple[M, list[Rebased]]:
    """`model` with every relative local `ConfigPath` joined to `folder`.

    Absolute paths, ``~/...`` and URIs (``gs://...``) are left as they are.

    Returns:
      The new model, and what was resolved (for messages: a folder that is
      not found is reported with where it was looked for).
    """
    updates: dict[str, Any] = {}
    rebased: list[Rebased] = []
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        key = f"{prefix}{name}"
        if _is_path(field.metadata, field.annotation) and isinstance(value, str):
            updates[name] = _against(folder, value, key, rebased)
        elif _holds_paths(field.annotation) and isinstance(value, list):
            updates[name] = [
                _against(folder, item, f"{key}[{index}]", rebased)
                for index, item in enumerate(value)
            ]
        elif isinstance(value, BaseModel):
            updates[name], inner = rebase(value, folder, prefix=f"{key}.")
            rebased.extend(inner)
        elif isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
            # A list of sections (a coco source's parts): source.parts[0].images.
            items = []
            for index, item in enumerate(value):
                item, inner = rebase(item, folder, prefix=f"{key}[{index}].")
                items.append(item)
                rebased.extend(inner)
            updates[name] = items
    return model.model_copy(update=updates), rebased


def _against(folder: str, path: str, key: str, rebased: list[Rebased]) -> str:
    if storage.is_remote(path) or os.path.isabs(os.path.expanduser(path)):
        return path
    resolved = os.path.normpath(os.path.join(folder, path))
    rebased.append(Rebased(key, path, resolved))
    return resolved


def _is_path(metadata: list[Any], annotation: Any) -> bool:
    """Whether a field is a `ConfigPath`, or an optional one (``ConfigPath |
    None``: pydantic keeps the metadata of an ``Annotated`` inside a union
    in the annotation, not in the field's metadata)."""
    return _PATH_KEY in metadata or any(
        _is_config_path(arg) for arg in typing.get_args(annotation) if arg is not type(None)
    )


def _is_config_path(annotation: Any) -> bool:
    return typing.get_origin(annotation) is Annotated and _PATH_KEY in typing.get_args(annotation)


def _holds_paths(annotation: Any) -> bool:
    """Whether `annotation` is a list of `ConfigPath`."""
    if typing.get_origin(annotation) is not list:
        return False
    (item,) = typing.get_args(annotation)
    return _is_config_path(item)
