"""A file's UTF-8 text line by line, with a cap on what one line may hold in memory.

A manifest is data other teams fill, and a line of it is read whole before it
is parsed: a file without a line break (a binary or corrupt file named as the
manifest, a 450 MB single-line JSON) or a JSONL row with a huge embedded
string would take the launcher, or the worker of a listing job, down with
`MemoryError` or the OOM killer. `text_lines` reads fixed-size chunks and
holds at most `MAX_LINE_BYTES` of a line; a longer line is read through to
its end without being kept and comes back as a `LongLine`, so the manifest's
reader reports it as one bad row (``line_too_long``) and goes on at the next
line, with the line numbers after it unchanged.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
from collections.abc import Callable, Iterator

MAX_LINE_BYTES = 16 * 1024 * 1024
"""The bytes a manifest line may hold, its final ``\\n`` not counted. A COCO-like
JSONL row with hundreds of objects, their polygons and RLE masks is some hundreds
of KB (SA-1B's densest images, ~100 RLE masks each, a few MB); read and parsed,
a row takes some times its size in memory."""

# Bytes read at a time: the memory a line being skipped takes.
_CHUNK_BYTES = 64 * 1024

# The character other than '\n' that ends a line of a JSONL manifest (alone,
# not before a '\n': `sources._logical_lines`): its line numbers count it too.
_OTHER_BREAKS = "\r"


@dataclasses.dataclass(frozen=True)
class LongLine:
    """A line longer than the cap: read through to its end, never held.

    Attributes:
      size: Its bytes, its final ``\\n`` not counted.
      limit: The cap it exceeds (`MAX_LINE_BYTES`).
      sha256: The hex digest of those bytes: what identifies the line where
        its text would (a dropped row's version entry).
      lines: The lines a JSONL manifest's reader makes of its text
        (`sources._logical_lines`: 1 unless it holds a ``\\r`` not before
        its ``\\n``).
    """

    size: int
    limit: int
    sha256: str
    lines: int

    @property
    def problem(self) -> str:
        """What is wrong with the line, for its row's message."""
        return (
            f"the line is {self.size} bytes long, more than the {self.limit} bytes a line may hold"
        )

    @property
    def text(self) -> str:
        """The line's stand-in for its text: its size and digest."""
        return f"<a line of {self.size} bytes, sha256 {self.sha256}>"


def text_lines(read: Callable[[int], bytes], limit: int) -> Iterator[str | LongLine]:
    """The text `read` returns, line by line, as it is used: UTF-8 (a BOM
    dropped), lines ending at ``\\n`` only (as `io.StringIO` splits them), each
    with its ``\\n``; a line of more than `limit` bytes as a `LongLine`.

    Args:
      read: Returns up to that many more bytes of the file, ``b""`` at its end
        (a binary file's ``read``).
      limit: The most bytes of a line held at once, its ``\\n`` not counted.

    Raises:
      UnicodeDecodeError: the text is not UTF-8 (a skipped line's too); and
        whatever `read` raises.
    """
    splitter = _LineSplitter(limit)
    while chunk := read(_CHUNK_BYTES):
        *ended, rest = chunk.split(b"\n")
        for part in ended:
            yield splitter.end(part, newline=True)
        splitter.add(rest)
    if splitter.holds_a_line:
        last = splitter.end(b"", newline=False)
        if last != "":  # not a BOM alone
            yield last
    splitter.finish()


class _LineSplitter:
    """The line being read: its bytes so far, or once they exceed the cap,
    a `_SkippedLine` that counts them. Not thread-safe: one per file."""

    def __init__(self, limit: int):
        self._limit = limit
        # One decoder for the whole file, skipped lines included: it drops
        # the BOM at the start, and every byte is checked to be UTF-8.
        self._decoder = codecs.getincrementaldecoder("utf-8-sig")()
        self._start = bytearray()
        self._skipped: _SkippedLine | None = None

    @property
    def holds_a_line(self) -> bool:
        """Whether bytes of a line without its ``\\n`` were added."""
        return bool(self._start) or self._skipped is not None

    def add(self, data: bytes) -> None:
        """More of the current line (without a ``\\n``)."""
        if self._skipped is None and len(self._start) + len(data) <= self._limit:
            self._start += data
            return
        if self._skipped is None:
            self._skipped = _SkippedLine(self._decoder)
            self._skipped.add(bytes(self._start))
            self._start.clear()
        self._skipped.add(data)

    def end(self, data: bytes, *, newline: bool) -> str | LongLine:
        """The current line, ended by `data` (without a ``\\n``) and a
        ``\\n`` (or the end of the file)."""
        ending = b"\n" if newline else b""
        if self._skipped is None and not self._start and len(data) <= self._limit:
            return self._decoder.decode(data + ending, final=not newline)  # most lines
        self.add(data)
        if self._skipped is None:
            text = self._decoder.decode(bytes(self._start) + ending, final=not newline)
            self._start.clear()
            return text
        skipped, self._skipped = self._skipped, None
        return skipped.end(self._limit, newline=newline)

    def finish(self) -> None:
        """Checks that the file does not end inside a character.

        Raises:
          UnicodeDecodeError: it does.
        """
        self._decoder.decode(b"", final=True)


class _SkippedLine:
    """A line over the cap, counted as it is read and let go: its size, its
    digest, and its line breaks as a JSONL manifest's reader sees them
    (`sources._logical_lines`)."""

    def __init__(self, decoder: codecs.IncrementalDecoder):
        self._decoder = decoder
        self._digest = hashlib.sha256()
        self._size = 0
        self._breaks = 0
        self._last = ""  # its last character so far

    def add(self, data: bytes) -> None:
        self._digest.update(data)
        self._size += len(data)
        text = self._decoder.decode(data)
        if text:
            self._breaks += sum(text.count(character) for character in _OTHER_BREAKS)
            self._last = text[-1]

    def end(self, limit: int, *, newline: bool) -> LongLine:
        self._decoder.decode(b"\n" if newline else b"", final=not newline)
        # A line of each break and of the text after the last one; "\r\n" is
        # one break, so a '\r' before the '\n' adds none.
        ends_with_break = self._last == "\r" if newline else self._last in _OTHER_BREAKS
        lines = self._breaks + (0 if ends_with_break else 1)
        return LongLine(self._size, limit, self._digest.hexdigest(), lines)
