"""Records of a base version rewritten with this build's class ids, without decoding their images.

Class ids index the sorted class list, so a class added to a dataset (or
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
id bytes change, in place. The image step then hands it on like a reused
record, as where its frame is in the base shard (`sharding.ReusedRun`,
marked ``relabelled``), with its index entry, statistics and counts as this
build's; the shard writer, while it copies the base's frames, checks the
frame (length and CRCs), rewrites the ids in the record's bytes
(`FrameRelabel.frame`: the record's protobuf walked to the int64 lists of
``label``, ``labels`` and ``classes``, nothing decoded or serialized again)
and frames it with its new CRC. The record never goes through a sorted run,
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

import numpy as np

from kiln.pipeline import tfrecord
from kiln.pipeline.statistics import TargetCounts
from kiln.schemas import Schema

# Record features that hold class ids (`kiln.schemas.schema_for`).
_ID_FEATURES = ("labels", "classes")
# ... and the image's own class id, which `FrameRelabel` maps too.
_LABEL = "label"


class Relabel:
    """Maps a base version's class ids to this build's.

    Args:
      base_names: The base version's sorted class names (its kiln.json).
      names: This build's sorted class names.
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
            if name == "labels":  # ascending (a monotone map keeps it so; sorted to be sure)
                ids.sort()
            fields[name] = np.asarray(ids, dtype=np.int64)
        return self._schema.encode(fields)

    def frame_relabel(self) -> FrameRelabel | None:
        """What rewrites this map's ids in a framed record where the shard
        writer copies it (`FrameRelabel`), or None when some id's varint
        width changes (then records are rewritten by `record`)."""
        names = [name for name in (_LABEL, *_ID_FEATURES) if name in self._schema.names]
        return FrameRelabel.for_map(self._map, [self._schema.key(name) for name in names])

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


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """The varint at `pos` and where it ends; ValueError if it runs past `end`."""
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError(f"a varint runs past its field at byte {pos}")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        shift += 7
        if byte < 0x80:
            return value, pos


def _fields(data: bytes | memoryview, start: int, end: int):
    """``(field number, wire type, value start, value end)`` of each field of
    the protobuf message in ``data[start:end]`` (a varint's own bytes for
    wire type 0, a length-delimited field's contents for 2)."""
    pos = start
    while pos < end:
        tag, pos = _read_varint(data, pos, end)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, after = _read_varint(data, pos, end)
        elif wire == 2:
            length, pos = _read_varint(data, pos, end)
            after = pos + length
        elif wire == 1:
            after = pos + 8
        elif wire == 5:
            after = pos + 4
        else:
            raise ValueError(f"wire type {wire} at byte {pos}")
        if after > end:
            raise ValueError(f"field {number} runs past its message at byte {pos}")
        yield number, wire, pos, after
        pos = after


class FrameRelabel:
    """Rewrites the class ids of a framed record of a base version in its
    bytes: `frame` maps every id of the int64 lists the record holds under
    `keys` (``image/class/label``, ``image/class/labels``,
    ``objects/label``: the features `Relabel` maps) through `id_map`, and
    frames the record again. Picklable: the shard writer carries it.

    Only made for a map that keeps every id's varint width (`for_map`), so
    the record keeps its length: the ids are overwritten where they are,
    and every length in the record and the frame's header stay as they
    were. Those are the bytes `Relabel.record` gives (the serializer's
    layout depends on the features present and their lengths, not their
    values; ``labels`` stays ascending, as the map is monotone: both lists
    are sorted). A negative id (no class) is kept.

    Args:
      id_map: The base's class id -> this build's.
      keys: The record keys of the features holding class ids.
    """

    def __init__(self, id_map: Mapping[int, int], keys: Iterable[str]):
        self._map = dict(id_map)
        self._keys = frozenset(key.encode("utf-8") for key in keys)

    @classmethod
    def for_map(cls, id_map: Mapping[int, int], keys: Iterable[str]) -> FrameRelabel | None:
        """A `FrameRelabel`, or None when an id would change its varint width."""
        if any(_varint_size(old) != _varint_size(new) for old, new in id_map.items()):
            return None
        return cls(id_map, keys)

    def frame(self, framed: bytes | memoryview) -> bytes:
        """`framed` (one intact frame: `tfrecord.is_frame`) with its record's
        class ids mapped, and the record's CRC computed again.

        Raises:
          ValueError: the record is not a `tf.train.Example` as kiln writes
            them, or holds an id the map does not know (it is not the
            record the base's index says).
        """
        record = tfrecord.unframe(framed)
        start = tfrecord.HEADER_SIZE
        pieces: list[bytes | memoryview] = []
        done = 0
        for at, end, value in self._ids(record):
            new = self._mapped(value)
            if len(new) != end - at:  # `for_map` rules this out
                raise ValueError(f"class id {value} -> {new!r} changes the record's length")
            pieces += (record[done:at], new)
            done = end
        pieces.append(record[done:])
        data = b"".join(pieces)
        return b"".join((framed[:start], data, tfrecord.crc_bytes(data)))

    def _mapped(self, value: int) -> bytes:
        if value >= 1 << 63:  # negative: no class
            return _varint(value)
        if value not in self._map:
            raise ValueError(f"class id {value} is not one of the base's classes this build keeps")
        return _varint(self._map[value])

    def _ids(self, record: bytes | memoryview):
        """``(start, end, value)`` of each class id's varint in `record`, in order."""
        end = len(record)
        for number, wire, start, stop in _fields(record, 0, end):
            if (number, wire) != (1, 2):  # Example.features
                raise ValueError(f"not a tf.train.Example (field {number}, wire type {wire})")
            for number, wire, entry, entry_end in _fields(record, start, stop):
                if (number, wire) != (1, 2):  # Features.feature: map entries
                    raise ValueError(f"not a tf.train.Features (field {number})")
                yield from self._entry_ids(record, entry, entry_end)

    def _entry_ids(self, record: bytes | memoryview, start: int, end: int):
        key = None
        values: list[tuple[int, int]] = []
        for number, wire, at, stop in _fields(record, start, end):
            if number == 1 and wire == 2:
                key = bytes(record[at:stop])
            elif number == 2 and wire == 2:
                values.append((at, stop))
        if key not in self._keys:
            return
        for at, stop in values:  # the Feature message
            for number, wire, lists, lists_end in _fields(record, at, stop):
                if (number, wire) != (3, 2):  # Feature.int64_list
                    raise ValueError(f"{key!r} holds no int64 list (field {number})")
                for number, wire, pos, pos_end in _fields(record, lists, lists_end):
                    if number != 1 or wire not in (0, 2):  # Int64List.value
                        raise ValueError(f"{key!r}: not an Int64List (field {number})")
                    while pos < pos_end:  # packed: varints back to back; or one
                        value, after = _read_varint(record, pos, pos_end)
                        yield pos, after, value
                        pos = after
