"""Static checks of training code for tf.data / tf.function tracing pitfalls.

`Dataset.map` (and `filter`, `flat_map`, `interleave`) and `tf.function` do not
call a Python function once per element: they *trace* it once into a graph.
Python code in the body therefore runs once, at trace time, and whatever it
computed is frozen into the graph. This module finds the usual ways that goes
wrong, by reading the source with the standard library's `ast` only (no
TensorFlow import, so it is fast and runs anywhere):

=====  =================================================================
K000   the file could not be read or parsed (always reported)
K101   `random.*` / `numpy.random.*` (or a NumPy/Python generator object)
K102   `.numpy()`, or `int()` / `float()` / `bool()` of a tensor
K103   `print(...)`
K104   Python `if` / conditional expression / `and`-`or` / comprehension
       `if` on a tensor value
K105   Python `while` on a tensor value
K106   `assert` on a tensor value
K107   `tf.py_function` / `tf.numpy_function` / `tf.compat.v1.py_func`
K108   a NumPy / OpenCV / SciPy / scikit-image / PIL call on a tensor value
=====  =================================================================

Which code is traced: functions passed to `.map` / `.filter` / `.flat_map` /
`.interleave` of something that looks like a `tf.data.Dataset` (see
`_DatasetEvidence`), functions decorated with or wrapped in `tf.function`,
and - transitively, up to `MAX_CALL_DEPTH` calls deep - every function of the
same module they call or hand to another call (`tf.cond`, `tf.map_fn`, ...).
Functions are resolved from lambdas, names (defined before or after use,
nested or at module level), `functools.partial`, `tf.function(fn)`, factory
functions that return a nested function, methods (`self.augment`,
`instance.augment`, `Class.augment`, base classes in the same module) and
callable instances (`__call__`). Names imported from other modules are not
followed: lint those modules too (their own `map` calls and `tf.function`s are
checked where they are).

Which values are tensors (for K102 `int()`, K104-K106, K108): the traced
function's parameters that receive dataset elements (parameters without a
default value and not bound by `functools.partial` or `self`), everything
computed from them, and the results of TensorFlow ops. Static properties
(`x.shape`, `x.dtype`, `x.ndim`, `len(...)`, `isinstance(...)`, `x is None`,
`"key" in features`) and configuration (closure variables, `self.*`,
parameters with defaults, constants) are not tensors, so branching on them is
fine and not reported. Across calls in the same module, a callee's parameter
is a tensor exactly when the caller passes one, and a call returns a tensor
only if the callee may return one.

Silence one line with a trailing ``# kiln: noqa`` (every code) or
``# kiln: noqa[K101,K103]`` (those codes).
"""

from __future__ import annotations

import ast
import dataclasses
import io
import os
import pathlib
import re
import tokenize
from typing import Iterable, Iterator, Sequence

MAX_CALL_DEPTH = 10
"""How many calls deep the checker follows functions called from traced code."""

_MAX_RESOLVE_DEPTH = 8
"""How many indirections (aliases, partials, factories) a function reference may take."""


@dataclasses.dataclass(frozen=True)
class Rule:
    """One kind of finding: its code, a short title and the standard fix."""

    code: str
    title: str
    fix: str


RULES: dict[str, Rule] = {
    rule.code: rule
    for rule in (
        Rule("K000", "the file could not be read or parsed",
             "fix the syntax error; nothing else in this file was checked"),
        Rule("K101", "Python or NumPy randomness in traced code",
             "use tf.random.stateless_* / tf.image.stateless_random_* with a per-element "
             "seed, e.g. from Dataset.enumerate"),
        Rule("K102", "Python value of a symbolic tensor",
             "keep it in TF ops, or do the work offline in kiln build"),
        Rule("K103", "print() in traced code",
             "use tf.print, which runs for every element"),
        Rule("K104", "Python branch on a tensor",
             "use tf.cond(pred, true_fn, false_fn), or tf.where(pred, x, y) element-wise"),
        Rule("K105", "Python while loop on a tensor",
             "use tf.while_loop(cond, body, loop_vars), or loop over a static bound such as x.shape"),
        Rule("K106", "assert on a tensor",
             "use tf.debugging.assert_* (e.g. tf.debugging.assert_less), which checks every element"),
        Rule("K107", "Python code wrapped in tf.py_function / tf.numpy_function",
             "move the work offline into kiln build (a registered transform), or write it in TF ops"),
        Rule("K108", "NumPy/OpenCV call on a tensor",
             "do it offline in kiln build, or use the TF equivalent (tf.image.*, tf.math.*)"),
    )
}

SYNTAX_ERROR_CODE = "K000"


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
    """One problem at one place. Ordered by file, line, column, code.

    Attributes:
      path: the file as it was given (or found under a given directory).
      line: 1-based line number.
      col: 1-based column number.
      code: the rule code, a key of `RULES`.
      message: what is wrong here and why, one line.
      fix: what to write instead, one line.
    """

    path: str
    line: int
    col: int
    code: str
    message: str
    fix: str

    def format(self) -> str:
        """``path:line:col: CODE message (fix: ...)`` on one line."""
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message} (fix: {self.fix})"

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


# --- public API ---------------------------------------------------------------

def lint_source(
    source: str,
    filename: str = "<string>",
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
) -> list[Finding]:
    """Checks one module's source text.

    Args:
      source: the Python source.
      filename: used as `Finding.path`.
      select: report only codes starting with one of these (e.g. ``["K10"]``).
      ignore: do not report codes starting with one of these.

    Returns:
      Findings sorted by line and column. A source that does not parse gives a
      single K000 finding at the error, whatever `select`/`ignore` say.

    Raises:
      ValueError: if `select` or `ignore` name a code prefix no rule has.
    """
    code_filter = _CodeFilter(select, ignore)
    try:
        tree = ast.parse(source, filename=filename)
    except (SyntaxError, ValueError, RecursionError) as e:  # ValueError: null bytes
        return [_unparsable(filename, e)]
    checker = _ModuleChecker(tree, filename)
    try:
        checker.run()
    except RecursionError:
        # Machine-generated code can nest deeper than the checker recurses.
        return [Finding(filename, 1, 1, SYNTAX_ERROR_CODE,
                        "expressions nested too deeply to check",
                        "split the deepest expressions, or lint this file's sources instead")]
    suppressed = _noqa_lines(source)
    kept = [
        f for f in checker.findings()
        if code_filter.wants(f.code) and not _is_suppressed(f, suppressed)
    ]
    return sorted(kept)


def lint_file(
    path: str | os.PathLike,
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
) -> list[Finding]:
    """Checks one file; an unreadable or undecodable file gives one K000 finding."""
    name = str(path)
    try:
        raw = pathlib.Path(path).read_bytes()
        source = _decode(raw)
    except (OSError, UnicodeDecodeError, SyntaxError) as e:
        return [_unparsable(name, e)]
    return lint_source(source, name, select=select, ignore=ignore)


