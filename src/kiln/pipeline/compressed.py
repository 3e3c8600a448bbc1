"""Reading an annotation file that may be compressed, in memory bounded by what is asked for.

Beam's `FileSystems.open` decompresses a file by its suffix (``.gz``, ``.bz2``,
``.xz``, ``.lzma``, ``.deflate``, ``.zst``, ``.zstd``), but its reader
decompresses up to 16 MiB of compressed input at a time, whole: a 1 MB gzip
bomb named ``manifest.csv.gz`` became a GiB in memory at the first read,
before any cap on a line (`text_lines`) could apply. `open_decompressed`
opens the file as stored and decompresses it with readers whose
``read(n)`` holds about `n` bytes of output: Python's own for gzip and
bzip2, `_StreamsReader` over lzma's and zlib's decompressors for xz/lzma and
deflate, and zstandard's stream reader for zstd.

The bytes a decompressor keeps to refer back to are set by the file: an
xz/lzma dictionary (up to 4 GiB in an ``.lzma`` header), a zstd window (up to
2 GiB). A few hostile bytes would make it allocate that much, so both are
capped at `MAX_WINDOW_BYTES`; a file over it is refused (`WindowTooLarge`)
before the memory is taken.

A file that ends inside a compressed stream is an error (`EOFError`), never
a shorter file. zstandard's reader alone does not say so (its read returns
``b""`` at the end of the input inside a frame), so `_ZstdFrames` follows
the frames' layout in the bytes it is given and `_ZstdReader` raises. NUL
bytes after an xz stream are its stream padding, passed over when a
multiple of 4 (as ``xz`` does), an error otherwise.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import zlib
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple, Protocol, cast

from kiln.lazy_import import LazyModule

if TYPE_CHECKING:
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems
else:  # Beam on first use: validating a config needs none of it
    CompressionTypes = LazyModule("apache_beam.io.filesystem", "CompressionTypes")
    FileSystems = LazyModule("apache_beam.io.filesystems", "FileSystems")

# Compressed bytes read from the file at a time.
_PIECE_BYTES = 64 * 1024

_CUT_SHORT = "the file ends inside a compressed stream"

MAX_WINDOW_BYTES = 128 * 1024 * 1024
"""The most bytes a decompressor may keep to refer back to: an xz/lzma
dictionary, a zstd window. ``xz -9`` (and ``-9e``) writes a 64 MiB
dictionary; ``zstd --long`` a 128 MiB window, the most the zstd command
itself decompresses unless given ``--memory``. Real files stay within it; a
header declaring more is refused before the memory is taken."""

# What lzma's decoder takes besides its dictionary (some tens of KiB): its
# memory limit is the dictionary's and this.
_LZMA_STATE_BYTES = 1024 * 1024

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
        the store or the decompressor does (`OSError`, ...), `EOFError` if
        the file ends inside a compressed stream, `WindowTooLarge` if it
        needs a dictionary or window over `MAX_WINDOW_BYTES`.
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
        try:
            return self._reader.read(size)
        except EOFError:  # in the same words for every format
            raise EOFError(_CUT_SHORT) from None

    def close(self) -> None:
        try:
            self._reader.close()
        finally:
            self._raw.close()

    def __enter__(self) -> _Decompressed:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class WindowTooLarge(ValueError):
    """A compressed stream needs more than `MAX_WINDOW_BYTES` to decompress."""


class _Decompressor(Protocol):
    """One compressed stream's decompressor, as lzma's and bz2's are."""

    @property
    def eof(self) -> bool:
        """Whether the stream's end was reached."""

    @property
    def unused_data(self) -> bytes:
        """What followed the stream's end in the input given."""

    @property
    def needs_input(self) -> bool:
        """Whether `decompress` has no more output before it is given input."""

    def decompress(self, data: bytes, max_length: int = -1) -> bytes:
        """At most `max_length` bytes more of output, `data` added to the input."""


