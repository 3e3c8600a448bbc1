"""Splits that stay put and stay balanced (`kiln.pipeline.splits`).

With fractions a record keeps its split while its content (or key) is
unchanged; with ``stratify: true`` every class gets each split's share
within one file, and files already assigned keep their split when new ones
arrive. Checked on the assignment rule itself and on real builds, whose
splits are read back from the shards.
"""

import hashlib
import os
import random
import shutil

import pytest
import tensorflow as tf

from conftest import make_config
from kiln.pipeline import ConfigError, build, config, demo_data
from kiln.pipeline import splits as splits_module
from kiln.pipeline.splits import stratify_class
from kiln.schemas import Schema

FRACTIONS = {"train": 0.7, "validation": 0.15, "test": 0.15}
SHARDS = {"num_shards": {"train": 2, "validation": 1, "test": 1}}


def splits_of(result):
    """key -> split of every record, read from the shards."""
    found = {}
    schema = Schema.from_json(result.info.schema)
    for split in result.info.splits.values():
        for shard in split.shards:
            path = os.path.join(result.dataset_dir, shard.filename)
            for serialized in tf.data.TFRecordDataset(path).as_numpy_iterator():
                found[schema.decode(serialized)["key"].decode()] = split.name
    return found


def largest_deviation(result):
    """The largest |count - fraction * class size| over classes and splits, in files."""
    info = result.info
    worst = 0.0
    for name in info.class_names:
        size = sum(split.class_counts[name] for split in info.splits.values())
        for split, fraction in FRACTIONS.items():
            worst = max(worst, abs(info.splits[split].class_counts[name] - fraction * size))
    return worst


def assign(fractions, keys, previous):
    """`stratify_class` over keys in a fixed random order, as the listing calls it."""
    order = sorted(keys, key=lambda key: (hashlib.sha256(key.encode()).digest(), key))
    rows = [(position, previous.get(key)) for position, key in enumerate(order)]
    kept = {}
    for _, split in rows:
        if split is not None:
            kept[split] = kept.get(split, 0) + 1
    chosen = dict(stratify_class(fractions, rows, kept, len(order)))
    return {key: chosen[position] for position, key in enumerate(order)}


@pytest.mark.parametrize(
    "fractions",
    [FRACTIONS, {"train": 0.8, "validation": 0.1, "test": 0.1}, {"a": 0.5, "b": 0.5}],
)
def test_stratified_assignment_is_within_one_file_and_keeps_assigned_files(fractions):
    rng = random.Random(7)
    for trial in range(300):
        keys = [f"{trial}/{i}" for i in range(rng.randint(1, 40))]
        assigned = {}
        for step in range(8):
            chosen = assign(fractions, keys, assigned)
            assert all(chosen[key] == split for key, split in assigned.items())
            assigned = chosen
            for split, fraction in fractions.items():
                count = sum(1 for s in chosen.values() if s == split)
                assert abs(count - fraction * len(keys)) < 1, (trial, step, split)
            keys = keys + [f"{trial}/{step}/{i}" for i in range(rng.choice([0, 1, 2, 3, 9, 30]))]


def test_zero_fraction_splits_get_nothing():
    chosen = assign({"train": 0.9, "test": 0.1, "unused": 0.0}, [str(i) for i in range(57)], {})
    assert "unused" not in chosen.values()


def assign_class_sets(fractions, files, previous):
    """`stratify_class_sets` over ``key -> classes`` as the listing calls it:
    in stratum order, then draw, then key."""
    no_class = (splits_module.NO_CLASS,)
    sizes, kept, kept_files = {}, {}, {}
    for key, classes in files.items():
        for c in classes or no_class:
            sizes[c] = sizes.get(c, 0) + 1
            if key in previous:
                kept.setdefault(c, {})[previous[key]] = kept.get(c, {}).get(previous[key], 0) + 1
        if key in previous:
            kept_files[previous[key]] = kept_files.get(previous[key], 0) + 1
    order = splits_module.class_set_order(sizes)
    keys = sorted(
        files,
        key=lambda key: (
            order[splits_module.key_class(files[key] or no_class, order)],
            hashlib.sha256(key.encode()).digest(),
            key,
        ),
    )
    rows = [(i, files[key] or no_class, previous.get(key)) for i, key in enumerate(keys)]
    chosen = dict(
        splits_module.stratify_class_sets(fractions, rows, sizes, kept, kept_files, len(keys))
    )
    return {key: chosen[i] for i, key in enumerate(keys)}


def hashed(fractions, keys):
    """What ``split_by: key`` without stratify draws (the baseline)."""
    policy = splits_module.SplitPolicy(tuple(sorted(fractions.items())), "key")
    return {key: policy.assign(key, "", None) for key in keys}


