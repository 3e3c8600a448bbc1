"""The record format shared by the build job and the reader.

`RECORD` declares a record's features once; the Beam encoder, the reader's
parse spec and decoder, and the metadata all derive from it. `DatasetInfo`
is the `kiln.json` written beside the shards.

The metadata (`kiln.schemas.metadata`, standard library only) is imported
here; the features (`kiln.schemas.features`, which needs TensorFlow) on
first use of one of their names, so that tools that only read kiln.json
(`kiln diff`) start without TensorFlow.
"""

from typing import TYPE_CHECKING, Any

from kiln.schemas.metadata import (
    DUPLICATES_FILENAME,
    ERRORS_FILENAME,
    INDEX_FILENAME,
    LATEST_FILENAME,
    METADATA_FILENAME,
    SPLIT_NAME_PATTERN,
    STAGING_PREFIX,
    ChannelStatistics,
    DatasetInfo,
    MetadataChecksumError,
    MetadataError,
    ShardInfo,
    SplitInfo,
    shard_filename,
)

if TYPE_CHECKING:
    from kiln.schemas.features import (
        ENCODINGS,
        RECORD,
        Feature,
        Schema,
        SchemaError,
        decode_image,
    )

_FEATURE_NAMES = frozenset(
    {"ENCODINGS", "RECORD", "Feature", "Schema", "SchemaError", "decode_image"}
)


def __getattr__(name: str) -> Any:
    if name in _FEATURE_NAMES:
        from kiln.schemas import features

        return getattr(features, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ENCODINGS",
    "RECORD",
    "Feature",
    "Schema",
    "SchemaError",
    "decode_image",
    "DUPLICATES_FILENAME",
    "ERRORS_FILENAME",
    "INDEX_FILENAME",
    "LATEST_FILENAME",
    "METADATA_FILENAME",
    "SPLIT_NAME_PATTERN",
    "STAGING_PREFIX",
    "ChannelStatistics",
    "DatasetInfo",
    "MetadataChecksumError",
    "MetadataError",
    "ShardInfo",
    "SplitInfo",
    "shard_filename",
]
