"""A manifest line longer than the cap (`text_lines.MAX_LINE_BYTES`): a file
with no line break, a binary file named as the manifest, a JSONL row with a
huge embedded string. It is never held whole: it becomes one ``line_too_long``
row naming its line, the rows after it keep their line numbers, and the build
goes on. The cap is lowered here so that a line of some MB is 50 times over it;
tests/test_hostile_inputs.py builds one over the real cap."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import tracemalloc
import zlib

import pytest

from conftest import make_config
from kiln.errors import ConfigError
from kiln.pipeline import build, compressed, sources, text_lines

CAP = 64 * 1024


@pytest.fixture
def low_cap(monkeypatch):
    monkeypatch.setattr(text_lines, "MAX_LINE_BYTES", CAP)


def good_images(corpus, count: int = 24) -> list[str]:
    """The absolute paths of `count` images of the demo corpus that decode."""
    keys = sorted(
        f"{name}/{file}"
        for name in os.listdir(corpus.out_dir)
        if os.path.isdir(os.path.join(corpus.out_dir, name))
        for file in os.listdir(os.path.join(corpus.out_dir, name))
    )
    keys = [key for key in keys if key not in corpus.broken][::2][:count]
    return [os.path.join(corpus.out_dir, key) for key in keys]


def dropped_rows(path: str) -> dict[str, tuple[str, str]]:
    """The rows of the manifest `path` dropped while it is read: key -> (reason, message)."""
    rows, _ = sources.manifest_rows(path)
    found = {}
    for row in rows:
        problem = sources.row_problem(row, path, from_source=False)
        if problem is not None:
            dropped = problem[0]
            found[dropped.key] = (dropped.reason, dropped.message)
    return found


def long_row(kind: str, size: int) -> str:
    """A row of about `size` bytes that would parse: a huge string in a field."""
    if kind == "jsonl":
        return json.dumps({"path": "circle/a.png", "label": "circle", "notes": "x" * size})
    return 'circle/a.png,"' + "x" * size + '"'


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_a_line_over_the_cap_is_one_row_and_the_build_goes_on(demo_corpus, tmp_path, low_cap, kind):
    images = good_images(demo_corpus)
    label = {path: os.path.basename(os.path.dirname(path)) for path in images}
    if kind == "jsonl":
        rows = [json.dumps({"path": path, "label": label[path]}) for path in images]
        header = []
    else:
        rows = [f"{path},{label[path]}" for path in images]
        header = ["path,label"]
    bad = "{not json" if kind == "jsonl" else "a.png,circle,one field too many"
    # Line numbers: the long row after the first six rows, a bad row right after it.
    lines = [*header, *rows[:6], long_row(kind, 50 * CAP), bad, *rows[6:]]
    manifest = tmp_path / f"manifest.{kind}"
    manifest.write_text("\n".join(lines) + "\n")
    long_line = len(header) + 7
    config = make_config(
        demo_corpus.out_dir,
        output=str(tmp_path / "out"),
        source={
            "type": "manifest",
            "path": str(manifest),
            "allowed_roots": [str(demo_corpus.out_dir)],
        },
        errors={"max_fraction": 0.2},
    )

    result = build(config)

    assert result.info.dropped == {"line_too_long": 1, "bad_row": 1}
    with open(os.path.join(result.dataset_dir, "errors.jsonl")) as f:
        errors = {row["key"]: row for row in map(json.loads, f)}
    assert sorted(errors) == [f"manifest.{kind}:{long_line}", f"manifest.{kind}:{long_line + 1}"]
    too_long = errors[f"manifest.{kind}:{long_line}"]
    assert (too_long["stage"], too_long["reason"]) == ("list", "line_too_long")
    assert too_long["uri"] == str(manifest)
    size = len(long_row(kind, 50 * CAP))
    assert too_long["message"] == (
        f"the line is {size} bytes long, more than the {CAP} bytes a line may hold "
        f"(one row per line): skipped unread"
    )
    assert errors[f"manifest.{kind}:{long_line + 1}"]["reason"] == "bad_row"
    stored = sum(split.num_examples for split in result.info.splits.values())
    assert stored == len(images)


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_reading_a_line_200_times_the_cap_holds_a_small_part_of_it(tmp_path, low_cap, kind):
    header = "" if kind == "jsonl" else "path,label\n"
    small = tmp_path / f"small.{kind}"
    small.write_text(header + long_row(kind, 2 * CAP) + "\n")
    dropped_rows(str(small))  # Beam's file system and the readers imported, not traced
    manifest = tmp_path / f"manifest.{kind}"
    size = 200 * CAP  # 13 MB
    manifest.write_text(header + long_row(kind, size) + "\n")

    tracemalloc.start()
    try:
        found = dropped_rows(str(manifest))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert [reason for reason, _ in found.values()] == ["line_too_long"]
    # A 64 KiB piece of the file at a time (and its text): not the line.
    assert peak < size / 10, peak


def test_jsonl_line_numbers_after_a_long_line_count_its_line_breaks(tmp_path, low_cap):
    # JSONL lines end at '\n', '\r\n' or a bare '\r', never at U+2028 (in a
    # JSON string, where it may stand unescaped): the long line counts as two.
    long_line = json.dumps({"path": "a.png", "label": "a", "notes": "x" * CAP + "\u2028 y"})
    long_line = long_line.replace("\\u2028", "\u2028") + '\r{"path": "c.png"}'
    lines = [
        json.dumps({"path": "b.png", "label": "b"}),
        long_line,
        "{not json",
        "x" * (CAP + 1),  # one byte over, at the end of the file without a line break
    ]
    manifest = tmp_path / "m.jsonl"
    manifest.write_bytes("\n".join(lines).encode())

    found = dropped_rows(str(manifest))

    assert {key: reason for key, (reason, _) in found.items()} == {
        "m.jsonl:2": "line_too_long",
        "m.jsonl:4": "bad_row",
        "m.jsonl:5": "line_too_long",
    }
    assert found["m.jsonl:5"][1].startswith(f"the line is {CAP + 1} bytes long, ")


def test_a_line_of_exactly_the_cap_is_read(tmp_path, low_cap):
    row = json.dumps({"path": "a.png", "label": "a", "notes": ""})
    row = row[:-2] + "x" * (CAP - len(row)) + '"}'
    assert len(row.encode()) == CAP
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(row + "\r\n" + row + "y\n")  # the '\r' counts: the first is over too

    rows, _ = sources.manifest_rows(str(manifest))

    assert [getattr(row, "reason", "row") for row in rows] == ["line_too_long", "line_too_long"]
    manifest.write_text(row + "\n" + row)
    rows, _ = sources.manifest_rows(str(manifest))
    assert [(type(row).__name__, row.line) for row in rows] == [("Row", 1), ("Row", 2)]


def test_a_csv_quoted_field_running_into_a_long_line_names_it(tmp_path, low_cap):
    lines = [
        "path,label",
        'a.png,"two',  # a quoted field over three lines, the third over the cap
        "lines",
        "x" * (2 * CAP) + '"',
        "b.png,b,one field too many",
    ]
    manifest = tmp_path / "m.csv"
    manifest.write_text("\n".join(lines) + "\n")

    found = dropped_rows(str(manifest))

    assert found["m.csv:2"][0] == "line_too_long"
    assert found["m.csv:2"][1].startswith(f"line 4: the line is {2 * CAP + 1} bytes long")
    assert "a quoted field runs on over 3 lines, to line 4" in found["m.csv:2"][1]
    assert found["m.csv:5"][0] == "bad_row"


def test_a_csv_manifest_whose_header_is_over_the_cap_is_a_config_error(tmp_path, low_cap):
    manifest = tmp_path / "m.csv"
    manifest.write_bytes(b"path,label" + b"," * (3 * CAP))  # no line break at all

    config = {"type": "manifest", "path": str(manifest)}
    with pytest.raises(ConfigError) as raised:
        sources.ManifestSource.model_validate(config).list_files(splits_from_source=False)

    assert str(raised.value) == (
        f"source.path: m.csv: line 1: the line is {3 * CAP + 10} bytes long, more than the "
        f"{CAP} bytes a line may hold; not a CSV header"
    )


def test_the_cap_the_config_reference_states_is_the_cap():
    described = sources.ManifestSource.model_fields["path"].description or ""
    assert f"({text_lines.MAX_LINE_BYTES} bytes)" in described


def compress(data: bytes, suffix: str) -> bytes:
    """`data` compressed as Beam reads a file with `suffix`."""
    import zstandard

    compressors = {
        ".gz": gzip.compress,
        ".bz2": bz2.compress,
        ".xz": lzma.compress,
        ".lzma": lambda data: lzma.compress(data, format=lzma.FORMAT_ALONE),
        ".deflate": zlib.compress,
        ".zst": zstandard.ZstdCompressor().compress,
    }
    return compressors[suffix](data)


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz", ".lzma", ".deflate", ".zst"])
def test_a_compressed_manifest_is_decompressed_a_piece_at_a_time(tmp_path, low_cap, suffix):
    # A bomb: 64 MiB of NUL on one line, some KB compressed. Beam's reader
    # decompressed 16 MiB of the file at a time whole, before the cap applied.
    rows = "path,label\na.png,a\n"
    small = tmp_path / f"small.csv{suffix}"
    small.write_bytes(compress(rows.encode(), suffix))
    assert [row.path for row in sources.manifest_rows(str(small))[0]] == ["a.png"]
    size = 64 << 20
    manifest = tmp_path / f"manifest.csv{suffix}"
    # Two streams one after the other, as `cat a.gz b.gz` makes: both are read.
    manifest.write_bytes(
        compress(b"path,label\n" + b"\0" * size + b"\n", suffix) + compress(b"a.png,a\n", suffix)
    )

    tracemalloc.start()
    try:
        found = [(type(row).__name__, row.line) for row in sources.manifest_rows(str(manifest))[0]]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert found == [("_BadRow", 2), ("Row", 3)]
    # xz and lzma hold their dictionary (8 MiB at the default preset).
    assert peak < size / 4, peak


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz", ".lzma", ".deflate", ".zst"])
def test_a_compressed_manifest_cut_short_is_a_config_error(tmp_path, suffix):
    # Beam's reader took a cut file for a shorter manifest (or an empty one),
    # and so did zstandard's stream reader (tests/test_compressed_files.py).
    manifest = tmp_path / f"m.csv{suffix}"
    rows = "".join(f"{i}.png,a\n" for i in range(1000))
    manifest.write_bytes(compress(f"path,label\n{rows}".encode(), suffix)[:-40])

    with pytest.raises(ConfigError) as raised:
        sources.ManifestSource.model_validate(
            {"type": "manifest", "path": str(manifest)}
        ).list_files(splits_from_source=False)

    # One message for every format (gzip's and bz2's readers say it otherwise).
    assert str(raised.value) == (
        f"source.path: cannot read manifest {manifest}: the file ends inside a compressed stream"
    )


def test_a_manifest_s_format_is_told_by_its_suffix_once_decompressed():
    from apache_beam.io.filesystem import CompressionTypes

    for suffix in compressed.SUFFIXES:
        # The suffixes looked past are those Beam's reader decompresses by.
        assert CompressionTypes.detect_compression_type(f"m.csv{suffix}") != (
            CompressionTypes.UNCOMPRESSED
        )
        assert sources.is_jsonl(f"m.jsonl{suffix}")
        assert sources.is_jsonl(f"m.json{suffix.upper()}")
        assert not sources.is_jsonl(f"m.csv{suffix}")
    assert sources.is_jsonl("m.jsonl") and not sources.is_jsonl("m.jsonl.tar")
