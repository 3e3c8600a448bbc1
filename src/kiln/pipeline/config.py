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
    targets:                        # what records carry besides the image (README, "Detection
      label: {}                     # and segmentation"); absent: label only
    errors:
      max_fraction: 0.05            # more dropped files than this fails the build
      allow_empty: false            # true: publish even when no example is stored
    plugins: []                     # modules that register your own transforms

Relative paths in the config resolve against the current directory (the
Makefile runs from the repository's top), except image paths inside a
manifest, which resolve against the manifest's folder.

The resolved config (`BuildSpec.to_json`) is that shape with every default
filled in, transforms in their canonical form and paths made absolute. It is
saved in `kiln.json`; its fingerprint is part of the dataset version. The
output root is deliberately left out of both: where a dataset is written is
not a property of the dataset, so moving it or building it elsewhere must not
change its metadata.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field

from kiln import transforms
from kiln.errors import ConfigError, quote, quote_text
from kiln.pipeline import storage
from kiln.pipeline.sources import Listing, Source
from kiln.pipeline.versioning import fingerprint
from kiln.schemas import CLASSIFICATION, SPLIT_NAME_PATTERN, TargetsConfig

logger = logging.getLogger(__name__)

# Pillow's default decompression-bomb limit (Image.MAX_IMAGE_PIXELS): large
# enough for any real photo, small enough to refuse a 50000x50000 PNG bomb.
DEFAULT_MAX_PIXELS = 89_478_485

# Names end up in file names (`<name>-<split>.tfrecord-...`).
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"

SplitName = Annotated[str, Field(pattern=SPLIT_NAME_PATTERN)]


class _Model(BaseModel):
    # Each field's docstring is its meaning in docs/configuration.md
    # (`config_reference`): adding a key is one place plus its consumer.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ImageConfig(_Model):
    channels: Literal[1, 3] = 3
    """1: grayscale (ITU-R 601 luma), 3: RGB. Alpha is composited over white; 16-bit samples
    are rounded to 8 bits; EXIF orientation is applied."""
    max_pixels: pydantic.PositiveInt = DEFAULT_MAX_PIXELS
    """Images with more pixels (width x height, read from the header) are dropped as
    `too_many_pixels` before decoding: a decompression-bomb guard. 89478485 is Pillow's
    limit."""
    min_size: pydantic.PositiveInt = 1
    """Images whose shorter side is below this are dropped as `too_small`."""


class EncodingConfig(_Model):
    format: Literal["jpeg", "png", "raw"] = "jpeg"
    """`jpeg` (small, lossy), `png` (lossless) or `raw` (uint8 pixels with their shape:
    largest, fastest to read)."""
    quality: Annotated[int, Field(ge=1, le=100)] = 95
    """JPEG quality. Ignored (and left out of the fingerprint) for png and raw."""


class SplitsConfig(_Model):
    fractions: dict[SplitName, Annotated[float, Field(ge=0, le=1)]] | None = None
    """Split name to fraction, summing to 1, e.g. `{train: 0.8, validation: 0.1, test: 0.1}`;
    assigned by a salted hash. Default (with `from_source: false`): everything in `train`."""
    from_source: bool = False
    """Take splits from the source: `root/<split>/<class>/<image>` folders or the manifest's
    `split` column. Excludes `fractions`."""
    split_by: Literal["content", "key"] = "content"
    """What the fractions hash: `content` (the file's sha256: identical files always share a
    split, so duplicates cannot leak between train and test) or `key` (the path: stable when
    files are re-encoded)."""
    salt: str = ""
    """Mixed into the hash: change it to draw a different assignment."""

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
    """Shards per split = ceil(split bytes / this many MB)."""
    # A positive int, or split name -> positive int (splits not named are
    # sized by target_shard_mb). Checked by hand: pydantic's messages for a
    # union name its internal member types, not the user's mistake.
    num_shards: Any = None
    """A fixed shard count instead: one positive int for every split, or `{split: count}`
    (splits not named use `target_shard_mb`)."""
    compression: Literal["none", "gzip"] = "none"
    """`gzip` compresses the shards (`.gz` suffix). TFDS cannot read gzip shards, so such
    builds get no TFDS metadata."""

    @pydantic.field_validator("num_shards")
    @classmethod
    def _positive_counts(cls, value):
        def count(v, where):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{where}must be a positive integer, got {quote(v)}")
            return v

        if value is None:
            return None
        if isinstance(value, dict):
            for split, v in value.items():
                if not isinstance(split, str) or not re.match(SPLIT_NAME_PATTERN, split):
                    raise ValueError(
                        f"{quote(split)} is not a valid split name (letters, digits, '_')"
                    )
                count(v, f"{split}: ")
            return dict(value)
        return count(value, "")


class ErrorsConfig(_Model):
    max_fraction: Annotated[float, Field(ge=0, le=1)] = 0.05
    """If more than this fraction of the input files is dropped, the build fails (exit 1) and
    publishes nothing. Every dropped file is a row in `errors.jsonl`."""
    allow_empty: bool = False
    """Publish a dataset with no example at all (every input dropped). Off: such a build fails
    (exit 1), so a broken source never replaces a good dataset with an empty one."""


class BuildConfig(_Model):
    """The YAML file's schema. See the module docstring for the shape."""

    name: str = Field(pattern=_NAME_PATTERN)
    """Dataset name: the folder `<output>/<name>/` and the shard file prefix
    `<name>-<split>.tfrecord-...`."""
    source: Source
    """Where the images come from: an `image_folder` or a `manifest`."""
    output: str = Field(min_length=1)
    """Output root: the dataset lands in `<output>/<name>/<version>/` with
    `<output>/<name>/LATEST` naming the newest version. Local or `gs://`. `kiln build
    --output` overrides it. Not part of the dataset's fingerprint."""
    image: ImageConfig = ImageConfig()
    """Decoding: what the images become before the transforms."""
    transforms: list[Any] = []
    """Offline transforms, applied in order to every image once, at build time: a list of names
    or `{name: {param: value}}`. See [transforms.md](transforms.md)."""
    encoding: EncodingConfig = EncodingConfig()
    """How the stored images are encoded in the records."""
    splits: SplitsConfig = SplitsConfig()
    """How images are assigned to splits."""
    sharding: ShardingConfig = ShardingConfig()
    """How each split is cut into TFRecord shards."""
    augment: list[Any] = []
    """The reader's default augmentation for the train split (random TF ops, every epoch),
    stored in `kiln.json`; validated at build time. See
    [augmentations.md](augmentations.md)."""
    targets: TargetsConfig | None = None
    """What each record carries besides the image: `label` (one class), `labels` (several),
    `boxes`, `mask`, `instance_masks`, `keypoints`, `extra` columns. Absent: `label` only,
    the records of a classification dataset. See README, "Detection and segmentation"."""
    errors: ErrorsConfig = ErrorsConfig()
    """What to do about bad input files."""
    plugins: list[Annotated[str, Field(min_length=1)]] = []
    """Python modules to import before validating: they register your own offline transforms
    (and augmentation ops). Only modules named here are imported."""


@dataclasses.dataclass(frozen=True)
class BuildSpec:
    """A validated build config with every default resolved: what a build runs.

    The job, the metadata and the report carry this typed object; its JSON
    form (`to_json`) is made only where it is written into `kiln.json` and
    hashed into the fingerprint.

    Attributes:
      config: The validated config, resolved: the source's location absolute
        and its classes sorted, ``splits.fractions`` defaulting to
        ``{train: 1.0}`` unless splits come from the source.
      chain: The offline transforms, ready to apply.
      augment: The reader's default augmentation list, validated, in its
        canonical JSON form (the reader applies it; the build only stores it).
      output_root: Absolute output root (local path or URI).
      origin: Where the config came from, for messages (a file name or "config").
    """

    config: BuildConfig
    chain: transforms.Chain
    augment: tuple[Any, ...]
    output_root: str
    origin: str

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def targets(self) -> TargetsConfig:
        """What the records carry (`CLASSIFICATION` without a ``targets:`` section)."""
        return self.config.targets or CLASSIFICATION

    @property
    def dataset_root(self) -> str:
        """``<output>/<name>``: holds the versions, LATEST and staging folders."""
        return storage.join(self.output_root, self.name)

    def to_json(self) -> dict[str, Any]:
        """The resolved config as saved in `kiln.json` (without ``output``:
        where a dataset is written is not a property of the dataset)."""
        data = self.config.model_dump(mode="json", exclude={"output"})
        if self.config.targets is None:
            # A classification dataset's config (and so its fingerprint and
            # version) is what it was before targets existed.
            del data["targets"]
        data["transforms"] = self.chain.to_json()
        data["augment"] = list(self.augment)
        if self.config.encoding.format != "jpeg":
            # Only JPEG is lossy: keep unused knobs out of the fingerprint.
            data["encoding"]["quality"] = None
        return data

    @functools.cached_property
    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of `to_json`: part of the version."""
        return fingerprint(self.to_json())

    def list_source(self) -> Listing:
        """Lists the source (`sources`).

        Raises:
          ConfigError: naming this config, when the source cannot be read at
            all or holds no usable image.
        """
        try:
            return self.config.source.list_files(
                splits_from_source=self.config.splits.from_source, targets=self.targets
            )
        except ConfigError as e:
            raise self.error(str(e)) from None

    def error(self, message: str) -> ConfigError:
        """A `ConfigError` naming this config: ``config error in <origin>: <message>``."""
        return ConfigError(f"config error in {self.origin}: {message}")


def load(
    config: str | os.PathLike | Mapping[str, Any],
    *,
    output: str | None = None,
    check_paths: bool = True,
) -> BuildSpec:
    """Reads, validates and resolves a build config into a `BuildSpec`.

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

    problem = _size_problem(raw)
    if problem:
        raise fail(problem)

    try:
        model = BuildConfig.model_validate(raw)
    except pydantic.ValidationError as e:
        raise fail(_describe(e)) from None

    try:
        # Plugins first: they may register transforms and augmentation ops.
        transforms.import_plugins(model.plugins)
        chain = dataclasses.replace(
            transforms.parse(model.transforms), plugins=tuple(model.plugins)
        )
    except transforms.TransformConfigError as e:
        raise fail(str(e)) from None
    _check_channels(chain, model.image.channels, fail)
    _check_targets(model, chain, fail)
    augment = _validate_augment(model.augment, fail)

    spec = BuildSpec(
        config=_resolved(model),
        chain=chain,
        augment=tuple(augment),
        output_root=storage.absolute(model.output),
        origin=origin,
    )
    if check_paths:
        problem = spec.config.source.check(spec.output_root)
        if problem:
            raise spec.error(problem)
    return spec


# Bounds on what a config may be, so that a hostile or broken file fails in
# milliseconds with one line: a real config is a few KB, a few hundred values
# and a few levels deep. YAML aliases let a 600-byte file stand for billions
# of values ("billion laughs"); they are allowed, but the document they
# expand to must stay within MAX_CONFIG_VALUES.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_VALUES = 100_000
MAX_CONFIG_DEPTH = 32


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"config error in {path}: the file is larger than "
            f"{MAX_CONFIG_BYTES >> 20} MiB; a config is a few KB of settings"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"config error in {path}: not UTF-8 text (byte {e.start}, line {line}: {e.reason})"
        ) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.constructor.ConstructorError as e:
        # safe_load builds plain data only: a tag such as !!python/object
        # (which would run code with an unsafe loader) is refused.
        where = f" (line {e.problem_mark.line + 1})" if e.problem_mark else ""
        raise ConfigError(
            f"config error in {path}: not valid YAML{where}: {e.problem}; a config is plain "
            f"data (mappings, lists, strings, numbers), read with a safe loader"
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config error in {path}: not valid YAML: {quote_text(str(e))}") from None
    except RecursionError:
        raise ConfigError(
            f"config error in {path}: nested more than Python can read; "
            f"a config is a few levels deep"
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"config error in {path}: expected a mapping of settings at the top level, "
            f"got {type(raw).__name__}"
        )
    return raw


def _size_problem(raw: Any) -> str | None:
    """Why `raw` is too large or too deep to be a config, or None.

    Counts the values the document expands to, each shared (aliased) value
    once per place it appears, without expanding anything: a memo by object
    identity makes it linear in the parsed size. A value that contains
    itself (a recursive alias) is refused too.
    """
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, int, bool]] = [(raw, 1, False)]
    open_ids: set[int] = set()
    while stack:
        value, depth, children_done = stack.pop()
        if not isinstance(value, (dict, list)):
            continue
        key = id(value)
        children = list(value.values()) if isinstance(value, dict) else value
        if children_done:
            open_ids.discard(key)
            sizes[key] = 1 + sum(sizes.get(id(child), 1) for child in children)
            if sizes[key] > MAX_CONFIG_VALUES:
                return (
                    f"expands to more than {MAX_CONFIG_VALUES} values (through YAML "
                    f"aliases?); a config is a few hundred settings"
                )
            continue
        if key in sizes:
            continue
        if key in open_ids:
            return "a value contains itself (a recursive YAML alias)"
        if depth > MAX_CONFIG_DEPTH:
            return f"nested more than {MAX_CONFIG_DEPTH} levels deep"
        open_ids.add(key)
        stack.append((value, depth, True))
        stack.extend((child, depth + 1, False) for child in children)
    return None


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
        message = (
            f"type must be 'image_folder' or 'manifest', got {quote(first['input'].get('type'))}"
        )
    elif kind == "union_tag_not_found":
        message = "needs a type: 'image_folder' or 'manifest'"
    elif kind == "string_pattern_mismatch":
        message = (
            f"{quote(first['input'])} is not a valid name (letters, digits and '_'"
            + (", '.', '-'" if loc == ["name"] else "")
            + ")"
        )
    elif message.startswith("Value error, "):
        message = message[len("Value error, ") :]
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
            fix = (
                (
                    "set image.channels: 1 to store gray images, or keep_channels: true to "
                    "store three equal channels"
                )
                if channels == 3
                else "drop keep_channels: true (image.channels: 1 stores one channel)"
            )
            raise fail(
                f"transforms[{index}].to_grayscale: gives {current}-channel images but "
                f"image.channels is {channels}; {fix}"
            )


