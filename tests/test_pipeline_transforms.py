"""The build job's PTransforms on real Beam pipelines: splits, sharding, the
shard writer, statistics, image processing and the error report."""

import dataclasses
import glob
import gzip
import hashlib
import json
import os
import random
from typing import NamedTuple, Optional

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from kiln import transforms
from kiln.pipeline import sharding, statistics, tfrecord
from kiln.pipeline.error_report import DroppedFile, WriteErrorReport
from kiln.pipeline.images import ImageProcessor, ProcessImages
from kiln.pipeline.splits import AssignSplits, SplitPolicy
from kiln.schemas import RECORD, ChannelStatistics


def local_pipeline():
    # Beam 2.77's DirectRunner first tries to download the Prism runner;
    # the FnApiRunner is the DirectRunner's own batch engine.
    return test_pipeline.TestPipeline(runner="FnApiRunner")


class Record(NamedTuple):
    """The fields AssignSplits reads and sets (as on images.ProcessedImage)."""

    key: str
    sha256: str
    split: Optional[str]


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
        records.append(Record(f"class/{i:05d}.png",
                              hashlib.sha256(str(content).encode()).hexdigest(), None))
    return records


def test_assign_splits_by_content_follows_the_documented_rule():
    records = make_records(400)
    policy = SplitPolicy.from_config({"fractions": FRACTIONS, "split_by": "content", "salt": ""})
    expected = [(r.key, expected_split(FRACTIONS, r.sha256)) for r in records]
    with local_pipeline() as p:
        out = (p | beam.Create(records) | AssignSplits(policy)
               | beam.Map(lambda r: (r.key, r.split)))
        assert_that(out, equal_to(expected))
    counts = {name: sum(1 for _, s in expected if s == name) for name in FRACTIONS}
    assert 0.7 * 400 < counts["train"] < 0.9 * 400
    assert counts["validation"] > 20 and counts["test"] > 20


def test_assign_splits_puts_identical_content_in_one_split():
    records = make_records(300, duplicate_every=3)  # pairs of records share content
    policy = SplitPolicy.from_config({"fractions": FRACTIONS})
    with local_pipeline() as p:
        out = (p | beam.Create(records) | AssignSplits(policy)
               | beam.Map(lambda r: (r.sha256, r.split))
               | beam.GroupByKey()
               | beam.MapTuple(lambda sha, splits: len(set(splits))))
        assert_that(out, equal_to([1] * len({r.sha256 for r in records})))


def test_assign_splits_by_key_and_salt():
    records = make_records(200)
    by_key = SplitPolicy.from_config({"fractions": FRACTIONS, "split_by": "key", "salt": "s1"})
    expected = [(r.key, expected_split(FRACTIONS, r.key, salt="s1")) for r in records]
    with local_pipeline() as p:
        out = (p | beam.Create(records) | AssignSplits(by_key)
               | beam.Map(lambda r: (r.key, r.split)))
        assert_that(out, equal_to(expected))
    unsalted = [expected_split(FRACTIONS, r.key) for r in records]
    assert unsalted != [split for _, split in expected]  # the salt changes the draw


def test_assign_splits_from_source_keeps_the_source_split():
    records = [Record(f"k{i}", "0" * 64, s)
               for i, s in enumerate(["train", "test", "train", "extra"])]
    policy = SplitPolicy.from_config({"from_source": True})
    with local_pipeline() as p:
        out = p | beam.Create(records) | AssignSplits(policy) | beam.Map(lambda r: (r.key, r.split))
        assert_that(out, equal_to([(r.key, r.split) for r in records]))


def test_a_zero_fraction_split_gets_nothing():
    fractions = {"a": 0.5, "b": 0.0, "c": 0.5}
    policy = SplitPolicy.from_config({"fractions": fractions})
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


def sharded_records(n, split="train", seed=0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        key = f"{split}/item-{i:04d}"
        payload = f"{key}:".encode() + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60)))
        out.append(sharding.ShardedRecord(split, sharding.sort_key(key), payload))
    return out


