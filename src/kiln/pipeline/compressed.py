"""Reading an annotation file that may be compressed, in memory bounded by what is asked for.

Beam's `FileSystems.open` decompresses a file by its suffix (``.gz``, ``.bz2``,
``.xz``, ``.lzma``, ``.deflate``, ``.zst``, ``.zstd``), but its reader
decompresses up to 16 MiB of compressed input at a time, whole: a 1 MB gzip
bomb named ``manifest.csv.gz`` became a GiB in memory at the first read,
before any cap on a line (`text_lines`) could apply. `open_decompressed`
opens the file as stored and decompresses it with readers whose
``read(n)`` holds about `n` bytes of output: Python's own for gzip, bzip2
and xz/lzma, zstandard's stream reader, and `_ZlibReader` for deflate.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO

from kiln.lazy_import import LazyModule

if TYPE_CHECKING:
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems
else:  # Beam on first use: validating a config needs none of it
    CompressionTypes = LazyModule("apache_beam.io.filesystem", "CompressionTypes")
    FileSystems = LazyModule("apache_beam.io.filesystems", "FileSystems")

# Compressed bytes read from the file at a time.
_PIECE_BYTES = 64 * 1024

# The suffixes by which `FileSystems.open` decompresses a file
# (`CompressionTypes.detect_compression_type`), compared in lower case.
SUFFIXES = (".bz2", ".deflate", ".gz", ".zst", ".zstd", ".xz", ".lzma")


def without_suffix(path: str) -> str:
    """`path` without the suffix it is decompressed by, if any (``m.jsonl.gz``
    -> ``m.jsonl``): what the file holds once read, for choosing its format."""
    lower = path.lower()
    for suffix in SUFFIXES:
        if lower.endswith(suffix):
            return path[: -len(suffix)]
    return path


def open_decompressed(path: str) -> Any:
    """`path` open for reading (``read``, ``close``, a context manager),
    decompressed as Beam's `FileSystems.open` would by its suffix, in bounded
    memory (see the module docstring).

    Raises:
      Exception: what the file system raises opening it; reading raises what
        the store or the decompressor does (`OSError`, `EOFError`, ...).
    """
    kind = CompressionTypes.detect_compression_type(path)
    raw = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    if kind == CompressionTypes.UNCOMPRESSED:
        return raw
    try:
        return _Decompressed(_READERS[kind](raw), raw)
    except BaseException:
        raw.close()
        raise


class _Decompressed:
    """A decompressing reader and the file under it, closed together."""

    def __init__(self, reader: Any, raw: BinaryIO):
        self._reader = reader
        self._raw = raw

    def read(self, size: int = -1) -> bytes:
        return self._reader.read(size)

    def close(self) -> None:
        try:
            self._reader.close()
        finally:
            self._raw.close()

    def __enter__(self) -> _Decompressed:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _ZlibReader:
    """A zlib stream's bytes (``.deflate``, as Beam writes it), at most the
    size asked for at a time; concatenated streams are read one after another."""

    def __init__(self, raw: BinaryIO):
        self._raw = raw
        self._decompressor = zlib.decompressobj()
        self._fed = False  # whether the decompressor was given input
        self._input = b""  # compressed bytes it has not taken yet

    def read(self, size: int = -1) -> bytes:
        if size == 0:
            return b""
        limit = size if size > 0 else _PIECE_BYTES
        while True:
            if not self._input:
                self._input = self._raw.read(_PIECE_BYTES)
                if not self._input:
                    if self._fed and not self._decompressor.eof:
                        raise EOFError("the file ends inside a compressed stream")
                    return b""
            out = self._decompressor.decompress(self._input, limit)
            self._fed = True
            self._input = self._decompressor.unconsumed_tail
            if self._decompressor.eof:  # what follows is another stream
                self._input = self._decompressor.unused_data
                self._decompressor, self._fed = zlib.decompressobj(), False
            if out:
                return out

    def close(self) -> None:
        """Nothing to release: `_Decompressed` closes the file."""


def _zstd_reader(raw: BinaryIO) -> Any:
    import zstandard  # Beam's dependency, for .zst files only

    return zstandard.ZstdDecompressor().stream_reader(
        raw, read_size=_PIECE_BYTES, read_across_frames=True, closefd=False
    )


_READERS: dict[str, Callable[[BinaryIO], Any]] = {
    "gzip": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    "bzip2": bz2.BZ2File,
    "lzma": lzma.LZMAFile,
    "zstd": _zstd_reader,
    "deflate": _ZlibReader,
}
