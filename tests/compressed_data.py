"""Compressed annotation files for the tests: zstd frames as zstd's tools
write them."""

from __future__ import annotations

import zstandard


def zstd_streamed(data: bytes, **params) -> bytes:
    """`data` as one zstd frame written as a stream: no content size in its
    header, a checksum at its end, a block per 128 KiB."""
    parameters = zstandard.ZstdCompressionParameters(write_checksum=True, **params)
    compressor = zstandard.ZstdCompressor(compression_params=parameters)
    stream = compressor.compressobj()
    return stream.compress(data) + stream.flush()
