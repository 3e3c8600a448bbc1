"""TFDS-compatible metadata (`dataset_info.json`, `features.json`) from `RECORD` and `kiln.json`.

With these files beside the shards, TensorFlow Datasets reads a kiln version
folder as it reads its own::

    builder = tfds.builder_from_directory("/data/shapes/3f2a9c1b0d4e")
    train = builder.as_dataset(split="train")             # dicts keyed like the records
    train = builder.as_dataset(split="train", as_supervised=True)  # (image, label)

The TFDS features are keyed by kiln's serialized keys (``RECORD.key(name)``),
flat, so TFDS parses exactly the records kiln wrote: the image feature
decodes the stored image, the label is a ``ClassLabel`` with the dataset's
class names, the other features are scalars and text. Targets
(`kiln.schemas.targets`) map onto TFDS's own features: multi-label
``image/class/labels`` is a ``Sequence(ClassLabel)``, the semantic mask an
``Image`` of one channel (stored raw: a uint8 ``Tensor`` of bytes, ``(H, W, 1)``
for one image size, else flat ``(None,)``), extras scalars or text, and the per-object
features one ``objects`` ``Sequence`` of a dict whose flattened keys are
kiln's (``objects/bbox`` a ``BBoxFeature``, ``objects/label`` a
``ClassLabel``, fields and keypoints tensors, ``objects/mask`` an ``Image``). Nothing here imports
tensorflow_datasets: the JSON is written by hand in the layout TFDS's own
``FeatureConnector.to_json`` and ``DatasetInfo`` proto JSON use (the tests
load it with TFDS and compare).

Not every kiln dataset maps onto TFDS; `tfds_files` raises `TfdsUnsupported`
for these, and the build then writes no TFDS files:

- gzip-compressed shards: TFDS reads TFRecord files uncompressed only.
- raw pixels of varying sizes (``image_size`` null): TFDS's tensor feature
  needs the shape stored in each record for that, and kiln stores height and
  width as separate features. Raw pixels of one size map onto a fixed-shape
  ``Tensor(dtype=uint8, encoding="bytes")``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from kiln.schemas.features import RECORD, Feature, Schema
from kiln.schemas.metadata import DatasetInfo

TFDS_DATASET_INFO_FILENAME = "dataset_info.json"
TFDS_FEATURES_FILENAME = "features.json"

# TFDS wants a semantic version; kiln's versions are content ids (named in
# the description). It is the TFDS layout's version, not the data's.
TFDS_VERSION = "1.0.0"
TFDS_FILE_FORMAT = "tfrecord"
# TFDS's default shard template; kiln's shard_filename follows it (checked
# per shard in `tfds_files`, so a change to either cannot go unnoticed).
TFDS_FILEPATH_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"

_FEATURES = "tensorflow_datasets.core.features."
_IMAGE_CLASS = _FEATURES + "image_feature.Image"
_TENSOR_CLASS = _FEATURES + "tensor_feature.Tensor"
_SCALAR_CLASS = _FEATURES + "scalar.Scalar"
_TEXT_CLASS = _FEATURES + "text_feature.Text"
_CLASS_LABEL_CLASS = _FEATURES + "class_label_feature.ClassLabel"
_FEATURES_DICT_CLASS = _FEATURES + "features_dict.FeaturesDict"
_SEQUENCE_CLASS = _FEATURES + "sequence_feature.Sequence"
_BBOX_CLASS = _FEATURES + "bounding_boxes.BBoxFeature"

# Per-object features share this key prefix: one TFDS Sequence of a dict.
_OBJECTS = "objects"

# The record features with a special TFDS meaning, by RECORD name.
_IMAGE = "image"
_LABEL = "label"


class TfdsUnsupported(ValueError):
    """The dataset cannot be described to TFDS; the message says why."""


def labels_filename(feature_key: str) -> str:
    """Where TFDS reads a ``ClassLabel``'s names from (its naming rule).

    TFDS replaces the ``/`` of a top-level feature name by ``.`` and appends
    ``.labels.txt``, one class name per line; a feature inside a dict (our
    ``objects`` Sequence) is named ``<parent>-<name>``.
    """
    if feature_key.startswith(_OBJECTS + "/"):
        return _OBJECTS + "-" + feature_key[len(_OBJECTS) + 1 :].replace("/", ".") + ".labels.txt"
    return feature_key.replace("/", ".") + ".labels.txt"


def tfds_files(info: DatasetInfo) -> dict[str, str]:
    """The TFDS metadata files of a dataset: file name -> text.

    ``dataset_info.json``, ``features.json``, and the label feature's class
    names file (see `labels_filename`). Deterministic: the same `info` gives
    the same bytes.

    Raises:
      TfdsUnsupported: for datasets TFDS cannot read (see the module docstring).
    """
    _check_supported(info)
    schema = Schema.from_json(info.schema)
    names = "".join(f"{name}\n" for name in info.class_names)
    files = {
        TFDS_DATASET_INFO_FILENAME: _dumps(dataset_info_json(info)),
        TFDS_FEATURES_FILENAME: _dumps(features_json(info)),
    }
    for feature in schema.features:
        if feature.name in _CLASS_FEATURES:
            files[labels_filename(feature.key)] = names
    return files


def missing_tfds_files(names: Iterable[str], exists: Callable[[str], bool]) -> list[str] | None:
    """Which of a version's TFDS files `names` (`tfds_files`) `exists` does
    not find, sorted: any one missing beside the others is damage, as TFDS
    cannot read the version without it. None when none of them is there: a
    version built before kiln wrote TFDS metadata, which is not damage
    (verify accepts it, a rebuild leaves it as it is)."""
    names = sorted(names)
    missing = [name for name in names if not exists(name)]
    return None if len(missing) == len(names) else missing


# Features whose values are class ids (ClassLabel in TFDS).
_CLASS_FEATURES = ("label", "labels", "classes")


def features_json(info: DatasetInfo) -> dict[str, Any]:
    """``features.json``: a ``FeaturesDict`` keyed by the records' serialized keys
    (per-object features nested in one ``objects`` Sequence)."""
    schema = Schema.from_json(info.schema)
    features: dict[str, Any] = {}
    objects: dict[str, Any] = {}
    for feature in schema.features:
        if feature.key.startswith(_OBJECTS + "/"):
            objects[feature.key[len(_OBJECTS) + 1 :]] = _object_feature_json(feature, info)
        else:
            features[feature.key] = _feature_json(feature, info)
    if objects:
        features[_OBJECTS] = {
            "pythonClassName": _SEQUENCE_CLASS,
            "sequence": {
                "feature": {
                    "pythonClassName": _FEATURES_DICT_CLASS,
                    "featuresDict": {"features": objects},
                },
                "length": "-1",
            },
            "description": "The objects of the image, one entry per object.",
        }
    return {
        "type": _FEATURES_DICT_CLASS,
        "content": {"features": features},
        "proto_cls": "tensorflow_datasets.FeaturesDict",
    }


def dataset_info_json(info: DatasetInfo) -> dict[str, Any]:
    """``dataset_info.json``: the ``tensorflow_datasets.DatasetInfo`` proto as JSON."""
    splits = []
    for name in sorted(info.splits):
        split = info.splits[name]
        splits.append(
            {
                "name": name,
                "numBytes": str(sum(shard.num_bytes for shard in split.shards)),
                "shardLengths": [str(shard.num_records) for shard in split.shards],
                "filepathTemplate": TFDS_FILEPATH_TEMPLATE,
            }
        )
    return {
        "name": info.name,
        "version": TFDS_VERSION,
        "description": (
            f"kiln dataset {info.name!r}, version {info.version}, written by kiln "
            f"{info.kiln_version}. kiln.json beside this file is the full metadata "
            f"(build config, statistics, default augmentation); read it with "
            f"kiln.reader.load for seeded augmentation."
        ),
        "fileFormat": TFDS_FILE_FORMAT,
        "splits": splits,
        **(
            {
                "supervisedKeys": {
                    "tuple": {
                        "items": [
                            {"featureKey": RECORD.key(_IMAGE)},
                            {"featureKey": RECORD.key(_LABEL)},
                        ]
                    }
                }
            }
            if _LABEL in Schema.from_json(info.schema).names
            else {}
        ),
    }


def unsupported_reason(info: DatasetInfo) -> str | None:
    """Why TFDS cannot read the dataset (`TfdsUnsupported`'s message), or None if it can."""
    try:
        _check_supported(info)
    except TfdsUnsupported as e:
        return str(e)
    return None


def _check_supported(info: DatasetInfo) -> None:
    if info.compression is not None:
        raise TfdsUnsupported(
            f"shards are {info.compression}-compressed; TFDS reads uncompressed TFRecords only"
        )
    if info.encoding["format"] == "raw" and info.image_size is None:
        raise TfdsUnsupported(
            "raw pixels of varying sizes: a TFDS tensor feature of unknown shape needs "
            "the shape inside each record"
        )
    for name in info.class_names:
        if not name.strip() or name != name.strip() or "\n" in name:
            raise TfdsUnsupported(
                f"class name {name!r} cannot be written to a TFDS labels file "
                f"(one stripped name per line)"
            )
    for split_name, split in info.splits.items():
        for index, shard in enumerate(split.shards):
            expected = _tfds_shard_name(info.name, split_name, index, len(split.shards))
            if shard.filename != expected:
                raise TfdsUnsupported(
                    f"shard {shard.filename!r} does not follow TFDS's file template "
                    f"{TFDS_FILEPATH_TEMPLATE!r} (expected {expected!r})"
                )


def _tfds_shard_name(dataset: str, split: str, index: int, num_shards: int) -> str:
    # TFDS expands {SHARD_X_OF_Y} as "%05d-of-%05d", as kiln's shard_filename does.
    return (
        TFDS_FILEPATH_TEMPLATE.replace("{DATASET}", dataset)
        .replace("{SPLIT}", split)
        .replace("{FILEFORMAT}", TFDS_FILE_FORMAT)
        .replace("{SHARD_X_OF_Y}", f"{index:05d}-of-{num_shards:05d}")
    )


def _class_label_json(info: DatasetInfo) -> dict[str, Any]:
    return {
        "pythonClassName": _CLASS_LABEL_CLASS,
        "classLabel": {"numClasses": str(info.num_classes)},
    }


def _mask_json(info: DatasetInfo) -> dict[str, Any]:
    """An instance mask, or the semantic mask stored as PNG: an ``Image`` of one channel."""
    height, width = info.image_size if info.image_size is not None else (-1, -1)
    return {
        "pythonClassName": _IMAGE_CLASS,
        "image": {
            "shape": {"dimensions": [str(height), str(width), "1"]},
            "dtype": "uint8",
            "encodingFormat": "png",
        },
    }


def _semantic_mask_json(info: DatasetInfo) -> dict[str, Any]:
    """The semantic mask: an ``Image`` for PNG; raw bytes a ``Tensor(dtype=uint8,
    encoding="bytes")``, of shape ``(height, width, 1)`` when every stored image has
    kiln.json's one size, else ``(None,)``: the flat pixels, which the user
    reshapes to the record's ``image/height`` and ``image/width``."""
    mask = info.targets_config.mask
    if mask is None or mask.encoding == "png":
        return _mask_json(info)
    if info.image_size is not None:
        height, width = info.image_size
        dimensions = [str(height), str(width), "1"]
    else:
        dimensions = ["-1"]
    return {
        "pythonClassName": _TENSOR_CLASS,
        "tensor": {"shape": {"dimensions": dimensions}, "dtype": "uint8", "encoding": "bytes"},
    }


def _object_feature_json(feature: Feature, info: DatasetInfo) -> dict[str, Any]:
    """One member of the ``objects`` Sequence: the feature of ONE object."""
    if feature.name == "boxes":
        content = {
            "pythonClassName": _BBOX_CLASS,
            "boundingBox": {"shape": {"dimensions": ["4"]}, "dtype": "float32"},
        }
    elif feature.name == "classes":
        content = _class_label_json(info)
    elif feature.name == "instance_masks":
        content = _mask_json(info)
    else:  # per-object fields and keypoints: tensors of the item shape
        content = {
            "pythonClassName": _TENSOR_CLASS if len(feature.shape) > 1 else _SCALAR_CLASS,
            "tensor": {
                "shape": {"dimensions": [str(d) for d in feature.shape[1:]]}
                if len(feature.shape) > 1
                else {},
                "dtype": _tensor_dtype(feature),
                "encoding": "none",
            },
        }
    content["description"] = feature.description
    return content


def _feature_json(feature: Feature, info: DatasetInfo) -> dict[str, Any]:
    if feature.name == _IMAGE:
        content = _image_json(info)
    elif feature.name == _LABEL:
        content = _class_label_json(info)
    elif feature.name == "labels":
        content = {
            "pythonClassName": _SEQUENCE_CLASS,
            "sequence": {"feature": _class_label_json(info), "length": "-1"},
        }
    elif feature.name == "mask":
        content = _semantic_mask_json(info)
    elif feature.dtype == "bytes":
        content = {"pythonClassName": _TEXT_CLASS, "text": {}}
    else:
        content = {
            "pythonClassName": _SCALAR_CLASS,
            "tensor": {"shape": {}, "dtype": _tensor_dtype(feature), "encoding": "none"},
        }
    content["description"] = feature.description
    return content


def _image_json(info: DatasetInfo) -> dict[str, Any]:
    height, width = info.image_size if info.image_size is not None else (-1, -1)
    shape = {"dimensions": [str(height), str(width), str(info.channels)]}
    if info.encoding["format"] == "raw":
        return {
            "pythonClassName": _TENSOR_CLASS,
            "tensor": {"shape": shape, "dtype": "uint8", "encoding": "bytes"},
        }
    return {
        "pythonClassName": _IMAGE_CLASS,
        "image": {"shape": shape, "dtype": "uint8", "encodingFormat": info.encoding["format"]},
    }


def _tensor_dtype(feature: Feature) -> str:
    return {"int64": "int64", "float32": "float32"}[feature.dtype]


def _dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