def run_write_shards(tmp_path, records, config, name="ds"):
    folder, temp = str(tmp_path / "out"), str(tmp_path / "out" / ".work" / "tmp")
    with local_pipeline() as p:
        infos = (p | beam.Create(records)
                 | sharding.WriteShards(folder, temp, name, config)
                 | beam.MapTuple(lambda split, index, info: (split, index, info.filename,
                                                             info.num_records)))
        assert_that(infos, equal_to(expected_infos(records, config, name)))
    return folder


def expected_infos(records, config, name):
    by_split = {}
    for r in records:
        by_split.setdefault(r.split, []).append(r)
    expected = []
    for split, rs in by_split.items():
        n = sharding.count_shards(split, len(rs), sum(tfrecord.framed_size(len(r.record)) for r in rs),
                                  config)
        for index in range(n):
            lower, upper = index * 2**64 // n, (index + 1) * 2**64 // n
            inside = [r for r in rs if lower <= int(r.sort_key, 16) < upper]
            suffix = ".gz" if config["compression"] == "gzip" else ""
            expected.append((split, index, f"{name}-{split}.tfrecord-{index:05d}-of-{n:05d}{suffix}",
                             len(inside)))
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
    assert not glob.glob(os.path.join(folder, ".work", "tmp", "*"))  # temp files renamed away


def test_write_shards_writes_empty_shards_and_sizes_by_target(tmp_path):
    # 3 records in 8 fixed shards: most hash ranges are empty, the files must exist.
    records = sharded_records(3, "small")
    config = {"num_shards": 8, "target_shard_mb": 1, "compression": "none"}
    folder = run_write_shards(tmp_path / "fixed", records, config)
    paths = sorted(glob.glob(os.path.join(folder, "ds-small.tfrecord-*-of-00008")))
    assert len(paths) == 8
    assert sum(len(read_tfrecords(p)) for p in paths) == 3

    # By target size: 200 records of ~50 bytes at a 2 KB target -> several shards.
    records = sharded_records(200, "big")
    total = sum(tfrecord.framed_size(len(r.record)) for r in records)
    config = {"num_shards": None, "target_shard_mb": 2048 / 2**20, "compression": "none"}
    folder = run_write_shards(tmp_path / "target", records, config)
    paths = glob.glob(os.path.join(folder, "ds-big.tfrecord-*"))
    assert len(paths) == -(-total // 2048) > 1


def test_records_spill_to_sorted_runs_that_are_merged_and_deleted(tmp_path):
    # A ~1 KB run size against ~5 KB of records: many runs, each holding
    # records of every shard; the shards must still hold exactly their hash
    # range in order, and no run file may be left behind.
    records = sharded_records(150, "train", seed=3)
    random.Random(1).shuffle(records)
    config = {"num_shards": 3, "target_shard_mb": 1024 / 2**20, "compression": "none"}
    temp = tmp_path / "out" / ".work" / "tmp"
    with local_pipeline() as p:
        runs = (p | beam.Create(records)
                | beam.ParDo(sharding.SpillRunsFn(str(tmp_path / "runs"), 1024))
                | beam.Map(lambda run: len(run.entries)))
        assert_that(runs | beam.combiners.Count.Globally(),
                    lambda counts: counts[0] > 3 or pytest.fail(f"{counts} runs"), label="Runs")
        assert_that(runs | beam.CombineGlobally(sum), equal_to([150]), label="AllSpilled")
    folder = run_write_shards(tmp_path, records, config)
    paths = sorted(glob.glob(os.path.join(folder, "ds-train.tfrecord-*-of-00003")))
    wanted = sorted(records, key=lambda r: r.sort_key)
    assert [r for path in paths for r in read_tfrecords(path)] == [r.record for r in wanted]
    assert not os.listdir(temp)


def test_gzip_shards_are_readable_and_deterministic(tmp_path):
    records = [r.record for r in sharded_records(30)]
    first = sharding.write_shard(str(tmp_path / "a.gz"), str(tmp_path / "a.tmp"), records, "gzip")
    second = sharding.write_shard(str(tmp_path / "b.gz"), str(tmp_path / "b.tmp"), records, "gzip")
    assert first.sha256 == second.sha256
    with open(tmp_path / "a.gz", "rb") as f:
        data = f.read()
    assert hashlib.sha256(data).hexdigest() == first.sha256 and len(data) == first.num_bytes
    assert gzip.decompress(data) == b"".join(tfrecord.frame(r) for r in records)
    assert read_tfrecords(str(tmp_path / "a.gz"), "GZIP") == records


def test_a_retried_shard_write_leaves_one_correct_file(tmp_path):
    records = [r.record for r in sharded_records(10)]
    target = str(tmp_path / "ds-train.tfrecord-00000-of-00001")
    # A first attempt died after writing part of its temp file...
    with open(tmp_path / "ds-train.tfrecord-00000-of-00001.attempt1", "wb") as f:
        f.write(b"half a shard")
    # ...two later attempts both completed (Beam may run a bundle twice).
    infos = [sharding.write_shard(target, str(tmp_path / f"attempt{i}"), records, "none")
             for i in (2, 3)]
    assert infos[0] == infos[1]
    assert read_tfrecords(target) == records
    with open(target, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == infos[0].sha256
    assert sorted(os.listdir(tmp_path)) == [
        "ds-train.tfrecord-00000-of-00001", "ds-train.tfrecord-00000-of-00001.attempt1"]


# --- statistics ---------------------------------------------------------------------

def random_images(seed, count, channels=3):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=(rng.integers(3, 30), rng.integers(3, 30), channels),
                         dtype=np.uint8) for _ in range(count)]