class _StreamsReader:
    """Compressed streams' bytes, at most the size asked for at a time;
    concatenated streams (``cat a.xz b.xz``) are read one after another.
    With `padded`, NUL bytes after a stream, a multiple of 4 of them, are
    passed over: xz's stream padding (the .xz format, section 2.2), which
    ``xz`` reads and some writers append to fill a block or a tape record."""

    def __init__(
        self,
        raw: BinaryIO,
        new_decompressor: Callable[[], _Decompressor],
        *,
        padded: bool = False,
    ):
        self._raw = raw
        self._new_decompressor = new_decompressor
        self._decompressor = new_decompressor()
        self._fed = False  # whether the decompressor was given input
        self._input = b""  # compressed bytes it has not been given yet
        self._padded = padded
        self._after_a_stream = False  # whether padding may come next

    def read(self, size: int = -1) -> bytes:
        if size == 0:
            return b""
        limit = size if size > 0 else _PIECE_BYTES
        while True:
            if self._after_a_stream:
                self._pass_padding()
            if not self._input and self._decompressor.needs_input:
                self._input = self._raw.read(_PIECE_BYTES)
                if not self._input:
                    if self._fed and not self._decompressor.eof:
                        raise EOFError(_CUT_SHORT)
                    return b""
            try:
                out = self._decompressor.decompress(self._input, limit)
            except lzma.LZMAError as e:
                if str(e) != "Memory usage limit exceeded":  # CPython's words for it
                    raise
                raise WindowTooLarge(
                    f"the file's xz/lzma dictionary is larger than the {_in_mib(MAX_WINDOW_BYTES)} "
                    f"kiln decompresses with"
                ) from None
            self._input, self._fed = b"", True
            if self._decompressor.eof:  # what follows is another stream
                self._input = self._decompressor.unused_data
                self._decompressor, self._fed = self._new_decompressor(), False
                self._after_a_stream = self._padded
            if out:
                return out

    def _pass_padding(self) -> None:
        """Passes over the NUL bytes that follow a stream, reading as far as
        needed, up to the next stream or the file's end.

        Raises:
          lzma.LZMAError: their count is not a multiple of 4 (as ``xz`` says).
        """
        count = 0
        while True:
            if not self._input:
                self._input = self._raw.read(_PIECE_BYTES)
                if not self._input:
                    break
            rest = self._input.lstrip(b"\0")
            count += len(self._input) - len(rest)
            self._input = rest
            if rest:
                break
        if count % 4:
            raise lzma.LZMAError(
                f"the {count} NUL bytes after an xz stream are not stream padding "
                f"(a multiple of 4 bytes): the data is corrupt"
            )
        self._after_a_stream = False

    def close(self) -> None:
        """Nothing to release: `_Decompressed` closes the file."""


def _lzma_decompressor() -> _Decompressor:
    return lzma.LZMADecompressor(memlimit=MAX_WINDOW_BYTES + _LZMA_STATE_BYTES)


class _ZlibDecompressor:
    """A zlib stream's decompressor (``.deflate``, as Beam writes it) as a
    `_Decompressor`: `zlib.decompressobj` hands back the input a limited
    call did not use, and does not say whether it holds more output."""

    def __init__(self) -> None:
        self._decompressor = zlib.decompressobj()
        self._tail = b""  # input it has not used
        self.needs_input = True

    @property
    def eof(self) -> bool:
        return self._decompressor.eof

    @property
    def unused_data(self) -> bytes:
        return self._decompressor.unused_data

    def decompress(self, data: bytes, max_length: int = -1) -> bytes:
        out = self._decompressor.decompress(self._tail + data, max(max_length, 0))
        self._tail = self._decompressor.unconsumed_tail
        # Output up to the limit may leave more inside zlib with no input left.
        self.needs_input = not self._tail and not 0 < max_length <= len(out)
        return out


class _ZstdReader:
    """A .zst file's frames' bytes, one after another, at most the size
    asked for at a time, by zstandard's stream reader; its end inside a
    frame is an error (see `_ZstdFrames`)."""

    def __init__(self, raw: BinaryIO):
        import zstandard  # Beam's dependency, for .zst files only

        self._frames = _ZstdFrames(raw)
        # The limit is `_ZstdFrames`' too, which names the window it refuses;
        # the decompressor's own keeps its memory to it whatever happens.
        decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES)
        self._reader = decompressor.stream_reader(
            cast(BinaryIO, self._frames),  # it calls `read(size)` only
            read_size=_PIECE_BYTES,
            read_across_frames=True,
            closefd=False,
        )

    def read(self, size: int = -1) -> bytes:
        out = self._reader.read(size)
        if not out and size != 0 and not self._frames.ended_at_a_frame_edge:
            raise EOFError(_CUT_SHORT)
        return out

    def close(self) -> None:
        self._reader.close()


