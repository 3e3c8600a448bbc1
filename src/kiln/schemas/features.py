"""The one declaration of a kiln record's features.

Everything that touches a record derives from its `Schema`: the Beam encoder
(`Schema.encode`), the reader's parse spec (`Schema.parse_spec`), decoding
(`Schema.parse`, `decode_image`, `decode_mask`) and the schema saved in
`kiln.json` (`Schema.to_json`, read back with `Schema.from_json`). `RECORD`
is the schema of a classification dataset (a build without ``targets:``);
`schema_for` assembles the schema of any declared targets
(`kiln.schemas.targets`). No feature key string may appear outside this
package.

Shapes: a feature is a scalar (shape ``()``, one value) or variable-length
(shape ``(None, ...)``: N items of the trailing shape, stored flat, N*4
floats for ``(None, 4)``). `Schema.parse` of one record returns dense
tensors of the declared shape with a dynamic N; of a batch, ragged tensors
``[batch, (N), ...]``.

Imports TensorFlow and NumPy only: the reader depends on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.lazy_import import LazyModule
from kiln.schemas.targets import TargetsConfig

if TYPE_CHECKING:
    import tensorflow as tf
else:  # imported when a record is encoded or parsed, not to name the features
    tf = LazyModule("tensorflow")

# Each dtype's name in TensorFlow (tf.string...).
_DTYPES = {"bytes": "string", "int64": "int64", "float32": "float32"}


class SchemaError(ValueError):
    """A record does not match the schema; the message names the field."""


@dataclasses.dataclass(frozen=True)
class Feature:
    """One feature of a `tf.train.Example`.

    Attributes:
      name: Python-side name (the key of decoded dicts), e.g. ``"label"``.
      key: Key inside the serialized `tf.train.Example`, e.g. ``"image/class/label"``.
      dtype: ``"bytes"``, ``"int64"`` or ``"float32"``.
      description: What the value means; saved in the metadata.
      shape: ``()`` for one value, or ``(None, d1, ...)``: a variable number
        of items of shape ``(d1, ...)``, stored flat.
    """

    name: str
    key: str
    dtype: str
    description: str
    shape: tuple[int | None, ...] = ()

    def __post_init__(self):
        if self.dtype not in _DTYPES:
            raise ValueError(f"feature {self.name!r}: unknown dtype {self.dtype!r}")
        shape = tuple(self.shape)
        object.__setattr__(self, "shape", shape)
        if shape and (
            shape[0] is not None
            or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape[1:])
        ):
            raise ValueError(
                f"feature {self.name!r}: shape must be () or (None, positive ints...), got {shape}"
            )
        if shape and self.dtype == "bytes" and len(shape) > 1:
            raise ValueError(f"feature {self.name!r}: a bytes feature is () or (None,)")

    @property
    def tf_dtype(self) -> tf.DType:
        return getattr(tf, _DTYPES[self.dtype])

    @property
    def item_size(self) -> int:
        """Values per item of a variable-length feature (4 for ``(None, 4)``)."""
        size = 1
        for dimension in self.shape[1:]:
            size *= int(dimension or 1)
        return size

    def fill(self, feature: tf.train.Feature, value: Any) -> None:
        """Sets one Python value into an empty `tf.train.Feature` in place,
        checking its type (in place: building nested messages and copying
        them in would make every value twice, and the build encodes every
        record)."""
        if self.shape:
            self._fill_sequence(feature, value)
            return
        if self.dtype == "bytes":
            if isinstance(value, str):
                value = value.encode("utf-8")
            if not isinstance(value, (bytes, bytearray, memoryview)):
                raise SchemaError(
                    f"field {self.name!r} ({self.key}): expected bytes or str, "
                    f"got {type(value).__name__}"
                )
            feature.bytes_list.value.append(bytes(value))
        elif self.dtype == "int64":
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise SchemaError(
                    f"field {self.name!r} ({self.key}): expected an integer, "
                    f"got {type(value).__name__} {value!r}"
                )
            feature.int64_list.value.append(int(value))
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise SchemaError(
                    f"field {self.name!r} ({self.key}): expected a number, "
                    f"got {type(value).__name__} {value!r}"
                )
            feature.float_list.value.append(float(value))

    def _fill_sequence(self, feature: tf.train.Feature, value: Any) -> None:
        where = f"field {self.name!r} ({self.key})"
        if self.dtype == "bytes":
            if isinstance(value, (bytes, str)) or not isinstance(value, (list, tuple)):
                raise SchemaError(f"{where}: expected a list of bytes, got {type(value).__name__}")
            items = []
            for item in value:
                if isinstance(item, str):
                    item = item.encode("utf-8")
                if not isinstance(item, (bytes, bytearray, memoryview)):
                    raise SchemaError(
                        f"{where}: expected a list of bytes, found {type(item).__name__}"
                    )
                items.append(bytes(item))
            feature.bytes_list.SetInParent()  # present even when empty
            feature.bytes_list.value.extend(items)
            return
        array = np.asarray(value)
        if array.size == 0:
            array = array.reshape((0, *self.shape[1:]))
        if array.ndim != len(self.shape) or array.shape[1:] != self.shape[1:]:
            raise SchemaError(
                f"{where}: expected shape {_shape_text(self.shape)}, got {list(array.shape)}"
            )
        if self.dtype == "int64":
            if array.size and array.dtype.kind not in "iu":
                raise SchemaError(f"{where}: expected integers, got {array.dtype}")
            feature.int64_list.SetInParent()
            feature.int64_list.value.extend(array.astype(np.int64).ravel().tolist())
        else:
            if array.size and (array.dtype.kind not in "iuf"):
                raise SchemaError(f"{where}: expected numbers, got {array.dtype}")
            feature.float_list.SetInParent()
            feature.float_list.value.extend(array.astype(np.float32).ravel().tolist())

    def parse_spec(self) -> tf.io.FixedLenFeature | tf.io.RaggedFeature:
        if self.shape:
            return tf.io.RaggedFeature(self.tf_dtype, row_splits_dtype=tf.int64)
        return tf.io.FixedLenFeature([], self.tf_dtype)

    def shaped(self, parsed: tf.Tensor | tf.RaggedTensor) -> tf.Tensor | tf.RaggedTensor:
        """A parsed value in the feature's shape: the flat values of one record
        reshaped to ``[N, d1, ...]``, or a batch's ragged rows to ``[B, (N), d1, ...]``."""
        if len(self.shape) <= 1:
            return parsed
        trailing = list(self.shape[1:])
        if isinstance(parsed, tf.RaggedTensor):
            values = tf.reshape(parsed.values, [-1, *trailing])
            return tf.RaggedTensor.from_row_splits(
                values, parsed.row_splits // self.item_size, validate=False
            )
        return tf.reshape(parsed, [-1, *trailing])

    def decode_values(self, proto: tf.train.Feature) -> Any:
        """The Python value of one record's feature (see `Schema.decode`)."""
        kind = proto.WhichOneof("kind")
        expected = {"bytes": "bytes_list", "int64": "int64_list", "float32": "float_list"}
        if self.shape and kind is None:  # an empty list written by another writer
            kind = expected[self.dtype]
        if kind != expected[self.dtype]:
            raise SchemaError(
                f"field {self.name!r} ({self.key}): expected {expected[self.dtype]}, found {kind}"
            )
        values = getattr(proto, kind).value
        if not self.shape:
            if len(values) != 1:
                raise SchemaError(
                    f"field {self.name!r} ({self.key}): expected one value, found {len(values)}"
                )
            return values[0]
        if self.dtype == "bytes":
            return list(values)
        if len(values) % self.item_size:
            raise SchemaError(
                f"field {self.name!r} ({self.key}): {len(values)} values is not a "
                f"multiple of {self.item_size} (shape {_shape_text(self.shape)})"
            )
        dtype = np.int64 if self.dtype == "int64" else np.float32
        return np.asarray(values, dtype=dtype).reshape((-1, *self.shape[1:]))

    def to_json(self) -> dict:
        data: dict[str, Any] = {
            "name": self.name,
            "key": self.key,
            "dtype": self.dtype,
            "description": self.description,
        }
        if self.shape:  # scalars keep the JSON they had before shapes existed
            data["shape"] = list(self.shape)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Feature:
        return cls(
            name=data["name"],
            key=data["key"],
            dtype=data["dtype"],
            description=data.get("description", ""),
            shape=tuple(data.get("shape", ())),
        )


