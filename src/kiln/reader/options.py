"""The options of `kiln.reader.load` that most training scripts leave at their defaults."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How `load` reads the records, beyond what changes what you get.

    Frozen and checked when made: ``ReadOptions(shuffle_buffer=0)`` raises
    at once, naming the field, not when the dataset is first iterated.

    Attributes:
      shuffle_buffer: Records in the shuffle buffer. None: as many records
        as fit in 256 MB (by the shards' average record size), at least 1000
        and at most 10000, and at most this pipeline's share (which is then
        shuffled completely). A larger buffer mixes more and costs memory
        and start-up time; the stream stays a function of the seed.
      deterministic: Keep the element order fixed (the seeded streams depend
        on it). False lets parallel reads and maps deliver out of order:
        faster when some files or images are slow, but not reproducible.
      dynamic_sharding: For ``tf.data.experimental.service.distribute(
        processing_mode="distributed_epoch")`` (``ShardingPolicy.DYNAMIC``):
        the dispatcher hands each worker shard files as it asks for them,
        so no worker knows its pass length and the dataset asserts no
        cardinality (without this the workers fail with "Input dataset was
        expected to contain N elements"). Each element's augmentation
        depends on the seed, the pass and its record's key only, so it is
        the same whichever worker reads it. Excludes an `input_context`.
    """

    shuffle_buffer: int | None = None
    deterministic: bool = True
    dynamic_sharding: bool = False

    def __post_init__(self) -> None:
        buffer = self.shuffle_buffer
        if buffer is not None and (isinstance(buffer, bool) or not isinstance(buffer, int)):
            raise ValueError(f"ReadOptions.shuffle_buffer must be an int or None, got {buffer!r}")
        if buffer is not None and buffer < 1:
            raise ValueError(f"ReadOptions.shuffle_buffer must be a positive int, got {buffer!r}")
        if not isinstance(self.deterministic, bool):
            raise ValueError(
                f"ReadOptions.deterministic must be True or False, got {self.deterministic!r}"
            )
        if not isinstance(self.dynamic_sharding, bool):
            raise ValueError(
                f"ReadOptions.dynamic_sharding must be True or False, got {self.dynamic_sharding!r}"
            )
