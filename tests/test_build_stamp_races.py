"""A file that changes between the listing and the read of it leaves no
version trusted. The launcher lists the inputs before the job reads them,
and the next build trusts what it listed: the inputs' stamp names the
version (the up-to-date check), each file's stamp vouches for its record's
sha256 (an incremental build). The job compares what it finds of each file
it reads with what the listing said, keeps every disagreement beside the
version (``.file-stamps/<version>/.stamp-disagreements.jsonl``), and the next
build neither keeps that version as up to date nor trusts those stamps.

Real builds throughout. The races are made deterministic by the builds' own
log lines: a logging handler (the test's, not kiln's code) changes a file
when the launcher says it has listed the source (before the up-to-date
check reads anything) or that it starts the job (before the job reads
anything)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import object_store
from conftest import backdated, make_config
from kiln.pipeline import build, publish, record_index
from kiln.schemas import INDEX_FILENAME
from test_build_file_stamps import SAME_SIZE, rewrite_keeping_stamp, same_size_png
from test_build_incremental import (
    assert_same_dataset,
    copy_corpus,
    full_build,
    good_keys,
    index_rows,
    new_png,
)
from test_build_listing_job import BUCKET, ROOT, store  # noqa: F401 (a fixture)
from test_build_mask_stamps import (  # noqa: F401 (corpus, pristine: fixtures)
    config_of,
    corpus,
    edited_mask,
    png,
    pristine,
)
from test_targets_incremental import read_rows


@contextlib.contextmanager
def when_logged(logger_name: str, starts: str, action: Callable[[], None]) -> Iterator[None]:
    """Runs `action` once, when the logger `logger_name` logs a message
    starting with `starts`, in the builds inside the block; fails unless it ran."""
    ran: list[bool] = []
    failed: list[BaseException] = []

    class Hook(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if not ran and record.getMessage().startswith(starts):
                ran.append(True)
                try:
                    action()
                except BaseException as e:  # raised by the test, after the build
                    failed.append(e)

    logger = logging.getLogger(logger_name)
    hook, level = Hook(logging.INFO), logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(hook)
    try:
        yield
    finally:
        logger.removeHandler(hook)
        logger.setLevel(level)
    if failed:
        raise failed[0]
    assert ran, f"{logger_name} logged nothing starting with {starts!r}"


def before_the_job(action: Callable[[], None]):
    """`action` after the listing and the up-to-date check, before the job reads a file."""
    return when_logged("kiln.pipeline.launcher", "running the build job", action)


def after_the_listing(action: Callable[[], None]):
    """`action` once the source is listed, before the up-to-date check reads a file."""
    return when_logged("kiln.pipeline.sources", "listed ", action)


def disagreements(result) -> list[dict]:
    """The lines of the stamp disagreements kept beside `result`'s version."""
    kept = Path(
        result.dataset_root,
        publish.FILE_STAMPS_FOLDER,
        result.version,
        publish.STAMP_DISAGREEMENTS_FILE,
    )
    return [json.loads(line) for line in kept.read_text().splitlines()]


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def row_of(result, key: str):
    return next(row for row in index_rows(result) if row.key == key)


def test_a_mask_file_that_appears_after_the_listing_keeps_its_version_from_being_trusted(
    corpus,  # noqa: F811 (the fixture)
    tmp_path,
):
    """A mask file missing when the source is listed (listed ``[-1, 0.0]``)
    appears before the job reads it, so the record gets the mask; then it
    is deleted again. The next listing is the one that build made, yet its
    version holds a mask no file holds: the next build runs the job and
    drops the image, as a build from scratch does."""
    config = dict(config_of(corpus, tmp_path), errors={"max_fraction": 0.5})
    rows = read_rows(corpus)
    key, mask = rows[4]["path"], corpus / rows[4]["mask"]
    aside = tmp_path / "aside.png"
    os.replace(mask, aside)  # its (old) modification time goes with it

    with before_the_job(lambda: os.replace(aside, mask)):
        raced = build(config)

    assert row_of(raced, key).masks[0] == sha256_of(mask.read_bytes())  # the job read it
    size = mask.stat().st_size
    os.replace(mask, aside)  # gone again: listed as the raced build listed it

    night = build(config)

    assert not night.up_to_date
    assert night.info.dropped == {"missing_mask": 1}
    assert_same_dataset(night, build(dict(config, output=str(tmp_path / "full")), full=True))
    again = build(config)
    assert again.up_to_date and again.version == night.version
    # What the raced build kept beside its version, naming the mask file.
    (found,) = disagreements(raced)
    assert (found["key"], Path(found["uri"]), found["mask"]) == (key, mask, True)
    assert found["listed"] == [-1, 0.0] and found["read"][0] == size


