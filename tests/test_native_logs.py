"""native_logs.filtered_stderr: what C libraries write to fd 2, filtered by line."""

from __future__ import annotations

import os

import pytest

from kiln import native_logs

IMAGE_LIBRARY_LINES = [
    b"libpng warning: iCCP: too short\n",
    b"libpng warning: tEXt: CRC error\n",
    b"libpng error: IDAT: invalid stored block lengths\n",
    b"Corrupt JPEG data: 4 extraneous bytes before marker 0xd9\n",
    b"Corrupt JPEG data: premature end of data segment\n",
    b"Premature end of JPEG file\n",
    b"Invalid SOS parameters for sequential JPEG\n",
    b"[ WARN:0@2.869] global grfmt_tiff.cpp:123 TIFF_Warning TIFFReadDirectory: Unknown field "
    b"with tag 65000 (0xfde8) encountered\n",
    b"TIFFReadDirectory: Warning, Unknown field with tag 65000 (0xfde8) encountered.\n",
    b"tempfile.tif: Using code not yet in table.\n",
    b"LZWDecode: Not enough data at scanline 0 (short 1525 bytes).\n",
    b"TIFFFillStrip: Read error on strip 0; got 0 bytes, expected 8061.\n",
]
# Errors nobody turned into a report row, and lines nobody anticipated: kept.
OTHER_LINES = [
    b"[ERROR:0@0.1] global loadsave.cpp:1726 imencodeWithMetadata imencode(): can't encode\n",
    b"Segmentation fault (core dumped)\n",
    b"/usr/lib/python3/warnings.py:1: UserWarning: something\n",
    b"a line that mentions libpng warning: later on\n",
    b"Premature end of JPEG file, and then some\n",
]


def test_image_library_lines_are_dropped_and_counted_and_the_rest_written_back(capfd):
    others = (OTHER_LINES * 3)[: len(IMAGE_LIBRARY_LINES)]
    interleaved = [line for pair in zip(IMAGE_LIBRARY_LINES, others, strict=True) for line in pair]
    with native_logs.filtered_stderr(native_logs.IMAGE_LIBRARY_LINES) as dropped:
        for line in interleaved:
            os.write(2, line)  # as a C library writes: below sys.stderr
        assert capfd.readouterr().err == ""  # nothing shows while the block runs
        assert dropped.count == 0
    assert capfd.readouterr().err == b"".join(
        line for line in interleaved if line not in IMAGE_LIBRARY_LINES
    ).decode("utf-8")
    assert dropped.count == len(IMAGE_LIBRARY_LINES)
    assert dropped.first == "libpng warning: iCCP: too short"


def test_line_ends_of_warnings_two_threads_interleaved_are_dropped_with_them(capfd):
    """libpng writes a warning and its line end in two calls: two decoding
    threads can leave both warnings on one line and their line ends after
    it. No blank line is left behind (cron mails any output of --quiet)."""
    with native_logs.filtered_stderr(native_logs.IMAGE_LIBRARY_LINES) as dropped:
        for piece in (
            b"libpng warning: iCCP: too short",
            b"libpng warning: tEXt: CRC error",
            b"\n",
            b"\n",
            b"kept\n",
            b"\n",
        ):
            os.write(2, piece)
    assert capfd.readouterr().err == "kept\n\n"
    assert dropped.count == 1


def test_fd_2_is_restored_when_the_block_raises(capfd):
    with pytest.raises(KeyboardInterrupt):
        with native_logs.filtered_stderr(native_logs.IMAGE_LIBRARY_LINES) as dropped:
            os.write(2, b"libpng warning: iCCP: too short\nstill running\n")
            raise KeyboardInterrupt
    os.write(2, b"kiln build: interrupted\n")
    assert capfd.readouterr().err == "still running\nkiln build: interrupted\n"
    assert dropped.count == 1


def test_by_default_only_abseils_notices_are_dropped(capfd):
    with native_logs.filtered_stderr():
        os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are ")
        os.write(2, b"written to STDERR\nlibpng warning: iCCP: too short\n")
    assert capfd.readouterr().err == "libpng warning: iCCP: too short\n"
