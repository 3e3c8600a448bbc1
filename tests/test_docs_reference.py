"""docs/transforms.md and docs/augmentations.md match the registries; doc links resolve.

Every built-in offline transform and augmentation op has a section, each
section's parameter table lists exactly the function's parameters, and the
documented defaults are the real ones. No section documents a name that is
not registered.
"""

from __future__ import annotations

import inspect
import math
import os
import re

import pytest
import yaml

from kiln import transforms
from kiln.reader import augment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIRED = object()


def sections(path: str, level: str) -> dict[str, dict[str, object]]:
    """Section name -> {parameter: documented default} from the Markdown tables."""
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        text = f.read()
    out: dict[str, dict[str, object]] = {}
    current = None
    for line in text.splitlines():
        heading = re.fullmatch(rf"{level} `(\w+)`", line)
        if heading:
            current = out.setdefault(heading.group(1), {})
        elif line.startswith("#"):
            current = None
        elif current is not None and line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip("|").split(" | ")]
            name, default = cells[0].strip("`"), cells[2]
            current[name] = REQUIRED if default == "required" else yaml.safe_load(
                default.strip("`"))
    return out


def same_default(documented, actual) -> bool:
    if isinstance(actual, (tuple, list)):
        return (isinstance(documented, list) and len(documented) == len(actual)
                and all(same_default(d, a) for d, a in zip(documented, actual)))
    if isinstance(actual, float) and not isinstance(documented, bool):
        # Rounded in prose: 4/3 is written 1.333.
        return isinstance(documented, (int, float)) and math.isclose(documented, actual,
                                                                     rel_tol=1e-3)
    return documented == actual and type(documented) is type(actual)


def builtin_transforms() -> dict[str, dict[str, object]]:
    out = {}
    for name in transforms.names():
        fn = transforms.get(name)
        if fn.__module__ != "kiln.transforms.functional":
            continue  # registered by a test or a plugin
        params = list(inspect.signature(fn).parameters.values())[1:]
        out[name] = {p.name: REQUIRED if p.default is inspect.Parameter.empty else p.default
                     for p in params}
    return out


def builtin_augmentations() -> dict[str, dict[str, object]]:
    out = {}
    for name in augment.names():
        definition = augment.get(name)
        if definition.builtin:
            out[name] = {param: REQUIRED if default is augment.REQUIRED else default
                         for param, (_, default) in definition.params.items()}
    return out


@pytest.mark.parametrize("doc, level, registry", [
    ("docs/transforms.md", "##", builtin_transforms),
    ("docs/augmentations.md", "###", builtin_augmentations),
])
def test_every_builtin_is_documented_with_its_parameters(doc, level, registry):
    documented = sections(doc, level)
    actual = registry()
    assert sorted(documented) == sorted(actual), f"{doc}: sections differ from the registry"
    for name, params in actual.items():
        assert sorted(documented[name]) == sorted(params), f"{doc}: {name} parameters"
        for param, default in params.items():
            written = documented[name][param]
            if default is REQUIRED or written is REQUIRED:
                assert written is default, f"{doc}: {name}.{param} required?"
            else:
                assert same_default(written, default), \
                    f"{doc}: {name}.{param} default {written!r}, actually {default!r}"


def test_relative_links_in_docs_resolve():
    documents = ["README.md"] + [os.path.join("docs", name)
                                 for name in sorted(os.listdir(os.path.join(REPO, "docs")))
                                 if name.endswith(".md")]
    for document in documents:
        with open(os.path.join(REPO, document), encoding="utf-8") as f:
            text = f.read()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            path = os.path.normpath(os.path.join(REPO, os.path.dirname(document), target))
            assert os.path.exists(path), f"{document}: broken link to {target}"
