"""Heavy libraries imported where they are used, not where they are named.

TensorFlow takes seconds to import and Beam about as long. Many modules
only *declare* things whose bodies use them: an augmentation op's name and
parameters (all a config needs to validate), a record's features, a store's
paths. `LazyModule` lets such a module keep writing ``tf.image.resize(...)``
in its function bodies while importing TensorFlow only when the first of
those bodies runs::

    from typing import TYPE_CHECKING

    from kiln.lazy_import import LazyModule

    if TYPE_CHECKING:  # the type checker sees the real module
        import tensorflow as tf
    else:
        tf = LazyModule("tensorflow")

So ``kiln build --help``, a config error and ``kiln inspect`` answer without
paying for TensorFlow or Beam (tests/test_startup.py checks which modules
each of them imports). A module using it must not touch the library at its
top level (no ``tf.constant`` as a module constant, no ``@tf.function`` on
a module-level function): that would import it at once.
"""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """Stands for the module `name` (or its attribute `attribute`), imported
    on the first attribute access.

    Args:
      name: The module to import, e.g. ``"tensorflow"``.
      attribute: Optional name in that module to stand for instead, e.g.
        ``LazyModule("apache_beam.io.filesystems", "FileSystems")``.
    """

    def __init__(self, name: str, attribute: str | None = None):
        self._name = name
        self._attribute = attribute
        self._target: Any = None

    def _resolve(self) -> Any:
        if self._target is None:
            target = importlib.import_module(self._name)
            if self._attribute is not None:
                target = getattr(target, self._attribute)
            self._target = target
        return self._target

    def __getattr__(self, attribute: str) -> Any:
        # Only called for names the proxy itself lacks: everything but its
        # own three fields goes to the real module.
        if attribute in ("_name", "_attribute", "_target"):
            raise AttributeError(attribute)  # not set yet (an instance made without __init__)
        return getattr(self._resolve(), attribute)

    def __repr__(self) -> str:
        what = self._name + (f".{self._attribute}" if self._attribute else "")
        state = "imported" if self._target is not None else "not imported yet"
        return f"<LazyModule {what} ({state})>"
