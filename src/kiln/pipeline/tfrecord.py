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


def masked_crc32c(data: bytes | memoryview) -> int:
    """CRC32C of `data`, rotated and offset as TFRecord stores it.

    The mask keeps a CRC over data that itself contains CRCs well distributed.
    (google_crc32c takes bytes only: a memoryview is copied first.)
    """
    crc = google_crc32c.value(data if isinstance(data, bytes) else bytes(data))
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """One record as TFRecord bytes (header, data, footer)."""
    header, footer = header_and_footer(record)
    return b"".join((header, record, footer))


def header_and_footer(record: bytes) -> tuple[bytes, bytes]:
    """The bytes around `record` in its frame: `frame` is ``header + record +
    footer`` (for writing a frame without copying the record into one)."""
    length = _LENGTH.pack(len(record))
    return length + _CRC.pack(masked_crc32c(length)), crc_bytes(record)


def crc_bytes(record: bytes | memoryview) -> bytes:
    """A frame's footer: the masked CRC32C of `record`, as stored."""
    return _CRC.pack(masked_crc32c(record))


def framed_size(record_size: int) -> int:
    """Bytes a record of `record_size` bytes takes in an uncompressed shard."""
    return HEADER_SIZE + record_size + FOOTER_SIZE


def unframe(framed: bytes | memoryview) -> bytes | memoryview:
    """The record inside one frame (no check: see `is_frame`)."""
    return framed[HEADER_SIZE : len(framed) - FOOTER_SIZE]


def is_frame(framed: bytes | memoryview) -> bool:
    """Whether `framed` is exactly one intact frame: its length field says
    its size, and both CRCs match."""
    if len(framed) < HEADER_SIZE + FOOTER_SIZE:
        return False
    (length,) = _LENGTH.unpack_from(framed)
    if length != len(framed) - HEADER_SIZE - FOOTER_SIZE:
        return False
    (length_crc,) = _CRC.unpack_from(framed, _LENGTH.size)
    if length_crc != masked_crc32c(framed[: _LENGTH.size]):
        return False
    (crc,) = _CRC.unpack_from(framed, len(framed) - FOOTER_SIZE)
    return crc == masked_crc32c(unframe(framed))
