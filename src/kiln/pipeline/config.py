"""The build config: YAML in, a validated and resolved config out.

A config file is data (read with `yaml.safe_load`); the pydantic models below
are its schema. Everything is checked before any work starts, and the first
problem is reported on one line naming the field, e.g.::

    config error in configs/x.yaml: splits.fractions: must sum to 1, got 0.9

The shape (every key but ``name``, ``source`` and ``output`` has a default)::

    name: shapes                    # letters, digits, '_', '.', '-'
    source:
      type: image_folder            # root/<class>/<image> or root/<split>/<class>/<image>
      root: build/demo-data         # local path or gs://bucket/prefix
      classes: [circle, square]     # optional: the class list; other labels are dropped
    # or
    source:
      type: manifest                # CSV (header path,label[,split]) or JSONL rows
      path: data/manifest.csv       # relative image paths resolve against its folder
    output: build/datasets          # the dataset lands in <output>/<name>/<version>/
    image:
      channels: 3                   # 1 (grayscale) or 3 (RGB)
      max_pixels: 89478485          # larger images are dropped (decompression bombs)
      min_size: 1                   # images with a shorter side below this are dropped
    transforms:                     # offline transforms, see kiln.transforms
      - resize: {shorter_side: 72}
    encoding:
      format: jpeg                  # jpeg | png | raw
      quality: 95                   # jpeg only
    splits:
      fractions: {train: 0.8, validation: 0.1, test: 0.1}
      split_by: content             # content (duplicates share a split) | key
      salt: ""                      # change to draw a different assignment
    # or
    splits:
      from_source: true             # root/<split>/... folders or the manifest's split column
    sharding:
      target_shard_mb: 128          # shard count per split = ceil(split bytes / this)
      num_shards: null              # or a fixed count: 8, or per split: {train: 8, test: 1}
      compression: none             # none | gzip
    augment: []                     # the reader's default augmentation for the train split
    errors:
      max_fraction: 0.05            # more dropped files than this fails the build
    plugins: []                     # modules that register your own transforms

Relative paths in the config resolve against the current directory (the
Makefile runs from the repository's top), except image paths inside a
manifest, which resolve against the manifest's folder.

The resolved config (`ResolvedConfig.data`) is that shape with every default
filled in, transforms in their canonical form and paths made absolute. It is
saved in `kiln.json`; its fingerprint is part of the dataset version. The
output root is deliberately left out of both: where a dataset is written is
not a property of the dataset, so moving it or building it elsewhere must not
change its metadata.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from typing import Annotated, Any, Literal, Mapping, Union

import pydantic
import yaml
from apache_beam.io.filesystems import FileSystems
from pydantic import BaseModel, ConfigDict, Field

from kiln import transforms
from kiln.cli import UsageError
from kiln.pipeline.versioning import fingerprint

logger = logging.getLogger(__name__)

# Pillow's default decompression-bomb limit (Image.MAX_IMAGE_PIXELS): large
# enough for any real photo, small enough to refuse a 50000x50000 PNG bomb.
DEFAULT_MAX_PIXELS = 89_478_485

# Names end up in file names (`<name>-<split>.tfrecord-...`); '-' would make
# the split ambiguous, so splits may not contain it.
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
_SPLIT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_]*$"

SplitName = Annotated[str, Field(pattern=_SPLIT_PATTERN)]


class ConfigError(UsageError):
    """The build config is invalid. The message names the file and the field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ImageFolderSource(_Model):
    """``root/<class>/<image>``, or ``root/<split>/<class>/<image>`` with
    ``splits.from_source``. Class names are the sorted folder names."""

    type: Literal["image_folder"]
    root: str = Field(min_length=1)
    classes: list[str] | None = None


