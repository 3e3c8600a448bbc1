"""Incremental builds trust mask files' stamps as they trust images': a mask
file whose path and stamp (size, modification time, and a local file's
inode and ctime) are those the base build listed for its image is not
read, its sha256 taken from the base's record index (``masks``), unless
the record is processed after all. A mask rewritten or replaced with its
size and modification time restored, or swapped with another by renames,
is read. The cost of a nightly
rebuild of a segmentation dataset then follows what changed, not its size:
the ``masks_read`` / ``masks_not_read`` counters show it. ``--rehash`` reads
every mask; a mask modified as the base build started is read by the job and
verified by content by the up-to-date check; a base without its kept
listing reads every mask as before. Real builds throughout (a manifest of
generated images with a semantic mask file each and instance mask files)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import cv2
import numpy as np
import pytest

import targets_data as data
from conftest import backdated
from kiln.pipeline import build, incremental, publish, target_rows
from kiln.pipeline.command import summary
from test_build_file_stamps import (
    replace_keeping_stamp,
    rewrite_keeping_stamp,
    swap_by_renames,
    without_inode_ctime,
)
from test_targets_build import config as targets_config
from test_targets_incremental import assert_same_dataset, index_rows, read_rows

COUNT = 6


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """The corpus, written once and dated an hour back; each test copies it
    (the copy keeps the dates). The semantic mask of image 4 is an
    uncompressed PNG: its size depends on its shape alone, so it can be
    rewritten with other pixels and the same size."""
    folder = tmp_path_factory.mktemp("mask-stamps")
    data.corpus(folder, COUNT)
    rows = [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()]
    path = folder / rows[4]["mask"]
    mask = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    path.write_bytes(stored_png(mask))
    return backdated(folder)


@pytest.fixture
def corpus(pristine, tmp_path):
    folder = tmp_path / "data"
    shutil.copytree(pristine, folder)
    return folder


def config_of(folder, tmp_path, name="out"):
    return targets_config(str(folder / "manifest.jsonl"), tmp_path / name)


def stored_png(pixels: np.ndarray) -> bytes:
    ok, encoded = cv2.imencode(".png", pixels, [cv2.IMWRITE_PNG_COMPRESSION, 0])
    assert ok
    return encoded.tobytes()


def png(pixels: np.ndarray) -> bytes:
    ok, encoded = cv2.imencode(".png", pixels)
    assert ok
    return encoded.tobytes()


def masks_of(row: dict) -> list[str]:
    """The mask files (paths relative to the corpus) a manifest row names."""
    return [path for _, path in target_rows.mask_uris(row)]


def all_masks(rows: list[dict]) -> set[str]:
    return {path for row in rows for path in masks_of(row)}


def edited_mask(folder, path: str) -> np.ndarray:
    """The semantic mask at `path` with its first row's values swapped
    between classes 0 and 1: other pixels, still class ids."""
    mask = cv2.imread(str(folder / path), cv2.IMREAD_UNCHANGED)
    mask[0, :] = 1 - mask[0, :].clip(0, 1)
    return mask


def sha256_of(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def row_of(result, key: str):
    return next(row for row in index_rows(result) if row.key == key)


def key_of(folder, row: dict) -> str:
    """The key a manifest row's image is stored under: its path as the
    manifest gives it."""
    return row["path"]


def touch_an_image(folder, row: dict) -> None:
    """Another image under the row's path, its annotations unchanged."""
    pixels = cv2.imread(str(folder / row["path"]))
    pixels[0, 0] = (7, 7, 7)
    (folder / row["path"]).write_bytes(png(pixels))


def test_a_nightly_rebuild_reads_the_masks_of_the_changed_image_only(corpus, tmp_path):
    config = config_of(corpus, tmp_path)
    build(config)
    rows = read_rows(corpus)
    total = len(all_masks(rows))
    changed = rows[2]
    assert len(masks_of(changed)) >= 2  # a semantic mask and an instance mask
    touch_an_image(corpus, changed)

    night = build(config)

    report = night.incremental
    assert report.used and (report.changed, report.reused) == (1, COUNT - 1)
    # The changed image was decoded: its masks were read. No other was.
    assert night.counters["masks_read"] == len(masks_of(changed))
    assert night.counters["masks_not_read"] == total - len(masks_of(changed))
    assert report.masks_not_read == total - len(masks_of(changed))
    assert f"not read: {COUNT - 1} files and {report.masks_not_read} mask files" in summary(night)
    # The sha256s the index keeps are those of the masks' bytes.
    for row in rows:
        assert row_of(night, key_of(corpus, row)).masks == tuple(
            sha256_of(corpus / path) for path in masks_of(row)
        )
    assert_same_dataset(night, build(config_of(corpus, tmp_path, "full"), full=True))