def class_deviations(fractions, files, assigned):
    """class -> the largest |files of the class in a split - fraction * class size|."""
    worst = {}
    for c in {c for classes in files.values() for c in classes}:
        members = [key for key, classes in files.items() if c in classes]
        worst[c] = max(
            abs(sum(1 for key in members if assigned[key] == split) - fraction * len(members))
            for split, fraction in fractions.items()
        )
    return worst


def random_class_sets(rng, trial, count):
    """``key -> classes``: 0 to 4 objects per image over 2 to 12 classes of
    very unequal frequency (some classes in a handful of images)."""
    num_classes = rng.randint(2, 12)
    weights = [rng.random() ** 3 for _ in range(num_classes)]
    return {
        f"{trial}/{i}": tuple(
            sorted(set(rng.choices(range(num_classes), weights, k=rng.randint(0, 4))))
        )
        for i in range(count)
    }


def test_class_set_stratification_balances_every_class_far_better_than_a_hash():
    fractions = {"train": 0.8, "validation": 0.1, "test": 0.1}
    rng = random.Random(1)
    stratified, baseline = [], []
    for trial in range(200):
        files = random_class_sets(rng, trial, rng.randint(20, 300))
        assigned = assign_class_sets(fractions, files, {})
        worst = class_deviations(fractions, files, assigned)
        sizes = {c: sum(c in classes for classes in files.values()) for c in worst}
        rarest = min(sizes, key=lambda c: (sizes[c], c))
        assert worst[rarest] < 1, trial  # the first stratum is exact
        # Files without a class are spread by their own shares too.
        empty = [key for key, classes in files.items() if not classes]
        for split, fraction in fractions.items():
            count = sum(1 for key in empty if assigned[key] == split)
            assert abs(count - fraction * len(empty)) < 1, trial
        stratified.append(max(worst.values()))
        baseline.append(max(class_deviations(fractions, files, hashed(fractions, files)).values()))
    # Every class, not only the rarest: the median corpus's worst class is
    # within one file of its shares (a hash's is four files off).
    assert sorted(stratified)[100] < 1 and sorted(baseline)[100] >= 3
    assert sum(s <= b for s, b in zip(stratified, baseline, strict=True)) >= 190


def test_class_set_stratification_keeps_assigned_files_and_skips_empty_splits():
    fractions = {"a": 0.6, "b": 0.4, "unused": 0.0}
    rng = random.Random(3)
    for trial in range(50):
        files = random_class_sets(rng, trial, rng.randint(5, 60))
        assigned = {}
        for step in range(5):
            chosen = assign_class_sets(fractions, files, assigned)
            assert all(chosen[key] == split for key, split in assigned.items())
            assert "unused" not in chosen.values()
            assigned = chosen
            more = random_class_sets(rng, f"{trial}/{step}", rng.choice([0, 1, 5, 20]))
            files = {**files, **more}


def test_stratify_needs_split_by_key(base_config, tmp_path):
    base_config["splits"] = {"fractions": FRACTIONS, "stratify": True}
    base_config["output"] = str(tmp_path)
    with pytest.raises(ConfigError, match=r"splits.*stratify: true needs split_by: key"):
        config.load(base_config)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """A folder of 43 demo images (11/11/11/10 per class) and one of 60 whose
    first 43 are the same files."""
    tmp = tmp_path_factory.mktemp("stratified")
    demo_data.generate(tmp / "images", num_images=43, include_broken=False)
    demo_data.generate(tmp / "more", num_images=60, include_broken=False)
    return tmp


def add_new_files(corpora, images):
    more = corpora / "more"
    added = []
    for class_name in sorted(os.listdir(more)):
        for name in sorted(os.listdir(more / class_name)):
            if not (images / class_name / name).exists():
                shutil.copyfile(more / class_name / name, images / class_name / name)
                added.append(f"{class_name}/{name}")
    return added


@pytest.mark.parametrize("stratify", [False, True])
def test_files_keep_their_split_when_files_are_added(corpora, tmp_path, stratify):
    images = tmp_path / "images"
    shutil.copytree(corpora / "images", images)
    splits = {"fractions": FRACTIONS, "split_by": "key" if stratify else "content"}
    if stratify:
        splits["stratify"] = True
    settings = make_config(
        str(images), output=str(tmp_path / "out"), splits=splits, sharding=SHARDS
    )
    first = build(settings)
    before = splits_of(first)
    assert len(before) == 43

    added = add_new_files(corpora, images)
    assert len(added) == 17
    second = build(settings)
    after = splits_of(second)
    assert set(after) == set(before) | set(added)
    assert {key: after[key] for key in before} == before

    if stratify:
        # Every class's split counts are within one file of their share,
        # before and after the additions.
        assert largest_deviation(first) < 1
        assert largest_deviation(second) < 1
        # A fresh build of the same 60 files (no previous version) is
        # balanced too. Its assignment may differ from the one that kept the
        # first 43 in place: the assigned splits are part of the version.
        fresh = build({**settings, "output": str(tmp_path / "fresh")})
        assert largest_deviation(fresh) < 1
        assert (fresh.version == second.version) == (splits_of(fresh) == after)


