"""Which functions TensorFlow traces: `tf.function`s, and functions given to `Dataset.map`.

`Dataset.map` (and `filter`, `flat_map`, `interleave`) and `tf.function` do not
call a Python function once per element: they *trace* it once into a graph.
Traced here are the functions decorated with or wrapped in `tf.function`,
kiln augmentation ops (decorated with `kiln.reader.register_augmentation`, and
the `inference=` function given to it: the reader maps them), and those
passed to `.map` / `.filter` / `.flat_map` / `.interleave` of something that
looks like a tf.data Dataset rather than another library's object with a
`.map` (see `DatasetEvidence`). `taint` starts from these and follows the
same-module functions they call. Functions imported from other modules are
followed by `project`, into the files checked in the same run.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from kiln.tools.lint.resolution import (
    FUNCTION_NODES,
    MAX_RESOLVE_DEPTH,
    TF_FUNCTION,
    ModuleIndex,
    ResolvedFunction,
    keyword_argument,
)

# `kiln.reader`'s augmentation registry: the reader's Dataset.map traces every op.
_REGISTER_AUGMENTATION = frozenset(
    {"kiln.reader.register_augmentation", "kiln.reader.ops.register_augmentation"}
)
_DATASET_FUNCTION_METHODS = {
    # method: (position of the function argument, its keyword name)
    "map": (0, "map_func"),
    "filter": (0, "predicate"),
    "flat_map": (0, "map_func"),
    "interleave": (0, "map_func"),
}
# Methods and constructors only tf.data has: strong evidence of a Dataset.
_TF_DATA_ONLY_METHODS = frozenset(
    {
        "prefetch",
        "padded_batch",
        "unbatch",
        "with_options",
        "interleave",
        "flat_map",
        "from_tensor_slices",
        "from_tensors",
        "list_files",
        "ragged_batch",
        "take_while",
        "bucket_by_sequence_length",
        "as_dataset",
        "snapshot",
        "rejection_resample",
    }
)
# Dataset methods other libraries also have: follow the chain to its root.
_CHAINABLE_METHODS = frozenset(
    {
        "map",
        "filter",
        "batch",
        "shuffle",
        "repeat",
        "cache",
        "take",
        "skip",
        "shard",
        "zip",
        "enumerate",
        "apply",
        "concatenate",
        "window",
        "unique",
        "ignore_errors",
    }
)
_TF_DATA_KEYWORDS = frozenset(
    {
        "num_parallel_calls",
        "deterministic",
        "cycle_length",
        "block_length",
        "map_func",
        "predicate",
    }
)
# Keywords of Hugging Face datasets, multiprocessing and concurrent.futures map().
_OTHER_MAP_KEYWORDS = frozenset(
    {
        "batched",
        "num_proc",
        "remove_columns",
        "fn_kwargs",
        "with_indices",
        "with_rank",
        "load_from_cache_file",
        "input_columns",
        "chunksize",
        "timeout",
    }
)
# Libraries whose own datasets have a .map running Python per item.
_OTHER_DATASET_LIBRARIES = frozenset(
    {
        "datasets",
        "ray",
        "grain",
        "torch",
        "torchdata",
        "dask",
        "pyspark",
    }
)
# Libraries with a .map on objects not usually named like datasets (pools, frames).
_OTHER_MAP_LIBRARIES = frozenset(
    {
        "multiprocessing",
        "concurrent",
        "pandas",
        "polars",
        "joblib",
        "apache_beam",
    }
)
_DATASET_NAME = re.compile(r"(^|_)(ds|dataset|datasets)(_|\d|$)|dataset", re.IGNORECASE)
_TF_LIBRARIES = frozenset({"tensorflow", "tensorflow_datasets", "keras", "tf_keras", "kiln"})
_OTHER_NAME = re.compile(
    r"(^|_)(pool|executor|df|series|frame|rdd|pcoll|client|futures?|workers?)(_|\d|$)",
    re.IGNORECASE,
)
_OTHER_CONSTRUCTOR = re.compile(
    r"Pool|Executor|DataFrame|Series|SparkContext|Client", re.IGNORECASE
)


def traced_functions(
    index: ModuleIndex, imported: list[str] | None = None
) -> Iterator[ResolvedFunction]:
    """The functions TensorFlow traces: tf.function-decorated or -wrapped ones,
    kiln augmentation ops, and those passed to a tf.data Dataset's
    map/filter/flat_map/interleave.

    The dotted import paths of traced functions imported from other modules
    (``ds.map(helpers.augment)``) are appended to `imported`, if given.
    """
    evidence = DatasetEvidence(index)
    for node in ast.walk(index.tree):
        if isinstance(node, FUNCTION_NODES):
            decorators = index.decorator_names(node)
            if TF_FUNCTION in decorators:
                yield ResolvedFunction(node, skip=1 if index.is_method(node) else 0)
            elif decorators & _REGISTER_AUGMENTATION:
                # fn(image, seed, *, params): the image and seed are tensors,
                # the keyword-only parameters configuration.
                yield ResolvedFunction(node)
                yield from _inference_forms(index, node)
        elif isinstance(node, ast.Call):
            scope = index.scope_of(node)
            if _is_tf_function_wrapper(index, node.func) and node.args:
                # tf.function(fn, ...) and tf.function(input_signature=...)(fn)
                callables = index.resolve_callables(node.args[0], scope)
                yield from callables
                _note_imported(index, node.args[0], callables, imported)
            elif (
                isinstance(node.func, ast.Attribute) and node.func.attr in _DATASET_FUNCTION_METHODS
            ):
                position, keyword = _DATASET_FUNCTION_METHODS[node.func.attr]
                function = (
                    node.args[position]
                    if len(node.args) > position
                    else keyword_argument(node, keyword)
                )
                if function is None:
                    continue
                callables = index.resolve_callables(function, scope)
                if evidence.is_dataset_call(node):
                    yield from callables
                    _note_imported(index, function, callables, imported)


def _note_imported(
    index: ModuleIndex,
    function: ast.AST,
    callables: list[ResolvedFunction],
    imported: list[str] | None,
) -> None:
    """Appends a traced function's import path to `imported` when it is not this module's."""
    if imported is not None and not callables:
        qualified = index.qualify(function)
        if qualified:
            imported.append(qualified)


def _inference_forms(index: ModuleIndex, op: ast.AST) -> Iterator[ResolvedFunction]:
    """The ``inference=`` functions given to the op's `register_augmentation`."""
    for decorator in getattr(op, "decorator_list", []):
        if isinstance(decorator, ast.Call) and index.qualify(decorator.func) in (
            _REGISTER_AUGMENTATION
        ):
            inference = keyword_argument(decorator, "inference")
            if inference is not None:
                yield from index.resolve_callables(inference, index.scope_of(op))