def test_a_mask_edited_in_place_is_read_and_its_record_rebuilt(corpus, tmp_path):
    config = config_of(corpus, tmp_path)
    base = build(config)
    rows = read_rows(corpus)
    edited = rows[3]
    (corpus / edited["mask"]).write_bytes(png(edited_mask(corpus, edited["mask"])))

    night = build(config)

    report = night.incremental
    assert (report.changed, report.reused) == (1, COUNT - 1)
    assert report.not_read == COUNT - 1  # the edited mask's image was read: it was decoded
    key = key_of(corpus, edited)
    assert row_of(night, key).masks[0] == sha256_of(corpus / edited["mask"])
    assert row_of(night, key).masks != row_of(base, key).masks
    assert night.counters["masks_read"] == len(masks_of(edited))
    assert night.counters["masks_not_read"] == len(all_masks(rows)) - len(masks_of(edited))
    assert_same_dataset(night, build(config_of(corpus, tmp_path, "full"), full=True))


@pytest.mark.parametrize("how", ["rewritten", "replaced"])
def test_a_mask_rewritten_with_its_stamp_restored_is_read_without_rehash(corpus, tmp_path, how):
    """``cp -p`` over it, ``touch -r`` (a new ctime) or ``tar x`` (a new
    inode): other pixels, the same size and modification time. The inputs'
    stamp differs, and the job reads that mask (and no other), its record
    rebuilt as a build from scratch builds it."""
    config = config_of(corpus, tmp_path)
    base = build(config)
    rows = read_rows(corpus)
    rewritten = rows[4]
    path = corpus / rewritten["mask"]
    before = sha256_of(path)
    restored = rewrite_keeping_stamp if how == "rewritten" else replace_keeping_stamp
    restored(path, stored_png(edited_mask(corpus, rewritten["mask"])))
    assert sha256_of(path) != before

    night = build(config)

    key = key_of(corpus, rewritten)
    assert not night.up_to_date and night.incremental.hashed_all == ""
    assert (night.incremental.changed, night.incremental.reused) == (1, COUNT - 1)
    assert row_of(night, key).masks[0] == sha256_of(path) != row_of(base, key).masks[0]
    # The rewritten mask was read; its image then, to be decoded, and its other masks.
    assert night.counters["masks_read"] == len(masks_of(rewritten))
    assert night.counters["masks_not_read"] == len(all_masks(rows)) - len(masks_of(rewritten))
    assert_same_dataset(night, build(config_of(corpus, tmp_path, "full"), full=True))


def test_two_same_size_masks_swapped_by_renames_are_read(corpus, tmp_path):
    """Two semantic masks of the same size and modification time swapped by
    renames: each path keeps its size and time, not its inode. Both are
    read, both records rebuilt, as a build from scratch builds them."""
    rows = read_rows(corpus)
    first, second = corpus / rows[4]["mask"], corpus / rows[5]["mask"]
    second.write_bytes(stored_png(edited_mask(corpus, rows[4]["mask"])))
    assert first.stat().st_size == second.stat().st_size
    assert sha256_of(first) != sha256_of(second)
    when = first.stat().st_mtime_ns - 3600 * 10**9
    os.utime(first, ns=(when, when))
    os.utime(second, ns=(when, when))
    config = config_of(corpus, tmp_path)
    base = build(config)
    swap_by_renames(first, second)

    night = build(config)

    assert not night.up_to_date and night.version != base.version
    keys = key_of(corpus, rows[4]), key_of(corpus, rows[5])
    assert row_of(night, keys[0]).masks[0] == row_of(base, keys[1]).masks[0]
    assert row_of(night, keys[1]).masks[0] == row_of(base, keys[0]).masks[0]
    assert night.incremental.changed == 2
    assert night.counters["masks_read"] == len(masks_of(rows[4])) + len(masks_of(rows[5]))
    assert_same_dataset(night, build(config_of(corpus, tmp_path, "full"), full=True))


def test_a_mask_modified_as_the_base_build_started_is_read_by_the_job(corpus, tmp_path):
    """A mask stamp at or after the start of the build that listed it (here a
    minute ahead) is not trusted: the next job reads it."""
    config = config_of(corpus, tmp_path)
    rows = read_rows(corpus)
    racy = corpus / rows[4]["mask"]
    ahead = os.stat(racy).st_mtime + 3600 + 60  # an hour back, then a minute ahead of now
    os.utime(racy, (ahead, ahead))
    build(config)
    touch_an_image(corpus, rows[1])

    night = build(config)

    assert night.counters["base_mask_stamps_too_recent"] == 1
    assert night.counters["masks_read"] == len(masks_of(rows[1])) + 1
    assert night.counters["masks_not_read"] == len(all_masks(rows)) - len(masks_of(rows[1])) - 1
    assert night.incremental.changed == 1


