"""The build job's parts, the PTransforms on real Beam pipelines: splits, sharding,
the shard writer, statistics, image processing and the error report."""

import dataclasses
import glob
import gzip
import hashlib
import json
import os
import pickle
import random
import threading
from typing import NamedTuple

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import GlobalWindow

from kiln import transforms
from kiln.pipeline import duplicates, memory, sharding, statistics, tfrecord, versioning
from kiln.pipeline.config import EncodingConfig, ImageConfig, ShardingConfig, SplitsConfig
from kiln.pipeline.error_report import DroppedFile, write_error_report
from kiln.pipeline.images import ImageProcessor, ProcessedImage, ProcessImages
from kiln.pipeline.splits import SplitPolicy
from kiln.schemas import RECORD, ChannelStatistics


def local_pipeline():
    # Beam 2.77's DirectRunner first tries to download the Prism runner;
    # the FnApiRunner is the DirectRunner's own batch engine.
    return test_pipeline.TestPipeline(runner="FnApiRunner")


class Record(NamedTuple):
    """The fields a SplitPolicy reads (as on images.ProcessedImage)."""

    key: str
    sha256: str
    split: str | None


# --- splits ------------------------------------------------------------------------


def expected_split(fractions, value, salt=""):
    """The documented rule, written out independently of kiln.pipeline.splits."""
    digest = hashlib.sha256(f"{salt}\x00{value}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0**64
    bound = 0.0
    for name in sorted(fractions):
        bound += fractions[name]
        if u < bound:
            return name
    return sorted(name for name in fractions if fractions[name] > 0)[-1]


FRACTIONS = {"train": 0.8, "validation": 0.1, "test": 0.1}


def make_records(n, duplicate_every=0):
    records = []
    for i in range(n):
        content = i // 2 if duplicate_every and i % duplicate_every < 2 else 1000 + i
        records.append(
            Record(f"class/{i:05d}.png", hashlib.sha256(str(content).encode()).hexdigest(), None)
        )
    return records


def test_assign_splits_by_content_follows_the_documented_rule():
    records = make_records(400)
    policy = SplitPolicy.from_config(
        SplitsConfig(**{"fractions": FRACTIONS, "split_by": "content", "salt": ""})
    )
    expected = [(r.key, expected_split(FRACTIONS, r.sha256)) for r in records]
    assert [(r.key, policy.assign(r.key, r.sha256, r.split)) for r in records] == expected
    counts = {name: sum(1 for _, s in expected if s == name) for name in FRACTIONS}
    assert 0.7 * 400 < counts["train"] < 0.9 * 400
    assert counts["validation"] > 20 and counts["test"] > 20


def test_assign_splits_puts_identical_content_in_one_split():
    records = make_records(300, duplicate_every=3)  # pairs of records share content
    policy = SplitPolicy.from_config(SplitsConfig(**{"fractions": FRACTIONS}))
    splits_of_content = {}
    for r in records:
        splits_of_content.setdefault(r.sha256, set()).add(policy.assign(r.key, r.sha256, None))
    assert len(splits_of_content) < len(records)  # there are copies
    assert all(len(splits) == 1 for splits in splits_of_content.values())


def test_assign_splits_by_key_and_salt():
    records = make_records(200)
    by_key = SplitPolicy.from_config(
        SplitsConfig(**{"fractions": FRACTIONS, "split_by": "key", "salt": "s1"})
    )
    expected = [(r.key, expected_split(FRACTIONS, r.key, salt="s1")) for r in records]
    assert [(r.key, by_key.assign(r.key, r.sha256, r.split)) for r in records] == expected
    unsalted = [expected_split(FRACTIONS, r.key) for r in records]
    assert unsalted != [split for _, split in expected]  # the salt changes the draw


def test_assign_splits_from_source_keeps_the_source_split():
    records = [
        Record(f"k{i}", "0" * 64, s) for i, s in enumerate(["train", "test", "train", "extra"])
    ]
    policy = SplitPolicy.from_config(SplitsConfig(**{"from_source": True}))
    assert [policy.assign(r.key, r.sha256, r.split) for r in records] == [r.split for r in records]
    with pytest.raises(ValueError, match=r"k9: splits\.from_source, but the listing gives no"):
        policy.assign("k9", "0" * 64, None)


def test_a_zero_fraction_split_gets_nothing():
    fractions = {"a": 0.5, "b": 0.0, "c": 0.5}
    policy = SplitPolicy.from_config(SplitsConfig(**{"fractions": fractions}))
    splits = {policy.assign(r.key, r.sha256, None) for r in make_records(300)}
    assert splits == {"a", "c"}


# --- tfrecord framing ---------------------------------------------------------------


def test_framing_is_byte_identical_to_tensorflows_writer(tmp_path):
    records = [b"", b"x", bytes(range(256)) * 40, "ünïcode".encode()]
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    with open(path, "rb") as f:
        assert f.read() == b"".join(tfrecord.frame(r) for r in records)
    assert tfrecord.framed_size(len(records[2])) == len(tfrecord.frame(records[2]))


# --- sharding and the shard writer --------------------------------------------------


def read_tfrecords(path, compression=None):
    return [r.numpy() for r in tf.data.TFRecordDataset(path, compression_type=compression)]


class ShardedRecord(NamedTuple):
    """A record on its way to a shard (as the image step has it)."""

    split: str
    sort_key: str
    record: bytes


def sharded_records(n, split="train", seed=0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        key = f"{split}/item-{i:04d}"
        noise = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60)))
        payload = f"{key}:".encode() + noise
        out.append(ShardedRecord(split, sharding.sort_key(key), payload))
    return out


