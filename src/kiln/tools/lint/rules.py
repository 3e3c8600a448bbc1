"""The lint codes: what each one means, its messages and fix, and which code is which pitfall.

`taint` walks the traced functions and knows which values are tensors; the
functions here decide, for one statement, expression or call, whether it is a
pitfall and say what is wrong with it.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from collections.abc import Callable

from kiln.tools.lint.resolution import ModuleIndex

IsTensor = Callable[[ast.AST], bool]
"""Whether an expression may hold a tensor computed from the element, where it is checked."""


@dataclasses.dataclass(frozen=True)
class Rule:
    """One kind of finding: its code, a short title and the standard fix."""

    code: str
    title: str
    fix: str


RULES: dict[str, Rule] = {
    rule.code: rule
    for rule in (
        Rule(
            "K000",
            "the file could not be read or parsed",
            "fix the syntax error; nothing else in this file was checked",
        ),
        Rule(
            "K101",
            "Python or NumPy randomness in traced code",
            "use tf.random.stateless_* / tf.image.stateless_random_* with a per-element "
            "seed, e.g. from Dataset.enumerate",
        ),
        Rule(
            "K102",
            "Python value of a symbolic tensor",
            "keep it in TF ops, or do the work offline in kiln build",
        ),
        Rule("K103", "print() in traced code", "use tf.print, which runs for every element"),
        Rule(
            "K104",
            "Python branch on a tensor",
            "use tf.cond(pred, true_fn, false_fn), or tf.where(pred, x, y) element-wise",
        ),
        Rule(
            "K105",
            "Python while loop on a tensor",
            "use tf.while_loop(cond, body, loop_vars), or loop over a static bound such as x.shape",
        ),
        Rule(
            "K106",
            "assert on a tensor",
            "use tf.debugging.assert_* (e.g. tf.debugging.assert_less), which checks every element",
        ),
        Rule(
            "K107",
            "Python code wrapped in tf.py_function / tf.numpy_function",
            "move the work offline into kiln build (a registered transform), or write it in TF ops",
        ),
        Rule(
            "K108",
            "NumPy/OpenCV call on a tensor",
            "do it offline in kiln build, or use the TF equivalent (tf.image.*, tf.math.*)",
        ),
        Rule(
            "K109",
            "Python state mutated in traced code",
            "keep per-element state in a tf.Variable created outside the traced function and "
            "updated with assign_add / assign, or carry it in the dataset (Dataset.scan, "
            "Dataset.enumerate)",
        ),
        Rule(
            "K110",
            "Python clock, unique id or OS entropy in traced code",
            "use tf.timestamp() for the time; for an id or a seed, the element's index "
            "(Dataset.enumerate) or its record's key",
        ),
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
        return f"{self.path}:{self.line}:{self.col}: {self.describe()}"

    def describe(self) -> str:
        """``CODE message (fix: ...)``: the finding without its place, as flake8 shows it."""
        return f"{self.code} {self.message} (fix: {self.fix})"

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Violation:
    """A pitfall found at a node, before it has a place: its code, what is wrong
    and why, and the fix when the rule's standard fix does not fit."""

    code: str
    message: str
    fix: str | None = None

    def at(self, path: str, node: ast.stmt | ast.expr) -> Finding:
        return Finding(
            path,
            node.lineno,
            node.col_offset + 1,
            self.code,
            self.message,
            self.fix or RULES[self.code].fix,
        )


# --- files that could not be checked (K000) -----------------------------------------