def numpy_statistics(images):
    pixels = np.concatenate([im.reshape(-1, im.shape[-1]) for im in images]).astype(np.float64)
    return pixels.shape[0], pixels.mean(axis=0), pixels.std(axis=0)


@pytest.mark.parametrize("channels", [1, 3])
def test_pixel_sums_are_exact(channels):
    for image in random_images(4, 5, channels) + [np.full((300, 200, channels), 255, np.uint8)]:
        wide = image.reshape(-1, channels).astype(np.int64)
        sums = statistics.pixel_sums(image)
        assert sums.count == wide.shape[0]
        assert list(sums.sums) == wide.sum(axis=0).tolist()
        assert list(sums.squares) == (wide * wide).sum(axis=0).tolist()


def test_pixel_sums_of_an_image_too_large_for_a_float32_histogram():
    image = np.full((4097, 4097, 1), 255, np.uint8)  # > 2**24 pixels in one bin
    image[0, 0, 0] = 3
    n = 4097 * 4097
    assert statistics.pixel_sums(image) == (n, ((n - 1) * 255 + 3,), ((n - 1) * 255**2 + 9,))


def test_channel_moments_match_numpy_per_split():
    train, test = random_images(0, 40), random_images(1, 9)
    elements = ([("train", statistics.pixel_sums(im)) for im in train]
                + [("test", statistics.pixel_sums(im)) for im in test])

    def matches(expected):
        def check(actual):
            actual = dict(actual)
            assert sorted(actual) == sorted(expected)
            for split, images in expected.items():
                count, mean, std = numpy_statistics(images)
                assert actual[split].count == count
                np.testing.assert_allclose(actual[split].mean, mean, rtol=1e-12)
                np.testing.assert_allclose(actual[split].std, std, rtol=1e-12)
        return check

    with local_pipeline() as p:
        out = (p | beam.Create(elements)
               | beam.CombinePerKey(statistics.ChannelMomentsCombineFn()))
        assert_that(out, matches({"train": train, "test": test}))