def build_started(result) -> float:
    folder = os.path.join(result.dataset_root, publish.FILE_STAMPS_FOLDER, result.version)
    with open(os.path.join(folder, publish.LISTED_FROM_FILE)) as f:
        return float(f.read())


def test_a_mask_written_just_before_a_build_is_verified_by_content(corpus, tmp_path, caplog):
    """The up-to-date check reads a racily clean mask file and compares it
    with the sha256 its image's record keeps: equal, the version is up to
    date. Rewritten with its size and time restored, its ctime is not as
    listed: the inputs' stamp differs (nothing to verify), and the job
    runs and stores the new mask."""
    config = config_of(corpus, tmp_path)
    rows = read_rows(corpus)
    racy = corpus / rows[4]["mask"]
    racy.write_bytes(racy.read_bytes())  # modified now
    base = build(config)
    assert build_started(base) - incremental.RACY_SECONDS <= os.stat(racy).st_mtime  # no wait
    caplog.set_level("INFO", logger="kiln.pipeline.up_to_date")

    again = build(config)

    assert again.up_to_date and again.version == base.version
    assert "read the 1 file modified within 2 s" in caplog.text

    rewrite_keeping_stamp(racy, stored_png(edited_mask(corpus, rows[4]["mask"])))

    night = build(config)

    assert not night.up_to_date and night.version != base.version
    assert "the bytes of its mask file" not in caplog.text
    key = key_of(corpus, rows[4])
    assert row_of(night, key).masks[0] == sha256_of(racy)
    assert night.incremental.changed == 1


def test_a_base_without_its_kept_listing_reads_every_mask(corpus, tmp_path):
    config = config_of(corpus, tmp_path)
    base = build(config)
    shutil.rmtree(os.path.join(base.dataset_root, publish.FILE_STAMPS_FOLDER, base.version))
    rows = read_rows(corpus)
    touch_an_image(corpus, rows[2])

    night = build(config)

    assert "keeps no file stamps" in night.incremental.hashed_all
    assert night.counters["masks_read"] == len(all_masks(rows))
    assert night.counters.get("masks_not_read", 0) == 0
    assert (night.incremental.changed, night.incremental.reused) == (1, COUNT - 1)
    assert_same_dataset(night, build(config_of(corpus, tmp_path, "full"), full=True))


def test_a_base_whose_index_keeps_no_mask_sha256s_reads_every_mask(corpus, tmp_path, monkeypatch):
    """A base built by a kiln before the index kept mask sha256s (here: its
    build given none to keep): its masks are read, and its reused records'
    index lines gain them, as a build from scratch writes them."""
    from kiln.pipeline import targets

    config = config_of(corpus, tmp_path)
    with monkeypatch.context() as older:
        older.setattr(targets.ListedTargets, "mask_sha256s", property(lambda self: None))
        base = build(config)
    assert all(row.masks is None for row in index_rows(base))
    rows = read_rows(corpus)
    touch_an_image(corpus, rows[2])

    night = build(config)

    assert (night.incremental.changed, night.incremental.reused) == (1, COUNT - 1)
    assert night.counters["masks_read"] == len(all_masks(rows))
    assert night.counters.get("masks_not_read", 0) == 0
    assert all(row.masks for row in index_rows(night))
    assert_same_dataset(night, build(config_of(corpus, tmp_path, "full"), full=True))


def test_a_base_listed_without_inode_and_ctime_reads_every_mask_once(corpus, tmp_path):
    """A base kept by a kiln before the mask stamps held inode and ctime:
    every mask file is read once (the records reused but the touched
    image's), and trusted by the next build."""
    config = config_of(corpus, tmp_path)
    base = build(config)
    without_inode_ctime(base)
    rows = read_rows(corpus)
    touch_an_image(corpus, rows[2])

    night = build(config)

    assert (night.incremental.changed, night.incremental.reused) == (1, COUNT - 1)
    assert night.counters["masks_read"] == len(all_masks(rows))
    assert night.counters.get("masks_not_read", 0) == 0
    touch_an_image(corpus, rows[3])

    again = build(config)

    assert again.counters["masks_read"] == len(masks_of(rows[3]))
    assert again.counters["masks_not_read"] == len(all_masks(rows)) - len(masks_of(rows[3]))