class ManifestSource(_Model):
    """A CSV (header ``path,label[,split]``) or JSONL (``{"path", "label"[, "split"]}``)
    file; ``.jsonl``/``.json`` means JSONL, anything else CSV. Class names are
    `classes` if given, else the sorted distinct labels."""

    type: Literal["manifest"]
    path: str = Field(min_length=1)
    classes: list[str] | None = None


class ImageConfig(_Model):
    channels: Literal[1, 3] = 3
    max_pixels: pydantic.PositiveInt = DEFAULT_MAX_PIXELS
    min_size: pydantic.PositiveInt = 1


class EncodingConfig(_Model):
    format: Literal["jpeg", "png", "raw"] = "jpeg"
    quality: Annotated[int, Field(ge=1, le=100)] = 95


class SplitsConfig(_Model):
    fractions: dict[SplitName, Annotated[float, Field(ge=0, le=1)]] | None = None
    from_source: bool = False
    split_by: Literal["content", "key"] = "content"
    salt: str = ""

    @pydantic.field_validator("fractions")
    @classmethod
    def _fractions_sum_to_one(cls, fractions):
        if fractions is not None:
            if not fractions:
                raise ValueError("must name at least one split")
            total = math.fsum(fractions.values())
            if abs(total - 1.0) > 1e-6:
                raise ValueError(f"must sum to 1, got {total:g}")
        return fractions

    @pydantic.model_validator(mode="after")
    def _one_way_to_split(self):
        if self.from_source and self.fractions is not None:
            raise ValueError("give either fractions or from_source: true, not both")
        return self


class ShardingConfig(_Model):
    target_shard_mb: pydantic.PositiveFloat = 128.0
    # A positive int, or split name -> positive int (splits not named are
    # sized by target_shard_mb). Checked by hand: pydantic's messages for a
    # union name its internal member types, not the user's mistake.
    num_shards: Any = None
    compression: Literal["none", "gzip"] = "none"

    @pydantic.field_validator("num_shards")
    @classmethod
    def _positive_counts(cls, value):
        def count(v, where):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{where}must be a positive integer, got {v!r}")
            return v

        if value is None:
            return None
        if isinstance(value, dict):
            for split, v in value.items():
                if not isinstance(split, str) or not re.match(_SPLIT_PATTERN, split):
                    raise ValueError(f"{split!r} is not a valid split name (letters, digits, '_')")
                count(v, f"{split}: ")
            return dict(value)
        return count(value, "")


class ErrorsConfig(_Model):
    max_fraction: Annotated[float, Field(ge=0, le=1)] = 0.05


class BuildConfig(_Model):
    """The YAML file's schema. See the module docstring for the shape."""

    name: str = Field(pattern=_NAME_PATTERN)
    source: Annotated[Union[ImageFolderSource, ManifestSource], Field(discriminator="type")]
    output: str = Field(min_length=1)
    image: ImageConfig = ImageConfig()
    transforms: list[Any] = []
    encoding: EncodingConfig = EncodingConfig()
    splits: SplitsConfig = SplitsConfig()
    sharding: ShardingConfig = ShardingConfig()
    augment: list[Any] = []
    errors: ErrorsConfig = ErrorsConfig()
    plugins: list[Annotated[str, Field(min_length=1)]] = []


@dataclasses.dataclass(frozen=True)
class ResolvedConfig:
    """A validated config with every default filled in.

    Attributes:
      model: The validated `BuildConfig` (paths as written).
      data: The resolved config as plain JSON data (saved in `kiln.json`).
      fingerprint: sha256 of the canonical JSON of `data`.
      chain: The offline transforms, ready to apply.
      output_root: Absolute output root (local path or URI).
      origin: Where the config came from, for messages (a file name or "config").
    """

    model: BuildConfig
    data: dict[str, Any]
    fingerprint: str
    chain: transforms.Chain
    output_root: str
    origin: str

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def source(self) -> dict[str, Any]:
        return self.data["source"]

    @property
    def splits(self) -> dict[str, Any]:
        return self.data["splits"]

    @property
    def dataset_root(self) -> str:
        """``<output>/<name>``: holds the versions, LATEST and staging folders."""
        return FileSystems.join(self.output_root, self.name)


