"""Records of a base version rewritten with this build's class ids, without decoding their images.

Class ids index the class list (the sorted names found, or
``source.classes`` in its order), so a class added to a dataset (or
removed from it) shifts the ids of every class after it: ``[cat, dog]``
becomes ``[ant, cat, dog]`` and every cat and dog record's ``label`` changes.
Their listing inputs hold the class id (`record_index.inputs_fingerprint`),
so an incremental build (`incremental`) cannot reuse those records as they
are; decoding, transforming and encoding their images again would make the
same pixels at the cost of a full build. Instead, a record whose source file
has the same bytes, and whose listing inputs computed with the *base's*
class list equal the base's (`Relabel.base_ids`), is read from the base's
shard, its class ids are mapped to the new list (``label``, ``labels``,
``classes``) and it is serialized again: the bytes a build from scratch
writes, since only ids differ and a record's encoding is deterministic.

Not relabelled, and processed from their files instead:
- records of a dataset with a semantic ``mask`` (its pixel values are
  class ids of the source's own numbering: what they mean moves with the
  list, not with a mapping kiln could apply);
- records using a class that is not in both lists (an object whose class
  was unknown to the base was dropped from it, and is kept now).

**Where the rewrite happens.** When the change of list keeps every id's
width as a protobuf varint (`FrameRelabel.for_map`: always when both lists
have at most 128 classes), a relabelled record keeps its length: only the
id bytes change. The image step then hands it on like a reused
record, as where its frame is in the base shard (`sharding.ReusedRun`,
marked ``relabelled``), with its index entry, statistics and counts as this
build's; the shard writer, while it copies the base's frames, checks the
frame (length and CRCs), maps the ids of the record's ``label``, ``labels``
and ``classes`` (`FrameRelabel.frame`: the `tf.train.Example` parsed and
serialized by protobuf, its image bytes untouched, no schema decode) and
frames it with its new CRC. The record never goes through a sorted run,
and a gzip base's shards are streamed as for reused records. A base shard
changed after its check fails the build there, as it does for reused
records (`sharding.read_reused`).

Otherwise (an id crosses a varint width, as 127 -> 128 does) the records'
lengths change, and the shard count a target size gives is decided before
the shard writer sees them: each record is read from the base's shard in
the image step, rewritten (`Relabel.record`) and sent through the runs like
a new record. A gzip-compressed base's records are read so too: reading one
means inflating its shard from the start, so the files to relabel are
grouped by the base shard that holds their records and each such shard is
inflated once (`images.RewriteFromBaseShards`), not once per record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from kiln.lazy_import import LazyModule
from kiln.pipeline import tfrecord
from kiln.pipeline.statistics import TargetCounts
from kiln.schemas import Schema

if TYPE_CHECKING:
    import tensorflow as tf
else:  # on first use: validating a config imports this module, and needs no TensorFlow
    tf = LazyModule("tensorflow")

# Record features that hold class ids (`kiln.schemas.schema_for`).
_ID_FEATURES = ("labels", "classes")
# ... and the image's own class id, which `FrameRelabel` maps too.
_LABEL = "label"


class Relabel:
    """Maps a base version's class ids to this build's.

    Args:
      base_names: The base version's class names (its kiln.json).
      names: This build's class names.
      schema: The record schema (the same for both: the processing
        fingerprints are equal).
    """

    def __init__(self, base_names: Sequence[str], names: Sequence[str], schema: Schema):
        self.base_ids = {name: i for i, name in enumerate(base_names)}
        self._base_names = list(base_names)
        new_ids = {name: i for i, name in enumerate(names)}
        self._names = list(names)
        self._new_ids = new_ids
        self._map = {old: new_ids[name] for name, old in self.base_ids.items() if name in new_ids}
        self._schema = schema
        self._id_features = [name for name in _ID_FEATURES if name in schema.names]

    def covers(self, names: Iterable[str]) -> bool:
        """Whether every class name is in both lists (then its records can be
        relabelled: what the base kept or dropped of them is what this
        build would)."""
        return all(name in self.base_ids and name in self._new_ids for name in names)

    def base_name(self, label: int) -> str | None:
        """The base's class name of its class id `label` (None: no label)."""
        return None if label < 0 else self._base_names[label]

    def base_label(self, label: int) -> int:
        """The base's id of this build's class id `label` (-1: no label)."""
        return label if label < 0 else self.base_ids[self._names[label]]

    def record(self, serialized: bytes, label: int, key: str, base_key: str | None = None) -> bytes:
        """The base's record of `base_key` (default: `key`) as the record of
        `key` with this build's class ids: `label` (the image's class id, -1
        for none) and every id in ``labels`` and ``classes`` mapped. A
        `base_key` other than `key` is a file that moved (`moves`).

        Raises:
          KeyError: an id in the record is not in both lists (a caller
            checked `covers` with the names the listing gives).
          ValueError: the bytes are not a record of the schema, or of
            another key (`kiln.schemas.SchemaError` is one).
        """
        fields = self._schema.decode(serialized)
        expected = key if base_key is None else base_key
        if fields["key"] != expected.encode("utf-8"):
            raise ValueError(f"the base's record is of key {fields['key']!r}, not {expected!r}")
        fields["key"] = key
        if "label" in fields:
            fields["label"] = label
        for name in self._id_features:
            ids = [self._map[int(i)] for i in fields[name]]
            if name == "labels":  # ascending: a declared class list reordered permutes ids
                ids.sort()
            fields[name] = np.asarray(ids, dtype=np.int64)
        return self._schema.encode(fields)

    def frame_relabel(self) -> FrameRelabel | None:
        """What rewrites this map's ids in a framed record where the shard
        writer copies it (`FrameRelabel`), or None when some id's varint
        width changes (then records are rewritten by `record`)."""
        names = [name for name in (_LABEL, *_ID_FEATURES) if name in self._schema.names]
        ascending = [self._schema.key(name) for name in names if name == "labels"]
        return FrameRelabel.for_map(
            self._map, [self._schema.key(name) for name in names], ascending
        )

    def counts(self, counts: TargetCounts | None) -> TargetCounts | None:
        """A base record's statistics counts with this build's class ids."""
        if counts is None:
            return None
        return counts._replace(
            image_classes=tuple(sorted(self._map[c] for c in counts.image_classes)),
            objects=tuple((self._map[c], size) for c, size in counts.objects),
        )


