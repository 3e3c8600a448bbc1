"""TFRecord framing, written by hand so kiln controls every byte of a shard.

A TFRecord file is a sequence of frames::

    uint64 length            (little endian)
    uint32 masked_crc32c(length bytes)
    byte   data[length]
    uint32 masked_crc32c(data)

(the format `tf.data.TFRecordDataset` reads; see tensorflow/core/lib/io/
record_writer.cc). Beam's WriteToTFRecord would frame records the same way,
but it chooses shard contents and order itself; kiln needs both fixed.

Only the standard library and google-crc32c, which the pipeline extra
installs. (`kiln verify` checks CRCs with TensorFlow's record reader
instead, so that it runs in the reader-only install.)
"""

from __future__ import annotations

import struct

import google_crc32c

_MASK_DELTA = 0xA282EAD8
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")

LENGTH = _LENGTH  # the frame's length field, for readers of kiln's own shards
HEADER_SIZE = _LENGTH.size + _CRC.size  # 12
FOOTER_SIZE = _CRC.size  # 4


def masked_crc32c(data: bytes) -> int:
    """CRC32C of `data`, rotated and offset as TFRecord stores it.

    The mask keeps a CRC over data that itself contains CRCs well distributed.
    """
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """One record as TFRecord bytes (header, data, footer)."""
    length = _LENGTH.pack(len(record))
    return b"".join(
        (
            length,
            _CRC.pack(masked_crc32c(length)),
            record,
            _CRC.pack(masked_crc32c(record)),
        )
    )


def framed_size(record_size: int) -> int:
    """Bytes a record of `record_size` bytes takes in an uncompressed shard."""
    return HEADER_SIZE + record_size + FOOTER_SIZE
