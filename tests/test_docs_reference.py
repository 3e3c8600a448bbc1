"""docs/transforms.md and docs/augmentations.md match the registries; doc links resolve.

Every built-in offline transform and augmentation op has a section, each
section's parameter table lists exactly the function's parameters, and the
documented defaults are the real ones. No section documents a name that is
not registered.
"""

from __future__ import annotations

import math
import os
import re

import pytest
import yaml

from kiln.reader.ops import AUGMENTATIONS
from kiln.transforms.chain import TRANSFORMS

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
            current[name] = (
                REQUIRED if default == "required" else yaml.safe_load(default.strip("`"))
            )
    return out


def same_default(documented, actual) -> bool:
    if isinstance(actual, (tuple, list)):
        return (
            isinstance(documented, list)
            and len(documented) == len(actual)
            and all(same_default(d, a) for d, a in zip(documented, actual, strict=True))
        )
    if isinstance(actual, float) and not isinstance(documented, bool):
        # Rounded in prose: 4/3 is written 1.333.
        return isinstance(documented, (int, float)) and math.isclose(
            documented, actual, rel_tol=1e-3
        )
    return documented == actual and type(documented) is type(actual)


def documented_parameters(entry) -> dict[str, object]:
    """Parameter -> default (or REQUIRED) of a registered function, from its parameter model."""
    return {
        name: REQUIRED if field.is_required() else field.default
        for name, field in entry.parameters.model_fields.items()
    }


def builtin_transforms() -> dict[str, dict[str, object]]:
    return {
        name: documented_parameters(TRANSFORMS.get(name))
        for name in TRANSFORMS.names()
        # The others are registered by a test or a plugin.
        if TRANSFORMS.get(name).fn.__module__ == "kiln.transforms.functional"
    }


def builtin_augmentations() -> dict[str, dict[str, object]]:
    return {
        name: documented_parameters(AUGMENTATIONS.get(name))
        for name in AUGMENTATIONS.names()
        if AUGMENTATIONS.get(name).builtin
    }


@pytest.mark.parametrize(
    "doc, level, registry",
    [
        ("docs/transforms.md", "##", builtin_transforms),
        ("docs/augmentations.md", "###", builtin_augmentations),
    ],
)
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
                assert same_default(written, default), (
                    f"{doc}: {name}.{param} default {written!r}, actually {default!r}"
                )


def test_relative_links_in_docs_resolve():
    documents = ["README.md"] + [
        os.path.join("docs", name)
        for name in sorted(os.listdir(os.path.join(REPO, "docs")))
        if name.endswith(".md")
    ]
    for document in documents:
        with open(os.path.join(REPO, document), encoding="utf-8") as f:
            text = f.read()
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            path = os.path.normpath(os.path.join(REPO, os.path.dirname(document), target))
            assert os.path.exists(path), f"{document}: broken link to {target}"
