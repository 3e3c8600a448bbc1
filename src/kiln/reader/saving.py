"""Makes a saved model with `AugmentationLayer` loadable once `kiln.reader` is imported.

Keras finds a custom layer of a ``.keras`` file by the name it was registered
under (``"kiln>AugmentationLayer"``) in its table of custom objects
(`keras.saving.get_custom_objects`); it imports the module a file names only
for Keras' own packages. The layer's module needs TensorFlow, which
``import kiln.reader`` does not import (validating an augmentation list,
`info` and `locate` must not pay seconds for it). So importing the package
puts a stand-in under that name: at once when Keras is already imported,
otherwise as soon as Keras is imported (a one-shot import hook: TensorFlow
imports Keras while it initializes, so the stand-in touches neither until a
model is loaded). The stand-in's `from_config` imports `kiln.reader.layer`
and builds the real layer, whose own registration then replaces it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)

# What `keras.saving.register_keras_serializable(package="kiln")` on the class gives.
REGISTERED_NAME = "kiln>AugmentationLayer"


class _AugmentationLayerOnFirstLoad:
    """Keras' entry for ``kiln>AugmentationLayer`` until `kiln.reader.layer` is imported."""

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        from kiln.reader.layer import AugmentationLayer

        return AugmentationLayer.from_config(config)


def _register(keras: ModuleType) -> None:
    try:
        custom_objects = keras.saving.get_custom_objects()
    except AttributeError:  # a Keras without keras.saving (2.x before 2.13)
        logger.warning(
            "kiln.reader: this Keras has no keras.saving.get_custom_objects; import "
            "kiln.reader.layer before loading a model with an AugmentationLayer"
        )
        return
    # The real class, if its module is imported already, stays.
    custom_objects.setdefault(REGISTERED_NAME, _AugmentationLayerOnFirstLoad)


class _RegisteringLoader(importlib.abc.Loader):
    """Keras' own loader, registering the stand-in once Keras' package has run."""

    def __init__(self, loader: importlib.abc.Loader, watcher: _WhenKerasIsImported):
        self._loader = loader
        self._watcher = watcher

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        if self._watcher in sys.meta_path:
            sys.meta_path.remove(self._watcher)  # Keras is imported once
        module.__loader__ = self._loader  # Keras' own loader from here on
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _register(module)


class _WhenKerasIsImported(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hands Keras' spec back with a registering loader.

    Stays on `sys.meta_path` until Keras is imported: a spec can be looked up
    without importing (TensorFlow's start-up calls ``find_spec("keras")``).
    """

    def find_spec(self, fullname, path, target=None):
        if fullname != "keras":
            return None
        # The other finders, this one aside.
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is None:
                    return None
                spec.loader = _RegisteringLoader(spec.loader, self)
                return spec
        return None


def register_with_keras() -> None:
    """Makes ``kiln>AugmentationLayer`` known to Keras now, or when Keras is imported."""
    keras = sys.modules.get("keras")
    if keras is not None:
        _register(keras)
    elif not any(isinstance(finder, _WhenKerasIsImported) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WhenKerasIsImported())


register_with_keras()