def spill(records, folder, run_bytes):
    """The records written to sorted runs by a RunWriter, as the image step does."""
    os.makedirs(folder, exist_ok=True)
    writer = sharding.RunWriter(folder, run_bytes)
    runs = []
    for r in records:
        content = hashlib.sha256(r.record).hexdigest()
        if writer.add(GlobalWindow(), r.split, r.sort_key, r.record, content, f"k/{r.sort_key}"):
            runs += [windowed.value for windowed in writer.flush()]
    return runs + [windowed.value for windowed in writer.flush()]


def all_shard_paths(folder):
    return glob.glob(os.path.join(folder, "*.tfrecord-*"))


def run_write_shards(tmp_path, records, config, name="ds", run_bytes=1 << 20, threads=1):
    folder, temp = str(tmp_path / "out"), str(tmp_path / "out" / ".work" / "tmp")
    runs = spill(records, temp, run_bytes)
    with local_pipeline() as p:
        infos = (
            p
            | beam.Create(runs)
            | sharding.ShardRuns(folder, temp, name, ShardingConfig(**config), threads)
            | beam.MapTuple(
                lambda split, index, info: (split, index, info.filename, info.num_records)
            )
        )
        assert_that(infos, equal_to(expected_infos(records, config, name)))
    return folder


def expected_infos(records, config, name):
    by_split = {}
    for r in records:
        by_split.setdefault(r.split, []).append(r)
    expected = []
    for split, rs in by_split.items():
        n = sharding.count_shards(
            split,
            len(rs),
            sum(tfrecord.framed_size(len(r.record)) for r in rs),
            ShardingConfig(**config),
        )
        for index in range(n):
            lower, upper = index * 2**64 // n, (index + 1) * 2**64 // n
            inside = [r for r in rs if lower <= int(r.sort_key, 16) < upper]
            suffix = ".gz" if config["compression"] == "gzip" else ""
            expected.append(
                (
                    split,
                    index,
                    f"{name}-{split}.tfrecord-{index:05d}-of-{n:05d}{suffix}",
                    len(inside),
                )
            )
    return expected


def test_write_shards_hash_ranges_give_a_global_order(tmp_path):
    records = sharded_records(120, "train") + sharded_records(7, "test", seed=1)
    config = {"num_shards": {"train": 4, "test": 1}, "target_shard_mb": 1, "compression": "none"}
    random.Random(5).shuffle(records)
    folder = run_write_shards(tmp_path, records, config)

    for split, count in (("train", 4), ("test", 1)):
        paths = sorted(glob.glob(os.path.join(folder, f"ds-{split}.tfrecord-*-of-{count:05d}")))
        assert len(paths) == count
        read_back = [r for path in paths for r in read_tfrecords(path)]
        wanted = sorted((r for r in records if r.split == split), key=lambda r: r.sort_key)
        # Reading the shards in order reads the split in hash order.
        assert read_back == [r.record for r in wanted]
    # Temp shard files were renamed away; only the sorted runs and each
    # shard's part of the record index are left, for the job's last step
    # and then the launcher to delete with the work folder.
    left = os.listdir(os.path.join(folder, ".work", "tmp"))
    parts = sorted(name for name in left if name.startswith("index-"))
    assert parts == sorted(f"index-{os.path.basename(path)}" for path in all_shard_paths(folder))
    assert left and all(name.startswith(("run-", "index-")) for name in left)


