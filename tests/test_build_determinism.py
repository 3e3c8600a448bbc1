"""Determinism: the same inputs and config give byte-identical shards and
kiln.json, whatever the runner mode, the number of workers, the order in
which the input files were created, or the order of manifest rows."""

import hashlib
import os
import random
import shutil

from conftest import make_config
from kiln.pipeline import build


def digests(result):
    """file name -> sha256 of every file in the version folder (read from disk)."""
    out = {}
    for name in sorted(os.listdir(result.dataset_dir)):
        with open(os.path.join(result.dataset_dir, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def copy_files(source_dir, destination, order):
    """Copies a corpus file by file in the given order (creation order differs)."""
    for relative in order:
        target = os.path.join(destination, relative)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(source_dir, relative), target)


def corpus_listing(root):
    return sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files
    )


def test_same_bytes_across_creation_order_workers_and_running_mode(demo_corpus, tmp_path):
    images = str(tmp_path / "images")
    files = corpus_listing(demo_corpus.out_dir)
    copy_files(demo_corpus.out_dir, images, files)
    config = make_config(images, output=str(tmp_path / "first"))
    first = build(config)  # in-memory, one worker, all cores as image threads

    # Recreate the same files in the opposite order, then build with two
    # worker processes.
    shutil.rmtree(images)
    copy_files(demo_corpus.out_dir, images, list(reversed(files)))
    config["output"] = str(tmp_path / "second")
    second = build(config, ["--direct_num_workers=2", "--direct_running_mode=multi_processing"])

    assert not second.up_to_date
    assert second.version == first.version
    first_files, second_files = digests(first), digests(second)
    assert first_files == second_files
    shard_names = [n for n in first_files if ".tfrecord-" in n]
    assert len(shard_names) == 5  # 3 train, 1 validation, 1 test
    for split in first.info.splits.values():
        for shard in split.shards:
            assert first_files[shard.filename] == shard.sha256  # kiln.json matches the file
    with (
        open(os.path.join(first.dataset_dir, "kiln.json"), "rb") as a,
        open(os.path.join(second.dataset_dir, "kiln.json"), "rb") as b,
    ):
        assert a.read() == b.read()


def test_shuffled_manifest_rows_and_threads_give_the_same_bytes(demo_corpus, tmp_path):
    keys = [k for k in corpus_listing(demo_corpus.out_dir) if k not in demo_corpus.broken]
    rows = [f"{k},{k.split('/')[0]}" for k in keys]
    results = []
    for attempt, args in enumerate(
        [[], ["--direct_num_workers=2", "--direct_running_mode=multi_threading"]]
    ):
        random.Random(attempt).shuffle(rows)
        config = make_config(
            demo_corpus.out_dir,
            output=str(tmp_path / f"out{attempt}"),
            source={
                "type": "manifest",
                "path": _place_manifest(demo_corpus, tmp_path, rows),
                "allowed_roots": [demo_corpus.out_dir],
            },  # where the link leads
            sharding={"num_shards": 2, "compression": "gzip"},
            encoding={"format": "jpeg", "quality": 90},
        )
        results.append(build(config, args, image_threads=1 + attempt))
    first, second = results
    assert first.version == second.version
    assert digests(first) == digests(second)
    assert all(
        s.filename.endswith(".gz") for split in first.info.splits.values() for s in split.shards
    )


def _place_manifest(corpus, tmp_path, rows):
    """A manifest beside a symlink to the corpus, with paths relative to it."""
    folder = tmp_path / "listed"
    folder.mkdir(exist_ok=True)
    link = folder / "images"
    if not link.exists():
        link.symlink_to(corpus.out_dir, target_is_directory=True)
    manifest = folder / "manifest.csv"
    manifest.write_text("path,label\n" + "".join(f"images/{row}\n" for row in rows))
    return str(manifest)
