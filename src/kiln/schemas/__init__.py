"""The record format shared by the build job and the reader.

`RECORD` declares a record's features once; the Beam encoder, the reader's
parse spec and decoder, and the metadata all derive from it. `DatasetInfo`
is the `kiln.json` written beside the shards.
"""

from kiln.schemas.features import (
    ENCODINGS,
    RECORD,
    Feature,
    Schema,
    SchemaError,
    decode_image,
)
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
    ordered_splits,
    shard_filename,
    share_text,
)

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
    "ordered_splits",
    "shard_filename",
    "share_text",
]