def file_not_checked(path: str, error: Exception) -> Finding:
    """The K000 finding for a file that could not be read, decoded or parsed."""
    line = getattr(error, "lineno", None) or 1
    col = getattr(error, "offset", None) or 1
    reason = getattr(error, "msg", None) or str(error)
    fix = RULES[SYNTAX_ERROR_CODE].fix
    if isinstance(error, SyntaxError):
        # Valid code for a newer Python (PEP 695's `type X = ...` on 3.11) fails here too.
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        message = f"syntax error (as Python {version} reads it): {reason}"
    elif isinstance(error, RecursionError):
        message = "nested too deeply to parse"
        fix = "split the deepest expressions"
    elif isinstance(error, OSError):
        message = f"cannot read the file: {error.strerror or error}"
        fix = "check the path and its permissions"
    else:
        message = f"cannot decode the file: {reason}"
        if isinstance(error, UnicodeDecodeError) and isinstance(error.object, bytes):
            # The line of the first byte that is not in the file's encoding.
            before = error.object[: error.start]
            line = before.count(b"\n") + 1
            col = error.start - (before.rfind(b"\n") + 1) + 1
        fix = "save it as UTF-8, or declare its encoding in a coding comment (PEP 263)"
    return Finding(path, int(line), int(col), SYNTAX_ERROR_CODE, message, fix)


def nested_too_deeply_to_check(path: str) -> Finding:
    """The K000 finding for code that parses but nests deeper than the checker recurses."""
    return Finding(
        path,
        1,
        1,
        SYNTAX_ERROR_CODE,
        "expressions nested too deeply to check",
        "split the deepest expressions, or lint this file's sources instead",
    )


# --- branches on tensors (K104, K105, K106) -------------------------------------------


def statement_violation(statement: ast.stmt, is_tensor: IsTensor) -> Violation | None:
    """A Python `if`, `while` or `assert` whose test is a tensor."""
    if isinstance(statement, ast.If) and is_tensor(statement.test):
        return Violation(
            "K104",
            "Python `if` on a tensor: needs AutoGraph to rewrite it into tf.cond; fails "
            "('symbolic tf.Tensor as a Python bool') without AutoGraph or source access, "
            "or when the branches differ in dtype/structure",
        )
    if isinstance(statement, ast.While) and is_tensor(statement.test):
        return Violation(
            "K105",
            "Python `while` on a tensor: needs AutoGraph to rewrite it into tf.while_loop; "
            "fails ('symbolic tf.Tensor as a Python bool') without AutoGraph or source access",
        )
    if isinstance(statement, ast.Assert) and is_tensor(statement.test):
        return Violation(
            "K106",
            "`assert` on a tensor fails in graph mode: AutoGraph does not convert assert, "
            "and a symbolic tensor has no truth value",
        )
    return None


def match_violation(statement: ast.Match, subject_is_tensor: bool) -> Violation | None:
    """A `match` on a tensor with a `case` that compares by value (`case 0:`)."""
    if not subject_is_tensor or not any(_compares_by_value(c.pattern) for c in statement.cases):
        return None
    return Violation(
        "K104",
        "`match` on a tensor: `case <value>` compares with == and takes the result's Python "
        "truth value, and AutoGraph does not convert `match` ('symbolic tf.Tensor as a "
        "Python bool')",
        "use tf.switch_case(index, branches) or tf.cond(pred, true_fn, false_fn)",
    )


def guard_violation(guard: ast.expr, is_tensor: IsTensor) -> Violation | None:
    """A `case ... if guard:` whose guard is a tensor."""
    if not is_tensor(guard):
        return None
    return Violation(
        "K104",
        "`case ... if` guard on a tensor takes its Python truth value, and AutoGraph does "
        "not convert `match` ('symbolic tf.Tensor as a Python bool')",
        "use tf.cond(pred, true_fn, false_fn), or tf.where(pred, x, y) element-wise",
    )


def _compares_by_value(pattern: ast.pattern) -> bool:
    """Whether a case pattern tests its subject with == (`case 0`, `case 0 | 1`)."""
    if isinstance(pattern, ast.MatchValue):
        return True
    if isinstance(pattern, ast.MatchOr):
        return any(_compares_by_value(p) for p in pattern.patterns)
    if isinstance(pattern, ast.MatchAs) and pattern.pattern is not None:
        return _compares_by_value(pattern.pattern)
    return False


