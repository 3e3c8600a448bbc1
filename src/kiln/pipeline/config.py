"""The build config: YAML in, a validated and resolved config out.

A config file is data (read with a `yaml.SafeLoader`, whose numbers are YAML
1.2's: ``1e-9`` is a number, not a string); the pydantic models below are its
schema. Everything is checked before any work starts, and every problem is
reported at once, each on one line naming the field, e.g.::

    config error in configs/x.yaml: splits.fractions: must sum to 1, got 0.9

    config error in configs/y.yaml: 2 problems:
      trasforms: unknown field; did you mean 'transforms'?
      sharding.target_shard_mb: expected a number, got 'lots'

The shape (every key but ``name``, ``source`` and ``output`` has a default)::

    name: shapes                    # letters, digits, '_', '.', '-'
    source:
      type: image_folder            # root/<class>/<image> or root/<split>/<class>/<image>
      root: ../build/demo-data      # local path (relative to this file) or gs://bucket/prefix
      classes: [circle, square]     # optional: the class list; other labels are dropped
    # or
    source:
      type: manifest                # CSV (header path,label[,split]) or JSONL rows
      path: data/manifest.csv       # relative image paths resolve against its folder
    output: ../build/datasets       # the dataset lands in <output>/<name>/<version>/
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
      check_box_convention: true    # false: boxes that look normalized, [x, y, w, h] or
                                    # [y_min, x_min, ...] only warn, instead of failing
    plugins: []                     # modules that register your own transforms

Relative paths in a config file resolve against the file's folder
(`config_paths`; configs/demo.yaml says ``../build/demo-data``), except image
paths inside a manifest, which resolve against the manifest's folder.

The resolved config (`BuildSpec.to_json`) is that shape with every default
filled in and transforms in their canonical form. It is saved in `kiln.json`;
its fingerprint is part of the dataset version. Locations are deliberately
left out of both: the output root (where a dataset is written is not a
property of the dataset) and the source's location (``root`` or ``path``,
``allowed_roots``: the same files under another folder or bucket are the same
inputs). kiln.json records the source location, made absolute, as
``provenance`` (`BuildSpec.provenance`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import re
import typing
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import ErrorDetails

from kiln import transforms
from kiln.errors import ConfigError, UsageError, did_you_mean, quote, quote_text
from kiln.pipeline import storage, voc
from kiln.pipeline.config_paths import ConfigPath, Rebased, rebase
from kiln.pipeline.error_report import as_text
from kiln.pipeline.sources import ImageFolderSource, Listing, ManifestSource, Source, is_jsonl
from kiln.pipeline.versioning import fingerprint
from kiln.registry import ListError, describe_error, unknown_names_first
from kiln.schemas import CLASSIFICATION, SPLIT_NAME_PATTERN, TargetsConfig
from kiln.schemas.targets import SEED_KEY
from kiln.transforms import encode

if TYPE_CHECKING:
    from kiln.reader.ops import Augmentation

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
    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, strict=True
    )


class ImageConfig(_Model):
    channels: Literal[1, 3] = 3
    """1: grayscale (ITU-R 601 luma), 3: RGB. Alpha is composited over white; 16-bit samples
    are rounded to 8 bits; EXIF orientation is applied."""
    max_pixels: pydantic.PositiveInt = DEFAULT_MAX_PIXELS
    """Images with more pixels (width x height, read from the header) are dropped as
    `too_many_pixels` before decoding: a decompression-bomb guard. 89478485 is Pillow's
    limit. The offline transforms may not make larger images either: a `pad`, `resize`,
    `center_crop` or `letterbox` whose parameters alone make images of more pixels (a fixed
    size, or a shorter side's square) is a config error naming it."""
    min_size: pydantic.PositiveInt = 1
    """Images whose shorter side is below this are dropped as `too_small`."""
    jpeg_scaled_decode: bool = False
    """Decode a JPEG at 1/2, 1/4 or 1/8 of its size (libjpeg's DCT scaling, as Pillow's
    `draft` and TensorFlow's `decode_jpeg(ratio=)` do) when `transforms:` starts with a
    `resize` (any interpolation but `nearest`) that shrinks it at least that much in both sides
    (whatever its EXIF orientation): the largest such factor. Much faster for large photos (the
    README's "Performance"), and the records keep the size a full decode gives; the pixels
    differ slightly (about 0.5/255 on average). Other formats, and JPEGs the resize does not
    shrink enough, are decoded in full. `max_pixels` and `min_size` apply to the size the
    header declares; boxes, keypoints and masks follow. Changes the dataset's version when on
    (a new fingerprint: records are not reused from a build without it)."""


class EncodingConfig(_Model):
    format: Literal["jpeg", "png", "raw"] = "jpeg"
    """`jpeg` (small, lossy), `png` (lossless) or `raw` (uint8 pixels with their shape:
    largest, fastest to read). JPEG stores at most 65500 pixels per side, PNG 1000000: a
    longer image (after the transforms) is dropped as `encode_failed`, and transforms whose
    parameters alone make every image longer are a config error."""
    quality: Annotated[int, Field(ge=1, le=100)] = 95
    """JPEG quality. Ignored (and left out of the fingerprint) for png and raw."""


class SplitsConfig(_Model):
    fractions: dict[SplitName, Annotated[float, Field(ge=0, le=1)]] | None = None
    """Split name to fraction, summing to 1, e.g. `{train: 0.8, validation: 0.1, test: 0.1}`;
    assigned by a salted hash. Default (with `from_source: false`): everything in `train`."""
    from_source: bool = False
    """Take splits from the source: `root/<split>/<class>/<image>` folders or the manifest's
    `split` column. Excludes `fractions`. Names that differ only in case (`Train`, `train`)
    are a config error; a small split whose name looks misspelt (`tarin` beside `train`) is a
    build warning."""
    split_by: Literal["content", "key"] = "content"
    """What the fractions hash: `content` (the file's sha256: identical files always share a
    split, so duplicates cannot leak between train and test) or `key` (the path: stable when
    files are re-encoded)."""
    salt: str = ""
    """Mixed into the hash: change it to draw a different assignment."""
    stratify: bool = False
    """Assign per class, so every class gets each split's fraction: within one file of
    `fraction x class size` in a fresh build (and as files are added, with up to three splits).
    A file the previous version (LATEST) holds under the same key keeps its split; new files fill
    the splits that are short. Needs `split_by: key`. The classes are the images' labels; with
    `targets:` and no `label`, the classes of each image's `labels` and objects, balanced by
    iterative stratification (the rarest class within one file of its shares, the others close;
    mask classes are not balanced, and a mask-only dataset cannot stratify). The trade-off is in
    the README ("Splits that stay put")."""

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
        if self.stratify and self.from_source:
            raise ValueError("stratify applies to fractions, not to from_source: true")
        if self.stratify and self.split_by != "key":
            raise ValueError(
                "stratify: true needs split_by: key (files are assigned before the job, "
                "which is where their contents are hashed)"
            )
        return self


class ShardingConfig(_Model):
    target_shard_mb: pydantic.PositiveFloat = 128.0
    """Shards per split = ceil(split bytes / this many MB). When `num_shards` fixes every
    split's count it sizes no shard, and is not part of the dataset's version."""
    # A positive int, or split name -> positive int (splits not named are
    # sized by target_shard_mb). Checked by hand: pydantic's messages for a
    # union name its internal member types, not the user's mistake.
    num_shards: Any = None
    """A fixed shard count instead: one positive int for every split, or `{split: count}`
    (splits not named use `target_shard_mb`). A mapping that gives every split of
    `splits.fractions` one count is the same config as that count (one version). A name that
    is not a split of `splits.fractions` (or `train`, its default) is a config error; with
    `splits.from_source` the build warns, once the source is listed, of a name that matches
    no split."""
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
    """Publish a dataset with no example at all (every input dropped, while listing or in the
    job; the rows are in `errors.jsonl`). Off: such a build fails (exit 1), so a broken source
    never replaces a good dataset with an empty one. A source that names nothing to build is a
    configuration error (exit 2) either way, with the first dropped row in its one line and no
    `errors.jsonl`: an empty manifest, a folder without class folders, or a source whose every
    file or row was dropped without naming a class, with no `source.classes` to give the
    dataset one (every row of a manifest missing a column or key the config asks for, a
    misspelt one, a format kiln does not read; files outside any class folder). With
    `source.classes` declared, rows dropped so are bad input like any other (exit 1, or an
    empty dataset with this option)."""
    check_box_convention: bool = True
    """With `targets.boxes`: fail the build (exit 1, nothing published) when the boxes as a
    whole look written in another convention than `[x_min, y_min, x_max, y_max]` pixels:
    normalized to [0, 1], `[x, y, width, height]` or `[y_min, x_min, y_max, x_max]` (at least
    10 boxes, and a large share of them, fit that convention and not kiln's; README,
    "Detection and segmentation"). `false`: build anyway, with a warning, when the boxes are
    right (a dataset of sub-pixel boxes in the top-left pixel, say)."""


class BuildConfig(_Model):
    """The YAML file's schema. See the module docstring for the shape."""

    name: str = Field(pattern=_NAME_PATTERN)
    """Dataset name: the folder `<output>/<name>/` and the shard file prefix
    `<name>-<split>.tfrecord-...`."""
    source: Source
    """Where the images come from: an `image_folder`, a `manifest`, a `coco` instances file or
    a `voc` annotation folder."""
    output: ConfigPath
    """Output root: the dataset lands in `<output>/<name>/<version>/` with
    `<output>/<name>/LATEST` naming the newest version. Local (relative to the config file's
    folder) or `gs://`. `kiln build --output` overrides it (relative to the current
    directory). Not part of the dataset's fingerprint."""
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
    stored in `kiln.json`; validated at build time, and checked against the dataset as
    `kiln.reader.load` checks it (targets, channels, crop sizes; your own ops also by the
    checks of their first use, traced on the dataset's image and targets: randomness from the
    seed only, float32 output, no size change without an inference form, which imports
    TensorFlow, so such a config check takes a few seconds, and again after the job on the
    one size it stored), so the build never publishes a list `load` refuses; when the stored
    images vary in size, nor a fixed crop larger than the least height or width among them,
    which would fail training at the first such image.
    See [augmentations.md](augmentations.md)."""
    targets: TargetsConfig | None = None
    """What each record carries besides the image: `label` (one class), `labels` (several),
    `boxes`, `mask`, `instance_masks`, `keypoints`, `extra` columns. Absent: `label` only,
    the records of a classification dataset. See README, "Detection and segmentation"."""
    errors: ErrorsConfig = ErrorsConfig()
    """What to do about bad input files."""
    plugins: list[Annotated[str, Field(min_length=1)]] = []
    """Python modules to import before validating: they register your own offline transforms
    (and augmentation ops). Only modules named here are imported, each once, in name order: the
    order they are written in does not matter (one config, one version). Two modules that
    register the same name are a config error."""

    @pydantic.field_validator("plugins")
    @classmethod
    def _in_name_order(cls, modules: list[str]) -> list[str]:
        # Imported in this order (`transforms.import_plugins`), so the order
        # written cannot change what registers: [b, a] and [a, b] are one
        # config, one fingerprint and one version.
        return sorted(set(modules))


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
        """The resolved config as saved in `kiln.json` and hashed into the
        fingerprint: what the dataset is made of and how, not where. Without
        ``output`` (where a dataset is written) and without the source's
        location (``source.root`` or ``source.path``, ``source.allowed_roots``:
        see `provenance`), so the same files moved to another folder or bucket
        give the same version; nor where they are listed (``source.listing``):
        listed by the launcher or by a job, the same files are the same
        dataset."""
        source = self.config.source
        data = self.config.model_dump(
            mode="json",
            exclude={
                "output": True,
                "source": source.fingerprint_exclude(),
            },
        )
        if self.config.targets is None:
            # A classification dataset's config (and so its fingerprint and
            # version) is what it was before targets existed.
            del data["targets"]
        elif data["targets"].get("mask") and data["targets"]["mask"]["encoding"] == "png":
            # Written only when raw: a mask config from before the choice
            # keeps its fingerprint (and its version).
            del data["targets"]["mask"]["encoding"]
        if self.config.targets is not None and self.config.targets.annotations_frame == "stored":
            # Written only when upright: a config without it keeps its fingerprint.
            del data["targets"]["annotations_frame"]
        data["transforms"] = self.chain.to_json()
        data["augment"] = list(self.augment)
        if self.config.errors.check_box_convention:
            # Written only when off: a config without it keeps its fingerprint.
            del data["errors"]["check_box_convention"]
        if not self.config.splits.stratify:
            # Written only when on: a config without it keeps its fingerprint.
            del data["splits"]["stratify"]
        if not self.config.image.jpeg_scaled_decode:
            # Written only when on: a config without it keeps its fingerprint.
            del data["image"]["jpeg_scaled_decode"]
        if self.config.encoding.format != "jpeg":
            # Only JPEG is lossy: keep unused knobs out of the fingerprint.
            data["encoding"]["quality"] = None
        data["sharding"] = self._sharding_json(data["sharding"])
        return data

    def _sharding_json(self, sharding: dict[str, Any]) -> dict[str, Any]:
        """``sharding`` in one form per set of shard counts, so that two
        spellings of one layout (the same shards, the same bytes) are one
        config, one fingerprint, one version:

        - ``num_shards`` per split that names every split with one count is
          that count (``{train: 2, test: 2}`` is ``2``), and ``{}`` is null
          (`load` refuses a count for a split ``splits.fractions`` does
          not have: `_shard_count_problems`);
        - ``target_shard_mb``, when ``num_shards`` fixes every split's count,
          sizes nothing that is stored: it is written as its default.

        A config written so already keeps its fingerprint. With
        ``splits.from_source`` the splits are known only from the listing:
        a per-split ``num_shards`` stays as written there.
        """
        splits = self.config.splits.fractions  # None: splits from the source
        fixed = sharding["num_shards"]
        if isinstance(fixed, dict) and splits is not None:
            fixed = {split: count for split, count in fixed.items() if split in splits} or None
            if fixed is not None and set(fixed) == set(splits) and len(set(fixed.values())) == 1:
                fixed = next(iter(fixed.values()))
        every_split = isinstance(fixed, int) or (
            isinstance(fixed, dict) and splits is not None and set(fixed) == set(splits)
        )
        if every_split:
            sharding["target_shard_mb"] = ShardingConfig.model_fields["target_shard_mb"].default
        return {**sharding, "num_shards": fixed}

    @functools.cached_property
    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of `to_json`: part of the version."""
        return fingerprint(self.to_json())

    def provenance(self) -> dict[str, Any]:
        """Where the build read from, for kiln.json's ``provenance``: the
        source's location fields (absolute), outside the fingerprint; a
        local path that is not UTF-8 shown as `error_report.as_text` shows it
        (kiln.json is UTF-8)."""
        return {"source": _as_texts(self.config.source.location())}

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


def _as_texts(value: Any) -> Any:
    """`value` with every string in it as `error_report.as_text` shows it."""
    if isinstance(value, str):
        return as_text(value)
    if isinstance(value, list):
        return [_as_texts(item) for item in value]
    if isinstance(value, dict):
        return {name: _as_texts(item) for name, item in value.items()}
    return value


def load(
    config: str | os.PathLike | Mapping[str, Any],
    *,
    output: str | None = None,
    check_paths: bool = True,
) -> BuildSpec:
    """Reads, validates and resolves a build config into a `BuildSpec`.

    Relative paths in a config file resolve against the file's folder
    (`config_paths`); in a mapping, and in `output`, against the current
    directory.

    Args:
      config: A YAML file path, or the already-parsed mapping.
      output: Overrides the config's ``output`` (the ``--output`` flag).
      check_paths: Check that the source exists and the output is not inside
        it. Off only for constructing a job whose data is not reachable from
        here (the Dataflow dry-run test).

    Raises:
      ConfigError: naming the file and, for each problem found (all of them,
        not only the first), the field and what is wrong with it.
    """
    if isinstance(config, Mapping):
        origin, raw, folder = "config", dict(config), None
    else:
        origin = os.fspath(config)
        raw = _read_yaml(origin)
        folder = os.path.dirname(os.path.abspath(origin))
    if output is not None:
        raw["output"] = storage.absolute(output)  # a flag: relative to the current directory

    problem = _size_problem(raw)
    if problem:
        raise ConfigError.of(origin, [problem])

    problems = _Problems(order=list(raw))
    try:
        model: BuildConfig | None = BuildConfig.model_validate(raw)
    except pydantic.ValidationError as e:
        model = None
        for error in unknown_names_first(e.errors(include_url=False), _known_keys):
            problems.add(*_describe(error))

    # The lists are checked even when other keys are wrong, so that one run
    # names every problem. Plugins first: they may register transforms and
    # augmentation ops.
    plugins = raw.get("plugins", [])
    if isinstance(plugins, list) and all(isinstance(p, str) and p for p in plugins):
        problems.check("plugins", lambda: transforms.import_plugins(plugins))
    chain = transforms.Chain()
    parsed = None
    if isinstance(raw.get("transforms", []), list):
        parsed = problems.check("transforms", lambda: transforms.parse(raw.get("transforms")))
        if parsed is not None:
            chain = dataclasses.replace(parsed, plugins=tuple(model.plugins if model else ()))
            problems.add("transforms", _channels_problem(chain, _channels(raw)))
            problems.add("transforms", _crop_problem(chain))
    augmentations = None
    if isinstance(raw.get("augment", []), list):
        augmentations = problems.check("augment", lambda: _validate_augment(raw.get("augment")))
    if model is not None and augmentations:
        checked = model
        problems.check("augment", lambda: _check_augment_at_config(checked, augmentations, parsed))
    augment = [augmentation.to_json() for augmentation in augmentations or ()]
    if model is not None and parsed is not None:
        problems.check("targets", lambda: _check_targets(model, chain))
        for problem in _size_limit_problems(chain, model.image.max_pixels, model.encoding.format):
            problems.add("transforms", problem)
    if model is not None:
        problems.check("source", lambda: _check_listing(model))
        for problem in _shard_count_problems(model):
            problems.add("sharding", problem)

    if model is None:
        raise ConfigError.of(origin, problems.sorted())
    rebased: list[Rebased] = []
    if folder is not None:
        model, rebased = rebase(model, folder)
    spec = BuildSpec(
        config=_resolved(model),
        chain=chain,
        augment=tuple(augment),
        output_root=storage.absolute(model.output),
        origin=origin,
    )
    if check_paths:
        problem = spec.config.source.location_problem(spec.output_root)
        if problem:
            key = problem.split(":", 1)[0].split(".", 1)[0]  # source.root: ... -> source
            problems.add(key, problem + _where_relative(problem, rebased, folder))
    if problems:
        raise ConfigError.of(origin, problems.sorted())
    return spec


def _shard_count_problems(model: BuildConfig) -> list[str]:
    """A problem for each split that ``sharding.num_shards`` gives a count
    but the build does not have, when the splits are known from the config
    (``splits.fractions``, or its default ``{train: 1}``): a misspelt name
    would leave its split to ``target_shard_mb`` without a word. With
    ``splits.from_source`` the names are known once the source is listed,
    and the launcher warns instead (`launcher._warn_about_shard_counts`)."""
    counts = model.sharding.num_shards
    if not isinstance(counts, dict) or model.splits.from_source:
        return []
    fractions = model.splits.fractions
    splits = sorted(fractions) if fractions is not None else ["train"]
    names = (
        f"splits.fractions names {', '.join(splits)}"
        if fractions is not None
        else "without splits.fractions every image is in train"
    )
    return [
        f"sharding.num_shards.{split}: not a split of this build{did_you_mean(split, splits)} "
        f"({names})"
        for split in counts
        if split not in splits
    ]


class _Problems:
    """The problems found in a config, each as (top-level key, ``key.path: what``).

    Listed in the order of the file's keys (a missing key first), so the
    message reads like the file.
    """

    def __init__(self, order: list[str]):
        self._order = order
        self._found: list[tuple[str, str]] = []

    def __bool__(self) -> bool:
        return bool(self._found)

    def add(self, key: str, problem: str | None) -> None:
        if problem:
            self._found.append((key, problem))

    def check(self, key: str, validate):
        """``validate()``, or None after adding the problems of the `ListError` it raised."""
        try:
            return validate()
        except ListError as e:
            for problem in e.problems:
                self.add(key, problem)
            return None

    def sorted(self) -> list[str]:
        def rank(found: tuple[str, str]) -> int:
            key = found[0]
            return self._order.index(key) if key in self._order else -1

        return [problem for _, problem in sorted(self._found, key=rank)]


def _where_relative(problem: str, rebased: list[Rebased], folder: str | None) -> str:
    """Where a relative path the `problem` names was looked for, or ""."""
    for path in rebased:
        if problem.startswith(f"{path.key}:"):
            return (
                f" ({path.key} is {path.written!r}: relative paths in a config resolve "
                f"against the config file's folder, {folder})"
            )
    return ""


# Bounds on what a config may be, so that a hostile or broken file fails in
# milliseconds with one line: a real config is a few KB, a few hundred values
# and a few levels deep. YAML aliases let a 600-byte file stand for billions
# of values ("billion laughs"); they are allowed, but the document they
# expand to must stay within MAX_CONFIG_VALUES.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_VALUES = 100_000
MAX_CONFIG_DEPTH = 32


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first_line: int):
        super().__init__(key, line, first_line)
        self.key, self.line, self.first_line = key, line, first_line


