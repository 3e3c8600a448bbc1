"""The one declaration of a kiln record's features.

Everything that touches a record derives from `RECORD`: the Beam encoder
(`Schema.encode`), the reader's parse spec (`Schema.parse_spec`), decoding
(`Schema.parse`, `decode_image`) and the schema saved in `kiln.json`
(`Schema.to_json`). No feature key string may appear outside this package.

Imports TensorFlow and NumPy only: the reader depends on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.lazy_import import LazyModule

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
    """One scalar feature of a `tf.train.Example`.

    Attributes:
      name: Python-side name (the key of decoded dicts), e.g. ``"label"``.
      key: Key inside the serialized `tf.train.Example`, e.g. ``"image/class/label"``.
      dtype: ``"bytes"``, ``"int64"`` or ``"float32"``.
      description: What the value means; saved in the metadata.
    """

    name: str
    key: str
    dtype: str
    description: str

    def __post_init__(self):
        if self.dtype not in _DTYPES:
            raise ValueError(f"feature {self.name!r}: unknown dtype {self.dtype!r}")

    @property
    def tf_dtype(self) -> tf.DType:
        return getattr(tf, _DTYPES[self.dtype])

    def fill(self, feature: tf.train.Feature, value: Any) -> None:
        """Sets one Python value into an empty `tf.train.Feature` in place,
        checking its type (in place: building nested messages and copying
        them in would make every value twice, and the build encodes every
        record)."""
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

    def parse_spec(self) -> tf.io.FixedLenFeature:
        return tf.io.FixedLenFeature([], self.tf_dtype)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "key": self.key,
            "dtype": self.dtype,
            "description": self.description,
        }


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

    def parse_spec(self) -> dict[str, tf.io.FixedLenFeature]:
        """The `tf.io.parse_example` spec, keyed by serialized key."""
        return {f.key: f.parse_spec() for f in self.features}

    def parse(self, serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        """Parses one serialized record (scalar) or a batch (vector) with TF ops.

        Returns a dict keyed by feature name. Works in graph mode, so it can
        be used inside `tf.data.Dataset.map`.
        """
        serialized = tf.convert_to_tensor(serialized, tf.string)
        if serialized.shape.rank == 0:
            parsed = tf.io.parse_single_example(serialized, self.parse_spec())
        else:
            parsed = tf.io.parse_example(serialized, self.parse_spec())
        return {f.name: parsed[f.key] for f in self.features}

    def decode(self, serialized: bytes) -> dict[str, Any]:
        """Parses one serialized record in Python (no graph): for tools and tests.

        Raises:
          SchemaError: naming the field, if a feature is missing or mistyped.
        """
        example = tf.train.Example.FromString(serialized)
        out = {}
        for feature in self.features:
            if feature.key not in example.features.feature:
                raise SchemaError(f"field {feature.name!r} ({feature.key}) is missing")
            proto = example.features.feature[feature.key]
            kind = proto.WhichOneof("kind")
            expected = {"bytes": "bytes_list", "int64": "int64_list", "float32": "float_list"}
            if kind != expected[feature.dtype]:
                raise SchemaError(
                    f"field {feature.name!r} ({feature.key}): expected "
                    f"{expected[feature.dtype]}, found {kind}"
                )
            values = getattr(proto, kind).value
            if len(values) != 1:
                raise SchemaError(
                    f"field {feature.name!r} ({feature.key}): expected one value, "
                    f"found {len(values)}"
                )
            out[feature.name] = values[0]
        return out

    def to_json(self) -> dict:
        return {"version": self.version, "features": [f.to_json() for f in self.features]}


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
            "Class id: index into the dataset's sorted class names.",
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