class _Field(NamedTuple):
    """The next part of a .zst file's layout: its size, and whether its bytes
    are wanted (a header) or only counted (a block's content)."""

    size: int
    wanted: bool
    frame_edge: bool = False  # whether it starts a frame


class _ZstdFrames:
    """A .zst file's bytes as they are read, its frames' layout followed (RFC
    8878: each frame's header, its blocks' headers and sizes, its checksum;
    skippable frames), so that its end can be told to fall between frames
    or inside one. Only headers are kept: a block's content is counted.

    Raises (from `read`):
      WindowTooLarge: a frame declares a window over `MAX_WINDOW_BYTES`,
        before the decompressor is given its header.
    """

    def __init__(self, raw: BinaryIO):
        self._raw = raw
        self._layout = _zstd_layout()
        self._field = next(self._layout)
        self._left = self._field.size  # bytes of the field still to come
        self._kept = bytearray()  # a wanted field's bytes so far
        self._exhausted = False

    @property
    def ended_at_a_frame_edge(self) -> bool:
        """Whether the file was read to its end, and it ends between frames."""
        return self._exhausted and self._field.frame_edge and self._left == self._field.size

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self._exhausted = not data
        start = 0
        while start < len(data):
            taken = min(self._left, len(data) - start)
            if self._field.wanted:
                self._kept += data[start : start + taken]
            start += taken
            self._left -= taken
            while self._left == 0:  # the field is whole (or empty): the next one
                self._field = self._layout.send(bytes(self._kept))
                self._left = self._field.size
                self._kept.clear()
        return data


_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE_MAGIC = 0x184D2A50  # the 16 values from it up
_NOT_FOLLOWED = 1 << 62  # a field larger than any file: what is not zstd


def _zstd_layout() -> Generator[_Field, bytes, None]:
    """The fields of a .zst file one after another: yields the next, and is
    sent the bytes of a wanted one (and ``b""`` for one only counted)."""
    while True:
        magic = int.from_bytes((yield _Field(4, True, frame_edge=True)), "little")
        if magic & ~0xF == _SKIPPABLE_MAGIC:
            size = int.from_bytes((yield _Field(4, True)), "little")
            yield _Field(size, False)
            continue
        if magic != _ZSTD_MAGIC:  # the decompressor refuses it
            while True:
                yield _Field(_NOT_FOLLOWED, False)
        descriptor = (yield _Field(1, True))[0]
        single_segment = descriptor >> 5 & 1
        content_size_bytes = (single_segment, 2, 4, 8)[descriptor >> 6]
        header = yield _Field(
            1 - single_segment + (0, 1, 2, 4)[descriptor & 3] + content_size_bytes, True
        )
        if single_segment:  # the window is the content
            window = int.from_bytes(header[len(header) - content_size_bytes :], "little")
            window += 256 if content_size_bytes == 2 else 0
        else:
            exponent, mantissa = header[0] >> 3, header[0] & 7
            window = (8 + mantissa) << (7 + exponent)  # (1 + mantissa / 8) * 2 ** (10 + exponent)
        if window > MAX_WINDOW_BYTES:
            raise WindowTooLarge(
                f"a zstd frame declares a window of {_in_mib(window)}, more than the "
                f"{_in_mib(MAX_WINDOW_BYTES)} kiln decompresses with"
            )
        last = False
        while not last:
            block = int.from_bytes((yield _Field(3, True)), "little")
            last, kind, size = bool(block & 1), block >> 1 & 3, block >> 3
            yield _Field(1 if kind == 1 else size, False)  # an RLE block's content is 1 byte
        yield _Field(4 if descriptor >> 2 & 1 else 0, False)  # the content's checksum


def _in_mib(size: int) -> str:
    """`size` for a message: ``134217728 bytes (128 MiB)``."""
    return f"{size} bytes ({size / (1 << 20):g} MiB)"


_READERS: dict[str, Callable[[BinaryIO], Any]] = {
    "gzip": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    "bzip2": bz2.BZ2File,
    "lzma": lambda raw: _StreamsReader(raw, _lzma_decompressor, padded=True),
    "zstd": _ZstdReader,
    "deflate": lambda raw: _StreamsReader(raw, _ZlibDecompressor),
}