def _varint_size(value: int) -> int:
    """Bytes `value` (an int64; negative ones as their 64-bit two's
    complement, as protobuf writes them) takes as a varint."""
    value &= (1 << 64) - 1
    return max(1, (value.bit_length() + 6) // 7)


class FrameRelabel:
    """Rewrites the class ids of a framed record of a base version: `frame`
    maps every id of the int64 lists the record holds under `keys`
    (``image/class/label``, ``image/class/labels``, ``objects/label``: the
    features `Relabel` maps) through `id_map`, and frames the record again.
    Picklable: the shard writer carries it.

    The record is parsed and serialized by protobuf (`tf.train.Example`,
    deterministic), its other features untouched: the bytes `Relabel.record`
    gives, whose serializer's layout depends on the features present and
    their lengths, not their values. The lists under `ascending`
    (``labels``, a set stored in ascending order) are sorted again: the map
    need not keep the order (``source.classes`` is kept as declared, so a
    reordered list permutes the ids). A negative id (no class) is kept.
    Only made for a map that keeps every id's varint width (`for_map`), so
    the record keeps its length, which the shard count was computed with.

    Args:
      id_map: The base's class id -> this build's.
      keys: The record keys of the features holding class ids.
      ascending: Those of `keys` whose ids are kept in ascending order.
    """

    def __init__(
        self, id_map: Mapping[int, int], keys: Iterable[str], ascending: Iterable[str] = ()
    ):
        self._map = dict(id_map)
        self._keys = tuple(keys)
        self._ascending = frozenset(ascending)

    @classmethod
    def for_map(
        cls, id_map: Mapping[int, int], keys: Iterable[str], ascending: Iterable[str] = ()
    ) -> FrameRelabel | None:
        """A `FrameRelabel`, or None when an id would change its varint width."""
        if any(_varint_size(old) != _varint_size(new) for old, new in id_map.items()):
            return None
        return cls(id_map, keys, ascending)

    def frame(self, framed: bytes | memoryview) -> bytes:
        """`framed` (one intact frame: `tfrecord.is_frame`) with its record's
        class ids mapped, framed again (its CRCs computed anew).

        Raises:
          ValueError: the record is not a `tf.train.Example` with the
            features of `keys`, or holds an id the map does not know (it is
            not the record the base's index says).
        """
        record = tfrecord.unframe(framed)
        try:
            example = tf.train.Example.FromString(record)
        except Exception as e:  # protobuf's DecodeError, whose module has no type stubs here
            raise ValueError(f"not a tf.train.Example ({e})") from None
        features = example.features.feature
        for key in self._keys:
            # An empty list may be stored as a Feature with no kind set.
            if key not in features or features[key].WhichOneof("kind") not in ("int64_list", None):
                raise ValueError(f"not a record of this dataset: no int64 feature {key!r}")
            values = features[key].int64_list.value
            mapped = [self._mapped(value) for value in values]
            values[:] = sorted(mapped) if key in self._ascending else mapped
        data = example.SerializeToString(deterministic=True)
        if len(data) != len(record):  # `for_map` rules this out
            raise ValueError("the class ids' new values change the record's length")
        return tfrecord.frame(data)

    def _mapped(self, value: int) -> int:
        if value < 0:  # no class
            return value
        if value not in self._map:
            raise ValueError(f"class id {value} is not one of the base's classes this build keeps")
        return self._map[value]
