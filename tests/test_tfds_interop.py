"""TFDS interop: `tfds.builder_from_directory` reads a kiln build like kiln's own reader.

tensorflow-datasets is a test-only dependency: the build writes the TFDS
metadata as plain JSON (`kiln.schemas.tfds_metadata`); here real TFDS loads
real builds and must yield the same examples as `kiln.reader.load` without
augmentation.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds  # test-only dependency (the dev extra)

import kiln.reader
from kiln.pipeline.tfds_export import write_tfds_metadata
from kiln.schemas import METADATA_FILENAME, RECORD
from kiln.schemas.tfds_metadata import (
    TFDS_DATASET_INFO_FILENAME,
    TFDS_FEATURES_FILENAME,
    TfdsUnsupported,
    labels_filename,
    tfds_files,
)

IMAGE_KEY, LABEL_KEY, KEY_KEY = RECORD.key("image"), RECORD.key("label"), RECORD.key("key")

BUILDS = {
    # The same overrides as tests/test_build.py, so the session shares the builds.
    "png": {},
    "jpeg": {"encoding": {"format": "jpeg", "quality": 95}},
    "raw_grayscale": {"image": {"channels": 1}, "encoding": {"format": "raw"}},
}


def kiln_examples(dataset_dir: str, split: str) -> dict[bytes, tuple[np.ndarray, int]]:
    """key -> (uint8 image, label) as kiln's reader yields them, unaugmented."""
    dataset = kiln.reader.load(
        dataset_dir, split, batch_size=None, shuffle=False, augment=None, as_supervised=False
    )
    out = {}
    for example in dataset.as_numpy_iterator():
        # The reader yields float32 in [0, 1] = uint8 / 255, exactly invertible.
        image = np.round(example["image"] * 255.0).astype(np.uint8)
        out[example["key"]] = (image, int(example["label"]))
    return out


def tfds_examples(dataset_dir: str, split: str) -> dict[bytes, tuple[np.ndarray, int]]:
    builder = tfds.builder_from_directory(dataset_dir)
    out = {}
    for example in tfds.as_numpy(builder.as_dataset(split=split)):
        assert example[KEY_KEY] not in out, "TFDS yielded a key twice"
        out[example[KEY_KEY]] = (example[IMAGE_KEY], int(example[LABEL_KEY]))
    return out


@pytest.mark.parametrize("kind", sorted(BUILDS))
def test_tfds_reads_the_same_examples_as_the_kiln_reader(build_dataset, kind):
    result = build_dataset(**BUILDS[kind])
    info = result.info
    for split in sorted(info.splits):
        expected = kiln_examples(result.dataset_dir, split)
        got = tfds_examples(result.dataset_dir, split)
        assert len(got) == len(expected) == info.splits[split].num_examples, split
        assert got.keys() == expected.keys()
        for key, (image, label) in expected.items():
            assert got[key][1] == label, key
            assert got[key][0].dtype == np.uint8
            np.testing.assert_array_equal(got[key][0], image, err_msg=f"{split} {key!r}")


def test_tfds_info_describes_the_dataset(build_dataset):
    result = build_dataset()
    info = result.info
    builder = tfds.builder_from_directory(result.dataset_dir)
    assert builder.info.name == info.name
    assert {name: split.num_examples for name, split in builder.info.splits.items()} == {
        name: split.num_examples for name, split in info.splits.items()
    }
    assert {name: split.num_shards for name, split in builder.info.splits.items()} == {
        name: len(split.shards) for name, split in info.splits.items()
    }
    assert builder.info.features[LABEL_KEY].names == info.class_names
    image_feature = builder.info.features[IMAGE_KEY]
    assert isinstance(image_feature, tfds.features.Image)
    assert tuple(image_feature.shape) == (*info.image_size, info.channels)
    assert info.version in builder.info.description

    # as_supervised: (image, label) with the stored image's static shape.
    supervised = builder.as_dataset(split="test", as_supervised=True)
    image_spec, label_spec = supervised.element_spec
    assert image_spec.shape == (*info.image_size, info.channels)
    assert image_spec.dtype == tf.uint8 and label_spec.dtype == tf.int64
    assert sum(1 for _ in supervised) == info.splits["test"].num_examples


def test_features_json_is_what_tfds_itself_writes(build_dataset):
    """TFDS parses our features.json and serializes it back to the same JSON."""
    result = build_dataset()
    with open(os.path.join(result.dataset_dir, TFDS_FEATURES_FILENAME)) as f:
        written = json.load(f)
    features = tfds.features.FeatureConnector.from_json(written)
    assert features.to_json() == written
    # Keyed by the record's serialized keys: TFDS parses exactly kiln's records.
    assert sorted(features.keys()) == sorted(f.key for f in RECORD.features)


def test_metadata_files_are_written_before_kiln_json_and_deterministic(build_dataset):
    result = build_dataset()
    directory = result.dataset_dir
    files = tfds_files(result.info)
    assert sorted(files) == sorted(
        [TFDS_DATASET_INFO_FILENAME, TFDS_FEATURES_FILENAME, labels_filename(LABEL_KEY)]
    )
    for name, text in files.items():
        with open(os.path.join(directory, name)) as f:
            assert f.read() == text, name
    # Pure function of kiln.json: same info, same bytes.
    assert tfds_files(result.info) == files
    kiln_json = os.stat(os.path.join(directory, METADATA_FILENAME)).st_mtime_ns
    assert all(os.stat(os.path.join(directory, name)).st_mtime_ns <= kiln_json for name in files)