def test_write_shards_writes_empty_shards_and_sizes_by_target(tmp_path):
    # 12 records in 8 fixed shards: some hash ranges are empty, the files must exist.
    records = sharded_records(12, "small")
    config = {"num_shards": 8, "target_shard_mb": 1, "compression": "none"}
    folder = run_write_shards(tmp_path / "fixed", records, config)
    paths = sorted(glob.glob(os.path.join(folder, "ds-small.tfrecord-*-of-00008")))
    assert len(paths) == 8
    counts = [len(read_tfrecords(p)) for p in paths]
    assert sum(counts) == 12 and 0 in counts

    # A fixed count above the records is capped at one shard per record: 3
    # records never make 100,000 files.
    records = sharded_records(3, "few")
    config = {"num_shards": 100_000, "target_shard_mb": 1, "compression": "none"}
    folder = run_write_shards(tmp_path / "capped", records, config)
    paths = sorted(glob.glob(os.path.join(folder, "ds-few.tfrecord-*")))
    assert [os.path.basename(p)[-5:] for p in paths] == ["00003"] * 3
    assert sum(len(read_tfrecords(p)) for p in paths) == 3

    # By target size: 200 records of ~50 bytes at a 2 KB target -> several shards.
    records = sharded_records(200, "big")
    total = sum(tfrecord.framed_size(len(r.record)) for r in records)
    config = {"num_shards": None, "target_shard_mb": 2048 / 2**20, "compression": "none"}
    folder = run_write_shards(tmp_path / "target", records, config)
    paths = glob.glob(os.path.join(folder, "ds-big.tfrecord-*"))
    assert len(paths) == -(-total // 2048) > 1


def test_records_spill_to_sorted_runs_that_are_merged(tmp_path):
    # A ~1 KB run size against ~5 KB of records: many runs, each holding
    # records of every shard; the shards must still hold exactly their hash
    # range in order.
    records = sharded_records(150, "train", seed=3)
    random.Random(1).shuffle(records)
    runs = spill(records, str(tmp_path / "runs"), 1024)
    assert len(runs) > 3 and sum(len(run.entries) for run in runs) == 150
    for run in runs:  # each run sorted, its contents aligned with its entries
        assert [e[:2] for e in run.entries] == sorted(e[:2] for e in run.entries)
        assert len(run.contents) == len(run.entries)

    config = {"num_shards": 3, "target_shard_mb": 1024 / 2**20, "compression": "none"}
    folder = run_write_shards(tmp_path, records, config, run_bytes=1024)
    paths = sorted(glob.glob(os.path.join(folder, "ds-train.tfrecord-*-of-00003")))
    wanted = sorted(records, key=lambda r: r.sort_key)
    assert [r for path in paths for r in read_tfrecords(path)] == [r.record for r in wanted]


def test_runs_hold_frames_the_shard_writer_keeps_as_views_of_one_read(tmp_path):
    # The run files hold each record framed as in a shard, so the shard
    # writer holds a shard's records once: views into one read per slice,
    # not records copied out of it and copied again into frames.
    records = sharded_records(40, "train", seed=4)
    runs = spill(records, str(tmp_path / "runs"), 1 << 20)
    slices = [piece for run in runs for _, piece in sharding._slices_by_shard(run, {"train": 2})]
    assert len(slices) == 2
    for piece in slices:
        read = sharding.read_run_frames([piece])
        assert len(read) == len(piece.entries)
        assert all(isinstance(framed, memoryview) for _, framed, _ in read)
        assert len({id(framed.obj) for _, framed, _ in read}) == 1  # one buffer per slice
        by_key = {r.sort_key: r.record for r in records}
        assert [bytes(framed) for _, framed, _ in read] == [
            tfrecord.frame(by_key[key]) for key, _, _ in read
        ]


def test_the_shard_writer_hands_freed_memory_back_before_each_shard(tmp_path, monkeypatch):
    # The image step's threads leave freed memory in the allocator's arenas;
    # the shard writer returns it to the system before it reads each shard,
    # so its peak does not land on top of it.
    assert isinstance(memory.release_free_memory(), bool)  # no-op off glibc
    calls = []
    monkeypatch.setattr(memory, "release_free_memory", lambda: calls.append(1) or True)
    config = {"num_shards": 3, "target_shard_mb": 1, "compression": "none"}
    run_write_shards(tmp_path, sharded_records(30, "train", seed=2), config)
    assert len(calls) == 3


def test_shards_written_on_several_threads_are_the_same_files(tmp_path, monkeypatch):
    records = sharded_records(120, "train", seed=5) + sharded_records(40, "test", seed=6)
    config = {"num_shards": {"train": 5, "test": 2}, "target_shard_mb": 1, "compression": "none"}
    one = run_write_shards(tmp_path / "one", records, config)
    threads: set[str] = set()
    write = sharding.write_frames

    def noting_thread(*args, **kwargs):
        threads.add(threading.current_thread().name)
        return write(*args, **kwargs)

    monkeypatch.setattr(sharding, "write_frames", noting_thread)
    two = run_write_shards(tmp_path / "two", records, config, threads=2)

    assert threads and all(name.startswith("kiln-shard") for name in threads)
    names = sorted(os.path.basename(path) for path in all_shard_paths(one))
    assert names == sorted(os.path.basename(path) for path in all_shard_paths(two))
    for name in names:
        with open(os.path.join(one, name), "rb") as a, open(os.path.join(two, name), "rb") as b:
            assert a.read() == b.read()


def test_gzip_shards_are_readable_and_deterministic(tmp_path):
    records = [r.record for r in sharded_records(30)]
    frames = [tfrecord.frame(r) for r in records]
    first = sharding.write_frames(str(tmp_path / "a.gz"), str(tmp_path / "a.tmp"), frames, "gzip")
    second = sharding.write_frames(str(tmp_path / "b.gz"), str(tmp_path / "b.tmp"), frames, "gzip")
    assert first.sha256 == second.sha256
    with open(tmp_path / "a.gz", "rb") as f:
        data = f.read()
    assert hashlib.sha256(data).hexdigest() == first.sha256 and len(data) == first.num_bytes
    assert gzip.decompress(data) == b"".join(tfrecord.frame(r) for r in records)
    assert read_tfrecords(str(tmp_path / "a.gz"), "GZIP") == records


def test_a_retried_shard_write_leaves_one_correct_file(tmp_path):
    records = [r.record for r in sharded_records(10)]
    frames = [tfrecord.frame(r) for r in records]
    target = str(tmp_path / "ds-train.tfrecord-00000-of-00001")
    # A first attempt died after writing part of its temp file...
    with open(tmp_path / "ds-train.tfrecord-00000-of-00001.attempt1", "wb") as f:
        f.write(b"half a shard")
    # ...two later attempts both completed (Beam may run a bundle twice).
    infos = [
        sharding.write_frames(target, str(tmp_path / f"attempt{i}"), frames, "none") for i in (2, 3)
    ]
    assert infos[0] == infos[1]
    assert read_tfrecords(target) == records
    with open(target, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == infos[0].sha256
    assert sorted(os.listdir(tmp_path)) == [
        "ds-train.tfrecord-00000-of-00001",
        "ds-train.tfrecord-00000-of-00001.attempt1",
    ]


# --- statistics ---------------------------------------------------------------------


def random_images(seed, count, channels=3):
    rng = np.random.default_rng(seed)
    return [
        rng.integers(
            0, 256, size=(rng.integers(3, 30), rng.integers(3, 30), channels), dtype=np.uint8
        )
        for _ in range(count)
    ]


def numpy_statistics(images):
    pixels = np.concatenate([im.reshape(-1, im.shape[-1]) for im in images]).astype(np.float64)
    return pixels.shape[0], pixels.mean(axis=0), pixels.std(axis=0)


@pytest.mark.parametrize("channels", [1, 3])
def test_pixel_sums_are_exact(channels):
    for image in random_images(4, 5, channels) + [np.full((300, 200, channels), 255, np.uint8)]:
        wide = image.reshape(-1, channels).astype(np.int64)
        sums = statistics.pixel_sums(image)
        assert sums.pixels == wide.shape[0]
        assert list(sums.sums) == wide.sum(axis=0).tolist()
        assert list(sums.squares) == (wide * wide).sum(axis=0).tolist()


def test_pixel_sums_of_an_image_too_large_for_a_float32_histogram():
    image = np.full((4097, 4097, 1), 255, np.uint8)  # > 2**24 pixels in one bin
    image[0, 0, 0] = 3
    n = 4097 * 4097
    assert statistics.pixel_sums(image) == (n, ((n - 1) * 255 + 3,), ((n - 1) * 255**2 + 9,))


def stored(image, split, label=0, key="k"):
    """A ProcessedImage carrying `image`'s statistics (the record is not read)."""
    height, width, _ = image.shape
    return ProcessedImage(
        key, label, split, "0" * 64, b"", height, width, statistics.pixel_sums(image)
    )


def summarize(partials):
    combine = statistics.SummaryCombineFn()
    return combine.extract_output(combine.merge_accumulators(partials))


def test_summary_statistics_match_numpy_per_split_through_beam():
    train, test = random_images(0, 40), random_images(1, 9)
    partials = []
    for start in range(0, 40, 7):  # several bundles' worth of partial summaries
        partial = statistics.Summary()
        for i, image in enumerate(train[start : start + 7]):
            partial.add(
                versioning.entry_hash(["file", f"t{start + i}"]),
                stored(image, "train", label=(start + i) % 3),
            )
        partials.append(partial)
    last = statistics.Summary()
    for image in test:
        last.add(1, stored(image, "test", label=1))
    last.add(2, None)  # a dropped file counts towards the version only
    partials.append(last)

    def check(actual):
        (summary,) = actual
        stats = summary.channel_statistics()
        assert sorted(stats) == ["test", "train"]
        for split, images in {"train": train, "test": test}.items():
            count, mean, std = numpy_statistics(images)
            assert stats[split].count == count
            np.testing.assert_allclose(stats[split].mean, mean, rtol=1e-12)
            np.testing.assert_allclose(stats[split].std, std, rtol=1e-12)
        assert summary.class_counts == {
            ("train", 0): 14,
            ("train", 1): 13,
            ("train", 2): 13,
            ("test", 1): 9,
        }
        assert summary.inputs_hash == versioning.combine_hashes(
            [versioning.entry_hash(["file", f"t{i}"]) for i in range(40)] + [1] * 9 + [2]
        )

    with local_pipeline() as p:
        out = p | beam.Create(partials) | beam.CombineGlobally(statistics.SummaryCombineFn())
        assert_that(out, check)


def test_summary_is_exact_whatever_the_merge_order():
    images = random_images(2, 60, channels=1) + [np.zeros((3, 5, 1), np.uint8)]
    results = set()
    for seed in range(5):
        order = list(range(len(images)))
        random.Random(seed).shuffle(order)
        cut = random.Random(seed).sample(range(1, len(order)), 4)
        partials = []
        for part in np.split(np.array(order), sorted(cut)):
            partial = statistics.Summary()
            for i in part:
                partial.add(
                    versioning.entry_hash(["file", int(i)]),
                    stored(images[i], "train", label=int(i) % 2),
                )
            partials.append(pickle.loads(pickle.dumps(partial)))  # as Beam ships them
        random.Random(seed).shuffle(partials)
        summary = summarize(partials)
        (stats,) = summary.channel_statistics().values()
        results.add(
            (
                stats.count,
                tuple(stats.mean),
                tuple(stats.std),
                tuple(sorted(summary.class_counts.items())),
                summary.sizes,
                summary.inputs_hash,
            )
        )
    assert len(results) == 1  # bit-identical floats: kiln.json stays byte-identical
    (result,) = results
    assert len(result[4]) == 2 and summarize([]).channel_statistics() == {}


def test_summary_image_size_is_set_only_when_every_image_has_it():
    one, other = np.zeros((4, 6, 3), np.uint8), np.zeros((6, 4, 3), np.uint8)
    same = statistics.Summary()
    for _ in range(3):
        same.add(0, stored(one, "train"))
    assert summarize([same, same]).image_size == [4, 6]
    mixed = statistics.Summary()
    mixed.add(0, stored(other, "test"))
    assert summarize([same, mixed]).image_size is None
    assert summarize([mixed, same]).sizes == summarize([same, mixed]).sizes
    assert statistics.Summary().image_size is None
    with pytest.raises(ValueError, match="cannot merge statistics of 3- and 1-channel"):
        same.add(0, stored(np.zeros((4, 6, 1), np.uint8), "train"))


def test_summary_smallest_size_takes_the_least_height_and_width_apart():
    sizes = [(40, 90), (70, 30), (100, 100), (55, 31)]
    partials = []
    for height, width in sizes:
        partial = statistics.Summary()
        partial.add(0, stored(np.zeros((height, width, 3), np.uint8), "train"))
        partials.append(pickle.loads(pickle.dumps(partial)))  # as Beam ships them
    least = [min(h for h, _ in sizes), min(w for _, w in sizes)]
    assert summarize(partials).smallest_size == least
    assert summarize(partials[::-1]).smallest_size == least
    assert summarize(partials).image_size is None
    assert statistics.Summary().smallest_size is None
    assert summarize([statistics.Summary(), partials[0]]).smallest_size == list(sizes[0])


# --- image processing ---------------------------------------------------------------


def test_process_images_outputs_runs_drops_and_a_summary(tmp_path):
    rng = np.random.default_rng(7)
    good = rng.integers(0, 256, size=(20, 30, 3), dtype=np.uint8)
    small = rng.integers(0, 256, size=(6, 6, 3), dtype=np.uint8)
    files = {
        "a/good.png": transforms.encode_image(good, format="png"),
        "a/small.png": transforms.encode_image(small, format="png"),  # smaller than the crop
        "b/empty.jpg": b"",
        "b/text.png": b"hello, not an image",
    }
    items = []
    for key, data in sorted(files.items()):
        path = tmp_path / key
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        items.append(
            {
                "key": key,
                "uri": str(path),
                "label": 0 if key.startswith("a") else 1,
                "split": None,
                "size": len(data),
            }
        )
    items.append(
        {
            "key": "b/gone.png",
            "uri": str(tmp_path / "b" / "gone.png"),
            "label": 1,
            "split": None,
            "size": 10,
        }
    )
    chain = transforms.parse([{"center_crop": {"size": 8}}])
    policy = SplitPolicy.from_config(SplitsConfig(**{"fractions": FRACTIONS, "split_by": "key"}))
    processor = ImageProcessor(
        chain,
        ImageConfig(channels=3, max_pixels=10_000, min_size=1),
        EncodingConfig(format="png"),
        ["a", "b"],
        policy,
    )
    split = expected_split(FRACTIONS, "a/good.png")
    sha_of = {key: hashlib.sha256(data).hexdigest() for key, data in files.items()}
    entries = [
        ["file", item["key"], "ab"[item["label"]], None, sha_of.get(item["key"])] for item in items
    ]

    def check_runs(runs):
        # The one stored image went straight into a sorted run file.
        assert [len(run.entries) for run in runs] == [1]
        (run,) = runs
        (entry,), (content,) = run.entries, run.contents
        assert entry[:3] == (split, sharding.sort_key("a/good.png"), 0)
        assert content == (sha_of["a/good.png"], "a/good.png")
        with open(run.run, "rb") as f:
            data = f.read()
        # The record framed as in a shard, then its line of the record index.
        framed_size = tfrecord.framed_size(entry[3])
        assert len(data) == framed_size + entry[4]
        framed, index_entry = data[:framed_size], data[framed_size:]
        assert tfrecord.is_frame(framed)
        record = tfrecord.unframe(framed)
        row = json.loads(index_entry)
        assert (row["key"], row["sha256"], row["label"]) == ("a/good.png", sha_of["a/good.png"], 0)
        assert (row["height"], row["width"], row["pixels"]) == (8, 8, 64)
        assert row["sums"] == [int(v) for v in good[6:14, 11:19].reshape(-1, 3).sum(axis=0)]
        decoded = RECORD.decode(record)
        assert (decoded["key"], decoded["label"]) == (b"a/good.png", 0)
        assert decoded["sha256"].decode() == sha_of["a/good.png"]
        stored = transforms.decode_image(decoded["image"])
        np.testing.assert_array_equal(stored, good[6:14, 11:19])

    runs_folder = tmp_path / "runs"
    runs_folder.mkdir()
    with local_pipeline() as p:
        # Files come in lists (lines of the listing).
        result = (
            p
            | beam.Create([items[:3], items[3:]])
            | ProcessImages(processor, threads=2, runs_folder=str(runs_folder), run_bytes=1 << 20)
        )
        assert_that(result.runs, check_runs, label="CheckRuns")
        assert_that(
            result.dropped | beam.Map(lambda d: (d.key, d.stage, d.reason)),
            equal_to(
                [
                    ("a/small.png", "transform", "transform_failed"),
                    ("b/empty.jpg", "decode", "empty"),
                    ("b/text.png", "decode", "not_an_image"),
                    ("b/gone.png", "read", "unreadable"),
                ]
            ),
            label="CheckDropped",
        )
        summary = result.summary | beam.CombineGlobally(statistics.SummaryCombineFn())

        def check_summary(actual):
            (merged,) = actual
            assert merged.inputs_hash == versioning.combine_hashes(
                versioning.entry_hash(entry) for entry in entries
            )
            assert merged.class_counts == {(split, 0): 1}
            assert merged.pixels == {split: statistics.pixel_sums(good[6:14, 11:19])}
            assert merged.image_size == [8, 8]

        assert_that(summary, check_summary, label="CheckSummary")


def small_png_processor() -> ImageProcessor:
    """An `ImageProcessor` of small images, one class, stored as PNG, all in train."""
    return ImageProcessor(
        transforms.parse([]),
        ImageConfig(channels=3, max_pixels=10_000, min_size=1),
        EncodingConfig(format="png"),
        ["a"],
        SplitPolicy.from_config(SplitsConfig(fractions={"train": 1.0})),
    )


def test_the_image_step_holds_opencv_to_one_thread_per_call_and_restores_it(tmp_path):
    import cv2

    from kiln.pipeline.images import ProcessImagesFn

    processor = small_png_processor()
    fn = ProcessImagesFn(processor, threads=2, runs_folder=str(tmp_path), run_bytes=1 << 20)
    before = cv2.getNumThreads()
    cv2.setNumThreads(3)
    try:
        fn.setup()
        assert cv2.getNumThreads() == 1  # images run in parallel, not inside OpenCV calls
        fn.teardown()
        assert cv2.getNumThreads() == 3
    finally:
        cv2.setNumThreads(before)


def test_the_image_step_keeps_opencvs_log_lines_off_stderr_unless_the_user_set_a_level(
    tmp_path, monkeypatch
):
    """OpenCV's lines about a file it fails on name no file; errors.jsonl has
    the file. A level the user set (OPENCV_LOG_LEVEL) is left alone."""
    import cv2

    from kiln.pipeline.images import ProcessImagesFn

    processor = small_png_processor()
    fn = ProcessImagesFn(processor, threads=1, runs_folder=str(tmp_path), run_bytes=1 << 20)
    levels = cv2.utils.logging
    before = levels.getLogLevel()
    levels.setLogLevel(levels.LOG_LEVEL_WARNING)
    try:
        monkeypatch.delenv("OPENCV_LOG_LEVEL", raising=False)
        fn.setup()
        assert levels.getLogLevel() == levels.LOG_LEVEL_FATAL
        fn.teardown()
        assert levels.getLogLevel() == levels.LOG_LEVEL_WARNING

        monkeypatch.setenv("OPENCV_LOG_LEVEL", "WARNING")
        fn.setup()
        assert levels.getLogLevel() == levels.LOG_LEVEL_WARNING
        fn.teardown()
    finally:
        levels.setLogLevel(before)


def test_an_image_too_long_for_its_encoding_is_dropped_with_its_size(tmp_path):
    """JPEG stores at most 65500 pixels per side: a 70000x20 panorama, and a
    4200x2 strip the transforms make 67200x32, are dropped as encode_failed
    (not a failed job); the others are stored."""
    files = {
        "a/panorama.png": np.full((20, 70_000, 3), 90, np.uint8),
        "a/strip.png": np.full((2, 4_200, 3), 90, np.uint8),
        "a/photo.png": np.full((40, 60, 3), 90, np.uint8),
    }
    items = {}
    for key, image in files.items():
        path = tmp_path / key
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(transforms.encode_image(image, format="png"))
        items[key] = {"key": key, "uri": str(path), "label": 0, "split": None, "size": 1}

    def processor(chain):
        return ImageProcessor(
            transforms.parse(chain),
            ImageConfig(channels=3, max_pixels=10_000_000, min_size=1),
            EncodingConfig(format="jpeg"),
            ["a"],
            SplitPolicy.from_config(SplitsConfig(fractions={"train": 1.0})),
        )

    as_is, resized = processor([]), processor([{"resize": {"shorter_side": 32}}])
    panorama = as_is(items["a/panorama.png"]).dropped
    assert (panorama.key, panorama.stage) == ("a/panorama.png", "encode")
    assert panorama.reason == "encode_failed"
    assert panorama.message.startswith(
        "the image to store is 70000x20 (WxH), more than the 65500 pixels per side that jpeg "
        "can hold; store it as png (up to 1000000) or raw (encoding.format)"
    )
    strip = resized(items["a/strip.png"]).dropped
    assert (strip.stage, strip.reason) == ("encode", "encode_failed")
    assert "67200x32 (WxH)" in strip.message
    assert strip.message.endswith("; the transforms made it from 4200x2")
    assert as_is(items["a/strip.png"]).image is not None
    photo = resized(items["a/photo.png"]).image
    assert (photo.height, photo.width) == (32, 48)


@pytest.mark.parametrize("budget, most_at_once", [(1_000, 1), (1_300, 2), (10, 1)])
def test_the_image_threads_decode_within_a_budget_of_pixels(
    tmp_path, monkeypatch, budget, most_at_once
):
    """Each file holds its header's pixels from decoding to encoding; a file
    larger than the whole budget (10) still runs, alone."""
    import threading
    import time

    from kiln.pipeline.images import ProcessImagesFn

    items = []
    for i in range(12):
        path = tmp_path / f"{i}.png"
        path.write_bytes(transforms.encode_image(np.full((20, 30, 3), i, np.uint8), format="png"))
        items.append({"key": f"a/{i}.png", "uri": str(path), "label": 0, "split": None, "size": 1})
    lock, active, most = threading.Lock(), [0], [0]
    real_encode = transforms.encode_image

    def counting_decode(*args, **kwargs):
        image = real_decode(*args, **kwargs)
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.01)
        return image

    def counting_encode(*args, **kwargs):
        with lock:
            active[0] -= 1
        return real_encode(*args, **kwargs)

    real_decode = transforms.decode_with_orientation
    monkeypatch.setattr(transforms, "decode_with_orientation", counting_decode)
    monkeypatch.setattr(transforms, "encode_image", counting_encode)
    monkeypatch.setattr(ProcessImagesFn, "PIXELS_IN_FLIGHT", budget)
    processor = small_png_processor()
    fn = ProcessImagesFn(processor, threads=4, runs_folder=str(tmp_path), run_bytes=1 << 20)
    fn.setup()
    try:
        fn.start_bundle()
        list(fn.process(items, window=GlobalWindow(), timestamp=0))
        outputs = list(fn.finish_bundle())
    finally:
        fn.teardown()
    (summary,) = [o.value.value for o in outputs if getattr(o, "tag", None) == "summary"]
    assert sum(summary.class_counts.values()) == 12
    assert most[0] == most_at_once  # 600 pixels each


def test_find_duplicates_over_runs_matches_a_direct_grouping():
    # 300 records drawn from 120 contents, in 7 runs, splits by key: copies
    # fall in every bucket, some within one split, some across splits.
    rng = random.Random(3)
    contents = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(120)]
    records = [
        (f"k{i:03d}", rng.choice(["train", "test"]), rng.choice(contents)) for i in range(300)
    ]
    runs = [
        sharding.SpilledRun(
            f"run-{i}",
            tuple((split, "0" * 16, 0, 1, 0) for _, split, _ in part),
            tuple((content, key) for key, _, content in part),
        )
        for i, part in enumerate(records[k : k + 43] for k in range(0, 300, 43))
    ]
    copies = {}
    for key, split, content in sorted(records):
        copies.setdefault(content, []).append((key, split))
    expected = [
        duplicates.DuplicateGroup(content, tuple(k for k, _ in stored), tuple(s for _, s in stored))
        for content, stored in copies.items()
        if len(stored) > 1
    ]
    assert (
        0
        < sum(g.extra_copies for g in expected if g.across_splits)
        < sum(g.extra_copies for g in expected)
    )
    assert len({int(g.sha256[:8], 16) % duplicates.DUPLICATE_BUCKETS for g in expected}) > 1

    with local_pipeline() as p:  # one group per content stored more than once
        assert_that(p | beam.Create(runs) | duplicates.FindDuplicates(), equal_to(expected))
    with local_pipeline() as p:  # no runs: nothing
        assert_that(p | beam.Create([]) | duplicates.FindDuplicates(), equal_to([]))