def test_a_mask_file_rewritten_between_the_listing_and_its_read_and_restored_is_read_again(
    corpus,  # noqa: F811 (the fixture)
    tmp_path,
):
    """A mask file rewritten (other pixels) after the listing and before the
    job reads it, then restored with its time: the next build is not up to
    date, and does not trust the mask's listed stamp (the base's record
    keeps the other bytes' sha256): it reads the mask file and stores what
    a build from scratch stores."""
    config = config_of(corpus, tmp_path)
    rows = read_rows(corpus)
    key, mask = rows[3]["path"], corpus / rows[3]["mask"]
    original, listed = mask.read_bytes(), mask.stat()
    other = png(edited_mask(corpus, rows[3]["mask"]))

    with before_the_job(lambda: mask.write_bytes(other)):
        raced = build(config)

    assert row_of(raced, key).masks[0] == sha256_of(other)
    mask.write_bytes(original)
    os.utime(mask, ns=(listed.st_atime_ns, listed.st_mtime_ns))

    night = build(config)

    assert not night.up_to_date
    assert row_of(night, key).masks[0] == sha256_of(original)
    assert night.incremental.changed == 1 and night.counters["base_stamps_disagreed"] == 1
    assert_same_dataset(night, build(config_of(corpus, tmp_path, "full"), full=True))
    (found,) = disagreements(raced)
    assert (found["key"], Path(found["uri"]), found["mask"]) == (key, mask, True)
    assert found["listed"] == [listed.st_size, listed.st_mtime]


def test_an_image_rewritten_between_the_listing_and_its_read_and_restored_is_read_again(
    demo_corpus, tmp_path
):
    """An image rewritten after the listing and before the job reads it (the
    record holds the new pixels), then restored with its time (``cp -p``):
    the listing is the raced build's again. The next build is not up to
    date, and its job does not trust the image's listed stamp (the base's
    record of that key is of the other bytes): it reads the file and
    stores what a build from scratch stores."""
    images_dir = backdated(copy_corpus(demo_corpus, tmp_path))
    config = make_config(images_dir, output=str(tmp_path / "out"))
    key = good_keys(demo_corpus, images_dir)[4]
    path = images_dir / key
    original, listed = path.read_bytes(), path.stat()

    with before_the_job(lambda: path.write_bytes(new_png(7))):
        raced = build(config)

    assert row_of(raced, key).sha256 == sha256_of(new_png(7))
    rewritten = path.stat().st_mtime
    path.write_bytes(original)
    os.utime(path, ns=(listed.st_atime_ns, listed.st_mtime_ns))

    night = build(config)

    assert not night.up_to_date
    assert night.incremental.used and night.incremental.changed == 1
    assert row_of(night, key).sha256 == sha256_of(original)
    assert_same_dataset(night, full_build(config, tmp_path))
    assert night.counters["base_stamps_disagreed"] == 1
    assert build(config).up_to_date
    # What the raced build kept beside its version, naming the image.
    (found,) = disagreements(raced)
    assert (found["key"], Path(found["uri"]), found["mask"]) == (key, path, False)
    assert found["listed"] == [listed.st_size, listed.st_mtime]
    assert found["read"] == [len(new_png(7)), rewritten]