def expression_violation(expression: ast.AST, is_tensor: IsTensor) -> Violation | None:
    """A conditional expression, or an `and`/`or` that takes a tensor's truth value."""
    if isinstance(expression, ast.IfExp) and is_tensor(expression.test):
        return Violation(
            "K104",
            "conditional expression on a tensor: needs AutoGraph to rewrite it into "
            "tf.cond; fails ('symbolic tf.Tensor as a Python bool') without it",
            "use tf.where(cond, a, b), or tf.cond(cond, lambda: a, lambda: b)",
        )
    # The last operand's truth value is never taken: `a and b` returns b as it is.
    if isinstance(expression, ast.BoolOp) and any(is_tensor(v) for v in expression.values[:-1]):
        operator = "and" if isinstance(expression.op, ast.And) else "or"
        return Violation(
            "K104",
            f"`{operator}` on a tensor takes its Python truth value: needs AutoGraph's "
            f"rewrite; fails ('symbolic tf.Tensor as a Python bool') without it",
            f"use tf.logical_{operator}(a, b) (or a {'&' if operator == 'and' else '|'} b "
            f"on boolean tensors)",
        )
    return None


def comprehension_condition_violation(condition: ast.expr, is_tensor: IsTensor) -> Violation | None:
    """A comprehension's `if` on a tensor, which AutoGraph never rewrites."""
    if not is_tensor(condition):
        return None
    return Violation(
        "K104",
        "comprehension `if` on a tensor takes its Python truth value, which a "
        "symbolic tensor does not have (fails in graph mode)",
        "filter with tf.boolean_mask(x, mask) or select with tf.where(mask, x, y)",
    )


# --- calls (K101, K102, K103, K107, K108) ---------------------------------------------

# tf.py_function and its relatives, wherever in tensorflow they are imported from.
PY_FUNCTION_NAMES = frozenset({"py_function", "numpy_function", "py_func", "eager_py_func"})
_CONCRETE_VALUE_BUILTINS = frozenset({"int", "float", "bool", "complex"})
_HOST_ARRAY_LIBRARIES = ("numpy.", "cv2.", "scipy.", "skimage.", "PIL.")
# Keras's image utilities that are NumPy/SciPy/PIL code, not ops (the legacy
# `preprocessing.image` augmentations: 'Cannot convert a symbolic tf.Tensor'
# in a map), under each Keras a user may import. `smart_resize` and
# `to_categorical` accept tensors and are not listed.
_KERAS_ROOTS = ("tensorflow.keras.", "keras.", "tf_keras.")
_KERAS_HOST_ARRAY_FUNCTIONS = frozenset(
    {
        *(
            f"preprocessing.image.{name}"
            for name in (
                "random_rotation",
                "random_shift",
                "random_shear",
                "random_zoom",
                "random_channel_shift",
                "random_brightness",
                "apply_affine_transform",
                "apply_channel_shift",
                "apply_brightness_shift",
                "img_to_array",
                "array_to_img",
                "load_img",
                "save_img",
            )
        ),
        *(f"utils.{name}" for name in ("img_to_array", "array_to_img", "load_img", "save_img")),
    }
)


# Python calls whose value differs per call but is taken once, at trace time
# (K110): clocks, unique ids and the OS's entropy.
_TRACE_TIME_VALUES = frozenset(
    {
        *(
            f"time.{name}{suffix}"
            for name in ("time", "perf_counter", "monotonic", "process_time", "thread_time")
            for suffix in ("", "_ns")
        ),
        "datetime.datetime.now",
        "datetime.datetime.utcnow",
        "datetime.datetime.today",
        "datetime.date.today",
        "uuid.uuid1",
        "uuid.uuid4",
        "os.urandom",
        "os.getrandom",
    }
)