def test_channel_moments_are_exact_whatever_the_merge_order():
    images = random_images(2, 60, channels=1)
    combine = statistics.ChannelMomentsCombineFn()
    results = set()
    for seed in range(5):
        order = list(images)
        random.Random(seed).shuffle(order)
        cut = random.Random(seed).sample(range(1, len(order)), 4)
        parts = np.split(np.arange(len(order)), sorted(cut))
        accumulators = []
        for part in parts:
            accumulator = combine.create_accumulator()
            for i in part:
                accumulator = combine.add_input(accumulator, statistics.pixel_sums(order[i]))
            accumulators.append(accumulator)
        random.Random(seed).shuffle(accumulators)
        result = combine.extract_output(combine.merge_accumulators(accumulators))
        results.add((result.count, tuple(result.mean), tuple(result.std)))
    assert len(results) == 1  # bit-identical floats: kiln.json stays byte-identical
    assert combine.extract_output(combine.create_accumulator()) is None


# --- image processing ---------------------------------------------------------------

def test_process_images_outputs_records_drops_and_input_hashes(tmp_path):
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
    for i, (key, data) in enumerate(sorted(files.items())):
        path = tmp_path / key
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        items.append({"key": key, "uri": str(path), "label": 0 if key.startswith("a") else 1,
                      "split": None, "size": len(data)})
    items.append({"key": "b/gone.png", "uri": str(tmp_path / "b" / "gone.png"), "label": 1,
                  "split": None, "size": 10})
    chain = transforms.parse([{"center_crop": {"size": 8}}])
    processor = ImageProcessor(chain, {"channels": 3, "max_pixels": 10_000, "min_size": 1},
                               {"format": "png", "quality": None}, ["a", "b"])

    def check_images(images):
        assert len(images) == 1
        (image,) = images
        decoded = RECORD.decode(image.record)
        assert (image.key, decoded["key"], decoded["label"]) == ("a/good.png", b"a/good.png", 0)
        assert decoded["sha256"].decode() == hashlib.sha256(files["a/good.png"]).hexdigest()
        stored = transforms.decode_image(decoded["image"])
        np.testing.assert_array_equal(stored, good[6:14, 11:19])
        assert image.pixel_sums == statistics.pixel_sums(good[6:14, 11:19])

    with local_pipeline() as p:
        result = p | beam.Create(items) | ProcessImages(processor, threads=2)
        assert_that(result.images, check_images, label="CheckImages")
        assert_that(
            result.dropped | beam.Map(lambda d: (d.key, d.stage, d.reason)),
            equal_to([("a/small.png", "transform", "transform_failed"),
                      ("b/empty.jpg", "decode", "empty"),
                      ("b/text.png", "decode", "not_an_image"),
                      ("b/gone.png", "read", "unreadable")]),
            label="CheckDropped")
        assert_that(result.inputs | beam.combiners.Count.Globally(), equal_to([5]),
                    label="CheckInputs")


def test_error_report_is_sorted_and_counted(tmp_path):
    rows = [DroppedFile(f"k{i % 7}", "decode", reason, f"/x/k{i}", "m")
            for i, reason in enumerate(["corrupt", "empty", "corrupt", "too_small", "corrupt"])]
    with local_pipeline() as p:
        counts = p | beam.Create(list(reversed(rows))) | WriteErrorReport(str(tmp_path))
        assert_that(counts, equal_to([{"corrupt": 3, "empty": 1, "too_small": 1}]))
    lines = (tmp_path / "errors.jsonl").read_text().splitlines()
    parsed = [json.loads(line) for line in lines]
    assert [(r["key"], r["uri"]) for r in parsed] == sorted((r.key, r.uri) for r in rows)
    assert set(parsed[0]) == {"key", "uri", "stage", "reason", "message"}


def test_channel_statistics_dataclass_is_what_extract_returns():
    combine = statistics.ChannelMomentsCombineFn()
    image = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    out = combine.extract_output(combine.add_input(combine.create_accumulator(),
                                                   statistics.pixel_sums(image)))
    assert isinstance(out, ChannelStatistics)
    assert dataclasses.asdict(out)["count"] == 4