def python_files(paths: Iterable[str | os.PathLike]) -> list[pathlib.Path]:
    """The files to check: each file given, and every ``*.py`` under each directory.

    Directories are walked in sorted order, skipping hidden directories, virtual
    environments, caches and build outputs (see `SKIPPED_DIRECTORIES`). Files named
    explicitly are checked whatever their extension. Duplicates are dropped.

    Raises:
      FileNotFoundError: naming the first path that does not exist.
    """
    found: list[pathlib.Path] = []
    seen: set[pathlib.Path] = set()
    for raw in paths:
        path = pathlib.Path(raw)
        if not path.exists():
            raise FileNotFoundError(f"no such file or directory: {raw}")
        candidates = [path] if path.is_file() else _walk_python_files(path)
        for candidate in candidates:
            key = candidate.resolve()
            if key not in seen:
                seen.add(key)
                found.append(candidate)
    return found


def lint_paths(
    paths: Iterable[str | os.PathLike],
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
) -> list[Finding]:
    """Checks files and directories (see `python_files`); findings sorted by file and line.

    Raises:
      FileNotFoundError: if a path does not exist (nothing is checked then).
      ValueError: if `select` or `ignore` name a code prefix no rule has.
    """
    _CodeFilter(select, ignore)  # validate before doing any work
    findings: list[Finding] = []
    for path in python_files(paths):
        findings.extend(lint_file(path, select=select, ignore=ignore))
    return sorted(findings)


SKIPPED_DIRECTORIES = frozenset({
    "__pycache__", "node_modules", "site-packages", "venv", "env", "build", "dist",
})


def _walk_python_files(root: pathlib.Path) -> Iterator[pathlib.Path]:
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(
            d for d in subdirectories
            if not d.startswith(".") and d not in SKIPPED_DIRECTORIES and not d.endswith(".egg-info")
        )
        for name in sorted(files):
            if name.endswith(".py"):
                yield pathlib.Path(directory) / name


