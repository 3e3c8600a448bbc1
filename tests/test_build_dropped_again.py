"""A file the base build dropped as undecodable is dropped again unread.

An incremental build reads the files it has no base record for. A file the
base's job dropped at the decode stage (empty, not an image, corrupt, too
many pixels, too small) has none, so every nightly rebuild read it and
failed to decode it again. When its stamp is the one the base listed, the
same bytes give the same drop under the same processing: the job takes the
reason and message the base's job kept beside its listing
(``.file-stamps/<version>/.dropped-sha256.jsonl``) and drops it again
without reading it. The result is byte-identical to a build from scratch.

Not dropped again: a file whose stamp changed (read: fixed, it is stored),
a drop of another stage (a transform's may pass), a base that kept no
reasons (an older kiln's) or whose file is damaged, and a dataset with
targets (its drops also depend on annotations and masks). Real builds; the
proof that a file was not read is the image step's reads, noted
(`noted_reads`).
"""

import json
import os

import cv2
import numpy as np

import targets_data
from conftest import backdated, make_config
from kiln.pipeline import build, publish
from kiln.pipeline.command import summary
from test_build_file_stamps import noted_reads
from test_build_incremental import assert_same_dataset, copy_corpus, full_build, new_png


def read_keys(reads, images_dir) -> set[str]:
    return {os.path.relpath(uri, images_dir) for uri in reads}


def kept_drops(result) -> list[dict]:
    """The rows the build kept of the files its job read and dropped."""
    with open(drops_file(result)) as f:
        return [json.loads(line) for line in f]


def errors_of(result) -> list[dict]:
    with open(os.path.join(result.dataset_dir, "errors.jsonl")) as f:
        return [json.loads(line) for line in f]


def corpus_and_base(demo_corpus, tmp_path):
    images_dir = copy_corpus(demo_corpus, tmp_path)
    backdated(images_dir)
    config = make_config(images_dir, output=str(tmp_path / "out"))
    return images_dir, config, build(config)


def test_the_base_drops_are_dropped_again_without_reading_them(demo_corpus, tmp_path, monkeypatch):
    images_dir, config, base = corpus_and_base(demo_corpus, tmp_path)
    broken = set(demo_corpus.broken)
    # The base kept why it dropped each file it read: the next build's input.
    assert {row["key"]: row["reason"] for row in kept_drops(base)} == demo_corpus.broken
    assert {row["stage"] for row in kept_drops(base)} == {"decode"}
    added = "star/zz_added.png"
    (images_dir / added).write_bytes(new_png(7))
    reads = noted_reads(monkeypatch)

    incremental = build(config)

    assert read_keys(reads, images_dir) == {added}
    report = incremental.incremental
    assert report.used and report.dropped_again == len(broken)
    assert (report.processed, report.added, report.changed) == (1, 1, 0)
    assert incremental.counters["files_dropped_again"] == len(broken)
    assert incremental.info.dropped == base.info.dropped
    assert errors_of(incremental) == errors_of(base)
    text = summary(incremental)
    assert "processed 1 (1 new, 0 changed, 0 dropped)" in text
    assert f"dropped again as the base dropped them: {len(broken)} files, not read" in text
    # Kept again for the build after it, unchanged.
    assert kept_drops(incremental) == kept_drops(base)
    assert_same_dataset(incremental, full_build(config, tmp_path))


def test_a_broken_file_fixed_or_touched_is_read(demo_corpus, tmp_path, monkeypatch):
    images_dir, config, base = corpus_and_base(demo_corpus, tmp_path)
    fixed, touched, *others = sorted(demo_corpus.broken)
    # Fixed: a real image in its place (another inode, size and time).
    (images_dir / fixed).unlink()
    pixels = np.random.default_rng(3).integers(0, 256, (48, 56, 3), dtype=np.uint8)
    ok, encoded = cv2.imencode(os.path.splitext(fixed)[1] or ".png", pixels)
    assert ok
    (images_dir / fixed).write_bytes(encoded.tobytes())
    # Touched: its bytes and modification time kept, its ctime not (a chmod).
    os.chmod(images_dir / touched, 0o600)
    reads = noted_reads(monkeypatch)

    incremental = build(config)

    assert read_keys(reads, images_dir) == {fixed, touched}
    report = incremental.incremental
    assert report.dropped_again == len(others)
    assert (report.processed, report.added) == (2, 1)
    assert fixed not in {row["key"] for row in errors_of(incremental)}
    assert touched in {row["key"] for row in errors_of(incremental)}
    assert_same_dataset(incremental, full_build(config, tmp_path))