def call_violation(
    call: ast.Call, index: ModuleIndex, scope: ast.AST, is_tensor: IsTensor
) -> Violation | None:
    """The pitfall a call in traced code is, if any; `scope` is the traced function."""
    qualified = index.qualify(call.func)
    func = call.func
    if qualified and (qualified in _TRACE_TIME_VALUES or qualified.startswith("secrets.")):
        return Violation(
            "K110",
            f"`{_shown_name(func)}()` runs once, at trace time: its value is baked into the graph "
            f"as a constant, the same for every element and epoch",
        )
    if qualified and (
        qualified.startswith("numpy.random.")
        or qualified == "random"
        or qualified.startswith("random.")
    ):
        return Violation(
            "K101",
            f"`{_shown_name(func)}()` runs once, at trace time: its value is baked into the graph "
            f"as a constant, the same for every element and epoch",
        )
    if isinstance(func, ast.Attribute) and index.is_python_rng(func.value, scope):
        return Violation(
            "K101",
            f"`{_shown_name(func)}()` draws from a NumPy/Python generator once, at trace time: its "
            f"value is baked into the graph as a constant, the same for every element and epoch",
        )
    if (
        isinstance(func, ast.Attribute)
        and func.attr == "numpy"
        and not call.args
        and not call.keywords
    ):
        return Violation(
            "K102",
            "`.numpy()` in traced code: the tensor is symbolic and has no value "
            "(AttributeError in graph mode)",
        )
    text = _text_violation(call, index, is_tensor)
    if text is not None:
        return text
    if any(index.is_builtin(func, name) for name in _CONCRETE_VALUE_BUILTINS) and any(
        is_tensor(a) for a in call.args
    ):
        return Violation(
            "K102",
            f"`{_shown_name(func)}()` of a tensor in traced code: the tensor is symbolic and "
            f"has no value (TypeError in graph mode)",
            "use tf.cast(x, dtype) to stay in the graph, or a static property such as x.shape",
        )
    if index.is_builtin(func, "print"):
        return Violation(
            "K103",
            "`print()` runs once, at trace time, and shows a symbolic Tensor, not the elements",
        )
    if _is_py_function(qualified):
        return Violation(
            "K107",
            f"`{_shown_name(func)}` runs Python per element: it holds the GIL (num_parallel_calls "
            f"barely helps), loses static shapes (set_shape needed), cannot be serialized with the "
            f"graph, and runs on the host only",
        )
    if (
        qualified
        and (qualified.startswith(_HOST_ARRAY_LIBRARIES) or _is_keras_host_array(qualified))
        and any(is_tensor(a) for a in [*call.args, *(k.value for k in call.keywords)])
    ):
        return Violation(
            "K108",
            f"`{_shown_name(func)}()` on a tensor in traced code: NumPy/OpenCV need concrete "
            f"arrays ('Cannot convert a symbolic tf.Tensor to a numpy array')",
        )
    if index.is_host_image_pipeline(func, scope) and any(
        is_tensor(a) for a in [*call.args, *(k.value for k in call.keywords)]
    ):
        return Violation(
            "K108",
            f"`{_shown_name(func)}(...)` calls an albumentations/imgaug/torchvision transform on a "
            f"tensor in traced code: it runs NumPy/PIL code, which needs concrete arrays",
        )
    return None


_STRING_FIX = (
    "build strings with tf.strings.join / tf.strings.format / tf.strings.as_string (a path: "
    "tf.strings.join([root, '/', name])), decode with tf.io.decode_* or tf.strings ops"
)
_PATH_FUNCTIONS = frozenset({"os.path.join", "posixpath.join", "pathlib.Path", "pathlib.PurePath"})


