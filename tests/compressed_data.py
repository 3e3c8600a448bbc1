"""Compressed annotation files for the tests: zstd frames as zstd's tools
write them, and small files whose headers ask the decompressor for
gibibytes, with the message kiln refuses each with."""

from __future__ import annotations

import lzma

import zstandard

LIMIT = "134217728 bytes (128 MiB)"  # kiln.pipeline.compressed.MAX_WINDOW_BYTES


def zstd_streamed(data: bytes, **params) -> bytes:
    """`data` as one zstd frame written as a stream: no content size in its
    header, a checksum at its end, a block per 128 KiB."""
    parameters = zstandard.ZstdCompressionParameters(write_checksum=True, **params)
    compressor = zstandard.ZstdCompressor(compression_params=parameters)
    stream = compressor.compressobj()
    return stream.compress(data) + stream.flush()


def xz_with_a_dictionary_of(size: int, data: bytes, *, alone: bool = False) -> bytes:
    """`data` as .xz (or .lzma) whose header declares a `size`-byte dictionary."""
    lzma_filter = {
        "id": lzma.FILTER_LZMA1 if alone else lzma.FILTER_LZMA2,
        "dict_size": size,
        "mf": lzma.MF_HC3,  # the compressor's own memory: some MB, whatever the dictionary
    }
    file_format = lzma.FORMAT_ALONE if alone else lzma.FORMAT_XZ
    return lzma.compress(data, format=file_format, filters=[lzma_filter])


def lzma_declaring_4_gib(data: bytes) -> bytes:
    """`data` as .lzma whose header declares a dictionary of 4 GiB - 1, the
    most the format can: what the compressor writes, its size field raised."""
    packed = bytearray(xz_with_a_dictionary_of(1 << 20, data, alone=True))
    packed[1:5] = (0xFFFFFFFF).to_bytes(4, "little")  # no checksum covers the header
    return bytes(packed)


def hostile_files(data: bytes) -> dict[str, bytes]:
    """Small files whose headers ask for more than the limit: suffix -> bytes."""
    return {
        ".xz": xz_with_a_dictionary_of(1536 << 20, data),  # the most xz writes, 1.5 GiB
        ".lzma": lzma_declaring_4_gib(data),
        ".zst": zstd_streamed(data, window_log=31),  # 2 GiB
    }


HOSTILE_MESSAGES = {
    ".xz": f"the file's xz/lzma dictionary is larger than the {LIMIT} kiln decompresses with",
    ".lzma": f"the file's xz/lzma dictionary is larger than the {LIMIT} kiln decompresses with",
    ".zst": (
        f"a zstd frame declares a window of 2147483648 bytes (2048 MiB), more than the "
        f"{LIMIT} kiln decompresses with"
    ),
}