def test_duplicate_report_is_sorted_canonical_and_hashed(tmp_path):
    groups = [
        duplicates.DuplicateGroup("b" * 64, ("x/2.png", "y/1.png"), ("test", "train")),
        duplicates.DuplicateGroup(
            "a" * 64, ("a/é.png", "b/1.png", "c/1.png"), ("train", "train", "train")
        ),
    ]
    sha256 = duplicates.write_duplicate_report(str(tmp_path), groups)
    data = (tmp_path / "duplicates.jsonl").read_bytes()
    assert sha256 == hashlib.sha256(data).hexdigest()
    assert data.decode("utf-8") == (
        '{"keys": ["a/é.png", "b/1.png", "c/1.png"], "sha256": "'
        + "a" * 64
        + '", "splits": ["train", "train", "train"]}\n'
        '{"keys": ["x/2.png", "y/1.png"], "sha256": "'
        + "b" * 64
        + '", "splits": ["test", "train"]}\n'
    )
    assert duplicates.write_duplicate_report(str(tmp_path), []) == hashlib.sha256(b"").hexdigest()
    assert (tmp_path / "duplicates.jsonl").read_bytes() == b""


def test_error_report_is_sorted_and_counted(tmp_path):
    rows = [
        DroppedFile(f"k{i % 7}", "decode", reason, f"/x/k{i}", "m")
        for i, reason in enumerate(["corrupt", "empty", "corrupt", "too_small", "corrupt"])
    ]
    counts, sha256 = write_error_report(str(tmp_path), list(reversed(rows)))
    assert counts == {"corrupt": 3, "empty": 1, "too_small": 1}
    assert sha256 == hashlib.sha256((tmp_path / "errors.jsonl").read_bytes()).hexdigest()
    assert list(counts) == sorted(counts)
    lines = (tmp_path / "errors.jsonl").read_text().splitlines()
    parsed = [json.loads(line) for line in lines]
    assert [(r["key"], r["uri"]) for r in parsed] == sorted((r.key, r.uri) for r in rows)
    assert set(parsed[0]) == {"key", "uri", "stage", "reason", "message"}