def _text_violation(call: ast.Call, index: ModuleIndex, is_tensor: IsTensor) -> Violation | None:
    """A tensor made into Python text: `str(t)`, `"...".format(t)`, `t.decode()`,
    `os.path.join(root, t)`: the symbolic Tensor's repr, or a TypeError/AttributeError."""
    func = call.func
    arguments = [*call.args, *(k.value for k in call.keywords)]
    if index.is_builtin(func, "str") and any(is_tensor(a) for a in call.args):
        what = "`str()` of a tensor gives the symbolic Tensor's repr"
    elif (
        isinstance(func, ast.Attribute)
        and func.attr == "format"
        and isinstance(func.value, ast.Constant)
        and isinstance(func.value.value, str)
        and any(is_tensor(a) for a in arguments)
    ):
        what = "`str.format()` of a tensor writes the symbolic Tensor's repr"
    elif isinstance(func, ast.Attribute) and func.attr == "decode" and is_tensor(func.value):
        what = "`.decode()` on a tensor fails (AttributeError: a tensor is not bytes)"
    elif index.qualify(func) in _PATH_FUNCTIONS and any(is_tensor(a) for a in arguments):
        what = (
            f"`{_shown_name(func)}()` of a tensor fails "
            f"(TypeError: expected str, bytes or os.PathLike object, not Tensor)"
        )
    else:
        return None
    return Violation(
        "K102", f"{what}: in traced code the tensor is symbolic and has no value", _STRING_FIX
    )


def formatted_string_violation(
    text: ast.JoinedStr | ast.BinOp, is_tensor: IsTensor
) -> Violation | None:
    """An f-string (or `"..." % t`) that formats a tensor: the symbolic Tensor's repr."""
    if isinstance(text, ast.JoinedStr):
        values = [v.value for v in text.values if isinstance(v, ast.FormattedValue)]
    else:
        values = [text.right]
    if not any(is_tensor(v) for v in values):
        return None
    return Violation(
        "K102",
        "a string formatted from a tensor in traced code holds the symbolic Tensor's repr "
        "('Tensor(\"args_0:0\", ...)'), the same for every element, not its value",
        _STRING_FIX,
    )


def _is_keras_host_array(qualified: str) -> bool:
    """Whether a dotted name is one of Keras's NumPy-based image utilities."""
    for root in _KERAS_ROOTS:
        if qualified.startswith(root):
            return qualified[len(root) :] in _KERAS_HOST_ARRAY_FUNCTIONS
    return False


def _is_py_function(qualified: str | None) -> bool:
    """Whether a dotted name is tf.py_function or one of its relatives."""
    return (
        qualified is not None
        and qualified.startswith("tensorflow.")
        and qualified.rsplit(".", 1)[-1] in PY_FUNCTION_NAMES
    )


def _shown_name(func: ast.AST) -> str:
    """The callee as written, shortened for messages."""
    try:
        text = ast.unparse(func)
    except Exception:  # unparse of odd trees is best-effort only
        return "call"
    return text if len(text) <= 40 else "..." + text[-37:]


# --- Python state mutated at trace time (K109) ---------------------------------------

# Methods that change a list, dict, set or deque in place.
MUTATING_METHODS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "add",
        "update",
        "pop",
        "popitem",
        "setdefault",
        "clear",
        "remove",
        "discard",
        "appendleft",
        "extendleft",
    }
)


def rebinding_violation(name: str, declaration: str, augmented: bool) -> Violation:
    """An assignment, augmented assignment or `del` of a name declared `global`/`nonlocal`."""
    if augmented:
        return Violation(
            "K109",
            f"`{name}` ({declaration}) is updated once, at trace time, not for every element: "
            f"after any number of elements it has changed once",
        )
    return Violation(
        "K109",
        f"`{name}` ({declaration}) is assigned once, at trace time: it holds what tracing "
        f"saw (a symbolic tensor or a trace-time value), never an element's",
    )


def mutation_violation(target: ast.AST, how: str) -> Violation:
    """A mutating method call, subscript assignment/`del` or augmented assignment on
    an object that outlives the traced function (module-level, enclosing scope, self)."""
    return Violation(
        "K109",
        f"{how} `{_shown_name(target)}` changes an object outside the traced function "
        f"once, at trace time: it gets one symbolic value from tracing, not one per element",
    )