class _ConfigLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` (plain data only) that refuses a key given twice in
    one mapping, at any depth: YAML's loaders keep the last one silently, so
    a second ``name:`` or ``source:`` further down a long file would win
    unnoticed. Keys merged in with ``<<:`` may be overridden, as YAML says."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in first:
                        raise _DuplicateKey(key, line, first[key])
                    first[key] = line
                except TypeError:  # an unhashable key: the base class says so
                    continue
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        """An integer; one of more digits than Python converts (4300) is a
        `ConstructorError` at its line, not a `ValueError` from nowhere."""
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"a number of {len(str(node.value))} digits, more than Python reads",
                node.start_mark,
            ) from None


_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _ConfigLoader.construct_yaml_int)

# YAML 1.2's floats that YAML 1.1 (PyYAML) reads as strings: an exponent
# without a dot (`1e-9`, `1E12`) or without a sign (`1.5e9`, `.5e3`). Without
# this, `target_shard_mb: 1e-9` was "expected a number, got '1e-9'". Added to
# this loader only (PyYAML copies the table on the first addition); the
# pattern needs an exponent, so integers stay integers.
_YAML_12_FLOAT = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", _YAML_12_FLOAT, list("-+.0123456789")
)


def _yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML parser's error on one line: where, what, and while doing what
    (its own text spans several lines, and names no file but "<unicode string>")."""
    if not isinstance(error, yaml.MarkedYAMLError):
        return quote_text(" ".join(str(error).split()))

    def at(mark: Any) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}"

    problem = error.problem or "not readable"
    text = f"{at(error.problem_mark)}: {problem}" if error.problem_mark else problem
    if error.context:
        started = f" at {at(error.context_mark)}" if error.context_mark else ""
        text += f" ({error.context}{started})"
    return quote_text(text)


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
        raw = yaml.load(text, Loader=_ConfigLoader)  # noqa: S506  # a SafeLoader
    except _DuplicateKey as e:
        raise ConfigError(
            f"config error in {path}: line {e.line}: duplicate key {quote(e.key)} (first on "
            f"line {e.first_line})"
        ) from None
    except yaml.constructor.ConstructorError as e:
        # safe_load builds plain data only: a tag such as !!python/object
        # (which would run code with an unsafe loader) is refused.
        where = f" (line {e.problem_mark.line + 1})" if e.problem_mark else ""
        raise ConfigError(
            f"config error in {path}: not valid YAML{where}: {e.problem}; a config is plain "
            f"data (mappings, lists, strings, numbers), read with a safe loader"
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config error in {path}: not valid YAML: {_yaml_problem(e)}") from None
    except RecursionError:
        raise ConfigError(
            f"config error in {path}: nested more than Python can read; "
            f"a config is a few levels deep"
        ) from None
    if raw is None:
        raise ConfigError(
            f"config error in {path}: the file is empty; a config needs at least name, source "
            f"and output (see docs/configuration.md)"
        )
    if not isinstance(raw, dict):
        raise ConfigError(
            f"config error in {path}: expected a mapping of settings at the top level "
            f"(key: value lines), got {_kind(raw)}"
        )
    return raw


def _kind(value: Any) -> str:
    """What a YAML value is, in a user's words."""
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the text {quote(value)}"
    return quote(value)


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


def _describe(error: ErrorDetails) -> tuple[str, str]:
    """One validation error as (top-level key, ``field.path: what is wrong``)."""
    loc = list(error["loc"])
    # A discriminated union puts the tag into the location
    # (source.image_folder.root); users wrote source.root.
    loc = [part for index, part in enumerate(loc) if not (index and part in _tags(loc[:index]))]
    if loc and loc[-1] == "[key]":  # a mapping's key failed, e.g. a split name
        del loc[-1]
    # A list's item by its index, as messages name it elsewhere: source.parts[1].images.
    where = (
        "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" if index else str(part)
            for index, part in enumerate(loc)
        )
        or "(top level)"
    )
    kind = error["type"]
    if kind == "union_tag_invalid":
        tag = error["input"].get("type")
        hint = did_you_mean(tag, _tags(loc)) if isinstance(tag, str) else ""
        message = f"type must be {_one_of(_tags(loc))}, got {quote(tag)}{hint}"
    elif kind == "union_tag_not_found":
        message = f"needs a type: {_one_of(_tags(loc))}"
    elif kind == "string_pattern_mismatch":
        message = (
            f"{quote(error['input'])} is not a valid name (letters, digits and '_'"
            + (", '.', '-'" if loc == ["name"] else "")
            + ")"
        )
    elif kind == "extra_forbidden" and _is_split_fraction(loc, error.get("input")):
        # `splits: {train: 0.8, ...}`: the fractions, one level too high.
        message = (
            f"unknown field; a split's fraction goes under splits.fractions: "
            f"splits: {{fractions: {{{loc[1]}: {error['input']}, ...}}}}"
        )
    else:
        message = describe_error(error, known=_known_keys(error["loc"][:-1]))
    return (str(loc[0]) if loc else ""), f"{where}: {message}"


def _is_split_fraction(loc: Sequence[int | str], value: object) -> bool:
    """Whether an unknown key of `splits` holds what looks like a split's fraction."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return len(loc) == 2 and loc[0] == "splits" and is_number


def _known_keys(loc: Sequence[int | str]) -> list[str]:
    """The keys of the section at `loc` (as pydantic locates it), for a did-you-mean."""
    return list(dict.fromkeys(name for model in _models_at(loc) for name in model.model_fields))


def _tags(loc: Sequence[int | str]) -> list[str]:
    """The ``type`` values of the kinds a discriminated union at `loc` holds (the source kinds)."""
    models = _models_at(loc)
    if len(models) < 2:
        return []
    return [
        tag
        for model in models
        if "type" in model.model_fields
        for tag in typing.get_args(model.model_fields["type"].annotation)
    ]


def _one_of(tags: list[str]) -> str:
    quoted = [repr(tag) for tag in tags]
    return " or ".join(filter(None, [", ".join(quoted[:-1]), *quoted[-1:]]))


def _models_at(loc: Sequence[int | str]) -> list[type[BaseModel]]:
    """The models of the section at `loc` (as pydantic locates it).

    Walks the models from `BuildConfig`: a field leads to the models its
    annotation holds, a discriminated union's tag (``source.image_folder``)
    to the member whose ``type`` it is. Any model added to the config works.
    """
    models: list[type[BaseModel]] = [BuildConfig]
    for part in loc:
        found: list[type[BaseModel]] = []
        for model in models:
            if part in model.model_fields:
                found.extend(_models_in(model.model_fields[str(part)].annotation))
            elif "type" in model.model_fields and part in typing.get_args(
                model.model_fields["type"].annotation
            ):
                found.append(model)
        models = found
    return models


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def _channels(raw: dict[str, Any]) -> int | None:
    """``image.channels`` if it is valid (else validation reports it), the default if unset."""
    image = raw.get("image", {})
    channels = image.get("channels", 3) if isinstance(image, dict) else None
    return channels if channels in (1, 3) and not isinstance(channels, bool) else None


# What the transforms so far make of every image's size: (where, kind, value),
# kind "exact" (value (height, width)), "shorter" or "longer" (value a side).
_Made = tuple[str, str, Any]


def _size_after(made: _Made | None, transform: Any, where: str) -> _Made | None:
    """What is known of every image's size after `transform`, given `made` before it.

    The sizes come from the built-ins that set one: `resize` (``size``
    exactly, or the shorter or longer side), `center_crop`, `letterbox` and
    `pad` with a ``size`` (exactly: a larger image is dropped). `to_grayscale`
    and `equalize` keep the size; after ``pad: {to_square: true}`` or a user
    transform it is not known.
    """
    params = transform.kwargs
    if transform.name == "resize":
        if params.get("size") is not None:
            return (where, "exact", _height_width(params["size"]))
        if params.get("shorter_side") is not None:
            return (where, "shorter", params["shorter_side"])
        return (where, "longer", params["longer_side"])
    if transform.name in ("center_crop", "letterbox") or (
        transform.name == "pad" and params.get("size") is not None
    ):
        return (where, "exact", _height_width(params["size"]))
    if transform.name in ("to_grayscale", "equalize"):
        return made
    return None


def _stored_size(chain: transforms.Chain) -> tuple[str, tuple[int, int]] | None:
    """``(where, (height, width))`` when the transforms give every stored
    image one size (`_size_after`), `where` the transform that sets it."""
    made = None
    for index, transform in enumerate(chain.transforms):
        made = _size_after(made, transform, f"transforms[{index}].{transform.name}")
    if made is None or made[1] != "exact":
        return None
    return made[0], made[2]


def _crop_problem(chain: transforms.Chain) -> str | None:
    """Why a `center_crop` fits no image the transforms before it make (the
    job would drop every file as ``transform_failed``, after reading them
    all), or None.

    What the transforms before it make is `_size_after`'s. A crop is refused
    only where no image can hold it: larger than an exact size, or than the
    longer side, or smaller shorter side than the crop's smaller side.
    """
    made: _Made | None = None
    for index, transform in enumerate(chain.transforms):
        where = f"transforms[{index}].{transform.name}"
        if transform.name == "center_crop" and made is not None:
            height, width = _height_width(transform.kwargs["size"])
            source, kind, value = made
            if kind == "exact":
                fits, images = (
                    value[0] >= height and value[1] >= width,
                    (f"{value[0]}x{value[1]} (HxW) images"),
                )
            elif kind == "shorter":
                fits, images = (
                    value >= min(height, width),
                    (f"images whose shorter side is {value}"),
                )
            else:
                fits, images = (
                    value >= max(height, width),
                    (f"images whose longer side is {value}"),
                )
            if not fits:
                return (
                    f"{where}: a {height}x{width} (HxW) crop fits none of the {images} "
                    f"that {source} makes (every file would be dropped); crop smaller "
                    f"or resize larger"
                )
        made = _size_after(made, transform, where)
    return None


def _size_limit_problems(chain: transforms.Chain, max_pixels: int, format: str) -> list[str]:
    """Why transforms make images larger than kiln handles, known from the
    config alone (`_size_after`), before any file is read: a ``pad: {size:
    100000}`` would allocate 28 GiB for every file, and drop each with a
    MemoryError.

    A transform that sets the size may make no image of more pixels than
    ``image.max_pixels`` (the bound on every image a build holds, decoded
    or made); the last one none longer than ``encoding.format`` stores
    (`encode.MAX_SIDE`, which would drop every file). A shorter side makes images of at least its
    square, a longer side images that long; a size that depends on the
    input otherwise (``to_square``, a user transform) is not refused.
    """
    problems = []
    made: _Made | None = None
    for index, transform in enumerate(chain.transforms):
        where = f"transforms[{index}].{transform.name}"
        made = _size_after(made, transform, where)
        if made is None or made[0] != where:
            continue
        parameter = f"{where}.{_size_parameter(transform)}"
        kind, value = made[1], made[2]
        pixels, images = (
            (value[0] * value[1], f"{value[0]}x{value[1]} (HxW) images")
            if kind == "exact"
            else (value * value, f"images of at least {value}x{value} pixels")
            if kind == "shorter"
            else (value, f"images {value} pixels long")
        )
        if pixels > max_pixels:
            problems.append(
                f"{parameter}: makes {images}, more pixels than image.max_pixels "
                f"({max_pixels}) allows an image; make them smaller, or raise image.max_pixels"
            )
            continue
        longest = max(value) if kind == "exact" else value
        limit = encode.MAX_SIDE.get(format)
        last = all(_size_after(made, later, "") == made for later in chain.transforms[index + 1 :])
        if last and limit is not None and longest > limit:
            others = [
                name if name not in encode.MAX_SIDE else f"{name} (up to {encode.MAX_SIDE[name]})"
                for name in encode.FORMATS
                if name != format and encode.MAX_SIDE.get(name, longest) >= longest
            ]
            problems.append(
                f"{parameter}: makes {images}, longer than the {limit} pixels per side "
                f"that encoding.format {format} stores (every file would be dropped); make "
                f"them smaller, or store {' or '.join(others)}"
            )
    return problems


def _size_parameter(transform: Any) -> str:
    """The parameter that sets the size a transform makes (`_size_after`)."""
    params = transform.kwargs
    if transform.name == "resize":
        return next(
            name for name in ("size", "shorter_side", "longer_side") if params.get(name) is not None
        )
    return "size"


def _height_width(size: Any) -> tuple[int, int]:
    """A transform's ``size`` (one int, or ``[height, width]``) as a pair."""
    if isinstance(size, int):
        return size, size
    return int(size[0]), int(size[1])


def _channels_problem(chain: transforms.Chain, channels: int | None) -> str | None:
    """Why a chain's built-in transforms change the channel count away from
    ``image.channels`` (every image would be dropped at the first file), or None.

    Images are decoded to ``image.channels``, and the stored images must
    have that many channels. `to_grayscale` makes one channel (three with
    ``keep_channels``). User transforms are checked per image instead.
    """
    if channels is None:
        return None
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
            return (
                f"transforms[{index}].to_grayscale: gives {current}-channel images but "
                f"image.channels is {channels}; {fix}"
            )
    return None


def _check_targets(model: BuildConfig, chain: transforms.Chain) -> None:
    """Refuses targets the source cannot supply (an image folder has a class
    per image only, a CSV manifest scalar columns only: label, labels,
    extras), and transforms that cannot move the geometric ones (a user
    transform that declares no geometry)."""
    targets = model.targets
    source = model.source
    if source.type in _OBJECT_SOURCES:
        _check_object_source(source.type, targets or CLASSIFICATION)
    if targets is None or targets.is_classification:
        return
    if SEED_KEY in targets.extra:
        raise ListError(
            f"targets.extra: {SEED_KEY!r} is the name of the element seeds the reader "
            f"passes to the model-side augmentation layer and to batch ops, which would "
            f"replace the column; choose another column name"
        )
    if model.splits.stratify and not (targets.label or targets.labels or targets.boxes):
        # The listing stratifies by the classes an image's annotations name:
        # a semantic mask's are only known once it is decoded, in the job.
        raise ListError(
            f"splits.stratify: balances the classes of the images' label, labels or "
            f"objects, and these targets ({', '.join(targets.kinds)}) name none before "
            f"the job decodes the masks; declare targets.label, labels or boxes, or drop "
            f"stratify"
        )
    chain.check_geometry(targets.kinds)  # TransformConfigError: a ListError
    if source.type == "image_folder":
        kind = next(kind for kind in targets.kinds if kind != "label")
        raise ListError(
            f"targets.{kind}: an image_folder source gives one class per image only; "
            f"list the images and their targets in a manifest (type: manifest, a .jsonl file)"
        )
    if source.type == "manifest" and not is_jsonl(source.path):
        for kind in ("boxes", "mask"):
            if getattr(targets, kind) is not None:
                raise ListError(
                    f"targets.{kind}: a CSV manifest holds label, labels and extra columns "
                    f"only; objects and masks need a JSONL manifest (.jsonl)"
                )
    if targets.mask is not None and source.classes is None:
        # Without source.classes the class list is the names the rows use,
        # sorted, and a mask's pixel values are ids into it: they would match
        # the ids the masks were drawn with by chance only (mask files carry
        # no names), and a mismatch mislabels every pixel without an error.
        # COCO and VOC give no semantic masks (_OBJECT_SOURCES).
        names_classes = targets.label or targets.labels or targets.boxes
        made_from = (
            "would be the class names the rows use, sorted, which match the masks' ids "
            "by chance only (class 0 is often the masks' background)"
            if names_classes
            else "would be made from the class names the rows use, and these targets name none"
        )
        raise ListError(
            f"targets.mask: a mask's pixel values are class ids, indexes into the class list, "
            f"and without source.classes that list {made_from}; declare "
            f"source.classes, in the masks' id order (e.g. [background, road, car])"
        )


def _check_listing(model: BuildConfig) -> None:
    """Refuses a listing in the job where it cannot work: a local folder (the
    workers may not see it), or where the launcher must see every file."""
    source = model.source
    if not (isinstance(source, (ImageFolderSource, ManifestSource)) and source.listing == "job"):
        return
    if isinstance(source, ManifestSource):
        _check_manifest_listing(model, source)
    elif not storage.is_remote(source.root):
        raise ListError(
            f"source.listing: job lists an object store's folders in the Beam job; "
            f"source.root {source.root} is a local folder: use listing: launcher"
        )
    if model.splits.stratify:
        raise ListError(
            "source.listing: job keeps the files' names out of the launcher, and "
            "splits.stratify assigns them there (class by class, before the job): "
            "use listing: launcher with stratify"
        )


# Sources of objects (COCO, Pascal VOC): the target kinds each can give.
_OBJECT_SOURCES = {
    "coco": ("boxes", "instance_masks", "keypoints"),
    "voc": ("boxes",),
}


def _check_object_source(kind: str, targets: TargetsConfig) -> None:
    """A COCO or VOC source gives objects, and only what its format holds.

    Raises:
      ListError: naming every target it cannot give, at once.
    """
    problems = []
    if targets.boxes is None:
        problems.append(
            f"targets.boxes: a {kind} source lists objects with boxes; declare them "
            f"(targets: {{boxes: {{}}}}, see docs/detection-sources.md)"
        )
    gives = ", ".join(_OBJECT_SOURCES[kind])
    problems += [
        f"targets.{name}: a {kind} source gives {gives} only"
        for name in targets.kinds
        if name not in _OBJECT_SOURCES[kind]
    ]
    if kind == "voc" and targets.boxes is not None:
        # A COCO annotation may hold any key; a VOC object its flags only.
        problems += [
            f"targets.boxes.fields.{name}: a voc object has no {name!r}; it gives "
            f"{', '.join(voc.FLAGS)} only"
            for name in sorted(targets.boxes.fields)
            if name not in voc.FLAGS
        ]
    if problems:
        raise ListError(*problems)


def _validate_augment(specs: list[Any] | None) -> list[Augmentation]:
    """The augment list validated with the reader's registry.

    The augmentations run in the reader, not here; checking them now stops a
    typo before an hour-long build rather than at training time. The reader
    is imported here, when a config is checked, not when this module is
    (validating imports no TensorFlow: the op bodies do, when they run).

    Raises:
      ListError: naming each wrong entry (``augment[0]...``).
    """
    from kiln import reader

    return reader.validate(specs)


def _check_augment_at_config(
    model: BuildConfig, augmentations: Sequence[Augmentation], chain: transforms.Chain | None
) -> None:
    """Refuses an augment list that `kiln.reader.load` would refuse on the
    dataset this config builds, before any work: the reader's own checks
    (`kiln.reader.augmenter.check_stored_list`) with what the config says:
    the targets, ``image.channels``, and the stored size when the transforms
    fix it (`_stored_size`). Otherwise the size is known after the job, and
    the launcher checks it before publishing (`check_augment`)."""
    made = None if chain is None else _stored_size(chain)
    if made is None:
        check_augment(model, augmentations, None)
    else:
        where, (height, width) = made
        check_augment(
            model,
            augmentations,
            (height, width),
            stored=f"the stored images ({where} makes every image {height}x{width})",
        )
    check_first_use(model, augmentations, None if made is None else made[1])


def check_first_use(
    model: BuildConfig, augmentations: Sequence[Augmentation], image_size: Sequence[int] | None
) -> None:
    """The first-use checks `load` runs on the list's own element ops
    (`kiln.reader.dataset.check_first_use`: randomness from the seed only,
    float32 output, no size change without an inference form), traced on
    the dataset's image and targets before any work, and again after the
    job on the one size it stored (`image_size`), which `load` checks with.
    Lists of kiln's ops only need no TensorFlow here.

    Raises:
      ListError: naming the entry and why `load` would refuse it.
    """
    if all(a.definition.builtin or a.definition.kind != "element" for a in augmentations):
        return
    from kiln.reader.augmenter import AugmentOpError
    from kiln.reader.dataset import check_first_use

    try:
        check_first_use(
            augmentations, model.targets, channels=model.image.channels, image_size=image_size
        )
    except AugmentOpError as e:
        raise ListError(str(e)) from None


def check_augment(
    model: BuildConfig,
    augmentations: Sequence[Augmentation],
    image_size: Sequence[int] | None,
    stored: str = "the stored images",
) -> None:
    """`kiln.reader.augmenter.check_stored_list` for the dataset `model` builds,
    whose images are `image_size` (None: not known, or not all one size).

    Raises:
      ListError: naming the op (``augment[2].mixup: ...``) and why the
        reader would refuse the list.
    """
    from kiln.reader.augmenter import check_stored_list
    from kiln.reader.targets import TargetError, TargetSpec

    targets = None if model.targets is None else model.targets.to_json()
    try:
        check_stored_list(
            augmentations,
            TargetSpec.from_json(targets),
            channels=model.image.channels,
            image_size=image_size,
            stored=stored,
        )
    except TargetError as e:
        raise ListError(str(e)) from None


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


def _check_manifest_listing(model: BuildConfig, source: ManifestSource) -> None:
    """Refuses a manifest's listing in the job where it is not built: a local
    manifest or allowed root (the workers may not see them), targets."""
    if not storage.is_remote(source.path):
        raise ListError(
            f"source.listing: job reads the manifest in the Beam job; source.path "
            f"{source.path} is a local file: use listing: launcher"
        )
    local = [root for root in source.allowed_roots if not storage.is_remote(root)]
    if local:
        raise ListError(
            f"source.listing: job looks the rows' objects up in the Beam job; "
            f"source.allowed_roots {local[0]} is a local folder: use listing: launcher"
        )
    if model.targets is not None and not model.targets.is_classification:
        raise ListError(
            "source.listing: job is built for a manifest of path, label[, split] rows; "
            "a manifest with targets (boxes, masks, extra columns) is listed by the "
            "launcher: use listing: launcher"
        )


def check_output_folders(spec: BuildSpec) -> None:
    """Refuses a local output root (or dataset folder) that is an existing
    file: checked as soon as the config loads (`kiln build`), before the
    job's modules are imported, and again by `launcher.build`.

    Also refuses an output root that holds a glob wildcard (``*``, ``?``,
    ``[``): Beam's filesystems read a path as a pattern where they list,
    delete or finalize files (`FileSystems.match`, a sink's rename), so under
    such a root a build failed after its job had run, on its own staging
    folder ("the job did not account for every input file", "Delete
    operation failed"), and left that folder behind.

    Raises:
      UsageError: naming the file, or the wildcard.
    """
    wildcards = sorted({c for c in spec.output_root if c in "*?["})
    if wildcards:
        raise UsageError(
            f"output {spec.output_root} holds {', '.join(repr(c) for c in wildcards)}, which "
            f"Beam's filesystems read as a wildcard; choose another output (the config's "
            f"output, or --output ROOT) without * ? ["
        )
    for folder in (spec.output_root, spec.dataset_root):
        if not storage.is_remote(folder) and os.path.lexists(folder) and not os.path.isdir(folder):
            raise UsageError(
                f"output {folder} is a file, not a folder: the dataset goes to "
                f"<output>/{spec.name}/<version>/; choose another output (the config's "
                f"output, or --output ROOT)"
            )
