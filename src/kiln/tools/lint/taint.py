"""The taint checker: which values in traced code are tensors, and the pitfalls found on them.

Starting from each traced function (`traced_functions`), the checker walks the
body in order and asks `rules` about every statement, expression and call.

Which values are tensors (for K102 `int()`, K104-K106, K108): the traced
function's parameters that receive dataset elements (parameters without a
default value and not bound by `functools.partial` or `self`), everything
computed from them, and the results of TensorFlow ops. Static properties
(`x.shape`, `x.dtype`, `x.ndim`, `len(...)`, `isinstance(...)`, `x is None`,
`"key" in features`) and configuration (closure variables, `self.*`,
parameters with defaults, constants) are not tensors, so branching on them is
fine and not reported. Across calls in the same module, a callee's parameter
is a tensor exactly when the caller passes one, and a call returns a tensor
only if the callee may return one. Same-module functions are followed up to
`MAX_CALL_DEPTH` calls deep; calls of functions imported from other modules
are noted as `ExternalCall`s, which `project` follows into the other files of
a run.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from collections.abc import Iterable, Sequence
from typing import TypeAlias

from kiln.tools.lint import rules
from kiln.tools.lint.resolution import (
    FUNCTION_NODES,
    PARTIAL,
    ModuleIndex,
    ResolvedFunction,
    keyword_argument,
)
from kiln.tools.lint.rules import Finding, Violation
from kiln.tools.lint.traced_functions import traced_functions

MAX_CALL_DEPTH = 10
"""How many calls deep the checker follows functions called from traced code."""

# Calls whose first argument (or this keyword) is Python run per element, not traced.
_PYTHON_CALLBACK_KEYWORDS = {
    **{name: "func" for name in rules.PY_FUNCTION_NAMES},
    "from_generator": "generator",
}

# TF calls that return Python values (or objects), not tensors.
_TF_STATIC_CALLS = frozenset(
    {
        "tensorflow.executing_eagerly",
        "tensorflow.is_tensor",
        "tensorflow.is_symbolic_tensor",
        "tensorflow.get_static_value",
        "tensorflow.as_dtype",
        "tensorflow.TensorShape",
        "tensorflow.TensorSpec",
        "tensorflow.RaggedTensorSpec",
        "tensorflow.SparseTensorSpec",
        "tensorflow.dimension_value",
        "tensorflow.compat.dimension_value",
        "tensorflow.DType",
        "tensorflow.debugging.is_numeric_tensor",
        "tensorflow.function",
    }
)
# TF namespaces whose calls are not tensor ops; they pass taint through their arguments.
_TF_NON_OP_PREFIXES = (
    "tensorflow.config.",
    "tensorflow.distribute.",
    "tensorflow.io.gfile.",
    "tensorflow.nest.",
    "tensorflow.data.",
    "tensorflow.test.",
    "tensorflow.sysconfig.",
    "tensorflow.version.",
    "tensorflow.autograph.",
    "tensorflow.keras.",
    "tensorflow.saved_model.",
    "tensorflow.train.Checkpoint",
    "tensorflow.summary.",
    "tensorflow.errors.",
    "tensorflow.python.",  # internals: no promise what they return
)
# Outside TensorFlow, `is_nested(x)`, `has_key(x)` and the like answer about structure.
_PREDICATE_PREFIXES = ("is_", "has_")
_STATIC_BUILTINS = frozenset(
    {
        "isinstance",
        "issubclass",
        "hasattr",
        "callable",
        "type",
        "id",
        "len",
        "repr",
        "str",
    }
)
# Attributes of a tensor known when the graph is built.
_STATIC_ATTRIBUTES = frozenset(
    {
        "shape",
        "dtype",
        "ndim",
        "rank",
        "name",
        "device",
        "graph",
        "element_spec",
    }
)
_STATIC_METHODS = frozenset({"get_shape", "numpy"})

# Strings made for a person, not for the graph (K102's formatted strings skip them).
_MESSAGE_MODULES = frozenset({"logging", "warnings", "absl"})
_LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical"})
_ERRORS = ("Error", "Exception", "Warning")
_MESSAGE_NAMES = ("msg", "message", "error", "err")

_COMPREHENSION_NODES = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_Comprehension: TypeAlias = ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp
# `try: ... except* E:` is a node of its own since Python 3.11.
if sys.version_info >= (3, 11):
    _TRY_NODES: tuple[type[ast.Try | ast.TryStar], ...] = (ast.Try, ast.TryStar)
else:
    _TRY_NODES = (ast.Try,)

# (function node id, its parameters holding tensors, closure names holding tensors).
_AnalysisKey = tuple[int, frozenset[str], frozenset[str]]


@dataclasses.dataclass(frozen=True)
class ExternalCall:
    """A function imported from another module that traced code calls or traces.

    `kiln lint` follows it when that module is among the files it checks
    (`project`). Attributes:
      qualified: its dotted import path as written (``.helpers.blur`` for a
        relative import).
      tensor_positions: the positional arguments that are tensors; None when it
        is traced on dataset elements (``ds.map(blur)``): its parameters without
        a default value are.
      tensor_keywords: the keyword arguments that are tensors.
      depth: the call depth of the calling function.
    """

    qualified: str
    tensor_positions: frozenset[int] | None
    tensor_keywords: frozenset[str]
    depth: int


def check_module(tree: ast.Module, path: str) -> list[Finding]:
    """The findings in one parsed module, in no particular order, before noqa and selection.

    Raises:
      RecursionError: for expressions nested deeper than the checker recurses.
    """
    checker = ModuleChecker(tree, path)
    checker.run()
    return checker.findings()


class ModuleChecker:
    """Finds the traced functions of one module and checks each of them."""

    def __init__(self, tree: ast.Module, filename: str):
        self.index = ModuleIndex(tree)
        self.filename = filename
        self._findings: dict[tuple[int, str], Finding] = {}
        # Analysis key -> the shallowest call depth it was analysed at.
        self._done: dict[_AnalysisKey, int] = {}
        self._returns: dict[_AnalysisKey, bool] = {}
        # Functions run while tracing: their locals are rebuilt on every trace.
        self.traced_nodes: set[ast.AST] = set()
        # Imported functions traced code calls, for `project` to follow.
        self.external_calls: list[ExternalCall] = []
        self._module_level_names: dict[str, ast.Name] = {}

    def findings(self) -> list[Finding]:
        return list(self._findings.values())

    def report(self, node: ast.stmt | ast.expr, violation: Violation | None) -> None:
        if violation is None:
            return
        finding = violation.at(self.filename, node)
        key = (finding.line, finding.code)
        # One finding per line and code: an `if a and b` on a tensor is one problem.
        if key not in self._findings or finding < self._findings[key]:
            self._findings[key] = finding

    def run(self) -> None:
        imported: list[str] = []
        for function in traced_functions(self.index, imported):
            self.analyse(function, function.element_params(), frozenset(), depth=0)
        self.external_calls.extend(ExternalCall(q, None, frozenset(), -1) for q in imported)

    def analyse_external(self, name: str, call: ExternalCall) -> None:
        """Checks the module-level function `name` as another module's traced code calls it."""
        # One node per name: resolve_callables caches by the node's id.
        reference = self._module_level_names.setdefault(name, ast.Name(id=name, ctx=ast.Load()))
        callees = self.index.resolve_callables(reference, self.index.tree)
        if not callees and name in self.index.imports:
            # Imported here in turn, as a package's __init__ re-exports its modules' names.
            imported = self.index.imports[name]
            self.external_calls.append(dataclasses.replace(call, qualified=imported))
        for callee in callees:
            if call.tensor_positions is None:
                params = callee.element_params()
            else:
                positional = callee.positional_params()
                params = {
                    positional[i][0].arg for i in call.tensor_positions if i < len(positional)
                }
                vararg = callee.node.args.vararg
                if vararg is not None and any(i >= len(positional) for i in call.tensor_positions):
                    params.add(vararg.arg)
                params |= call.tensor_keywords
            self.analyse(callee, params, frozenset(), call.depth + 1)

    @staticmethod
    def analysis_key(
        function: ResolvedFunction, tensor_params: Iterable[str], closure: frozenset[str]
    ) -> _AnalysisKey:
        return id(function.node), frozenset(tensor_params), closure

    def returns_tensor(self, key: _AnalysisKey) -> bool | None:
        """Whether an analysed function may return a tensor; None if not (yet) known."""
        return self._returns.get(key)

    def analyse(
        self,
        function: ResolvedFunction,
        tensor_params: set[str],
        closure: frozenset[str],
        depth: int,
    ) -> None:
        """Checks one function body given which of its parameters hold tensors."""
        if depth > MAX_CALL_DEPTH:
            return
        key = self.analysis_key(function, tensor_params, closure)
        if self._done.get(key, MAX_CALL_DEPTH + 1) <= depth:
            return  # done already, with at least as much call depth left
        self._done[key] = depth
        node = function.node
        self.traced_nodes.add(node)
        all_params = {
            p.arg
            for p in [
                *node.args.posonlyargs,
                *node.args.args,
                *node.args.kwonlyargs,
                *(a for a in (node.args.vararg, node.args.kwarg) if a),
            ]
        }
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

    def __init__(self, module: ModuleChecker, function: ast.AST, depth: int):
        self.module = module
        self.index = module.index
        self.function = function
        self.depth = depth
        self.returns_tensor = False
        self.declared = _declarations(function)

    # statements

    def block(self, statements: Sequence[ast.stmt], tainted: set[str]) -> set[str]:
        for statement in statements:
            tainted = self.statement(statement, tainted)
        return tainted

    def statement(self, node: ast.stmt, tainted: set[str]) -> set[str]:
        check = self.expression
        if isinstance(node, (*FUNCTION_NODES, ast.ClassDef)):
            # Not run here; checked when something calls it or passes it on.
            for decorator in node.decorator_list:
                check(decorator, tainted)
            return tainted
        if isinstance(node, ast.Assign):
            check(node.value, tainted)
            is_tensor = self.is_tensor(node.value, tainted)
            tainted = set(tainted)
            for target in node.targets:
                self._check_store(target, "assigning to")
                self._bind(target, is_tensor, tainted)
            return tainted
        if isinstance(node, ast.AnnAssign):
            if node.value is None:
                return tainted
            check(node.value, tainted)
            self._check_store(node.target, "assigning to")
            tainted = set(tainted)
            self._bind(node.target, self.is_tensor(node.value, tainted), tainted)
            return tainted
        if isinstance(node, ast.AugAssign):
            check(node.value, tainted)
            self._check_store(node.target, "updating")
            tainted = set(tainted)
            if self.is_tensor(node.value, tainted):
                self._bind(node.target, True, tainted, strong=False)
            return tainted
        if isinstance(node, ast.If):
            check(node.test, tainted)
            self.module.report(node, rules.statement_violation(node, self._tensor_test(tainted)))
            return self.block(node.body, tainted) | self.block(node.orelse, tainted)
        if isinstance(node, ast.While):
            check(node.test, tainted)
            self.module.report(node, rules.statement_violation(node, self._tensor_test(tainted)))
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
                    self._bind(
                        item.optional_vars, self.is_tensor(item.context_expr, tainted), tainted
                    )
            return self.block(node.body, tainted)
        if isinstance(node, _TRY_NODES):
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
            self.module.report(node, rules.statement_violation(node, self._tensor_test(tainted)))
            return tainted
        if isinstance(node, ast.Delete):
            for target in node.targets:
                self._check_store(target, "deleting from")
        if isinstance(node, ast.Match):
            check(node.subject, tainted)
            subject_is_tensor = self.is_tensor(node.subject, tainted)
            self.module.report(node, rules.match_violation(node, subject_is_tensor))
            after = set(tainted)
            for case in node.cases:
                # `case x if x > 0:` binds the subject (or a part of it) to x.
                in_case = tainted | _captured_names(case.pattern) if subject_is_tensor else tainted
                if case.guard is not None:
                    check(case.guard, in_case)
                    self.module.report(
                        case.guard, rules.guard_violation(case.guard, self._tensor_test(in_case))
                    )
                after |= self.block(case.body, in_case)
            return after
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                check(child, tainted)
        if isinstance(node, ast.Return) and node.value is not None:
            self.returns_tensor |= self.is_tensor(node.value, tainted)
        return tainted

    # Python state mutated at trace time (K109)

    def _check_store(self, target: ast.AST, how: str) -> None:
        """Reports an assignment target that changes state outliving this trace: a
        name declared global/nonlocal, or an item (or, when updated, an attribute)
        of an object from outside the traced function."""
        if isinstance(target, ast.Name):
            declaration = self.declared.get(target.id)
            if declaration and not (
                declaration == "nonlocal" and self._bound_in_traced_function(target.id)
            ):
                self.module.report(
                    target, rules.rebinding_violation(target.id, declaration, how == "updating")
                )
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._check_store(element, how)
        elif isinstance(target, ast.Starred):
            self._check_store(target.value, how)
        elif isinstance(target, ast.Subscript) and self.is_outer_state(target.value):
            self.module.report(target, rules.mutation_violation(target, how))
        elif (
            isinstance(target, ast.Attribute) and how == "updating" and self.is_outer_state(target)
        ):
            # `self.count += 1`; a plain `self.v = ...` is not reported: creating
            # tf.Variables on the first call is tf.function's documented pattern.
            self.module.report(target, rules.mutation_violation(target, how))

    def is_outer_state(self, node: ast.AST) -> bool:
        """Whether an object outlives this trace: rooted in a module-level or enclosing
        name (not one bound by a function being traced), or an attribute of `self`.
        Objects made by TensorFlow (a lookup table's insert is an op) are not."""
        path: list[ast.AST] = []
        root = node
        while isinstance(root, (ast.Attribute, ast.Subscript)):
            path.append(root)
            root = root.value
        if not isinstance(root, ast.Name) or self.index.qualify(root) is not None:
            return False  # a call's result, or a module such as np / tf
        index = self.index
        receiver = index.method_receiver(self.function, root.id)
        if receiver is not None:
            # `self.cache`, `self.stats["n"]`: state of the instance; `self` alone is not.
            first = path[-1] if path else None
            if not isinstance(first, ast.Attribute):
                return False
            values = [value for value, _ in index.class_member(receiver, first.attr)]
            return not any(self._made_by_tensorflow(value) for value in values)
        if root.id in index.local_names(self.function):
            return False
        scope = self._binding_scope(root.id)
        if scope is None or scope in self.module.traced_nodes:
            return False  # unknown (a builtin, a star import), or built while tracing
        bound_values = index.bindings(scope).get(root.id, [])
        return not any(self._made_by_tensorflow(value) for value in bound_values)

    def _made_by_tensorflow(self, value: object) -> bool:
        return isinstance(value, ast.Call) and (self.index.qualify(value.func) or "").startswith(
            ("tensorflow.", "keras.", "tf_keras.")
        )

    def _binding_scope(self, name: str) -> ast.AST | None:
        """The enclosing function or the module that binds `name`, seen from here."""
        index = self.index
        if self.declared.get(name) == "global":
            return index.tree if name in index.local_names(index.tree) else None
        current = index.scope_of(self.function)
        while True:
            if not isinstance(current, ast.ClassDef) and name in index.local_names(current):
                return current
            if current is index.tree:
                return None
            current = index.scope_of(current)

    def _bound_in_traced_function(self, name: str) -> bool:
        scope = self._binding_scope(name)
        return scope is not None and scope in self.module.traced_nodes

    def _loop(self, body: Sequence[ast.stmt], tainted: set[str]) -> set[str]:
        # Twice, so names that become tensors late in the body are tensors at its top.
        first = self.block(body, tainted) | tainted
        return self.block(body, first) | first

    def _bind(
        self, target: ast.AST, is_tensor: bool, tainted: set[str], strong: bool = True
    ) -> None:
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
            self._follow(ResolvedFunction(node), ResolvedFunction(node).element_params(), tainted)
            return
        if isinstance(node, _COMPREHENSION_NODES):
            self._comprehension(node, tainted)
            return
        if isinstance(node, (ast.IfExp, ast.BoolOp)):
            self.module.report(node, rules.expression_violation(node, self._tensor_test(tainted)))
        elif (
            isinstance(node, ast.JoinedStr)
            or (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Mod)
                and isinstance(node.left, ast.Constant)
                and isinstance(node.left.value, str)
            )
        ) and not self._is_diagnostic_text(node):
            self.module.report(
                node, rules.formatted_string_violation(node, self._tensor_test(tainted))
            )
        elif isinstance(node, ast.NamedExpr):
            self.expression(node.value, tainted)
            self._bind(node.target, self.is_tensor(node.value, tainted), tainted)
            return
        elif isinstance(node, ast.Call):
            skipped = self._call(node, tainted)
            for part in [node.func, *node.args, *(k.value for k in node.keywords)]:
                if part not in skipped:
                    self.expression(part, tainted)
            return
        for child in ast.iter_child_nodes(node):
            self.expression(child, tainted)

    def _is_diagnostic_text(self, node: ast.AST) -> bool:
        """Whether a string is a message (an exception's, a log line, print's, an
        assertion's), where the symbolic Tensor's repr is harmless or reported as K103."""
        child, parent = node, self.index.parents.get(node)
        while parent is not None and not isinstance(parent, (*FUNCTION_NODES, ast.Lambda)):
            if isinstance(parent, ast.Raise) or (
                isinstance(parent, ast.Assert) and child is parent.msg
            ):
                return True
            if isinstance(parent, ast.keyword) and parent.arg in ("message", "msg"):
                return True
            if isinstance(parent, ast.Call) and child is not parent.func:
                name = (self.index.qualify(parent.func) or "").split(".")
                called = parent.func.attr if isinstance(parent.func, ast.Attribute) else None
                if (
                    self.index.is_builtin(parent.func, "print")
                    or name[0] in _MESSAGE_MODULES
                    or called in _LOG_METHODS
                    or (isinstance(parent.func, ast.Name) and parent.func.id.endswith(_ERRORS))
                ):
                    return True
            if isinstance(parent, (ast.Assign, ast.AnnAssign)):
                targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
                return any(
                    isinstance(t, ast.Name) and any(w in t.id.lower() for w in _MESSAGE_NAMES)
                    for t in targets
                )
            if isinstance(parent, ast.stmt):
                return False
            child, parent = parent, self.index.parents.get(parent)
        return False

    def _comprehension(self, node: _Comprehension, tainted: set[str]) -> None:
        local = set(tainted)
        for generator in node.generators:
            self.expression(generator.iter, local)
            self._bind(generator.target, self.is_tensor(generator.iter, local), local)
            for condition in generator.ifs:
                self.expression(condition, local)
                self.module.report(
                    condition,
                    rules.comprehension_condition_violation(condition, self._tensor_test(local)),
                )
        elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        for element in elements:
            self.expression(element, local)

    def _call(self, node: ast.Call, tainted: set[str]) -> set[ast.AST]:
        """Reports the call itself and follows same-module callees; returns the
        argument nodes not to check as traced code (a py_function's Python function)."""
        index = self.index
        self.module.report(
            node, rules.call_violation(node, index, self.function, self._tensor_test(tainted))
        )
        qualified = index.qualify(node.func)
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr in rules.MUTATING_METHODS
            and self.is_outer_state(func.value)
        ):
            self.module.report(node, rules.mutation_violation(func.value, f"`.{func.attr}()` on"))
        skipped: set[ast.AST] = set()
        last = (qualified or "").rsplit(".", 1)[-1]
        if qualified and qualified.startswith("tensorflow.") and last in _PYTHON_CALLBACK_KEYWORDS:
            python_function = (
                node.args[0]
                if node.args
                else keyword_argument(node, _PYTHON_CALLBACK_KEYWORDS[last])
            )
            if python_function is not None:
                skipped.add(python_function)  # runs eagerly, per element: not traced code

        scope = self.function
        callees = index.resolve_callables(func, scope)
        for callee in callees:
            self._follow(callee, self._bind_arguments(callee, node, tainted), tainted)
        if not callees and qualified:
            self.module.external_calls.append(self._external_call(qualified, node, tainted))
        # Functions handed to another call (tf.cond, tf.map_fn, map, ...) run at trace
        # time too, on the call's other arguments: tensors if any of those is one.
        arguments = [*node.args, *(k.value for k in node.keywords)]
        for argument in arguments:
            if argument in skipped or isinstance(argument, ast.Lambda):
                continue
            if isinstance(argument, (ast.Name, ast.Attribute)) or (
                isinstance(argument, ast.Call) and index.qualify(argument.func) in PARTIAL
            ):
                callees = index.resolve_callables(argument, scope)
                handed_on = index.qualify(argument)
                if not callees and not handed_on:
                    continue
                gets_tensors = any(
                    self.is_tensor(other, tainted) for other in arguments if other is not argument
                )
                if not callees and handed_on:
                    positions = None if gets_tensors else frozenset[int]()
                    self.module.external_calls.append(
                        ExternalCall(handed_on, positions, frozenset(), self.depth)
                    )
                for callee in callees:
                    self._follow(
                        callee, callee.element_params() if gets_tensors else set(), tainted
                    )
        return skipped

    def _external_call(self, qualified: str, call: ast.Call, tainted: set[str]) -> ExternalCall:
        positions = set()
        for position, argument in enumerate(call.args):
            if isinstance(argument, ast.Starred):
                break  # where the rest lands is unknown without the callee
            if self.is_tensor(argument, tainted):
                positions.add(position)
        keywords = {
            k.arg for k in call.keywords if k.arg is not None and self.is_tensor(k.value, tainted)
        }
        return ExternalCall(qualified, frozenset(positions), frozenset(keywords), self.depth)

    def _follow(self, callee: ResolvedFunction, tensor_params: set[str], tainted: set[str]) -> None:
        self.module.analyse(callee, tensor_params, self._closure(callee, tainted), self.depth + 1)

    def _closure(self, callee: ResolvedFunction, tainted: set[str]) -> frozenset[str]:
        # A nested function sees this function's tensors through its closure.
        return frozenset(tainted) if self._is_inside(callee.node, self.function) else frozenset()

    def _call_returns_tensor(self, call: ast.Call, tainted: set[str]) -> bool | None:
        """For a call of same-module functions already analysed: whether any of them
        returns a tensor given these arguments. None when unknown."""
        callees = self.index.resolve_callables(call.func, self.function)
        if not callees:
            return None
        answers = [
            self.module.returns_tensor(
                self.module.analysis_key(
                    callee,
                    self._bind_arguments(callee, call, tainted),
                    self._closure(callee, tainted),
                )
            )
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

    def _bind_arguments(
        self, callee: ResolvedFunction, call: ast.Call, tainted: set[str]
    ) -> set[str]:
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
        arguments = [*call.args, *(k.value for k in call.keywords)]
        return any(self.is_tensor(a, tainted) for a in arguments)

    # data flow

    def _tensor_test(self, tainted: set[str]) -> rules.IsTensor:
        """`is_tensor` with the names holding tensors at this point, for `rules`."""
        return lambda node: self.is_tensor(node, tainted)

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
                if qualified.startswith("tensorflow.") and not qualified.startswith(
                    _TF_NON_OP_PREFIXES
                ):
                    return True  # a TF op returns a tensor whatever its inputs
            same_module = self._call_returns_tensor(node, tainted)
            if same_module is not None:
                return same_module
            name = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            if name.startswith(_PREDICATE_PREFIXES):
                return False
            if isinstance(func, ast.Attribute) and self.is_tensor(func.value, tainted):
                return True
            return self._has_tensor_argument(node, tainted)
        if isinstance(node, _COMPREHENSION_NODES):
            return any(self.is_tensor(g.iter, tainted) for g in node.generators) or any(
                self.is_tensor(child, tainted)
                for child in (
                    [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
                )
            )
        return any(self.is_tensor(child, tainted) for child in ast.iter_child_nodes(node))


def _declarations(function: ast.AST) -> dict[str, str]:
    """Names the function's own body declares ``global`` or ``nonlocal`` -> which."""
    declared: dict[str, str] = {}
    body = getattr(function, "body", [])
    pending: list[ast.AST] = list(body) if isinstance(body, list) else []
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Global):
            declared.update(dict.fromkeys(node.names, "global"))
        elif isinstance(node, ast.Nonlocal):
            declared.update(dict.fromkeys(node.names, "nonlocal"))
        elif not isinstance(node, (*FUNCTION_NODES, ast.ClassDef, ast.expr)):
            pending.extend(ast.iter_child_nodes(node))  # nested blocks, handlers, cases
    return declared


def _is_generator(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the function's own body (not a nested def or lambda) yields."""
    pending: list[ast.AST] = list(function.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(node, (*FUNCTION_NODES, ast.ClassDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))
    return False


def _captured_names(pattern: ast.pattern) -> set[str]:
    """The names a `case` pattern binds (`case x`, `case [first, *rest]`, `case {**rest}`)."""
    names = set()
    for node in ast.walk(pattern):
        if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
    return names