def test_channel_statistics_dataclass_is_what_kiln_json_gets():
    image = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    out = statistics.channel_statistics(statistics.pixel_sums(image))
    assert isinstance(out, ChannelStatistics)
    assert dataclasses.asdict(out)["count"] == 4
    assert statistics.channel_statistics(statistics.EMPTY) is None


class _StubProcessor:
    """Stands in for `ImageProcessor`: records which thread ran which file;
    the file keyed "slow" waits until `release` is set."""

    def __init__(self):
        import threading

        self.release = threading.Event()
        self.threads: dict[str, int] = {}

    def __call__(
        self, item, before_decoding=None, read_base=None, moved_candidate=None, read_later=False
    ):
        import threading

        from kiln.pipeline.images import Outcome

        self.threads[item["key"]] = threading.get_ident()
        if item["key"] == "slow":
            self.release.wait(timeout=10)
        return Outcome(None, DroppedFile(item["key"], "decode", "corrupt", item["uri"], ""), 1)


def _run_bundle(fn, files, taken, after_take=lambda: None):
    fn.setup()
    real_take = fn._take

    def take(item, outcome, window, timestamp):
        taken.append(item["key"])
        after_take()
        yield from real_take(item, outcome, window, timestamp)

    fn._take = take
    try:
        fn.start_bundle()
        list(fn.process(files, window=GlobalWindow(), timestamp=0))
        list(fn.finish_bundle())
    finally:
        fn.teardown()