def _shape_text(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("N" if d is None else str(d) for d in shape) + "]"


@dataclasses.dataclass(frozen=True)
class Schema:
    """An ordered set of features: encodes, parses and describes records."""

    features: tuple[Feature, ...]
    version: int = 1

    def __post_init__(self):
        names = [f.name for f in self.features]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate feature names in schema: {names}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.features)

    def feature(self, name: str) -> Feature:
        for feature in self.features:
            if feature.name == name:
                return feature
        raise KeyError(f"no feature {name!r} in schema; have {list(self.names)}")

    def key(self, name: str) -> str:
        """The serialized key of feature `name`."""
        return self.feature(name).key

    def to_example(self, record: Mapping[str, Any]) -> tf.train.Example:
        """Builds a `tf.train.Example` from a dict keyed by feature name.

        Raises:
          SchemaError: naming the field, if one is missing, unknown or of the
            wrong type.
        """
        unknown = set(record) - set(self.names)
        if unknown:
            raise SchemaError(
                f"unknown field(s) {sorted(unknown)}; the schema has {list(self.names)}"
            )
        example = tf.train.Example()
        protos = example.features.feature
        for feature in self.features:
            if feature.name not in record:
                raise SchemaError(f"field {feature.name!r} ({feature.key}) is missing")
            feature.fill(protos[feature.key], record[feature.name])
        return example

    def encode(self, record: Mapping[str, Any]) -> bytes:
        """Serializes a record. Deterministic: same record, same bytes."""
        return self.to_example(record).SerializeToString(deterministic=True)

    def parse_spec(self) -> dict[str, tf.io.FixedLenFeature | tf.io.RaggedFeature]:
        """The `tf.io.parse_example` spec, keyed by serialized key."""
        return {f.key: f.parse_spec() for f in self.features}

    def parse(self, serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        """Parses one serialized record (scalar) or a batch (vector) with TF ops.

        Returns a dict keyed by feature name: scalars, and variable-length
        features in their shape (dense ``[N, ...]`` for one record, ragged
        ``[B, (N), ...]`` for a batch). Works in graph mode, so it can be
        used inside `tf.data.Dataset.map`.
        """
        serialized = tf.convert_to_tensor(serialized, tf.string)
        if serialized.shape.rank == 0:
            parsed = tf.io.parse_single_example(serialized, self.parse_spec())
        else:
            parsed = tf.io.parse_example(serialized, self.parse_spec())
        return {f.name: f.shaped(parsed[f.key]) for f in self.features}

    def decode(self, serialized: bytes) -> dict[str, Any]:
        """Parses one serialized record in Python (no graph): for tools and tests.

        Scalars come back as Python values; variable-length features as NumPy
        arrays of their shape (``[N, 4]`` float32 boxes), or lists of bytes.

        Raises:
          SchemaError: naming the field, if a feature is missing or mistyped.
        """
        example = tf.train.Example.FromString(serialized)
        out = {}
        for feature in self.features:
            if feature.key not in example.features.feature:
                raise SchemaError(f"field {feature.name!r} ({feature.key}) is missing")
            out[feature.name] = feature.decode_values(example.features.feature[feature.key])
        return out

    def to_json(self) -> dict:
        return {"version": self.version, "features": [f.to_json() for f in self.features]}

    def layout_json(self) -> dict:
        """`to_json` without the features' descriptions: what a record's
        bytes depend on (names, keys, dtypes, shapes), for fingerprints that
        decide whether records can be reused. Prose is documentation: a
        corrected description must not make every dataset build again."""
        data = self.to_json()
        for feature in data["features"]:
            del feature["description"]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Schema:
        """The schema a `kiln.json` records (`DatasetInfo.schema`).

        Raises:
          SchemaError: the JSON is not a schema.
        """
        try:
            return cls(
                features=tuple(Feature.from_json(f) for f in data["features"]),
                version=int(data.get("version", 1)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise SchemaError(f"not a record schema ({type(e).__name__}: {e})") from None


RECORD = Schema(
    features=(
        Feature(
            "image",
            "image/encoded",
            "bytes",
            "The stored image: JPEG or PNG bytes, or raw uint8 pixels in "
            "row-major HWC order, as the dataset's encoding says.",
        ),
        Feature("height", "image/height", "int64", "Stored image height in pixels."),
        Feature("width", "image/width", "int64", "Stored image width in pixels."),
        Feature("channels", "image/channels", "int64", "Stored channels: 1 or 3."),
        Feature(
            "label",
            "image/class/label",
            "int64",
            "Class id: index into the dataset's class names (kiln.json's class_names).",
        ),
        Feature(
            "key",
            "image/key",
            "bytes",
            "Stable key of the source image, unique within the dataset.",
        ),
        Feature("sha256", "image/sha256", "bytes", "Hex sha256 of the source file's bytes."),
    )
)

ENCODINGS = ("jpeg", "png", "raw")

# How the semantic mask is stored (`kiln.schemas.targets.MaskTarget.encoding`),
# and what the mask feature's description says for each. The png text is the
# one from before the choice existed, so a png dataset's schema is unchanged.
MASK_ENCODINGS = ("png", "raw")
_MASK_STORED = {
    "png": (
        "Semantic segmentation: a single-channel uint8 PNG of the stored image's size, "
        "a class id per pixel"
    ),
    "raw": (
        "Semantic segmentation: raw uint8 bytes, one per pixel of the stored image in "
        "row-major order (height*width bytes; reshape to [height, width]), a class id per pixel"
    ),
}

_EXTRA_DTYPES = {"int": "int64", "float": "float32", "string": "bytes"}
_FIELD_DTYPES = {"int": "int64", "float": "float32"}


def schema_for(targets: TargetsConfig | None) -> Schema:
    """The record schema of a dataset with these targets (None: `RECORD`).

    The image features and ``key``/``sha256`` always; ``label`` when
    declared; then one feature per declared target (see the table in the
    README's "Detection and segmentation" section). A classification
    dataset's schema is `RECORD` itself, so its records keep their bytes.
    """
    if targets is None or targets.is_classification:
        return RECORD
    features = [f for f in RECORD.features if f.name != "label" or targets.label is not None]
    if targets.labels is not None:
        features.append(
            Feature(
                "labels",
                "image/class/labels",
                "int64",
                "Class ids of the image (multi-label), ascending: indices into the dataset's "
                "class names.",
                (None,),
            )
        )
    if targets.boxes is not None:
        features += [
            Feature(
                "boxes",
                "objects/bbox",
                "float32",
                "One box per object: [y_min, x_min, y_max, x_max] normalized to [0, 1] of the "
                "stored image (TFDS BBoxFeature order).",
                (None, 4),
            ),
            Feature(
                "classes",
                "objects/label",
                "int64",
                "Class id per object: index into the dataset's class names.",
                (None,),
            ),
        ]
        for name, kind in sorted(targets.boxes.fields.items()):
            features.append(
                Feature(
                    name,
                    f"objects/{name}",
                    _FIELD_DTYPES[kind],
                    f"Per-object field {name!r} ({kind}), from the source.",
                    (None,),
                )
            )
    if targets.keypoints is not None:
        count = len(targets.keypoints.names)
        features += [
            Feature(
                "keypoints",
                "objects/keypoints",
                "float32",
                f"Per object, {count} keypoints {targets.keypoints.names} as [y, x] "
                f"normalized to [0, 1] of the stored image.",
                (None, count, 2),
            ),
            Feature(
                "keypoint_visibility",
                "objects/keypoints/visibility",
                "int64",
                "Per object and keypoint, COCO visibility: 0 not labelled (or outside the "
                "stored image), 1 labelled but hidden, 2 visible.",
                (None, count),
            ),
        ]
    if targets.mask is not None:
        ignore = (
            f" ({targets.mask.ignore_value}: not labelled)."
            if targets.mask.ignore_value is not None
            else "."
        )
        stored = _MASK_STORED[targets.mask.encoding]
        features.append(Feature("mask", "segmentation/mask", "bytes", stored + ignore))
    if targets.instance_masks is not None:
        features.append(
            Feature(
                "instance_masks",
                "objects/mask",
                "bytes",
                "One single-channel uint8 PNG per object, of the stored image's size: 1 on the "
                "object, 0 elsewhere.",
                (None,),
            )
        )
    for name, column_type in sorted(targets.extra.items()):
        features.append(
            Feature(
                name,
                f"extra/{name}",
                _EXTRA_DTYPES[column_type],
                f"Per-image column {name!r} ({column_type}), from the manifest.",
            )
        )
    return Schema(tuple(features))


def decode_mask(
    encoded: tf.Tensor,
    encoding: str = "png",
    height: tf.Tensor | int | None = None,
    width: tf.Tensor | int | None = None,
) -> tf.Tensor:
    """Decodes a stored semantic mask to a uint8 ``[height, width]`` tensor (TF ops).

    Args:
      encoded: The ``mask`` feature of one record (a scalar string).
      encoding: ``"png"`` or ``"raw"`` (`MASK_ENCODINGS`): kiln.json's
        ``targets.mask.encoding``, png when absent (a dataset from before the
        choice).
      height, width: The stored image's size (the record's ``height`` and
        ``width``); needed for ``raw``, whose bytes are the pixels only. A raw
        mask of any other length than height*width fails: InvalidArgumentError
        "raw mask: its byte length is not height*width", with both numbers (a
        damaged record, or bytes not written by kiln).
    """
    if encoding == "png":
        mask = tf.io.decode_png(encoded, channels=1, dtype=tf.uint8)
        return tf.squeeze(mask, axis=2)  # a reshape: no copy
    if encoding == "raw":
        if height is None or width is None:
            raise ValueError("decoding a raw mask needs the record's height and width")
        height, width = tf.cast(height, tf.int32), tf.cast(width, tf.int32)
        check = tf.debugging.assert_equal(
            tf.strings.length(encoded),
            height * width,
            message="raw mask: its byte length is not height*width",
        )
        with tf.control_dependencies([check]):
            pixels = tf.io.decode_raw(encoded, tf.uint8)
        return tf.reshape(pixels, tf.stack([height, width]))
    raise ValueError(f"unknown mask encoding {encoding!r}; expected one of {MASK_ENCODINGS}")


def decode_masks(encoded: tf.Tensor) -> tf.Tensor:
    """Decodes one record's instance masks (``[N]`` PNGs: instance masks are
    PNG in every dataset) to uint8 ``[N, height, width]``.

    N may be 0 (an image without objects); the height and width then come
    out 0 (the caller knows the image's size and may reshape): `tf.map_fn`
    of no element cannot stack masks of unknown size, so that case is an
    empty tensor, as in the reader.
    """
    return tf.cond(
        tf.size(encoded) > 0,
        lambda: tf.map_fn(
            decode_mask,
            encoded,
            fn_output_signature=tf.TensorSpec([None, None], tf.uint8),
        ),
        lambda: tf.zeros([0, 0, 0], tf.uint8),
    )


def decode_image(
    encoded: tf.Tensor,
    height: tf.Tensor,
    width: tf.Tensor,
    channels: int,
    encoding: str,
) -> tf.Tensor:
    """Decodes one stored image to a uint8 ``[height, width, channels]`` tensor.

    TF ops only, so it runs inside `tf.data`. `channels` and `encoding` are
    per-dataset constants (from the metadata), so the output has a known
    channel count.
    """
    if encoding == "jpeg":
        image = tf.io.decode_jpeg(encoded, channels=channels)
    elif encoding == "png":
        image = tf.io.decode_png(encoded, channels=channels, dtype=tf.uint8)
    elif encoding == "raw":
        image = tf.io.decode_raw(encoded, tf.uint8)
        image = tf.reshape(image, tf.stack([height, width, channels]))
    else:
        raise ValueError(f"unknown encoding {encoding!r}; expected one of {ENCODINGS}")
    image.set_shape([None, None, channels])
    return image