def drops_file(result) -> str:
    folder = os.path.join(result.dataset_root, publish.FILE_STAMPS_FOLDER, result.version)
    return os.path.join(folder, publish.DROPPED_SHA256S_FILE)


def add_old_file(images_dir, key: str, seed: int) -> None:
    """A new image, last modified an hour ago (not racily recent: the next
    build trusts its stamp)."""
    path = images_dir / key
    path.write_bytes(new_png(seed))
    earlier = path.stat().st_mtime - 3600
    os.utime(path, (earlier, earlier))


def test_a_base_that_kept_no_reasons_has_its_broken_files_read(demo_corpus, tmp_path, monkeypatch):
    """A base built by a kiln that kept only the key and sha256 of the files
    it dropped, or whose file is damaged: the broken files are read."""
    images_dir, config, base = corpus_and_base(demo_corpus, tmp_path)
    older = [{"key": row["key"], "sha256": row["sha256"]} for row in kept_drops(base)]
    with open(drops_file(base), "w") as f:
        f.writelines(json.dumps(row, sort_keys=True) + "\n" for row in older)
    add_old_file(images_dir, "star/zz_added.png", 7)
    reads = noted_reads(monkeypatch)

    incremental = build(config)

    assert read_keys(reads, images_dir) == {"star/zz_added.png", *demo_corpus.broken}
    assert incremental.incremental.dropped_again == 0
    assert incremental.counters.get("files_dropped_again", 0) == 0
    assert errors_of(incremental) == errors_of(base)

    # Damaged: the same, and counted.
    with open(drops_file(incremental), "w") as f:
        f.write("{not json\n")
    add_old_file(images_dir, "star/zz_added_2.png", 8)
    del reads[:]
    again = build(config)
    assert read_keys(reads, images_dir) == {"star/zz_added_2.png", *demo_corpus.broken}
    assert again.counters["base_drops_unreadable"] == 1
    assert again.incremental.dropped_again == 0
    assert_same_dataset(again, full_build(config, tmp_path))


def test_a_transform_failure_is_read_again(demo_corpus, tmp_path, monkeypatch):
    """A drop after decoding (here a crop larger than the image) is not
    taken from the base: a transform's failure may pass (a plugin's)."""
    images_dir = copy_corpus(demo_corpus, tmp_path)
    small = "circle/zz_small.png"
    ok, encoded = cv2.imencode(".png", np.full((20, 20, 3), 90, np.uint8))
    assert ok
    (images_dir / small).write_bytes(encoded.tobytes())
    backdated(images_dir)
    config = make_config(
        images_dir, output=str(tmp_path / "out"), transforms=[{"center_crop": {"size": 32}}]
    )
    base = build(config)
    assert {row["key"]: row["stage"] for row in kept_drops(base)}[small] == "transform"
    (images_dir / "star/zz_added.png").write_bytes(new_png(7))
    reads = noted_reads(monkeypatch)

    incremental = build(config)

    assert read_keys(reads, images_dir) == {"star/zz_added.png", small}
    assert incremental.incremental.dropped_again == len(demo_corpus.broken)
    assert small in {row["key"] for row in errors_of(incremental)}


def test_a_dataset_with_targets_reads_its_broken_images(tmp_path, monkeypatch):
    """With targets, a drop's version entry holds the annotations and the
    sha256 of the masks they name: the broken image is read (and its masks),
    giving a build from scratch's bytes."""
    from test_targets_build import config as targets_config

    folder = tmp_path / "data"
    targets_data.corpus(folder, 6)
    rows = [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()]
    broken = rows[2]["path"]
    (folder / broken).write_bytes(b"\x00not an image")
    backdated(folder)
    spec = targets_config(
        str(folder / "manifest.jsonl"), tmp_path / "out", errors={"max_fraction": 0.5}
    )
    base = build(spec)
    assert broken in {row["key"] for row in errors_of(base)}
    rows.append(targets_data.manifest_row(6, folder))
    targets_data.write_manifest(folder, rows)
    reads = noted_reads(monkeypatch)

    incremental = build(spec)

    assert any(uri.endswith(broken) for uri in reads)
    assert incremental.incremental.dropped_again == 0
    assert_same_dataset(incremental, build(dict(spec, output=str(tmp_path / "full"))))
