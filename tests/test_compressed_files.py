"""Compressed manifests and COCO files (`kiln.pipeline.compressed`) read
honestly: a file cut short is a config error naming it, never a shorter
file, whatever its format; a header that asks the decompressor for more
than `compressed.MAX_WINDOW_BYTES` (an xz/lzma dictionary, a zstd window)
is a config error naming the limit, and files within it are read; xz's
stream padding is passed over.
tests/test_hostile_inputs.py builds such files under a memory limit."""

from __future__ import annotations

import json
import lzma

import pytest
import zstandard

from compressed_data import (
    HOSTILE_MESSAGES,
    hostile_files,
    xz_with_a_dictionary_of,
    zstd_streamed,
)
from kiln.errors import ConfigError
from kiln.pipeline import compressed, sources
from kiln.pipeline.sources import CocoSource
from kiln.schemas import TargetsConfig


def csv_rows(count: int, start: int = 0) -> bytes:
    # Long paths, so that some thousands of rows take several zstd blocks (128 KiB each).
    return "".join(f"{'x' * 100}/{i}.png,a\n" for i in range(start, start + count)).encode()


def skippable_frame(content: bytes) -> bytes:
    """A zstd skippable frame (metadata a decoder passes over)."""
    return (0x184D2A53).to_bytes(4, "little") + len(content).to_bytes(4, "little") + content


def manifest_paths(path) -> list[str]:
    return [row.path for row in sources.manifest_rows(str(path))[0]]


def list_manifest(path) -> None:
    sources.ManifestSource.model_validate({"type": "manifest", "path": str(path)}).list_files(
        splits_from_source=False
    )


# A .zst manifest of three frames, as `cat` of compressed files and zstd's
# own tools make them: one with its content size, a skippable frame, one
# written as a stream over several blocks.
FIRST = b"path,label\n" + csv_rows(10)
SECOND = csv_rows(3000, start=10)
FRAMES = [
    zstandard.ZstdCompressor().compress(FIRST),
    skippable_frame(b"kiln"),
    zstd_streamed(SECOND),
]
EDGES = [sum(map(len, FRAMES[:i])) for i in range(len(FRAMES) + 1)]


def test_a_zstd_manifest_of_several_frames_is_read_whole(tmp_path):
    manifest = tmp_path / "m.csv.zst"
    manifest.write_bytes(b"".join(FRAMES))
    assert zstandard.get_frame_parameters(FRAMES[2]).content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert len(SECOND) > 2 * 128 * 1024

    assert manifest_paths(manifest) == [f"{'x' * 100}/{i}.png" for i in range(3010)]
    # Cut where a frame ends, it is a shorter .zst file, as with gzip.
    manifest.write_bytes(b"".join(FRAMES)[: EDGES[2]])
    assert len(manifest_paths(manifest)) == 10


@pytest.mark.parametrize(
    "cut",
    [
        1,  # in the first frame's magic number
        5,  # in its header
        EDGES[1] // 2,  # in its block
        EDGES[1] - 1,  # in its last byte
        EDGES[1] + 6,  # in the skippable frame's size
        EDGES[2] - 1,  # in its content
        EDGES[2] + 4,  # in the third frame's header
        EDGES[2] + 8,  # in its first block's header
        (EDGES[2] + EDGES[3]) // 2,  # in a block in its middle
        EDGES[3] - 4,  # before its checksum
        EDGES[3] - 1,  # in its checksum
    ],
)
def test_a_zstd_manifest_cut_inside_a_frame_is_a_config_error(tmp_path, cut):
    # zstandard's reader took such a file for a shorter manifest, or an empty one.
    manifest = tmp_path / "m.csv.zst"
    manifest.write_bytes(b"".join(FRAMES)[:cut])

    with pytest.raises(ConfigError) as raised:
        list_manifest(manifest)

    assert str(raised.value) == (
        f"source.path: cannot read manifest {manifest}: the file ends inside a compressed stream"
    )


# xz's stream padding: NUL bytes after a stream, a multiple of 4 of them
# (``xz`` reads them; some writers pad to a block or a tape record).
XZ_FIRST, XZ_SECOND = lzma.compress(FIRST), lzma.compress(csv_rows(5, start=10))


@pytest.mark.parametrize(
    ("padding", "streams"),
    [
        (4, 1),  # after the only stream
        (8, 2),  # between two streams and after the second
        (100 << 10 | 4, 2),  # more than a piece of the file read at a time
    ],
)
def test_an_xz_manifest_with_stream_padding_is_read_whole(tmp_path, padding, streams):
    # The padding at the end was "the file ends inside a compressed stream";
    # between streams, lzma's "Input format not supported by decoder".
    manifest = tmp_path / "m.csv.xz"
    pad = b"\0" * padding
    manifest.write_bytes(XZ_FIRST + pad + (XZ_SECOND + pad if streams == 2 else b""))

    rows = 10 + (5 if streams == 2 else 0)
    assert manifest_paths(manifest) == [f"{'x' * 100}/{i}.png" for i in range(rows)]