def test_gzip_builds_get_no_tfds_metadata(build_dataset):
    result = build_dataset(sharding={"num_shards": 2, "compression": "gzip"})
    present = set(os.listdir(result.dataset_dir))
    assert METADATA_FILENAME in present
    assert TFDS_DATASET_INFO_FILENAME not in present and TFDS_FEATURES_FILENAME not in present
    with pytest.raises(TfdsUnsupported, match="gzip"):
        tfds_files(result.info)


def test_unsupported_layouts_are_refused_with_the_reason(build_dataset, tmp_path):
    info = build_dataset(image={"channels": 1}, encoding={"format": "raw"}).info
    varying = dataclasses.replace(info, image_size=None)
    with pytest.raises(TfdsUnsupported, match="raw pixels of varying sizes"):
        tfds_files(varying)
    assert write_tfds_metadata(str(tmp_path), varying) == []
    assert os.listdir(tmp_path) == []

    bad_label = dataclasses.replace(info, class_names=["ok", "two\nlines"])
    with pytest.raises(TfdsUnsupported, match="class name"):
        tfds_files(bad_label)

    split = info.splits["test"]
    renamed = dataclasses.replace(
        split, shards=[dataclasses.replace(split.shards[0], filename="other-name.tfrecord")]
    )
    with pytest.raises(TfdsUnsupported, match="TFDS's file template"):
        tfds_files(dataclasses.replace(info, splits={**info.splits, "test": renamed}))


def test_tfds_entry_points_on_a_kiln_output_folder(build_dataset):
    """What docs/reader.md says: builder_from_directory reads the version LATEST names
    (via `kiln.reader.locate`); tfds.load by name cannot, as kiln's version folders are
    content ids where TFDS wants ``<name>/<X.Y.Z>/``."""
    result = build_dataset()
    output = os.path.dirname(result.dataset_root)
    builder = tfds.builder_from_directory(kiln.reader.locate(result.dataset_root))
    assert builder.info.splits["train"].num_examples == result.info.splits["train"].num_examples
    assert not tfds.core.Version.is_valid(result.version)
    with pytest.raises(tfds.core.registered.DatasetNotFoundError):
        tfds.load(result.info.name, data_dir=output, split="train")


def test_tfds_reads_kilns_unshuffled_order_with_block_length_one(build_dataset):
    result = build_dataset()
    assert len(result.info.splits["train"].shards) > 1
    kiln_order = [
        key
        for key in kiln.reader.load(
            result.dataset_dir, batch_size=None, shuffle=False, augment=None, as_supervised=False
        )
        .map(lambda features: features["key"])
        .as_numpy_iterator()
    ]
    builder = tfds.builder_from_directory(result.dataset_dir)

    def tfds_order(**options):
        dataset = builder.as_dataset(split="train", shuffle_files=False, **options)
        return [example[KEY_KEY] for example in tfds.as_numpy(dataset)]

    # kiln reads its shards round-robin, one record at a time (16 files at once);
    # TFDS by default takes 16 records from each file in turn.
    same = tfds.ReadConfig(interleave_cycle_length=16, interleave_block_length=1)
    assert tfds_order(read_config=same) == kiln_order
    default = tfds_order()
    assert default != kiln_order and sorted(default) == sorted(kiln_order)


def test_a_tfds_file_missing_beside_the_others_is_damage_to_verify_and_inspect(
    build_dataset, tmp_path
):
    """TFDS cannot read a version whose features.json is gone: `kiln verify`
    fails naming it and `kiln inspect` says TFDS cannot read it, where a
    version without any TFDS file (built before kiln wrote them) passes."""
    from kiln.tools import inspection, verify

    result = build_dataset()
    copy = tmp_path / result.version  # verify wants the folder named for its version
    shutil.copytree(result.dataset_dir, copy)
    os.remove(copy / TFDS_FEATURES_FILENAME)
    with pytest.raises(ValueError, match="likely means the dataset was generated with an old"):
        tfds.builder_from_directory(str(copy))
    problems = verify.verify(str(copy)).problems
    assert [str(problem) for problem in problems] == [
        f"{TFDS_FEATURES_FILENAME}: missing, though the other TFDS files are there: "
        f"tfds.builder_from_directory cannot read the version"
    ]
    summary = inspection.inspect_dataset(str(copy))
    assert summary["tfds"] is False
    assert summary["tfds_unsupported"].startswith(
        f"{TFDS_FEATURES_FILENAME} missing beside the other TFDS files"
    )

    for name in tfds_files(result.info):  # none at all: an older build's version
        if os.path.exists(copy / name):
            os.remove(copy / name)
    assert verify.verify(str(copy)).ok
    summary = inspection.inspect_dataset(str(copy))
    assert summary["tfds"] is False and summary["tfds_unsupported"] is None
