"""Name resolution in one module: imports, scopes, and which functions and classes a name refers to.

A function reference resolves from a lambda, a name (defined before or after
use, nested or at module level, or assigned from another name),
`functools.partial`, `tf.function(fn)`, a factory function that returns a
nested function, a method (`self.augment`, `instance.augment`,
`Class.augment`, base classes in the same module, callables stored as
`self.fn = ...`) or a callable instance (its `__call__`). Only the module's own
source is read: a name imported from another module resolves to its dotted
import path (`ModuleIndex.qualify`), never to the code behind it.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import TypeAlias

MAX_RESOLVE_DEPTH = 8
"""How many indirections (aliases, partials, factories) a function reference may take."""

# Conventional names, so snippets without their imports are still checked.
_CONVENTIONAL_MODULES = {
    "tf": "tensorflow",
    "tensorflow": "tensorflow",
    "np": "numpy",
    "numpy": "numpy",
    "random": "random",
    "cv2": "cv2",
    "tfds": "tensorflow_datasets",
}

_TF_COMPAT_PREFIXES = ("tensorflow.compat.v1.", "tensorflow.compat.v2.")

TF_FUNCTION = "tensorflow.function"
# Wrappers that return the function they are given, still traced by whoever traces them.
_TF_FUNCTION_WRAPPERS = frozenset(
    {
        TF_FUNCTION,
        "tensorflow.autograph.experimental.do_not_convert",
    }
)

PARTIAL = frozenset({"functools.partial"})

_PYTHON_RNG_CONSTRUCTORS = frozenset(
    {
        "numpy.random.default_rng",
        "numpy.random.RandomState",
        "numpy.random.Generator",
        "random.Random",
        "random.SystemRandom",
    }
)

# Image augmentation libraries whose objects run NumPy/PIL code when called.
_HOST_IMAGE_PIPELINES = ("albumentations.", "imgaug.", "torchvision.transforms.")

FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef)
_SCOPE_NODES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _normalize(qualified: str) -> str:
    for prefix in _TF_COMPAT_PREFIXES:
        if qualified.startswith(prefix):
            return "tensorflow." + qualified[len(prefix) :]
    return qualified


@dataclasses.dataclass(frozen=True)
class _Parameter:
    """A parameter binding: the name is local to the function, its value unknown."""

    name: str


Binding: TypeAlias = ast.AST | _Parameter
"""What a name may be bound to: a def, a class, an assigned value or a parameter."""

DefiningScope: TypeAlias = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
"""Where a class member is seen from: its class for a def, the method that assigns it otherwise."""


@dataclasses.dataclass(frozen=True)
class ResolvedFunction:
    """A function the checker can analyse, with what is already bound.

    Attributes:
      node: the def or lambda.
      skip: leading positional parameters already bound (self, partial's args).
      bound_keywords: parameter names bound by `functools.partial`.
    """

    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
    skip: int = 0
    bound_keywords: frozenset[str] = frozenset()

    def partial(self, positional: int, keywords: Iterable[str]) -> ResolvedFunction:
        return dataclasses.replace(
            self,
            skip=self.skip + positional,
            bound_keywords=self.bound_keywords | frozenset(keywords),
        )

    def positional_params(self) -> list[tuple[ast.arg, bool]]:
        """(parameter, has_default) for the positional parameters not yet bound."""
        args = self.node.args
        positional = [*args.posonlyargs, *args.args]
        first_default = len(positional) - len(args.defaults)
        return [(p, i >= first_default) for i, p in enumerate(positional)][self.skip :]

    def element_params(self) -> set[str]:
        """Parameters that receive tensors when called with dataset elements."""
        names = {
            p.arg
            for p, has_default in self.positional_params()
            if not has_default and p.arg not in self.bound_keywords
        }
        if self.node.args.vararg is not None:
            names.add(self.node.args.vararg.arg)
        return names


class ModuleIndex:
    """Imports, scopes and bindings of one module, for resolving names."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.imports = self._collect_imports(tree)
        self._bindings_cache: dict[ast.AST, dict[str, list[Binding]]] = {}
        self._callables_cache: dict[tuple[int, int], list[ResolvedFunction]] = {}
        self._instances_cache: dict[tuple[int, int], list[ast.ClassDef]] = {}
        self._locals_cache: dict[ast.AST, frozenset[str]] = {}
        self.module_bindings = self.bindings(tree)

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
        return (
            isinstance(node, ast.Name)
            and node.id == name
            and name not in self.imports
            and name not in self.module_bindings
        )

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The innermost function, lambda, class or module containing `node`."""
        current = self.parents.get(node)
        while current is not None and not isinstance(current, _SCOPE_NODES):
            current = self.parents.get(current)
        return current if current is not None else self.tree

    def bindings(self, scope: ast.AST) -> dict[str, list[Binding]]:
        """Names bound directly in `scope` -> defs, classes, assigned values or `_Parameter`s."""
        cached = self._bindings_cache.get(scope)
        if cached is not None:
            return cached
        bound: dict[str, list[Binding]] = {}
        if isinstance(scope, (*FUNCTION_NODES, ast.Lambda)):
            args = scope.args
            for arg in [
                *args.posonlyargs,
                *args.args,
                *args.kwonlyargs,
                *(a for a in (args.vararg, args.kwarg) if a is not None),
            ]:
                bound.setdefault(arg.arg, []).append(_Parameter(arg.arg))
        if isinstance(scope, (ast.Module, ast.ClassDef, *FUNCTION_NODES)):
            for node in _statements_in_scope(scope.body):
                if isinstance(node, (*FUNCTION_NODES, ast.ClassDef)):
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

    def local_names(self, function: ast.AST) -> frozenset[str]:
        """Names Python makes local to a function or lambda (or global to the module):
        its parameters and every
        name its own body binds (assignment, loop or `with` target, import, def,
        `except ... as`, `del`), less those it declares `global` or `nonlocal`."""
        cached = self._locals_cache.get(function)
        if cached is not None:
            return cached
        names: set[str] = set()
        declared: set[str] = set()
        if isinstance(function, (*FUNCTION_NODES, ast.Lambda, ast.Module)):
            names.update(self.bindings(function))  # parameters, defs, simple assignments
            pending: list[ast.AST] = (
                [function.body] if isinstance(function, ast.Lambda) else list(function.body)
            )
            while pending:
                node = pending.pop()
                if isinstance(node, (ast.Global, ast.Nonlocal)):
                    declared.update(node.names)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                    names.add(node.id)
                elif isinstance(node, (*FUNCTION_NODES, ast.ClassDef)):
                    names.add(node.name)
                    pending.extend(getattr(node, "decorator_list", []))
                    continue  # its body is its own scope
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ExceptHandler) and node.name:
                    names.add(node.name)
                elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
                    names.add(node.name)
                elif isinstance(node, ast.MatchMapping) and node.rest:
                    names.add(node.rest)
                if isinstance(node, ast.Lambda):
                    continue  # its own scope
                pending.extend(ast.iter_child_nodes(node))
        result = frozenset(names - declared)
        self._locals_cache[function] = result
        return result

    def lookup(self, name: str, scope: ast.AST) -> list[Binding]:
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
        return self.enclosing_class(
            function
        ) is not None and "staticmethod" not in self.decorator_names(function)

    def method_receiver(self, scope: ast.AST, name: str) -> ast.ClassDef | None:
        """The class whose instance (or class) `name` is, when `name` is the first
        parameter of an enclosing method (``self``/``cls``), seen from `scope`."""
        current: ast.AST | None = scope
        while current is not None and current is not self.tree:
            if isinstance(current, FUNCTION_NODES):
                params = [*current.args.posonlyargs, *current.args.args]
                if params and params[0].arg == name and self.is_method(current):
                    return self.enclosing_class(current)
                if name in self.bindings(current):
                    return None  # shadowed by a local of an inner function
            current = self.scope_of(current)
        return None

    def class_member(
        self, cls: ast.ClassDef, name: str, depth: int = 0
    ) -> list[tuple[ast.AST, DefiningScope]]:
        """Defs named `name` in `cls` or its same-module bases; else values assigned
        to ``self.<name>`` in its methods. Pairs of (def or value, the scope it is
        seen from: the defining class for a def, the assigning method for a value)."""
        if depth > MAX_RESOLVE_DEPTH:
            return []
        for node in cls.body:
            if isinstance(node, FUNCTION_NODES) and node.name == name:
                return [(node, cls)]
        for base in cls.bases:
            for base_class in self.resolve_class(base, self.scope_of(cls)):
                found = self.class_member(base_class, name, depth + 1)
                if found:
                    return found
        assigned: list[tuple[ast.AST, DefiningScope]] = []
        for method in cls.body:
            if not isinstance(method, FUNCTION_NODES):
                continue
            params = [*method.args.posonlyargs, *method.args.args]
            if not params:
                continue
            receiver = params[0].arg
            for node in _statements_in_scope(method.body):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if (
                            isinstance(target, ast.Attribute)
                            and target.attr == name
                            and isinstance(target.value, ast.Name)
                            and target.value.id == receiver
                        ):
                            assigned.append((node.value, method))
        return assigned

    def resolve_class(self, node: ast.AST, scope: ast.AST) -> list[ast.ClassDef]:
        if isinstance(node, ast.Name):
            return [b for b in self.lookup(node.id, scope) if isinstance(b, ast.ClassDef)]
        return []

    def instance_classes(self, node: ast.AST, scope: ast.AST, depth: int = 0) -> list[ast.ClassDef]:
        """Same-module classes that `node` may be an instance of (``Cls(...)``,
        a name or ``self.attr`` assigned one)."""
        if depth > MAX_RESOLVE_DEPTH:
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
                    classes.extend(
                        self.instance_classes(binding, self.scope_of(binding), depth + 1)
                    )
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

    def is_python_rng(self, node: ast.AST, scope: ast.AST) -> bool:
        """Whether `node`, seen from `scope`, is a NumPy Generator or RandomState, or a
        random.Random."""
        return self._made_by(node, scope, lambda name: name in _PYTHON_RNG_CONSTRUCTORS)

    def is_host_image_pipeline(self, node: ast.AST, scope: ast.AST) -> bool:
        """Whether `node`, seen from `scope`, is an object of a NumPy/PIL image
        augmentation library (``albumentations.Compose([...])``, an imgaug
        augmenter, a torchvision transform): calling it runs NumPy code."""
        return self._made_by(node, scope, lambda name: name.startswith(_HOST_IMAGE_PIPELINES))

    def _made_by(
        self, node: ast.AST, scope: ast.AST, constructor: Callable[[str], bool], depth: int = 0
    ) -> bool:
        """Whether `node`, seen from `scope`, is the value of a call of a name
        `constructor` accepts: directly, through a name bound to it, or
        through an attribute of ``self`` set to it."""
        if depth > MAX_RESOLVE_DEPTH:
            return False
        if isinstance(node, ast.Call):
            qualified = self.qualify(node.func)
            return qualified is not None and constructor(qualified)
        if isinstance(node, ast.Name):
            return any(
                isinstance(b, ast.expr) and self._made_by(b, scope, constructor, depth + 1)
                for b in self.lookup(node.id, scope)
            )
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner = self.method_receiver(scope, node.value.id)
            if owner is not None:
                return any(
                    isinstance(value, ast.expr)
                    and self._made_by(value, scope, constructor, depth + 1)
                    for value, _ in self.class_member(owner, node.attr)
                )
        return False

    def resolve_callables(
        self, node: ast.AST, scope: ast.AST, depth: int = 0
    ) -> list[ResolvedFunction]:
        """The same-module functions an expression may evaluate to (possibly none)."""
        if depth > MAX_RESOLVE_DEPTH:
            return []
        key = (id(node), id(scope))
        if key in self._callables_cache:
            return self._callables_cache[key]  # also breaks cycles: [] while in progress
        self._callables_cache[key] = []
        found = self._resolve_callables(node, scope, depth)
        self._callables_cache[key] = found
        return found

    def _resolve_callables(
        self, node: ast.AST, scope: ast.AST, depth: int
    ) -> list[ResolvedFunction]:
        if isinstance(node, ast.Lambda):
            return [ResolvedFunction(node)]
        if isinstance(node, ast.Name):
            found = []
            for binding in self.lookup(node.id, scope):
                if isinstance(binding, FUNCTION_NODES):
                    found.append(ResolvedFunction(binding))
                elif isinstance(binding, ast.expr):
                    found.extend(self.resolve_callables(binding, self.scope_of(binding), depth + 1))
            return found
        if isinstance(node, ast.Attribute):
            return self._resolve_attribute(node, scope, depth)
        if isinstance(node, ast.Call):
            return self._resolve_call_result(node, scope, depth)
        return []

    def _resolve_attribute(
        self, node: ast.Attribute, scope: ast.AST, depth: int
    ) -> list[ResolvedFunction]:
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

    def _members_as_callables(
        self, cls: ast.ClassDef, name: str, *, bound: bool, depth: int
    ) -> list[ResolvedFunction]:
        found = []
        for member, where in self.class_member(cls, name):
            if isinstance(member, FUNCTION_NODES):
                decorators = self.decorator_names(member)
                if "staticmethod" in decorators:
                    skip = 0
                elif "classmethod" in decorators:
                    skip = 1
                else:
                    skip = 1 if bound else 0
                found.append(ResolvedFunction(member, skip=skip))
            elif isinstance(member, ast.expr):
                found.extend(self.resolve_callables(member, where, depth + 1))
        return found

    def _resolve_call_result(
        self, node: ast.Call, scope: ast.AST, depth: int
    ) -> list[ResolvedFunction]:
        qualified = self.qualify(node.func)
        if qualified in PARTIAL or (
            isinstance(node.func, ast.Name)
            and node.func.id == "partial"
            and qualified is None
            and not self.lookup("partial", scope)
        ):
            if not node.args:
                return []
            keywords = [k.arg for k in node.keywords if k.arg]
            return [
                c.partial(len(node.args) - 1, keywords)
                for c in self.resolve_callables(node.args[0], scope, depth + 1)
            ]
        if qualified in _TF_FUNCTION_WRAPPERS:
            wrapped = node.args[0] if node.args else keyword_argument(node, "func")
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


def keyword_argument(call: ast.Call, name: str) -> ast.expr | None:
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
        if isinstance(statement, (*FUNCTION_NODES, ast.ClassDef)):
            continue
        nested: list[ast.stmt] = []
        for field in ("body", "orelse", "finalbody"):
            nested.extend(getattr(statement, field, []) or [])
        for handler in getattr(statement, "handlers", []) or []:
            nested.extend(handler.body)
        for case in getattr(statement, "cases", []) or []:
            nested.extend(case.body)
        pending.extend(reversed(nested))