@pytest.mark.parametrize("between", [False, True])
def test_nul_bytes_after_an_xz_stream_that_are_not_padding_are_a_config_error(tmp_path, between):
    manifest = tmp_path / "m.csv.xz"
    manifest.write_bytes(XZ_FIRST + b"\0" * 6 + (XZ_SECOND if between else b""))

    with pytest.raises(ConfigError) as raised:
        list_manifest(manifest)

    assert str(raised.value) == (
        f"source.path: cannot read manifest {manifest}: the 6 NUL bytes after an xz stream are "
        f"not stream padding (a multiple of 4 bytes): the data is corrupt"
    )


BOXES = TargetsConfig.model_validate({"boxes": {}})


def coco_text(images: int) -> bytes:
    document = {
        "images": [
            {"id": i, "file_name": f"{i}.jpg", "width": 8, "height": 8} for i in range(images)
        ],
        "annotations": [],
        "categories": [{"id": 1, "name": "thing"}],
    }
    return json.dumps(document, indent=1).encode() + b"\n" * (300 << 10)  # whole blocks of it


def list_coco(path) -> None:
    source = CocoSource(type="coco", annotations=str(path), images=str(path.parent))
    source.list_files(splits_from_source=False, targets=BOXES)


@pytest.mark.parametrize("where", ["in its JSON", "in the line breaks after it"])
def test_a_zstd_coco_file_cut_inside_a_frame_is_a_config_error_naming_it(tmp_path, where):
    # The JSON parser said the file was not valid JSON (when the cut fell in
    # its JSON) or nothing (in the whitespace after it): the file was read.
    text = coco_text(3000)
    packed = zstd_streamed(text)
    annotations = tmp_path / "instances.json.zst"
    annotations.write_bytes(packed)
    list_coco(annotations)  # whole, it is read
    annotations.write_bytes(packed[: len(packed) // 2 if where == "in its JSON" else -6])

    with pytest.raises(ConfigError) as raised:
        list_coco(annotations)

    assert str(raised.value) == (
        f"source.annotations: cannot read {annotations}: the file ends inside a compressed stream"
    )


@pytest.mark.parametrize("suffix", [".xz", ".lzma", ".zst"])
def test_a_manifest_asking_for_a_dictionary_or_window_over_the_limit_is_a_config_error(
    tmp_path, suffix
):
    # lzma's decoder has no memory limit of its own: it allocated what the
    # header asked, up to 4 GiB for a few dozen bytes (a MemoryError, or the
    # machine's memory); zstandard's refused a window with no word of why.
    manifest = tmp_path / f"m.csv{suffix}"
    manifest.write_bytes(hostile_files(b"path,label\n" + csv_rows(3))[suffix])
    assert manifest.stat().st_size < 500

    with pytest.raises(ConfigError) as raised:
        list_manifest(manifest)

    assert str(raised.value) == (
        f"source.path: cannot read manifest {manifest}: {HOSTILE_MESSAGES[suffix]}"
    )


def test_a_coco_file_asking_for_a_dictionary_over_the_limit_is_a_config_error(tmp_path):
    annotations = tmp_path / "instances.json.xz"
    annotations.write_bytes(hostile_files(coco_text(3))[".xz"])

    with pytest.raises(ConfigError) as raised:
        list_coco(annotations)

    assert str(raised.value) == (
        f"source.annotations: cannot read {annotations}: {HOSTILE_MESSAGES['.xz']}"
    )


@pytest.mark.parametrize(
    ("suffix", "packed"),
    [
        (".xz", lambda data: lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)),  # 64 MiB
        (".xz", lambda data: xz_with_a_dictionary_of(128 << 20, data)),
        (".lzma", lambda data: xz_with_a_dictionary_of(128 << 20, data, alone=True)),
        (".zst", lambda data: zstd_streamed(data, window_log=27)),  # zstd --long's 128 MiB
    ],
)
def test_files_with_a_dictionary_or_window_up_to_the_limit_are_read(tmp_path, suffix, packed):
    rows = b"path,label\n" + csv_rows(3)
    manifest = tmp_path / f"m.csv{suffix}"
    manifest.write_bytes(packed(rows))

    assert manifest_paths(manifest) == [f"{'x' * 100}/{i}.png" for i in range(3)]


def test_the_limit_the_config_reference_states_is_the_limit():
    described = sources.ManifestSource.model_fields["type"].description or ""
    assert f"over {compressed.MAX_WINDOW_BYTES >> 20} MiB" in described
    assert compressed.MAX_WINDOW_BYTES >> 20 << 20 == compressed.MAX_WINDOW_BYTES