def _is_tf_function_wrapper(index: ModuleIndex, func: ast.AST) -> bool:
    if isinstance(func, ast.Call) and not func.args:
        func = func.func
    return index.qualify(func) == TF_FUNCTION


class DatasetEvidence:
    """Decides whether ``receiver.map(fn)`` is tf.data's `Dataset.map`.

    Strong evidence (a chain rooted in ``tf.data``/``tfds``/``*Dataset(...)``,
    tf.data-only methods or keywords) says yes. Evidence of something else
    (``Pool``/``Executor``/DataFrame receivers, a module such as
    ``builtins.map``, Hugging Face ``batched=``/``num_proc=`` keywords) says no.
    Otherwise the answer is yes in a module that uses TensorFlow and imports no
    other library with a `.map`. Where pandas, multiprocessing or the like are
    imported, the receiver or the name the result is assigned to must also be
    named like a dataset (``ds``, ``train_ds``, ``self.dataset``,
    ``make_dataset(...)``). Where another library's datasets are imported
    (Hugging Face datasets, Ray, Grain, PyTorch, Spark, Dask), only strong
    evidence counts.
    """

    def __init__(self, index: ModuleIndex):
        self.index = index
        self._verdicts: dict[tuple[int, int], str] = {}
        # First and last parts: `import datasets`, `from lazy_modules import grain`.
        roots = {
            part
            for qualified in index.imports.values()
            for part in (qualified.split(".")[0], qualified.rsplit(".", 1)[-1])
        }
        self.other_datasets_imported = bool(roots & _OTHER_DATASET_LIBRARIES)
        self.other_maps_imported = bool(roots & _OTHER_MAP_LIBRARIES)
        self.uses_tensorflow = bool(roots & _TF_LIBRARIES) or any(
            isinstance(node, ast.Name)
            and node.id in ("tf", "tfds")
            and node.id not in index.imports
            and node.id not in index.module_bindings
            for node in ast.walk(index.tree)
        )

    def is_dataset_call(self, call: ast.Call) -> bool:
        if not isinstance(call.func, ast.Attribute):
            return False  # not a method call
        keywords = {k.arg for k in call.keywords if k.arg}
        if keywords & _TF_DATA_KEYWORDS:
            return True
        if keywords & _OTHER_MAP_KEYWORDS:
            return False
        scope = self.index.scope_of(call)
        verdict = self._receiver(call.func.value, scope, 0)
        if verdict == "tf":
            return True
        if verdict == "other":
            return False
        if not self.uses_tensorflow or self.other_datasets_imported:
            return False
        if self.other_maps_imported:
            names = [_receiver_name(call.func.value), *self._result_names(call)]
            return any(_DATASET_NAME.search(name) for name in names)
        return True

    def _result_names(self, call: ast.Call) -> list[str]:
        """Names the result is assigned to, through a method chain:
        ``train_ds = reader(paths).map(decode).batch(8)`` -> ["train_ds"]."""
        node: ast.AST = call
        parent = self.index.parents.get(node)
        while isinstance(parent, ast.Attribute) or (
            isinstance(parent, ast.Call) and parent.func is node
        ):
            node, parent = parent, self.index.parents.get(parent)
        if isinstance(parent, (ast.Assign, ast.AnnAssign)):
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            return [_receiver_name(target) for target in targets]
        return []

    def _receiver(self, node: ast.AST, scope: ast.AST, depth: int) -> str:
        """ "tf" (strong evidence), "other" (another library) or "unknown"."""
        if depth > MAX_RESOLVE_DEPTH:
            return "unknown"
        key = (id(node), id(scope))
        if key not in self._verdicts:
            self._verdicts[key] = "unknown"  # breaks cycles such as `ds = ds.map(f)`
            self._verdicts[key] = self._uncached_receiver(node, scope, depth)
        return self._verdicts[key]

    def _uncached_receiver(self, node: ast.AST, scope: ast.AST, depth: int) -> str:
        if isinstance(node, ast.Call):
            qualified = self.index.qualify(node.func) or ""
            if qualified.startswith(("tensorflow.data.", "tensorflow_datasets.", "kiln.reader")):
                return "tf"
            if isinstance(node.func, ast.Attribute):
                if node.func.attr in _TF_DATA_ONLY_METHODS:
                    return "tf"
                if node.func.attr in _CHAINABLE_METHODS:
                    return self._receiver(node.func.value, scope, depth + 1)
            callee = (
                node.func.attr
                if isinstance(node.func, ast.Attribute)
                else node.func.id
                if isinstance(node.func, ast.Name)
                else ""
            )
            if _OTHER_CONSTRUCTOR.search(qualified or callee):
                return "other"
            if (
                qualified.startswith(("tensorflow.", "keras.", "tf_keras."))
                and "dataset" in callee.lower()
            ):
                return "tf"  # tf.data.TFRecordDataset, keras.utils.image_dataset_from_directory
            return "unknown"
        referenced = self.index.qualify(node)
        if referenced is not None and not referenced.startswith("tensorflow"):
            return "other"  # a module's function, e.g. builtins.map(fn, items)
        if isinstance(node, ast.Name):
            if _OTHER_NAME.search(node.id):
                return "other"
            verdicts = {
                self._receiver(binding, self.index.scope_of(binding), depth + 1)
                for binding in self.index.lookup(node.id, scope)
                if isinstance(binding, ast.expr)
            }
            for verdict in ("tf", "other"):
                if verdict in verdicts:
                    return verdict
            return "unknown"
        if isinstance(node, ast.Attribute):
            if _OTHER_NAME.search(node.attr):
                return "other"
            return "unknown"
        if isinstance(node, ast.Subscript):
            return self._receiver(node.value, scope, depth + 1)
        return "unknown"


def _receiver_name(node: ast.AST) -> str:
    """The name a `.map` receiver goes by: ``ds``, ``self.train_ds``, ``make_dataset()``."""
    while isinstance(node, (ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""