def test_a_slow_file_does_not_hold_back_the_files_after_it(tmp_path):
    """Results are taken as they complete: while one image takes long, the
    files after it are taken (in input order they would wait behind it)."""
    from kiln.pipeline.images import ProcessImagesFn

    stub = _StubProcessor()
    fn = ProcessImagesFn(stub, threads=2, runs_folder=str(tmp_path), run_bytes=1 << 20)
    files = [{"key": key, "uri": key, "label": 0} for key in ["slow", *"abcdefgh"]]
    taken: list[str] = []

    def after_take():
        if len(taken) == 8:  # every fast file is out: let the slow one finish
            stub.release.set()

    _run_bundle(fn, files, taken, after_take)
    assert taken[-1] == "slow" and sorted(taken[:-1]) == list("abcdefgh")


def test_files_with_a_base_row_go_to_the_pool_as_one_task(tmp_path):
    """An element's files that have a base row (most likely reused: hashed,
    not decoded) run as one task on one thread; the others one task each."""
    from kiln.pipeline.images import ProcessImagesFn

    stub = _StubProcessor()
    stub.release.set()
    fn = ProcessImagesFn(stub, threads=2, runs_folder=str(tmp_path), run_bytes=1 << 20)
    with_base = [{"key": f"r{i}", "uri": "r", "label": 0, "base": object()} for i in range(20)]
    new = [{"key": f"n{i}", "uri": "n", "label": 0, "base": None} for i in range(4)]
    taken: list[str] = []
    _run_bundle(fn, with_base[:10] + new + with_base[10:], taken)
    assert sorted(taken) == sorted(item["key"] for item in with_base + new)
    assert len({stub.threads[item["key"]] for item in with_base}) == 1
    reused_at = [taken.index(item["key"]) for item in with_base]
    assert reused_at == sorted(reused_at)  # one task: taken together, in order
