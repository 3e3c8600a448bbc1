"""docs/configuration.md is generated from the config models and cannot drift from them."""

from __future__ import annotations

import os

import pytest

from kiln.pipeline import config_reference

REFERENCE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "configuration.md"
)


def test_committed_reference_is_up_to_date():
    with open(REFERENCE, encoding="utf-8") as f:
        committed = f.read()
    assert committed == config_reference.markdown(), (
        "docs/configuration.md is out of date; regenerate it with "
        "`python -m kiln.pipeline.config_reference > docs/configuration.md`"
    )


def test_reference_covers_every_key_with_its_default():
    text = config_reference.markdown()
    for key, default in [
        ("image.max_pixels", "89478485"),
        ("encoding.quality", "95"),
        ("sharding.target_shard_mb", "128.0"),
        ("errors.max_fraction", "0.05"),
    ]:
        assert f"| `{key}` |" in text and f"| `{default}` |" in text, key
    assert "| `source.path` | non-empty string (manifest only) | required |" in text


def test_a_key_without_a_docstring_fails(monkeypatch):
    schema = config_reference.BuildConfig.model_json_schema()
    del schema["$defs"]["SplitsConfig"]["properties"]["salt"]["description"]
    monkeypatch.setattr(
        config_reference.BuildConfig, "model_json_schema", classmethod(lambda cls: schema)
    )
    with pytest.raises(KeyError, match=r"'splits\.salt' has no meaning: write a docstring"):
        config_reference.markdown()


def test_every_meaning_is_the_docstring_under_its_field():
    text = config_reference.markdown()
    assert (
        '| `splits.salt` | string | `""` | Mixed into the hash: change it to draw a '
        "different assignment. |" in text
    )
    assert "| `source.allowed_roots` | list of non-empty strings | `[]` | More folders" in text