def _check_targets(model: BuildConfig, chain: transforms.Chain, fail) -> None:
    """Refuses targets the source cannot supply (an image folder has a class
    per image only, a CSV manifest scalar columns only: label, labels,
    extras), and transforms that cannot move the geometric ones (a user
    transform that declares no geometry)."""
    targets = model.targets
    if targets is None or targets.is_classification:
        return
    try:
        chain.check_geometry(targets.kinds)
    except transforms.TransformConfigError as e:
        raise fail(str(e)) from None
    source = model.source
    if source.type == "image_folder":
        kind = next(kind for kind in targets.kinds if kind != "label")
        raise fail(
            f"targets.{kind}: an image_folder source gives one class per image only; "
            f"list the images and their targets in a manifest (type: manifest, a .jsonl file)"
        )
    if source.type == "manifest" and not source.path.endswith((".jsonl", ".json")):
        for kind in ("boxes", "mask"):
            if getattr(targets, kind) is not None:
                raise fail(
                    f"targets.{kind}: a CSV manifest holds label, labels and extra columns "
                    f"only; objects and masks need a JSONL manifest (.jsonl)"
                )


def _validate_augment(specs: list[Any], fail) -> list[Any]:
    """The augment list validated with the reader's registry, in canonical JSON form.

    The augmentations run in the reader, not here; checking them now stops a
    typo before an hour-long build rather than at training time. The reader
    (TensorFlow) is imported here, when a config is checked, not when this
    module is.
    """
    from kiln import reader

    try:
        return [augmentation.to_json() for augmentation in reader.validate(specs)]
    except ValueError as e:
        message = str(e)
        raise fail(message if message.startswith("augment") else f"augment: {message}") from None


def _resolved(model: BuildConfig) -> BuildConfig:
    """`model` with its defaults resolved (see `BuildSpec.config`)."""
    splits = model.splits
    if not splits.from_source and splits.fractions is None:
        splits = splits.model_copy(update={"fractions": {"train": 1.0}})
    targets = model.targets
    if targets is not None and targets == CLASSIFICATION:
        targets = None  # `targets: {label: {}}` is the default spelled out: the same dataset
    return model.model_copy(
        update={"source": model.source.resolved(), "splits": splits, "targets": targets}
    )
