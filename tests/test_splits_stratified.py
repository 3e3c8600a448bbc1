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
from kiln.pipeline.splits import stratify_class
from kiln.schemas import RECORD

FRACTIONS = {"train": 0.7, "validation": 0.15, "test": 0.15}
SHARDS = {"num_shards": {"train": 2, "validation": 1, "test": 1}}


def splits_of(result):
    """key -> split of every record, read from the shards."""
    found = {}
    for split in result.info.splits.values():
        for shard in split.shards:
            path = os.path.join(result.dataset_dir, shard.filename)
            for serialized in tf.data.TFRecordDataset(path).as_numpy_iterator():
                found[RECORD.decode(serialized)["key"].decode()] = split.name
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