def load(
    config: str | os.PathLike | Mapping[str, Any],
    *,
    output: str | None = None,
    check_paths: bool = True,
) -> ResolvedConfig:
    """Reads, validates and resolves a build config.

    Args:
      config: A YAML file path, or the already-parsed mapping.
      output: Overrides the config's ``output`` (the ``--output`` flag).
      check_paths: Check that the source exists and the output is not inside
        it. Off only for constructing a job whose data is not reachable from
        here (the Dataflow dry-run test).

    Raises:
      ConfigError: naming the file and field, on the first problem found.
    """
    if isinstance(config, Mapping):
        origin, raw = "config", dict(config)
    else:
        origin = os.fspath(config)
        raw = _read_yaml(origin)
    if output is not None:
        raw["output"] = output

    def fail(message: str) -> ConfigError:
        return ConfigError(f"config error in {origin}: {message}")

    try:
        model = BuildConfig.model_validate(raw)
    except pydantic.ValidationError as e:
        raise fail(_describe(e)) from None

    try:
        # Plugins first: they may register transforms and augmentation ops.
        transforms.import_plugins(model.plugins)
        chain = dataclasses.replace(transforms.parse(model.transforms),
                                    plugins=tuple(model.plugins))
    except transforms.TransformConfigError as e:
        raise fail(str(e)) from None
    _check_channels(chain, model.image.channels, fail)
    augment = _validate_augment(model.augment, fail)

    data = _resolve(model, chain, augment)
    output_root = _absolute(model.output)
    resolved = ResolvedConfig(
        model=model,
        data=data,
        fingerprint=fingerprint(data),
        chain=chain,
        output_root=output_root,
        origin=origin,
    )
    if check_paths:
        _check_paths(resolved, fail)
    return resolved


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except yaml.constructor.ConstructorError as e:
        # safe_load builds plain data only: a tag such as !!python/object
        # (which would run code with an unsafe loader) is refused.
        where = f" (line {e.problem_mark.line + 1})" if e.problem_mark else ""
        raise ConfigError(
            f"config error in {path}: not valid YAML{where}: {e.problem}; a config is plain "
            f"data (mappings, lists, strings, numbers), read with a safe loader"
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config error in {path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"config error in {path}: expected a mapping of settings at the top level, "
            f"got {type(raw).__name__}"
        )
    return raw


def _describe(error: pydantic.ValidationError) -> str:
    """The first validation error as ``field.path: what is wrong``."""
    first = error.errors(include_url=False)[0]
    loc = list(first["loc"])
    # A discriminated union puts the tag into the location
    # (source.image_folder.root); users wrote source.root.
    if len(loc) >= 2 and loc[0] == "source" and loc[1] in ("image_folder", "manifest"):
        del loc[1]
    if loc and loc[-1] == "[key]":  # a mapping's key failed, e.g. a split name
        del loc[-1]
    where = ".".join(str(part) for part in loc) or "(top level)"
    kind, message = first["type"], first["msg"]
    if kind == "extra_forbidden":
        message = "unknown field"
    elif kind == "missing":
        message = "required field is missing"
    elif kind == "union_tag_invalid":
        message = f"type must be 'image_folder' or 'manifest', got {first['input'].get('type')!r}"
    elif kind == "union_tag_not_found":
        message = "needs a type: 'image_folder' or 'manifest'"
    elif kind == "string_pattern_mismatch":
        message = (f"{first['input']!r} is not a valid name (letters, digits and '_'"
                   + (", '.', '-'" if loc == ["name"] else "") + ")")
    elif message.startswith("Value error, "):
        message = message[len("Value error, "):]
    return f"{where}: {message}"


def _check_channels(chain: transforms.Chain, channels: int, fail) -> None:
    """Refuses a chain whose built-in transforms change the channel count away
    from ``image.channels``: every image would be dropped at the first file.

    Images are decoded to ``image.channels``, and the stored images must
    have that many channels. `to_grayscale` makes one channel (three with
    ``keep_channels``). User transforms are checked per image instead.
    """
    current = channels
    for index, transform in enumerate(chain.transforms):
        if transform.name != "to_grayscale":
            continue
        keep = dict(transform.params).get("keep_channels", False)
        current = 3 if keep else 1
        if current != channels:
            fix = ("set image.channels: 1 to store gray images, or keep_channels: true to "
                   "store three equal channels") if channels == 3 else \
                  "drop keep_channels: true (image.channels: 1 stores one channel)"
            raise fail(f"transforms[{index}].to_grayscale: gives {current}-channel images but "
                       f"image.channels is {channels}; {fix}")


def _validate_augment(specs: list[Any], fail) -> list[Any]:
    """Validates augmentation names with the reader's registry, when present.

    The augmentations run in the reader, not here; checking them now stops a
    typo before an hour-long build rather than at training time.
    """
    try:
        from kiln import reader
    except ImportError:
        return list(specs)
    validate = getattr(reader, "validate", None)
    if validate is None:
        return list(specs)
    try:
        resolved = validate(specs)
    except ValueError as e:
        message = str(e)
        raise fail(message if message.startswith("augment") else f"augment: {message}") from None
    return _as_json(resolved) if resolved is not None else list(specs)


def _as_json(value: Any) -> Any:
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [_as_json(v) for v in value]
    return value


def _resolve(model: BuildConfig, chain: transforms.Chain, augment: list[Any]) -> dict[str, Any]:
    splits = model.splits.model_dump(mode="json")
    if not model.splits.from_source and model.splits.fractions is None:
        splits["fractions"] = {"train": 1.0}
    encoding = model.encoding.model_dump(mode="json")
    if encoding["format"] != "jpeg":
        encoding["quality"] = None  # only JPEG is lossy; keep unused knobs out of the fingerprint
    source = model.source.model_dump(mode="json")
    location_field = "root" if source["type"] == "image_folder" else "path"
    source[location_field] = _absolute(source[location_field])
    if source.get("classes") is not None:
        source["classes"] = sorted(set(source["classes"]))
    return {
        "name": model.name,
        "source": source,
        "image": model.image.model_dump(mode="json"),
        "transforms": chain.to_json(),
        "encoding": encoding,
        "splits": splits,
        "sharding": model.sharding.model_dump(mode="json"),
        "augment": augment,
        "errors": model.errors.model_dump(mode="json"),
        "plugins": list(model.plugins),
    }


def is_remote(path: str) -> bool:
    """True for URIs with a scheme (gs://...), False for local paths."""
    return FileSystems.get_scheme(path) not in (None, "file")


def _absolute(path: str) -> str:
    if is_remote(path):
        return path.rstrip("/")
    return os.path.abspath(os.path.expanduser(path))


def _inside(path: str, folder: str) -> bool:
    path, folder = path.rstrip("/") + "/", folder.rstrip("/") + "/"
    return path.startswith(folder)


def _check_paths(resolved: ResolvedConfig, fail) -> None:
    source = resolved.source
    if source["type"] == "image_folder":
        root = source["root"]
        if is_remote(root):
            exists = bool(FileSystems.match([root + "/**"], limits=[1])[0].metadata_list)
        else:
            exists = os.path.isdir(root)
        if not exists:
            raise fail(f"source.root: folder not found or empty: {root}")
        if _inside(resolved.output_root, root):
            raise fail(
                f"output: {resolved.output_root} is inside the source folder {root}; "
                f"the next build would read its own output"
            )
    else:
        if not FileSystems.exists(source["path"]):
            raise fail(f"source.path: manifest not found: {source['path']}")