def test_a_recent_file_rewritten_as_the_up_to_date_check_reads_it_is_not_verified(
    demo_corpus, tmp_path
):
    """A file written just before a build (racily clean to the next) and
    rewritten unseen after it (its size and time restored). The next build
    lists it; before its up-to-date check reads it, it gets the version's
    bytes back, with a new time. The check's read finds the version's
    bytes, but not at the listed stamp: the version is not taken as up to
    date, the job runs and records the file; once the listed bytes are
    back under the listed stamp, the build after stores them."""
    images_dir = backdated(copy_corpus(demo_corpus, tmp_path))
    path = images_dir / SAME_SIZE
    path.write_bytes(same_size_png(1))
    config = make_config(images_dir, output=str(tmp_path / "out"))
    base = build(config)
    rewrite_keeping_stamp(path, same_size_png(2))
    listed = path.stat()

    with after_the_listing(lambda: path.write_bytes(same_size_png(1))):
        night = build(config)

    assert not night.up_to_date and night.version == base.version  # the bytes it read
    (found,) = disagreements(night)
    assert (found["key"], found["listed"]) == (SAME_SIZE, [listed.st_size, listed.st_mtime])
    rewrite_keeping_stamp(path, same_size_png(2))
    os.utime(path, ns=(listed.st_atime_ns, listed.st_mtime_ns))

    again = build(config)

    assert not again.up_to_date
    assert row_of(again, SAME_SIZE).sha256 == sha256_of(same_size_png(2))
    assert_same_dataset(again, full_build(config, tmp_path))


@pytest.mark.usefixtures("store")
def test_an_object_rewritten_with_another_size_between_the_listing_and_its_read(demo_corpus):
    """On an object store the job compares an object's size as read (its
    update time would cost a request): an object replaced by one of
    another size before the job reads it, then put back as it was (its
    update time too), leaves the version not up to date, and the next
    build stores the listed bytes again."""
    for name, (data, updated) in list(object_store.OBJECTS.items()):
        object_store.OBJECTS[name] = (data, updated - 3600)  # uploaded long ago
    config = make_config(ROOT, output=f"{BUCKET}/out")
    key = good_keys(demo_corpus, Path(demo_corpus.out_dir))[4]
    uri = f"{ROOT}/{key}"
    listed = object_store.OBJECTS[uri]

    with before_the_job(lambda: object_store.OBJECTS.__setitem__(uri, (new_png(7), listed[1]))):
        raced = build(config)

    assert row_of_object(raced, key).sha256 == sha256_of(new_png(7))
    object_store.OBJECTS[uri] = listed

    night = build(config)

    assert not night.up_to_date
    assert night.counters["base_stamps_disagreed"] == 1
    assert row_of_object(night, key).sha256 == sha256_of(listed[0])
    kept = f"{raced.dataset_root}/{publish.FILE_STAMPS_FOLDER}/{raced.version}/"
    (line,) = object_store.get(kept + publish.STAMP_DISAGREEMENTS_FILE).decode().splitlines()
    found = json.loads(line)
    assert (found["key"], found["uri"], found["mask"]) == (key, uri, False)
    assert found["listed"] == [len(listed[0]), listed[1]]
    assert found["read"] == [len(new_png(7)), None]  # no update time: not asked for


def row_of_object(result, key: str):
    """`key`'s record index row in a version on the object store."""
    index = object_store.get(f"{result.dataset_dir}/{INDEX_FILENAME}").decode()
    rows = [record_index.parse_line(line) for line in index.splitlines(keepends=True)]
    return next(row for row in rows if row.key == key)


@pytest.mark.parametrize("damage", ["garbage", "unreadable"])
def test_a_damaged_record_of_disagreements_trusts_no_stamp(demo_corpus, tmp_path, damage):
    """The base's record of disagreements cannot be read: the up-to-date
    check does not keep the version, and the job trusts none of the base's
    stamps (every file is read), so it still stores what a build from
    scratch stores."""
    images_dir = backdated(copy_corpus(demo_corpus, tmp_path))
    config = make_config(images_dir, output=str(tmp_path / "out"))
    key = good_keys(demo_corpus, images_dir)[4]
    path = images_dir / key
    original, listed = path.read_bytes(), path.stat()
    with before_the_job(lambda: path.write_bytes(new_png(7))):
        raced = build(config)
    path.write_bytes(original)
    os.utime(path, ns=(listed.st_atime_ns, listed.st_mtime_ns))
    kept = Path(
        raced.dataset_root,
        publish.FILE_STAMPS_FOLDER,
        raced.version,
        publish.STAMP_DISAGREEMENTS_FILE,
    )
    if damage == "garbage":
        kept.write_text("not a disagreement\n")
    else:  # a folder where the file was: it exists, and cannot be read
        kept.unlink()
        kept.mkdir()

    night = build(config)

    assert not night.up_to_date
    assert night.counters["base_disagreements_unreadable"] == 1
    assert night.incremental.not_read == 0
    assert row_of(night, key).sha256 == sha256_of(original)
    assert_same_dataset(night, full_build(config, tmp_path))