def write_detection_corpus(folder, count, start=0):
    """Images with 0 to 3 boxes of unequal classes ("rare" in one image of
    ten, "common" in most), listed in ``folder/manifest.jsonl`` (appended)."""
    import json

    import cv2
    import numpy as np

    rng = random.Random(11)
    folder.mkdir(exist_ok=True)
    lines = []
    for index in range(start + count):
        objects = [{"bbox": [1, 1, 9, 9], "class": "common"}] if index % 5 else []
        if index % 3 == 0:
            objects.append({"bbox": [2, 2, 12, 12], "class": "middling"})
        if index % 10 == 7:
            objects.append({"bbox": [4, 4, 14, 14], "class": "rare"})
        shade = rng.randint(0, 255)
        if index >= start:
            path = folder / f"{index:03d}.png"
            assert cv2.imwrite(str(path), np.full((16, 16, 3), shade, np.uint8))
            lines.append(json.dumps({"path": path.name, "objects": objects}))
    with open(folder / "manifest.jsonl", "a") as f:
        f.write("".join(line + "\n" for line in lines))
    return str(folder / "manifest.jsonl")


def test_a_detection_dataset_stratifies_by_the_classes_of_its_objects(tmp_path):
    data = tmp_path / "data"
    manifest = write_detection_corpus(data, 60)
    fractions = {"train": 0.6, "validation": 0.2, "test": 0.2}

    def settings(stratify, output):
        return {
            "name": "boxes",
            "source": {"type": "manifest", "path": manifest},
            "output": str(tmp_path / output),
            "encoding": {"format": "png"},
            "targets": {"boxes": {}},
            "splits": {"fractions": fractions, "split_by": "key", "stratify": stratify},
        }

    first = build(settings(True, "out"))
    hashed_build = build(settings(False, "hashed"))
    # kiln.json counts, per split, the images carrying each class.
    assert first.info.largest_class_deviation() < 1
    assert hashed_build.info.largest_class_deviation() >= 2
    counts = {name: first.info.splits[name].class_counts["rare"] for name in fractions}
    assert counts == {"train": 4, "validation": 1, "test": 1}

    before = splits_of(first)
    write_detection_corpus(data, 30, start=60)
    second = build(settings(True, "out"))
    after = splits_of(second)
    assert len(after) == 90 and {key: after[key] for key in before} == before
    assert second.info.largest_class_deviation() < 1.5


@pytest.mark.parametrize("damage", ["deleted", "edited"])
@pytest.mark.parametrize("kind", ["label", "boxes"])
def test_a_latest_whose_record_index_is_damaged_is_repaired_by_full(
    corpora, tmp_path, damage, kind
):
    """LATEST's record index deleted or edited by hand: `kiln verify` fails,
    and `kiln build --full` (or --rehash) repairs the version. With stratify
    every build read LATEST's splits from that index first and failed
    (exit 1, "repair it"), the repair included. The splits are in the shards
    too: the build reads them there, keeps every file's split, and finds or
    makes the same version."""
    from kiln.tools import verify

    splits = {"fractions": FRACTIONS, "split_by": "key", "stratify": True}
    if kind == "label":
        images = tmp_path / "images"
        shutil.copytree(corpora / "images", images)
        settings = make_config(
            str(images), output=str(tmp_path / "out"), splits=splits, sharding=SHARDS
        )
    else:  # records without a label (their shards hold none to read back)
        settings = {
            "name": "boxes",
            "source": {"type": "manifest", "path": write_detection_corpus(tmp_path / "data", 30)},
            "output": str(tmp_path / "out"),
            "encoding": {"format": "png"},
            "targets": {"boxes": {}},
            "splits": splits,
            "sharding": SHARDS,
        }
    first = build(settings)
    index = os.path.join(first.dataset_dir, "index.jsonl")
    intact = open(index, "rb").read()

    def spoil():
        if damage == "deleted":
            os.remove(index)
        else:
            with open(index, "ab") as f:
                f.write(b"\n")
        assert not verify.verify(first.dataset_root).ok

    spoil()
    repaired = build(settings, full=True)
    assert repaired.version == first.version
    assert open(index, "rb").read() == intact
    assert verify.verify(first.dataset_root).ok

    # The nightly build after new files came: every split of LATEST's records kept.
    spoil()
    if kind == "label":
        added = add_new_files(corpora, images)
    else:
        write_detection_corpus(tmp_path / "data", 10, start=30)
        added = [f"{index:03d}.png" for index in range(30, 40)]
    second = build(settings)
    assert {key: splits_of(second)[key] for key in splits_of(first)} == splits_of(first)
    assert set(splits_of(second)) == set(splits_of(first)) | set(added)
