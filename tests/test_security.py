"""Security basics, checked in the source: nothing read from disk is unpickled or
evaluated, YAML is only read with the safe loader, and modules are imported by a
computed name only where the user names them (a config's ``plugins:``, ``kiln
preview --plugin``) or from kiln's own command table.

(Beam pickles kiln's DoFns to ship them to its workers: that is Beam's own
transport of code kiln constructed, not data read from a file.)"""

import ast
import os

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src", "kiln")

FORBIDDEN_CALLS = {
    ("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler"),
    ("cloudpickle", "load"), ("cloudpickle", "loads"), ("dill", "load"), ("dill", "loads"),
    ("marshal", "load"), ("marshal", "loads"), ("shelve", "open"),
    ("yaml", "load"), ("yaml", "unsafe_load"), ("yaml", "full_load"), ("yaml", "load_all"),
    ("yaml", "unsafe_load_all"), ("yaml", "full_load_all"),
}
FORBIDDEN_BUILTINS = {"eval", "exec", "compile", "__import__"}
# Where a module name that is not a literal may be imported, and why.
DYNAMIC_IMPORTS = {
    ("transforms/chain.py", "import_plugins"),  # the config's plugins:
    ("tools/preview_command.py", "run"),           # kiln preview --plugin MODULE
    ("cli.py", "main"),                            # cli.COMMANDS, kiln's own modules
}


def python_files():
    for directory, _, files in os.walk(SRC):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                yield os.path.relpath(path, SRC).replace(os.sep, "/"), path


def calls(tree):
    """(enclosing function name, call node) for every call in a module."""
    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                else function
            if isinstance(child, ast.Call):
                yield function, child
            yield from visit(child, inner)
    yield from visit(tree, "<module>")


def dotted(node):
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, ast.Name):
        return node.id
    return None


def test_no_unpickling_eval_or_unsafe_yaml():
    found = []
    for relative, path in python_files():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for _, call in calls(tree):
            name = dotted(call.func) or ""
            parts = tuple(name.rsplit(".", 1)) if "." in name else ("", name)
            if parts in FORBIDDEN_CALLS or (not parts[0] and parts[1] in FORBIDDEN_BUILTINS):
                found.append(f"{relative}:{call.lineno}: {name}(...)")
            if name == "numpy.load" or name == "np.load":
                if any(k.arg == "allow_pickle" for k in call.keywords):
                    found.append(f"{relative}:{call.lineno}: {name}(allow_pickle=...)")
    assert found == []


def test_modules_are_imported_by_computed_name_only_where_the_user_names_them():
    dynamic = set()
    for relative, path in python_files():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for function, call in calls(tree):
            if dotted(call.func) in ("importlib.import_module", "import_module") and not (
                    call.args and isinstance(call.args[0], ast.Constant)):
                dynamic.add((relative, function))
    assert dynamic == DYNAMIC_IMPORTS
