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

A gzip-compressed base's records are relabelled too: reading one means
inflating its shard from the start, so the files to relabel are grouped by
the base shard that holds their records and each such shard is inflated
once (`images.RewriteFromBaseShards`), not once per record.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from kiln.pipeline.statistics import TargetCounts
from kiln.schemas import Schema

# Record features that hold class ids (`kiln.schemas.schema_for`).
_ID_FEATURES = ("labels", "classes")


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

    def counts(self, counts: TargetCounts | None) -> TargetCounts | None:
        """A base record's statistics counts with this build's class ids."""
        if counts is None:
            return None
        return counts._replace(
            image_classes=tuple(sorted(self._map[c] for c in counts.image_classes)),
            objects=tuple((self._map[c], size) for c, size in counts.objects),
        )
