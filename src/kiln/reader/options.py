"""The options of `kiln.reader.load` that most training scripts leave at their defaults."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping

# The dtypes `ReadOptions.label_dtype` takes for class ids.
LABEL_DTYPES = ("int64", "int32")


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How `load` reads the records, and the class ids' dtype.

    Frozen and checked when made: ``ReadOptions(shuffle_buffer=0)`` raises
    at once, naming the field, not when the dataset is first iterated.

    `load` and `load_for_model` take only a `ReadOptions`, not a dict of
    its fields: a dict is refused with a TypeError that spells the call to
    make instead (``options=kiln.reader.ReadOptions(shuffle_buffer=10)``).
    The class is the one typed spelling of these options, checked by type
    checkers and by itself when made, where the mistake is written; a dict
    would take a second, untyped path that is checked only inside `load`.
    From a config file: ``ReadOptions(**config["read_options"])`` (an
    unknown key is named by the TypeError of ``__init__``).

    Attributes:
      shuffle_buffer: Records in the shuffle buffer (an int or a NumPy
        integer). None: as many records
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
      label_dtype: The dtype of class ids: ``label``, multi-label
        ``labels`` and per-object ``classes`` (one-hot and multi-hot
        vectors stay float32). ``"int64"`` (the default, as stored, as
        PyTorch's losses take them) or ``"int32"`` (as JAX holds them
        without ``jax_enable_x64``, where int64 arrays are converted with a
        warning, and as TPU input pipelines often carry them). By name, or
        a NumPy or TensorFlow dtype (``np.int32``, ``tf.int32``).
    """

    shuffle_buffer: int | None = None
    deterministic: bool = True
    dynamic_sharding: bool = False
    label_dtype: str = "int64"

    def __post_init__(self) -> None:
        # numbers.Integral: an int or a NumPy integer (``records // np.int64(4)``),
        # as `load` takes its counts; stored as an int.
        buffer: object = self.shuffle_buffer
        if buffer is not None:
            if isinstance(buffer, bool) or not isinstance(buffer, numbers.Integral):
                raise ValueError(
                    f"ReadOptions.shuffle_buffer must be an int or None, got {buffer!r}"
                )
            if buffer < 1:
                raise ValueError(
                    f"ReadOptions.shuffle_buffer must be a positive int, got {buffer!r}"
                )
            object.__setattr__(self, "shuffle_buffer", int(buffer))
        if not isinstance(self.deterministic, bool):
            raise ValueError(
                f"ReadOptions.deterministic must be True or False, got {self.deterministic!r}"
            )
        if not isinstance(self.dynamic_sharding, bool):
            raise ValueError(
                f"ReadOptions.dynamic_sharding must be True or False, got {self.dynamic_sharding!r}"
            )
        # Stored by name, so that equal options compare equal however given.
        object.__setattr__(self, "label_dtype", _label_dtype_name(self.label_dtype))


def _label_dtype_name(dtype: object) -> str:
    """The name in `LABEL_DTYPES` of `dtype`: a name, a NumPy dtype or scalar type
    (``np.dtype("int32")``, ``np.int32``) or a TensorFlow dtype (``tf.int32``),
    all read by name, so that checking it needs neither NumPy nor TensorFlow."""
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None)
    if not isinstance(name, str) and isinstance(dtype, type):
        name = dtype.__name__  # np.int32
    if name not in LABEL_DTYPES:
        raise ValueError(
            f"ReadOptions.label_dtype must be one of {LABEL_DTYPES} (the class ids' dtype), "
            f"got {dtype!r}"
        )
    return name


def as_read_options(options: object) -> ReadOptions:
    """`options` as given to `load` (None: the defaults).

    Raises:
      TypeError: for anything but a `ReadOptions` or None, naming `options`
        and `ReadOptions`; for a mapping, with the call to write instead.
    """
    if options is None:
        return ReadOptions()
    if isinstance(options, ReadOptions):
        return options
    if isinstance(options, Mapping):
        if all(isinstance(key, str) and key.isidentifier() for key in options):
            fields = ", ".join(f"{key}={value!r}" for key, value in options.items())
        else:
            fields = f"**{dict(options)!r}"
        raise TypeError(
            f"options must be a kiln.reader.ReadOptions, not a {type(options).__name__}: "
            f"pass options=kiln.reader.ReadOptions({fields})"
        )
    raise TypeError(
        f"options must be a kiln.reader.ReadOptions or None, got {type(options).__name__} "
        f"{options!r}"
    )