def _decode(raw: bytes) -> str:
    """Decodes source bytes honouring a PEP 263 coding cookie, like the interpreter."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    return raw.decode(encoding)


def _unparsable(filename: str, error: Exception) -> Finding:
    line = getattr(error, "lineno", None) or 1
    col = getattr(error, "offset", None) or 1
    reason = getattr(error, "msg", None) or str(error)
    fix = RULES[SYNTAX_ERROR_CODE].fix
    if isinstance(error, SyntaxError):
        message = f"syntax error: {reason}"
    elif isinstance(error, RecursionError):
        message = "nested too deeply to parse"
        fix = "split the deepest expressions"
    elif isinstance(error, OSError):
        message = f"cannot read the file: {error.strerror or error}"
        fix = "check the path and its permissions"
    else:
        message = f"cannot decode the file: {reason}"
        fix = "save it as UTF-8, or declare its encoding in a coding comment (PEP 263)"
    return Finding(filename, int(line), int(col), SYNTAX_ERROR_CODE, message, fix)


# --- selection and suppression ------------------------------------------------

class _CodeFilter:
    """`select` / `ignore` by code prefix, flake8 style. K000 is never filtered."""

    def __init__(self, select: Iterable[str] | None, ignore: Iterable[str] | None):
        self.select = self._validated(select, "select")
        self.ignore = self._validated(ignore, "ignore") or ()

    @staticmethod
    def _validated(codes: Iterable[str] | None, what: str) -> tuple[str, ...] | None:
        if codes is None:
            return None
        cleaned = tuple(c.strip().upper() for c in codes if c.strip())
        for prefix in cleaned:
            if not any(code.startswith(prefix) for code in RULES):
                raise ValueError(
                    f"{what}: unknown code {prefix!r} (known: {', '.join(sorted(RULES))})")
        return cleaned

    def wants(self, code: str) -> bool:
        if code == SYNTAX_ERROR_CODE:
            return True
        if self.select is not None and not any(code.startswith(p) for p in self.select):
            return False
        return not any(code.startswith(p) for p in self.ignore)


_NOQA = re.compile(r"#\s*kiln:\s*noqa\b(?:\s*\[\s*(?P<codes>[A-Za-z0-9,\s]*)\])?", re.IGNORECASE)


def _noqa_lines(source: str) -> dict[int, frozenset[str] | None]:
    """Maps line -> silenced codes (None: every code), from real comments only."""
    silenced: dict[int, frozenset[str] | None] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type != tokenize.COMMENT:
                continue
            match = _NOQA.search(token.string)
            if not match:
                continue
            codes = match.group("codes")
            line = token.start[0]
            if codes is None:
                silenced[line] = None
            elif silenced.get(line, frozenset()) is not None:
                named = frozenset(c.strip().upper() for c in codes.split(",") if c.strip())
                silenced[line] = silenced.get(line, frozenset()) | named
    except (tokenize.TokenError, SyntaxError):
        pass  # the source parsed, so this cannot happen short of a tokenizer bug
    return silenced


def _is_suppressed(finding: Finding, silenced: dict[int, frozenset[str] | None]) -> bool:
    if finding.line not in silenced:
        return False
    codes = silenced[finding.line]
    return codes is None or finding.code in codes


# --- names: imports, scopes and what a name refers to ---------------------------

# Conventional names, so snippets without their imports are still checked.
_CONVENTIONAL_MODULES = {
    "tf": "tensorflow", "tensorflow": "tensorflow", "np": "numpy", "numpy": "numpy",
    "random": "random", "cv2": "cv2", "tfds": "tensorflow_datasets",
}

_TF_COMPAT_PREFIXES = ("tensorflow.compat.v1.", "tensorflow.compat.v2.")

# tf.py_function and its relatives, wherever in tensorflow they are imported from.
_PY_FUNCTION_NAMES = frozenset({"py_function", "numpy_function", "py_func", "eager_py_func"})
# Calls whose first argument (or this keyword) is Python run per element, not traced.
_PYTHON_CALLBACK_KEYWORDS = {
    **{name: "func" for name in _PY_FUNCTION_NAMES},
    "from_generator": "generator",
}

_TF_FUNCTION = "tensorflow.function"
# Wrappers that return the function they are given, still traced by whoever traces them.
_TF_FUNCTION_WRAPPERS = frozenset({
    _TF_FUNCTION, "tensorflow.autograph.experimental.do_not_convert",
})

_PARTIAL = frozenset({"functools.partial"})

_PYTHON_RNG_CONSTRUCTORS = frozenset({
    "numpy.random.default_rng", "numpy.random.RandomState", "numpy.random.Generator",
    "random.Random", "random.SystemRandom",
})

# TF calls that return Python values (or objects), not tensors.
_TF_STATIC_CALLS = frozenset({
    "tensorflow.executing_eagerly", "tensorflow.is_tensor", "tensorflow.is_symbolic_tensor",
    "tensorflow.get_static_value", "tensorflow.as_dtype", "tensorflow.TensorShape",
    "tensorflow.TensorSpec", "tensorflow.RaggedTensorSpec", "tensorflow.SparseTensorSpec",
    "tensorflow.dimension_value", "tensorflow.compat.dimension_value", "tensorflow.DType",
    "tensorflow.debugging.is_numeric_tensor", "tensorflow.function",
})
# TF namespaces whose calls are not tensor ops; they pass taint through their arguments.
_TF_NON_OP_PREFIXES = (
    "tensorflow.config.", "tensorflow.distribute.", "tensorflow.io.gfile.",
    "tensorflow.nest.", "tensorflow.data.", "tensorflow.test.", "tensorflow.sysconfig.",
    "tensorflow.version.", "tensorflow.autograph.", "tensorflow.keras.", "tensorflow.saved_model.",
    "tensorflow.train.Checkpoint", "tensorflow.summary.", "tensorflow.errors.",
    "tensorflow.python.",  # internals: no promise what they return
)
# Outside TensorFlow, `is_nested(x)`, `has_key(x)` and the like answer about structure.
_PREDICATE_PREFIXES = ("is_", "has_")
_STATIC_BUILTINS = frozenset({
    "isinstance", "issubclass", "hasattr", "callable", "type", "id", "len", "repr", "str",
})
# Attributes of a tensor known when the graph is built.
_STATIC_ATTRIBUTES = frozenset({
    "shape", "dtype", "ndim", "rank", "name", "device", "graph", "element_spec",
})
_STATIC_METHODS = frozenset({"get_shape", "numpy"})
_CONCRETE_VALUE_BUILTINS = frozenset({"int", "float", "bool", "complex"})
_HOST_ARRAY_LIBRARIES = ("numpy.", "cv2.", "scipy.", "skimage.", "PIL.")

_FunctionNode = (ast.FunctionDef, ast.AsyncFunctionDef)
_ScopeNode = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_ComprehensionNode = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def _normalize(qualified: str) -> str:
    for prefix in _TF_COMPAT_PREFIXES:
        if qualified.startswith(prefix):
            return "tensorflow." + qualified[len(prefix):]
    return qualified


@dataclasses.dataclass(frozen=True)
class _Param:
    """A parameter binding: the name is local to the function, its value unknown."""

    name: str


@dataclasses.dataclass(frozen=True)
class _Callable:
    """A function the checker can analyse, with what is already bound.

    Attributes:
      node: the def or lambda.
      skip: leading positional parameters already bound (self, partial's args).
      bound_keywords: parameter names bound by `functools.partial`.
    """

    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
    skip: int = 0
    bound_keywords: frozenset[str] = frozenset()

    def partial(self, positional: int, keywords: Iterable[str]) -> "_Callable":
        return dataclasses.replace(
            self, skip=self.skip + positional,
            bound_keywords=self.bound_keywords | frozenset(keywords))

    def positional_params(self) -> list[tuple[ast.arg, bool]]:
        """(parameter, has_default) for the positional parameters not yet bound."""
        args = self.node.args
        positional = [*args.posonlyargs, *args.args]
        first_default = len(positional) - len(args.defaults)
        return [(p, i >= first_default) for i, p in enumerate(positional)][self.skip:]

    def element_params(self) -> set[str]:
        """Parameters that receive tensors when called with dataset elements."""
        names = {p.arg for p, has_default in self.positional_params()
                 if not has_default and p.arg not in self.bound_keywords}
        if self.node.args.vararg is not None:
            names.add(self.node.args.vararg.arg)
        return names


class _ModuleIndex:
    """Imports, scopes and bindings of one module, for resolving names."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.imports = self._collect_imports(tree)
        self._bindings_cache: dict[ast.AST, dict[str, list[ast.AST]]] = {}
        self._callables_cache: dict[tuple[int, int], list[_Callable]] = {}
        self._instances_cache: dict[tuple[int, int], list[ast.ClassDef]] = {}
        self.module_bindings = self.bindings(tree)
        # First and last parts: `import datasets`, `from lazy_modules import grain`.
        roots = {part for qualified in self.imports.values()
                 for part in (qualified.split(".")[0], qualified.rsplit(".", 1)[-1])}
        self.other_datasets_imported = bool(roots & _OTHER_DATASET_LIBRARIES)
        self.other_maps_imported = bool(roots & _OTHER_MAP_LIBRARIES)
        self.uses_tensorflow = bool(roots & _TF_LIBRARIES) or any(
            isinstance(node, ast.Name) and node.id in ("tf", "tfds")
            and node.id not in self.imports and node.id not in self.module_bindings
            for node in ast.walk(tree))

    @staticmethod
    def _collect_imports(tree: ast.Module) -> dict[str, str]:
        imports: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        imports[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        imports[top] = top
            elif isinstance(node, ast.ImportFrom):
                base = "." * node.level + (node.module or "")
                for alias in node.names:
                    if alias.name != "*":
                        separator = "" if base.endswith(".") else "."
                        imports[alias.asname or alias.name] = f"{base}{separator}{alias.name}"
        return imports

    def qualify(self, node: ast.AST) -> str | None:
        """The dotted import path an expression refers to (``np.random.rand`` ->
        ``numpy.random.rand``), or None if it is not rooted in a module."""
        if isinstance(node, ast.Name):
            if node.id in self.imports:
                return _normalize(self.imports[node.id])
            if node.id in _CONVENTIONAL_MODULES and node.id not in self.module_bindings:
                return _CONVENTIONAL_MODULES[node.id]
            return None
        if isinstance(node, ast.Attribute):
            base = self.qualify(node.value)
            return _normalize(f"{base}.{node.attr}") if base else None
        return None

    def is_builtin(self, node: ast.AST, name: str) -> bool:
        return (isinstance(node, ast.Name) and node.id == name
                and name not in self.imports and name not in self.module_bindings)

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The innermost function, lambda, class or module containing `node`."""
        current = self.parents.get(node)
        while current is not None and not isinstance(current, _ScopeNode):
            current = self.parents.get(current)
        return current if current is not None else self.tree

    def bindings(self, scope: ast.AST) -> dict[str, list[ast.AST]]:
        """Names bound directly in `scope` -> defs, classes, assigned values or `_Param`s."""
        cached = self._bindings_cache.get(scope)
        if cached is not None:
            return cached
        bound: dict[str, list[ast.AST]] = {}
        if isinstance(scope, (*_FunctionNode, ast.Lambda)):
            args = scope.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                        *(a for a in (args.vararg, args.kwarg) if a is not None)]:
                bound.setdefault(arg.arg, []).append(_Param(arg.arg))
        if not isinstance(scope, ast.Lambda):
            for node in _statements_in_scope(scope.body):
                if isinstance(node, (*_FunctionNode, ast.ClassDef)):
                    bound.setdefault(node.name, []).append(node)
                elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target = node.targets[0]
                    if isinstance(target, ast.Name):
                        bound.setdefault(target.id, []).append(node.value)
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    if isinstance(node.target, ast.Name):
                        bound.setdefault(node.target.id, []).append(node.value)
                elif isinstance(node, (ast.With, ast.AsyncWith)):
                    for item in node.items:
                        if isinstance(item.optional_vars, ast.Name):
                            bound.setdefault(item.optional_vars.id, []).append(item.context_expr)
        self._bindings_cache[scope] = bound
        return bound

    def lookup(self, name: str, scope: ast.AST) -> list[ast.AST]:
        """What `name` may refer to from `scope`, by Python's rules (classes are
        not enclosing scopes for their methods), innermost binding first."""
        current: ast.AST | None = scope
        first = True
        while current is not None:
            if first or not isinstance(current, ast.ClassDef):
                found = self.bindings(current).get(name)
                if found:
                    return found
            first = False
            if current is self.tree:
                break
            current = self.scope_of(current)
        return []

    def enclosing_class(self, function: ast.AST) -> ast.ClassDef | None:
        parent = self.parents.get(function)
        return parent if isinstance(parent, ast.ClassDef) else None

    def decorator_names(self, function: ast.AST) -> set[str]:
        names = set()
        for decorator in getattr(function, "decorator_list", []):
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            qualified = self.qualify(target)
            if qualified:
                names.add(qualified)
            elif isinstance(target, ast.Name):
                names.add(target.id)
        return names

    def is_method(self, function: ast.AST) -> bool:
        """A def in a class body whose first parameter is the instance or class."""
        return (self.enclosing_class(function) is not None
                and "staticmethod" not in self.decorator_names(function))

    def method_receiver(self, scope: ast.AST, name: str) -> ast.ClassDef | None:
        """The class whose instance (or class) `name` is, when `name` is the first
        parameter of an enclosing method (``self``/``cls``), seen from `scope`."""
        current: ast.AST | None = scope
        while current is not None and current is not self.tree:
            if isinstance(current, _FunctionNode):
                params = [*current.args.posonlyargs, *current.args.args]
                if params and params[0].arg == name and self.is_method(current):
                    return self.enclosing_class(current)
                if name in self.bindings(current):
                    return None  # shadowed by a local of an inner function
            current = self.scope_of(current)
        return None

    def class_member(self, cls: ast.ClassDef, name: str, depth: int = 0) -> list[tuple[ast.AST, ast.ClassDef]]:
        """Defs named `name` in `cls` or its same-module bases; else values assigned
        to ``self.<name>`` in its methods. Pairs of (def or value, defining class)."""
        if depth > _MAX_RESOLVE_DEPTH:
            return []
        for node in cls.body:
            if isinstance(node, _FunctionNode) and node.name == name:
                return [(node, cls)]
        for base in cls.bases:
            for base_class in self.resolve_class(base, self.scope_of(cls)):
                found = self.class_member(base_class, name, depth + 1)
                if found:
                    return found
        assigned = []
        for method in cls.body:
            params = [*method.args.posonlyargs, *method.args.args] \
                if isinstance(method, _FunctionNode) else []
            if not params:
                continue
            receiver = params[0].arg
            for node in _statements_in_scope(method.body):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if (isinstance(target, ast.Attribute) and target.attr == name
                                and isinstance(target.value, ast.Name)
                                and target.value.id == receiver):
                            assigned.append((node.value, method))
        return assigned

    def resolve_class(self, node: ast.AST, scope: ast.AST) -> list[ast.ClassDef]:
        if isinstance(node, ast.Name):
            return [b for b in self.lookup(node.id, scope) if isinstance(b, ast.ClassDef)]
        return []

    def instance_classes(self, node: ast.AST, scope: ast.AST, depth: int = 0) -> list[ast.ClassDef]:
        """Same-module classes that `node` may be an instance of (``Cls(...)``,
        a name or ``self.attr`` assigned one)."""
        if depth > _MAX_RESOLVE_DEPTH:
            return []
        key = (id(node), id(scope))
        if key not in self._instances_cache:
            self._instances_cache[key] = []  # breaks cycles such as `a = b; b = a`
            self._instances_cache[key] = self._instance_classes(node, scope, depth)
        return self._instances_cache[key]

    def _instance_classes(self, node: ast.AST, scope: ast.AST, depth: int) -> list[ast.ClassDef]:
        if isinstance(node, ast.Call):
            return self.resolve_class(node.func, scope)
        if isinstance(node, ast.Name):
            classes = []
            for binding in self.lookup(node.id, scope):
                if isinstance(binding, ast.expr):
                    classes.extend(self.instance_classes(binding, self.scope_of(binding), depth + 1))
            return classes
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner = self.method_receiver(scope, node.value.id)
            if owner is not None:
                classes = []
                for value, where in self.class_member(owner, node.attr):
                    if isinstance(value, ast.expr):
                        classes.extend(self.instance_classes(value, where, depth + 1))
                return classes
        return []

    def resolve_callables(self, node: ast.AST, scope: ast.AST, depth: int = 0) -> list[_Callable]:
        """The same-module functions an expression may evaluate to (possibly none)."""
        if depth > _MAX_RESOLVE_DEPTH:
            return []
        key = (id(node), id(scope))
        if key in self._callables_cache:
            return self._callables_cache[key]  # also breaks cycles: [] while in progress
        self._callables_cache[key] = []
        found = self._resolve_callables(node, scope, depth)
        self._callables_cache[key] = found
        return found

    def _resolve_callables(self, node: ast.AST, scope: ast.AST, depth: int) -> list[_Callable]:
        if isinstance(node, ast.Lambda):
            return [_Callable(node)]
        if isinstance(node, ast.Name):
            found = []
            for binding in self.lookup(node.id, scope):
                if isinstance(binding, _FunctionNode):
                    found.append(_Callable(binding))
                elif isinstance(binding, ast.expr):
                    found.extend(self.resolve_callables(binding, self.scope_of(binding), depth + 1))
            return found
        if isinstance(node, ast.Attribute):
            return self._resolve_attribute(node, scope, depth)
        if isinstance(node, ast.Call):
            return self._resolve_call_result(node, scope, depth)
        return []

    def _resolve_attribute(self, node: ast.Attribute, scope: ast.AST, depth: int) -> list[_Callable]:
        # self.method / cls.method inside a class
        if isinstance(node.value, ast.Name):
            owner = self.method_receiver(scope, node.value.id)
            if owner is not None:
                return self._members_as_callables(owner, node.attr, bound=True, depth=depth)
            # Class.method: explicit first argument unless it is a classmethod.
            for cls in self.resolve_class(node.value, scope):
                return self._members_as_callables(cls, node.attr, bound=False, depth=depth)
        found = []
        for cls in self.instance_classes(node.value, scope):
            found.extend(self._members_as_callables(cls, node.attr, bound=True, depth=depth))
        return found

    def _members_as_callables(self, cls: ast.ClassDef, name: str, *, bound: bool, depth: int) -> list[_Callable]:
        found = []
        for member, where in self.class_member(cls, name):
            if isinstance(member, _FunctionNode):
                decorators = self.decorator_names(member)
                if "staticmethod" in decorators:
                    skip = 0
                elif "classmethod" in decorators:
                    skip = 1
                else:
                    skip = 1 if bound else 0
                found.append(_Callable(member, skip=skip))
            elif isinstance(member, ast.expr):
                found.extend(self.resolve_callables(member, where, depth + 1))
        return found

    def _resolve_call_result(self, node: ast.Call, scope: ast.AST, depth: int) -> list[_Callable]:
        qualified = self.qualify(node.func)
        if qualified in _PARTIAL or (isinstance(node.func, ast.Name) and node.func.id == "partial"
                                     and qualified is None and not self.lookup("partial", scope)):
            if not node.args:
                return []
            keywords = [k.arg for k in node.keywords if k.arg]
            return [c.partial(len(node.args) - 1, keywords)
                    for c in self.resolve_callables(node.args[0], scope, depth + 1)]
        if qualified in _TF_FUNCTION_WRAPPERS:
            wrapped = node.args[0] if node.args else _keyword(node, "func")
            return self.resolve_callables(wrapped, scope, depth + 1) if wrapped is not None else []
        # Cls(...) used as a function: its __call__.
        classes = self.resolve_class(node.func, scope)
        if classes:
            found = []
            for cls in classes:
                found.extend(self._members_as_callables(cls, "__call__", bound=True, depth=depth))
            return found
        # make_augment(cfg): the functions the factory returns.
        found = []
        for factory in self.resolve_callables(node.func, scope, depth + 1):
            if isinstance(factory.node, ast.Lambda):
                found.extend(self.resolve_callables(factory.node.body, factory.node, depth + 1))
                continue
            for statement in _statements_in_scope(factory.node.body):
                if isinstance(statement, ast.Return) and statement.value is not None:
                    found.extend(self.resolve_callables(statement.value, factory.node, depth + 1))
        return found


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    return None


def _statements_in_scope(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements of a block and its nested blocks, not entering nested defs or classes."""
    pending = list(reversed(body))
    while pending:
        statement = pending.pop()
        yield statement
        if isinstance(statement, (*_FunctionNode, ast.ClassDef)):
            continue
        nested: list[ast.stmt] = []
        for field in ("body", "orelse", "finalbody"):
            nested.extend(getattr(statement, field, []) or [])
        for handler in getattr(statement, "handlers", []) or []:
            nested.extend(handler.body)
        for case in getattr(statement, "cases", []) or []:
            nested.extend(case.body)
        pending.extend(reversed(nested))


# --- which .map calls are tf.data ----------------------------------------------

_DATASET_FUNCTION_METHODS = {
    # method: (position of the function argument, its keyword name)
    "map": (0, "map_func"),
    "filter": (0, "predicate"),
    "flat_map": (0, "map_func"),
    "interleave": (0, "map_func"),
}
# Methods and constructors only tf.data has: strong evidence of a Dataset.
_TF_DATA_ONLY_METHODS = frozenset({
    "prefetch", "padded_batch", "unbatch", "with_options", "interleave", "flat_map",
    "from_tensor_slices", "from_tensors", "list_files", "ragged_batch", "take_while",
    "bucket_by_sequence_length", "as_dataset", "snapshot", "rejection_resample",
})
# Dataset methods other libraries also have: follow the chain to its root.
_CHAINABLE_METHODS = frozenset({
    "map", "filter", "batch", "shuffle", "repeat", "cache", "take", "skip", "shard",
    "zip", "enumerate", "apply", "concatenate", "window", "unique", "ignore_errors",
})
_TF_DATA_KEYWORDS = frozenset({
    "num_parallel_calls", "deterministic", "cycle_length", "block_length", "map_func", "predicate",
})
# Keywords of Hugging Face datasets, multiprocessing and concurrent.futures map().
_OTHER_MAP_KEYWORDS = frozenset({
    "batched", "num_proc", "remove_columns", "fn_kwargs", "with_indices", "with_rank",
    "load_from_cache_file", "input_columns", "chunksize", "timeout",
})
# Libraries whose own datasets have a .map running Python per item.
_OTHER_DATASET_LIBRARIES = frozenset({
    "datasets", "ray", "grain", "torch", "torchdata", "dask", "pyspark",
})
# Libraries with a .map on objects not usually named like datasets (pools, frames).
_OTHER_MAP_LIBRARIES = frozenset({
    "multiprocessing", "concurrent", "pandas", "polars", "joblib", "apache_beam",
})
_DATASET_NAME = re.compile(r"(^|_)(ds|dataset|datasets)(_|\d|$)|dataset", re.IGNORECASE)
_TF_LIBRARIES = frozenset({"tensorflow", "tensorflow_datasets", "keras", "tf_keras", "kiln"})
_OTHER_NAME = re.compile(
    r"(^|_)(pool|executor|df|series|frame|rdd|pcoll|client|futures?|workers?)(_|\d|$)", re.IGNORECASE)
_OTHER_CONSTRUCTOR = re.compile(r"Pool|Executor|DataFrame|Series|SparkContext|Client", re.IGNORECASE)


class _DatasetEvidence:
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

    def __init__(self, index: _ModuleIndex):
        self.index = index
        self._verdicts: dict[tuple[int, int], str] = {}

    def is_dataset_call(self, call: ast.Call) -> bool:
        assert isinstance(call.func, ast.Attribute)
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
        index = self.index
        if not index.uses_tensorflow or index.other_datasets_imported:
            return False
        if index.other_maps_imported:
            names = [_receiver_name(call.func.value), *self._result_names(call)]
            return any(_DATASET_NAME.search(name) for name in names)
        return True

    def _result_names(self, call: ast.Call) -> list[str]:
        """Names the result is assigned to, through a method chain:
        ``train_ds = reader(paths).map(decode).batch(8)`` -> ["train_ds"]."""
        node: ast.AST = call
        parent = self.index.parents.get(node)
        while (isinstance(parent, ast.Attribute)
               or (isinstance(parent, ast.Call) and parent.func is node)):
            node, parent = parent, self.index.parents.get(parent)
        if isinstance(parent, (ast.Assign, ast.AnnAssign)):
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            return [_receiver_name(target) for target in targets]
        return []

    def _receiver(self, node: ast.AST, scope: ast.AST, depth: int) -> str:
        """"tf" (strong evidence), "other" (another library) or "unknown"."""
        if depth > _MAX_RESOLVE_DEPTH:
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
            callee = node.func.attr if isinstance(node.func, ast.Attribute) else \
                node.func.id if isinstance(node.func, ast.Name) else ""
            if _OTHER_CONSTRUCTOR.search(qualified or callee):
                return "other"
            if qualified.startswith(("tensorflow.", "keras.", "tf_keras.")) \
                    and "dataset" in callee.lower():
                return "tf"  # tf.data.TFRecordDataset, keras.utils.image_dataset_from_directory
            return "unknown"
        qualified = self.index.qualify(node)
        if qualified is not None and not qualified.startswith("tensorflow"):
            return "other"  # a module's function, e.g. builtins.map(fn, items)
        if isinstance(node, ast.Name):
            if _OTHER_NAME.search(node.id):
                return "other"
            verdicts = {
                self._receiver(binding, self.index.scope_of(binding), depth + 1)
                for binding in self.index.lookup(node.id, scope) if isinstance(binding, ast.expr)
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


# --- the checker ---------------------------------------------------------------

class _ModuleChecker:
    """Finds the traced functions of one module and checks each of them."""

    def __init__(self, tree: ast.Module, filename: str):
        self.index = _ModuleIndex(tree)
        self.filename = filename
        self._findings: dict[tuple[int, str], Finding] = {}
        # Analysis key -> the shallowest call depth it was analysed at.
        self._done: dict[tuple[int, frozenset[str], frozenset[str]], int] = {}
        self._returns: dict[tuple[int, frozenset[str], frozenset[str]], bool] = {}
        self._evidence = _DatasetEvidence(self.index)

    def findings(self) -> list[Finding]:
        return list(self._findings.values())

    def report(self, node: ast.AST, code: str, message: str, fix: str | None = None) -> None:
        key = (node.lineno, code)
        finding = Finding(self.filename, node.lineno, node.col_offset + 1, code, message,
                          fix or RULES[code].fix)
        # One finding per line and code: an `if a and b` on a tensor is one problem.
        if key not in self._findings or finding < self._findings[key]:
            self._findings[key] = finding

    def run(self) -> None:
        for callable_ in self._entries():
            self.analyse(callable_, callable_.element_params(), frozenset(), depth=0)

    def _entries(self) -> Iterator[_Callable]:
        """The functions TensorFlow traces: tf.function-decorated or -wrapped ones,
        and those passed to a tf.data Dataset's map/filter/flat_map/interleave."""
        index = self.index
        for node in ast.walk(index.tree):
            if isinstance(node, _FunctionNode):
                if _TF_FUNCTION in index.decorator_names(node):
                    yield _Callable(node, skip=1 if index.is_method(node) else 0)
            elif isinstance(node, ast.Call):
                scope = index.scope_of(node)
                if self._is_tf_function_wrapper(node.func) and node.args:
                    # tf.function(fn, ...) and tf.function(input_signature=...)(fn)
                    yield from index.resolve_callables(node.args[0], scope)
                elif (isinstance(node.func, ast.Attribute)
                      and node.func.attr in _DATASET_FUNCTION_METHODS):
                    position, keyword = _DATASET_FUNCTION_METHODS[node.func.attr]
                    function = node.args[position] if len(node.args) > position else \
                        _keyword(node, keyword)
                    if function is None:
                        continue
                    callables = index.resolve_callables(function, scope)
                    if callables and self._evidence.is_dataset_call(node):
                        yield from callables

    def _is_tf_function_wrapper(self, func: ast.AST) -> bool:
        if isinstance(func, ast.Call) and not func.args:
            func = func.func
        return self.index.qualify(func) == _TF_FUNCTION

    @staticmethod
    def analysis_key(callable_: _Callable, tensor_params: Iterable[str],
                     closure: frozenset[str]) -> tuple[int, frozenset[str], frozenset[str]]:
        return id(callable_.node), frozenset(tensor_params), closure

    def returns_tensor(self, key: tuple[int, frozenset[str], frozenset[str]]) -> bool | None:
        """Whether an analysed function may return a tensor; None if not (yet) known."""
        return self._returns.get(key)

    def analyse(self, callable_: _Callable, tensor_params: set[str],
                closure: frozenset[str], depth: int) -> None:
        """Checks one function body given which of its parameters hold tensors."""
        if depth > MAX_CALL_DEPTH:
            return
        key = self.analysis_key(callable_, tensor_params, closure)
        if self._done.get(key, MAX_CALL_DEPTH + 1) <= depth:
            return  # done already, with at least as much call depth left
        self._done[key] = depth
        node = callable_.node
        all_params = {p.arg for p in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                                      *(a for a in (node.args.vararg, node.args.kwarg) if a)]}
        tainted = (set(closure) - all_params) | set(tensor_params)
        body = _FunctionBodyChecker(self, node, depth)
        if isinstance(node, ast.Lambda):
            body.expression(node.body, tainted)
            self._returns[key] = body.is_tensor(node.body, tainted)
        else:
            # Defaults and decorators are evaluated where the def is, not here.
            body.block(node.body, tainted)
            self._returns[key] = body.returns_tensor or _is_generator(node)


class _FunctionBodyChecker:
    """Walks one traced function body in order, tracking which names hold tensors."""

    def __init__(self, module: _ModuleChecker, function: ast.AST, depth: int):
        self.module = module
        self.index = module.index
        self.function = function
        self.depth = depth
        self.returns_tensor = False

    # statements

    def block(self, statements: Sequence[ast.stmt], tainted: set[str]) -> set[str]:
        for statement in statements:
            tainted = self.statement(statement, tainted)
        return tainted

    def statement(self, node: ast.stmt, tainted: set[str]) -> set[str]:
        check = self.expression
        if isinstance(node, (*_FunctionNode, ast.ClassDef)):
            # Not run here; checked when something calls it or passes it on.
            for decorator in node.decorator_list:
                check(decorator, tainted)
            return tainted
        if isinstance(node, ast.Assign):
            check(node.value, tainted)
            is_tensor = self.is_tensor(node.value, tainted)
            tainted = set(tainted)
            for target in node.targets:
                self._bind(target, is_tensor, tainted)
            return tainted
        if isinstance(node, ast.AnnAssign):
            if node.value is None:
                return tainted
            check(node.value, tainted)
            tainted = set(tainted)
            self._bind(node.target, self.is_tensor(node.value, tainted), tainted)
            return tainted
        if isinstance(node, ast.AugAssign):
            check(node.value, tainted)
            tainted = set(tainted)
            if self.is_tensor(node.value, tainted):
                self._bind(node.target, True, tainted, strong=False)
            return tainted
        if isinstance(node, ast.If):
            check(node.test, tainted)
            if self.is_tensor(node.test, tainted):
                self.module.report(
                    node, "K104",
                    "Python `if` on a tensor: needs AutoGraph to rewrite it into tf.cond; fails "
                    "('symbolic tf.Tensor as a Python bool') without AutoGraph or source access, "
                    "or when the branches differ in dtype/structure")
            return self.block(node.body, tainted) | self.block(node.orelse, tainted)
        if isinstance(node, ast.While):
            check(node.test, tainted)
            if self.is_tensor(node.test, tainted):
                self.module.report(
                    node, "K105",
                    "Python `while` on a tensor: needs AutoGraph to rewrite it into tf.while_loop; "
                    "fails ('symbolic tf.Tensor as a Python bool') without AutoGraph or source access")
            after = self._loop(node.body, tainted)
            return after | self.block(node.orelse, after)
        if isinstance(node, (ast.For, ast.AsyncFor)):
            check(node.iter, tainted)
            tainted = set(tainted)
            self._bind(node.target, self.is_tensor(node.iter, tainted), tainted)
            after = self._loop(node.body, tainted)
            return after | self.block(node.orelse, after)
        if isinstance(node, (ast.With, ast.AsyncWith)):
            tainted = set(tainted)
            for item in node.items:
                check(item.context_expr, tainted)
                if item.optional_vars is not None:
                    self._bind(item.optional_vars, self.is_tensor(item.context_expr, tainted), tainted)
            return self.block(node.body, tainted)
        if isinstance(node, (ast.Try, *_try_star())):
            after = self.block(node.body, tainted)
            for handler in node.handlers:
                if handler.type is not None:
                    check(handler.type, tainted)
                after = after | self.block(handler.body, tainted | after)
            after = after | self.block(node.orelse, after)
            return self.block(node.finalbody, after)
        if isinstance(node, ast.Assert):
            check(node.test, tainted)
            if node.msg is not None:
                check(node.msg, tainted)
            if self.is_tensor(node.test, tainted):
                self.module.report(
                    node, "K106",
                    "`assert` on a tensor fails in graph mode: AutoGraph does not convert assert, "
                    "and a symbolic tensor has no truth value")
            return tainted
        if _is_match(node):
            check(node.subject, tainted)
            after = set(tainted)
            for case in node.cases:
                if case.guard is not None:
                    check(case.guard, tainted)
                after |= self.block(case.body, tainted)
            return after
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                check(child, tainted)
        if isinstance(node, ast.Return) and node.value is not None:
            self.returns_tensor |= self.is_tensor(node.value, tainted)
        return tainted

    def _loop(self, body: Sequence[ast.stmt], tainted: set[str]) -> set[str]:
        # Twice, so names that become tensors late in the body are tensors at its top.
        first = self.block(body, tainted) | tainted
        return self.block(body, first) | first

    def _bind(self, target: ast.AST, is_tensor: bool, tainted: set[str], strong: bool = True) -> None:
        if isinstance(target, ast.Name):
            if is_tensor:
                tainted.add(target.id)
            elif strong:
                tainted.discard(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._bind(element, is_tensor, tainted, strong)
        elif isinstance(target, ast.Starred):
            self._bind(target.value, is_tensor, tainted, strong)
        elif isinstance(target, ast.Subscript) and is_tensor:
            # features["image"] = tensor: the container now holds a tensor.
            root = target.value
            while isinstance(root, (ast.Subscript, ast.Attribute)):
                root = root.value
            if isinstance(root, ast.Name):
                tainted.add(root.id)

    # expressions

    def expression(self, node: ast.AST, tainted: set[str]) -> None:
        """Checks every call and branch in an expression."""
        if isinstance(node, ast.Lambda):
            self._follow(_Callable(node), _Callable(node).element_params(), tainted)
            return
        if isinstance(node, _ComprehensionNode):
            self._comprehension(node, tainted)
            return
        if isinstance(node, ast.IfExp):
            if self.is_tensor(node.test, tainted):
                self.module.report(
                    node, "K104",
                    "conditional expression on a tensor: needs AutoGraph to rewrite it into "
                    "tf.cond; fails ('symbolic tf.Tensor as a Python bool') without it",
                    "use tf.where(cond, a, b), or tf.cond(cond, lambda: a, lambda: b)")
        elif isinstance(node, ast.BoolOp):
            if any(self.is_tensor(value, tainted) for value in node.values[:-1]):
                operator = "and" if isinstance(node.op, ast.And) else "or"
                self.module.report(
                    node, "K104",
                    f"`{operator}` on a tensor takes its Python truth value: needs AutoGraph's "
                    f"rewrite; fails ('symbolic tf.Tensor as a Python bool') without it",
                    f"use tf.logical_{operator}(a, b) (or a {'&' if operator == 'and' else '|'} b "
                    f"on boolean tensors)")
        elif isinstance(node, ast.NamedExpr):
            self.expression(node.value, tainted)
            self._bind(node.target, self.is_tensor(node.value, tainted), tainted)
            return
        elif isinstance(node, ast.Call):
            skipped = self._call(node, tainted)
            for child in [node.func, *node.args, *(k.value for k in node.keywords)]:
                if child not in skipped:
                    self.expression(child, tainted)
            return
        for child in ast.iter_child_nodes(node):
            self.expression(child, tainted)

    def _comprehension(self, node: ast.AST, tainted: set[str]) -> None:
        local = set(tainted)
        for generator in node.generators:
            self.expression(generator.iter, local)
            self._bind(generator.target, self.is_tensor(generator.iter, local), local)
            for condition in generator.ifs:
                self.expression(condition, local)
                if self.is_tensor(condition, local):
                    self.module.report(
                        condition, "K104",
                        "comprehension `if` on a tensor takes its Python truth value, which a "
                        "symbolic tensor does not have (fails in graph mode)",
                        "filter with tf.boolean_mask(x, mask) or select with tf.where(mask, x, y)")
        elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        for element in elements:
            self.expression(element, local)

    def _call(self, node: ast.Call, tainted: set[str]) -> set[ast.AST]:
        """Reports the call itself and follows same-module callees; returns the
        argument nodes not to check as traced code (a py_function's Python function)."""
        index = self.index
        qualified = index.qualify(node.func)
        func = node.func
        skipped: set[ast.AST] = set()
        shown = _shown_name(func)

        if qualified and (qualified.startswith("numpy.random.") or qualified == "random"
                          or qualified.startswith("random.")):
            self.module.report(
                node, "K101",
                f"`{shown}()` runs once, at trace time: its value is baked into the graph as a "
                f"constant, the same for every element and epoch")
        elif isinstance(func, ast.Attribute) and self._is_python_rng(func.value):
            self.module.report(
                node, "K101",
                f"`{shown}()` draws from a NumPy/Python generator once, at trace time: its value "
                f"is baked into the graph as a constant, the same for every element and epoch")
        elif isinstance(func, ast.Attribute) and func.attr == "numpy" and not node.args \
                and not node.keywords:
            self.module.report(
                node, "K102",
                "`.numpy()` in traced code: the tensor is symbolic and has no value "
                "(AttributeError in graph mode)")
        elif any(index.is_builtin(func, name) for name in _CONCRETE_VALUE_BUILTINS) \
                and any(self.is_tensor(a, tainted) for a in node.args):
            self.module.report(
                node, "K102",
                f"`{shown}()` of a tensor in traced code: the tensor is symbolic and has no value "
                f"(TypeError in graph mode)",
                "use tf.cast(x, dtype) to stay in the graph, or a static property such as x.shape")
        elif index.is_builtin(func, "print"):
            self.module.report(
                node, "K103",
                "`print()` runs once, at trace time, and shows a symbolic Tensor, not the elements")
        elif _is_py_function(qualified):
            self.module.report(
                node, "K107",
                f"`{shown}` runs Python per element: it holds the GIL (num_parallel_calls barely "
                f"helps), loses static shapes (set_shape needed), cannot be serialized with the "
                f"graph, and runs on the host only")
        elif qualified and qualified.startswith(_HOST_ARRAY_LIBRARIES) \
                and self._has_tensor_argument(node, tainted):
            self.module.report(
                node, "K108",
                f"`{shown}()` on a tensor in traced code: NumPy/OpenCV need concrete arrays "
                f"('Cannot convert a symbolic tf.Tensor to a numpy array')")

        last = (qualified or "").rsplit(".", 1)[-1]
        if qualified and qualified.startswith("tensorflow.") and last in _PYTHON_CALLBACK_KEYWORDS:
            python_function = node.args[0] if node.args else \
                _keyword(node, _PYTHON_CALLBACK_KEYWORDS[last])
            if python_function is not None:
                skipped.add(python_function)  # runs eagerly, per element: not traced code

        scope = self.function
        for callee in index.resolve_callables(func, scope):
            self._follow(callee, self._bind_arguments(callee, node, tainted), tainted)
        # Functions handed to another call (tf.cond, tf.map_fn, map, ...) run at trace
        # time too, on the call's other arguments: tensors if any of those is one.
        arguments = [*node.args, *(k.value for k in node.keywords)]
        for argument in arguments:
            if argument in skipped or isinstance(argument, ast.Lambda):
                continue
            if isinstance(argument, (ast.Name, ast.Attribute)) or (
                    isinstance(argument, ast.Call) and index.qualify(argument.func) in _PARTIAL):
                callees = index.resolve_callables(argument, scope)
                if not callees:
                    continue
                gets_tensors = any(self.is_tensor(other, tainted)
                                   for other in arguments if other is not argument)
                for callee in callees:
                    self._follow(callee, callee.element_params() if gets_tensors else set(), tainted)
        return skipped

    def _follow(self, callee: _Callable, tensor_params: set[str], tainted: set[str]) -> None:
        self.module.analyse(callee, tensor_params, self._closure(callee, tainted), self.depth + 1)

    def _closure(self, callee: _Callable, tainted: set[str]) -> frozenset[str]:
        # A nested function sees this function's tensors through its closure.
        return frozenset(tainted) if self._is_inside(callee.node, self.function) else frozenset()

    def _call_returns_tensor(self, call: ast.Call, tainted: set[str]) -> bool | None:
        """For a call of same-module functions already analysed: whether any of them
        returns a tensor given these arguments. None when unknown."""
        callees = self.index.resolve_callables(call.func, self.function)
        if not callees:
            return None
        answers = [
            self.module.returns_tensor(self.module.analysis_key(
                callee, self._bind_arguments(callee, call, tainted), self._closure(callee, tainted)))
            for callee in callees
        ]
        if any(answer is None for answer in answers):
            return None
        return any(answers)

    def _is_inside(self, node: ast.AST, ancestor: ast.AST) -> bool:
        current = self.index.parents.get(node)
        while current is not None:
            if current is ancestor:
                return True
            current = self.index.parents.get(current)
        return False

    def _bind_arguments(self, callee: _Callable, call: ast.Call, tainted: set[str]) -> set[str]:
        """The callee's parameters that receive a tensor at this call."""
        params = [p for p, _ in callee.positional_params()]
        args = callee.node.args
        keyword_only = [p.arg for p in args.kwonlyargs]
        result: set[str] = set()
        position = 0
        for argument in call.args:
            if isinstance(argument, ast.Starred):
                if self.is_tensor(argument.value, tainted):
                    result.update(p.arg for p in params[position:])
                    if args.vararg is not None:
                        result.add(args.vararg.arg)
                break
            if self.is_tensor(argument, tainted):
                if position < len(params):
                    result.add(params[position].arg)
                elif args.vararg is not None:
                    result.add(args.vararg.arg)
            position += 1
        for keyword in call.keywords:
            if not self.is_tensor(keyword.value, tainted):
                continue
            if keyword.arg is None:  # **kwargs
                result.update(p.arg for p in params[position:])
                result.update(keyword_only)
            else:
                result.add(keyword.arg)
        return result

    def _has_tensor_argument(self, call: ast.Call, tainted: set[str]) -> bool:
        return any(self.is_tensor(a, tainted) for a in [*call.args, *(k.value for k in call.keywords)])

    def _is_python_rng(self, node: ast.AST, depth: int = 0) -> bool:
        """Whether `node` is a NumPy Generator/RandomState or a random.Random."""
        if depth > _MAX_RESOLVE_DEPTH:
            return False
        index = self.index
        if isinstance(node, ast.Call):
            return index.qualify(node.func) in _PYTHON_RNG_CONSTRUCTORS
        if isinstance(node, ast.Name):
            return any(isinstance(b, ast.expr) and self._is_python_rng(b, depth + 1)
                       for b in index.lookup(node.id, self.function))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner = index.method_receiver(self.function, node.value.id)
            if owner is not None:
                return any(isinstance(value, ast.expr) and self._is_python_rng(value, depth + 1)
                           for value, _ in index.class_member(owner, node.attr))
        return False

    # data flow

    def is_tensor(self, node: ast.AST, tainted: set[str]) -> bool:
        """Whether an expression may hold a tensor computed from the element."""
        index = self.index
        if isinstance(node, ast.Name):
            return node.id in tainted
        if isinstance(node, (ast.Constant, ast.Lambda, ast.JoinedStr)):
            return False
        if isinstance(node, ast.Attribute):
            if node.attr in _STATIC_ATTRIBUTES or node.attr.startswith("__"):
                return False  # x.shape, x.dtype, x.__class__, ...
            return self.is_tensor(node.value, tainted)
        if isinstance(node, ast.Subscript):
            return self.is_tensor(node.value, tainted) or self.is_tensor(node.slice, tainted)
        if isinstance(node, ast.Compare):
            if all(isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for op in node.ops):
                return False  # identity and membership are structure, decided at trace time
            return any(self.is_tensor(n, tainted) for n in [node.left, *node.comparators])
        if isinstance(node, ast.IfExp):
            return self.is_tensor(node.body, tainted) or self.is_tensor(node.orelse, tainted)
        if isinstance(node, ast.Call):
            func = node.func
            if any(index.is_builtin(func, name) for name in _STATIC_BUILTINS):
                return False
            if isinstance(func, ast.Attribute) and func.attr in _STATIC_METHODS:
                return False
            qualified = index.qualify(func)
            if qualified:
                if qualified in _TF_STATIC_CALLS:
                    return False
                if qualified.startswith("tensorflow.") and not qualified.startswith(_TF_NON_OP_PREFIXES):
                    return True  # a TF op returns a tensor whatever its inputs
            same_module = self._call_returns_tensor(node, tainted)
            if same_module is not None:
                return same_module
            name = func.attr if isinstance(func, ast.Attribute) else \
                func.id if isinstance(func, ast.Name) else ""
            if name.startswith(_PREDICATE_PREFIXES):
                return False
            if isinstance(func, ast.Attribute) and self.is_tensor(func.value, tainted):
                return True
            return self._has_tensor_argument(node, tainted)
        if isinstance(node, _ComprehensionNode):
            return any(self.is_tensor(g.iter, tainted) for g in node.generators) or any(
                self.is_tensor(child, tainted)
                for child in ([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]))
        return any(self.is_tensor(child, tainted) for child in ast.iter_child_nodes(node))


def _is_py_function(qualified: str | None) -> bool:
    return bool(qualified) and qualified.startswith("tensorflow.") and \
        qualified.rsplit(".", 1)[-1] in _PY_FUNCTION_NAMES


def _shown_name(func: ast.AST) -> str:
    """The callee as written, shortened for messages."""
    try:
        text = ast.unparse(func)
    except Exception:  # unparse of odd trees is best-effort only
        return "call"
    return text if len(text) <= 40 else "..." + text[-37:]


def _is_generator(function: ast.AST) -> bool:
    """Whether the function's own body (not a nested def or lambda) yields."""
    pending = list(function.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(node, (*_FunctionNode, ast.ClassDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))
    return False


def _try_star() -> tuple[type, ...]:
    star = getattr(ast, "TryStar", None)
    return (star,) if star is not None else ()


def _is_match(node: ast.AST) -> bool:
    match = getattr(ast, "Match", None)
    return match is not None and isinstance(node, match)
