"""The configuration reference (docs/configuration.md), generated from the config models.

Keys, types, defaults and which keys are required come from the pydantic
models in `kiln.pipeline.config` (through their JSON schema); only the
meaning of each key is written here. Generating fails if a key of the models
has no meaning below, or a meaning names a key the models do not have, and a
test regenerates the file and compares it with the committed one, so the
reference cannot drift from the code. Regenerate it with::

    python -m kiln.pipeline.config_reference > docs/configuration.md
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from kiln.pipeline.config import DEFAULT_MAX_PIXELS, BuildConfig

# key path -> meaning (Markdown). `source.*` keys hold for both source types
# unless the table says otherwise.
MEANINGS: dict[str, str] = {
    "name": "Dataset name: the folder `<output>/<name>/` and the shard file prefix "
            "`<name>-<split>.tfrecord-...`.",
    "source": "Where the images come from: an `image_folder` or a `manifest`.",
    "source.type": "`image_folder`: `root/<class>/<image>`, or `root/<split>/<class>/<image>` "
                   "with `splits.from_source`; class names are the sorted folder names. "
                   "`manifest`: a CSV (header `path,label[,split]`) or JSONL file "
                   "(`{\"path\", \"label\"[, \"split\"]}`; `.jsonl`/`.json` means JSONL).",
    "source.root": "The image folder: a local path or `gs://bucket/prefix`.",
    "source.path": "The manifest file; relative image paths in it resolve against its folder.",
    "source.classes": "The class list. Files with other labels are dropped (`unknown_label`). "
                      "Default: every folder name (image_folder) or distinct label (manifest), "
                      "sorted; a label is the index into the sorted list.",
    "output": "Output root: the dataset lands in `<output>/<name>/<version>/` with "
              "`<output>/<name>/LATEST` naming the newest version. Local or `gs://`. "
              "`kiln build --output` overrides it. Not part of the dataset's fingerprint.",
    "image": "Decoding: what the images become before the transforms.",
    "image.channels": "1: grayscale (ITU-R 601 luma), 3: RGB. Alpha is composited over white; "
                      "16-bit samples are rounded to 8 bits; EXIF orientation is applied.",
    "image.max_pixels": "Images with more pixels (width x height, read from the header) are "
                        "dropped as `too_many_pixels` before decoding: a decompression-bomb "
                        f"guard. {DEFAULT_MAX_PIXELS} is Pillow's limit.",
    "image.min_size": "Images whose shorter side is below this are dropped as `too_small`.",
    "transforms": "Offline transforms, applied in order to every image once, at build time: "
                  "a list of names or `{name: {param: value}}`. See "
                  "[transforms.md](transforms.md).",
    "encoding": "How the stored images are encoded in the records.",
    "encoding.format": "`jpeg` (small, lossy), `png` (lossless) or `raw` (uint8 pixels with "
                       "their shape: largest, fastest to read).",
    "encoding.quality": "JPEG quality. Ignored (and left out of the fingerprint) for png and raw.",
    "splits": "How images are assigned to splits.",
    "splits.fractions": "Split name to fraction, summing to 1, e.g. "
                        "`{train: 0.8, validation: 0.1, test: 0.1}`; assigned by a salted hash. "
                        "Default (with `from_source: false`): everything in `train`.",
    "splits.from_source": "Take splits from the source: `root/<split>/<class>/<image>` folders "
                          "or the manifest's `split` column. Excludes `fractions`.",
    "splits.split_by": "What the fractions hash: `content` (the file's sha256: identical files "
                       "always share a split, so duplicates cannot leak between train and test) "
                       "or `key` (the path: stable when files are re-encoded).",
    "splits.salt": "Mixed into the hash: change it to draw a different assignment.",
    "sharding": "How each split is cut into TFRecord shards.",
    "sharding.target_shard_mb": "Shards per split = ceil(split bytes / this many MB).",
    "sharding.num_shards": "A fixed shard count instead: one positive int for every split, or "
                           "`{split: count}` (splits not named use `target_shard_mb`).",
    "sharding.compression": "`gzip` compresses the shards (`.gz` suffix). TFDS cannot read "
                            "gzip shards, so such builds get no TFDS metadata.",
    "augment": "The reader's default augmentation for the train split (random TF ops, every "
               "epoch), stored in `kiln.json`; validated at build time. See "
               "[augmentations.md](augmentations.md).",
    "errors": "What to do about bad input files.",
    "errors.max_fraction": "If more than this fraction of the input files is dropped, the build "
                           "fails (exit 1) and publishes nothing. Every dropped file is a row "
                           "in `errors.jsonl`.",
    "plugins": "Python modules to import before validating: they register your own offline "
               "transforms (and augmentation ops). Only modules named here are imported.",
}

# Keys whose schema says nothing useful about their type (validated by hand).
TYPE_OVERRIDES = {
    "sharding.num_shards": "int > 0, or mapping split name → int > 0, or null",
}

INTRODUCTION = """\
# Configuration reference

