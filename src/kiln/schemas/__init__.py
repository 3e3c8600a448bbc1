"""The record format shared by the build job and the reader.

`RECORD` declares a classification record's features once, and
`schema_for` the record of any declared targets (`TargetsConfig`); the Beam
encoder, the reader's parse spec and decoder, and the metadata all derive
from the schema. `DatasetInfo` is the `kiln.json` written beside the shards.
"""

from kiln.schemas.features import (
    ENCODINGS,
    MASK_ENCODINGS,
    RECORD,
    Feature,
    Schema,
    SchemaError,
    decode_image,
    decode_mask,
    decode_masks,
    schema_for,
)
from kiln.schemas.metadata import (
    DROPPED_OBJECTS_FILENAME,
    DUPLICATES_FILENAME,
    ERRORS_FILENAME,
    INDEX_FILENAME,
    LATEST_FILENAME,
    METADATA_FILENAME,
    SPLIT_NAME_PATTERN,
    STAGING_PREFIX,
    ChannelStatistics,
    ClassObjects,
    DatasetInfo,
    MetadataChecksumError,
    MetadataError,
    ObjectStatistics,
    ShardInfo,
    SplitInfo,
    ordered_splits,
    shard_filename,
    share_text,
)
from kiln.schemas.targets import CLASSIFICATION, TargetsConfig

__all__ = [
    "ENCODINGS",
    "MASK_ENCODINGS",
    "RECORD",
    "Feature",
    "Schema",
    "SchemaError",
    "decode_image",
    "decode_mask",
    "decode_masks",
    "schema_for",
    "CLASSIFICATION",
    "TargetsConfig",
    "DUPLICATES_FILENAME",
    "DROPPED_OBJECTS_FILENAME",
    "ERRORS_FILENAME",
    "INDEX_FILENAME",
    "LATEST_FILENAME",
    "METADATA_FILENAME",
    "SPLIT_NAME_PATTERN",
    "STAGING_PREFIX",
    "ChannelStatistics",
    "ClassObjects",
    "DatasetInfo",
    "MetadataChecksumError",
    "MetadataError",
    "ObjectStatistics",
    "ShardInfo",
    "SplitInfo",
    "ordered_splits",
    "shard_filename",
    "share_text",
]