<!-- Generated by `python -m kiln.pipeline.config_reference > docs/configuration.md`
     from the config models in src/kiln/pipeline/config.py; do not edit by hand.
     tests/test_config_reference.py fails when this file and the models disagree. -->

A build config is a YAML file (read with a safe loader: data only) passed to
`kiln build --config FILE`. Every key but `name`, `source` and `output` has a
default. kiln checks the whole file before doing any work and reports the first
problem on one line naming the key, with exit code 2:

```
kiln build: error: config error in configs/x.yaml: splits.fractions: must sum to 1, got 0.9
```

Relative paths resolve against the current directory, except image paths inside a
manifest, which resolve against the manifest's folder. The resolved config (every
default filled in, paths absolute, transforms in canonical form) is saved in the
dataset's `kiln.json`, and its fingerprint is part of the dataset version: changing
any key but `output` makes a new version.

A complete example is [configs/demo.yaml](../configs/demo.yaml). The keys:
"""


def markdown() -> str:
    """The whole reference page.

    Raises:
      KeyError: naming a key of the models with no entry in `MEANINGS`, or an
        entry of `MEANINGS` that names no key of the models.
    """
    schema = BuildConfig.model_json_schema()
    rows = list(_rows(schema, schema, prefix=""))
    documented = {path for path, *_ in rows}
    documented |= {path.rsplit(".", 1)[0] for path in documented if "." in path}  # sections
    stale = sorted(set(MEANINGS) - documented)
    if stale:
        raise KeyError(f"MEANINGS describes key(s) the config models do not have: {stale}")
    sections: dict[str, list[tuple[str, str, str, str]]] = {}
    for path, type_text, default_text, meaning in rows:
        section = path.split(".", 1)[0] if "." in path else ""
        sections.setdefault(section, []).append((path, type_text, default_text, meaning))
    parts = [INTRODUCTION]
    for section, section_rows in sections.items():
        parts.append(f"\n## {'Top level' if not section else f'`{section}`'}\n")
        if section:
            parts.append(f"{MEANINGS[section]}\n")
        parts.append("| key | type | default | meaning |")
        parts.append("|---|---|---|---|")
        for path, type_text, default_text, meaning in section_rows:
            parts.append(f"| `{path}` | {_cell(type_text)} | {_cell(default_text)} | "
                         f"{_cell(meaning)} |")
    return "\n".join(parts) + "\n"


def _rows(root: dict, schema: dict, prefix: str) -> Iterator[tuple[str, str, str, str]]:
    """``(key path, type, default, meaning)`` per leaf key, in the models' order."""
    required = set(schema.get("required", []))
    for name, prop in schema["properties"].items():
        path = f"{prefix}{name}"
        target = _resolve(root, prop)
        variants = [_resolve(root, v) for v in prop.get("oneOf", [])]
        if variants:  # a discriminated union: the source types
            yield from _variant_rows(root, path, variants)
            continue
        if target.get("type") == "object" and "properties" in target:
            _meaning(path)  # the section's own description must exist
            yield from _rows(root, target, prefix=f"{path}.")
            continue
        default = "required" if name in required else f"`{_json(prop.get('default'))}`"
        yield path, _type_text(path, target), default, _meaning(path)


def _variant_rows(root: dict, path: str, variants: list[dict]) -> Iterator[tuple]:
    _meaning(path)
    seen: dict[str, list[str]] = {}
    for variant in variants:
        kind = variant["properties"]["type"]["const"]
        for name in variant["properties"]:
            seen.setdefault(name, []).append(kind)
    for name, kinds in seen.items():
        key = f"{path}.{name}"
        if name == "type":
            type_text = " \\| ".join(f"`{kind}`" for kind in kinds)
            yield key, type_text, "required", _meaning(key)
            continue
        variant = next(v for v in variants if v["properties"]["type"]["const"] == kinds[0])
        prop = variant["properties"][name]
        required = name in variant.get("required", [])
        only = "" if len(kinds) == len(variants) else f" ({', '.join(kinds)} only)"
        default = "required" if required else f"`{_json(prop.get('default'))}`"
        yield key, _type_text(key, _resolve(root, prop)) + only, default, _meaning(key)


def _resolve(root: dict, prop: dict) -> dict:
    ref = prop.get("$ref")
    if ref is None:
        return prop
    name = ref.rsplit("/", 1)[-1]
    return root["$defs"][name]


def _meaning(path: str) -> str:
    if path not in MEANINGS:
        raise KeyError(f"config key {path!r} has no meaning in "
                       f"kiln.pipeline.config_reference.MEANINGS: add one")
    return MEANINGS[path]


def _type_text(path: str, prop: dict) -> str:
    if path in TYPE_OVERRIDES:
        return TYPE_OVERRIDES[path]
    if "anyOf" in prop:
        options = [option for option in prop["anyOf"] if option.get("type") != "null"]
        nullable = len(options) < len(prop["anyOf"])
        text = " or ".join(_type_text(path, option) for option in options)
        return f"{text}, or null" if nullable else text
    if "enum" in prop:
        return " \\| ".join(f"`{_json(value)}`" for value in prop["enum"])
    if "const" in prop:
        return f"`{_json(prop['const'])}`"
    kind = prop.get("type")
    if kind == "array":
        items = prop.get("items") or {}
        return f"list of {_type_text(path, items)}s" if items.get("type") else "list"
    if kind == "object":
        values = list((prop.get("patternProperties") or {}).values())
        if values:
            return f"mapping split name → {_type_text(path, values[0])}"
        return "mapping"
    if kind == "string" and prop.get("minLength"):
        return "non-empty string"
    names = {"string": "string", "integer": "int", "number": "number", "boolean": "bool"}
    if kind not in names:
        raise KeyError(f"config key {path!r}: cannot describe its type {prop}; "
                       f"add it to TYPE_OVERRIDES")
    return names[kind] + _bounds(prop)


def _bounds(prop: dict) -> str:
    low, high = prop.get("minimum"), prop.get("maximum")
    if "exclusiveMinimum" in prop:
        return f" > {_json(prop['exclusiveMinimum'])}"
    if low is not None and high is not None:
        return f" {_json(low)}..{_json(high)}"
    if low is not None:
        return f" ≥ {_json(low)}"
    if prop.get("pattern"):
        return f" matching `{prop['pattern']}`"
    return ""


def _json(value: Any) -> str:
    """A value as written in YAML: strings bare, the rest as JSON (also valid YAML)."""
    if isinstance(value, str) and value:
        return value
    return json.dumps(value, ensure_ascii=False)


def _cell(text: str) -> str:
    # A raw '|' would end the table cell; escaped ones are already fine.
    return text.replace("\n", " ").replace(" | ", " \\| ")


if __name__ == "__main__":
    print(markdown(), end="")
