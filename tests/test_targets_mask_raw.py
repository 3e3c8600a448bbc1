"""``targets.mask.encoding: raw``: the semantic mask stored as one byte per pixel.

Real builds on the DirectRunner of the generated corpus (tests/targets_data.py),
once with the default PNG mask and once raw: the reader, `kiln verify`,
`kiln preview` and TFDS read the same masks from both, and switching the
encoding is a new dataset version.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

import kiln.reader
import targets_data as data
from conftest import backdated
from kiln.errors import ConfigError
from kiln.pipeline import build
from kiln.schemas import Schema, decode_mask
from test_targets_build import config, png_pixels, records

AUGMENT = [
    {"random_resized_crop": {"size": [40, 48], "scale_range": [0.4, 1.0], "method": "nearest"}},
    "random_flip_left_right",
    "random_flip_up_down",
]
RAW_TARGETS = {**data.TARGETS, "mask": {"ignore_value": data.IGNORE, "encoding": "raw"}}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mask-raw-corpus")
    manifest, rows = data.corpus(folder, 12)
    return backdated(folder), manifest, rows


@pytest.fixture(scope="module")
def png_build(corpus, tmp_path_factory):
    _, manifest, _ = corpus
    return build(config(manifest, tmp_path_factory.mktemp("png")))


@pytest.fixture(scope="module")
def raw_build(corpus, tmp_path_factory):
    _, manifest, _ = corpus
    return build(config(manifest, tmp_path_factory.mktemp("raw"), targets=RAW_TARGETS))


def read(dataset_dir: str, split: str, augment) -> list[tuple[np.ndarray, dict]]:
    dataset = kiln.reader.load(
        dataset_dir, split, batch_size=None, seed=11, augment=augment, shuffle=False
    )
    return [
        (image.numpy(), {name: value.numpy() for name, value in targets.items()})
        for image, targets in dataset
    ]


def test_raw_masks_are_height_times_width_bytes_of_the_png_pixels(png_build, raw_build):
    assert raw_build.info.targets["mask"] == {"ignore_value": data.IGNORE, "encoding": "raw"}
    assert png_build.info.targets["mask"] == {"ignore_value": data.IGNORE, "encoding": "png"}
    assert "raw" in Schema.from_json(raw_build.info.schema).feature("mask").description
    png, raw = records(png_build), records(raw_build)
    assert sorted(png) == sorted(raw)
    for key, record in raw.items():
        height, width = record["height"], record["width"]
        assert len(record["mask"]) == height * width
        expected = png_pixels(png[key]["mask"])
        assert expected.shape == (height, width)
        np.testing.assert_array_equal(
            np.frombuffer(record["mask"], np.uint8).reshape(height, width), expected
        )
        # Everything else is the same; instance masks stay PNG.
        assert record.keys() == png[key].keys()
        for name in record.keys() - {"mask"}:
            np.testing.assert_equal(record[name], png[key][name], err_msg=name)


def test_decode_mask_reads_either_encoding_and_refuses_a_short_raw_mask(png_build, raw_build):
    png, raw = records(png_build), records(raw_build)
    key = sorted(raw)[0]
    height, width = raw[key]["height"], raw[key]["width"]
    from_raw = decode_mask(tf.constant(raw[key]["mask"]), "raw", height, width)
    from_png = decode_mask(tf.constant(png[key]["mask"]))
    np.testing.assert_array_equal(from_raw.numpy(), from_png.numpy())
    with pytest.raises(tf.errors.InvalidArgumentError):
        decode_mask(tf.constant(raw[key]["mask"][:-1]), "raw", height, width)


@pytest.mark.parametrize("augment", [None, AUGMENT])
def test_the_reader_yields_the_same_elements_from_both_encodings(png_build, raw_build, augment):
    for split in png_build.info.splits:
        from_png = read(png_build.dataset_dir, split, augment)
        from_raw = read(raw_build.dataset_dir, split, augment)
        assert len(from_png) == len(from_raw) == png_build.info.splits[split].num_examples
        for (png_image, png_targets), (raw_image, raw_targets) in zip(
            from_png, from_raw, strict=True
        ):
            np.testing.assert_array_equal(raw_image, png_image)
            assert raw_targets.keys() == png_targets.keys()
            for name in png_targets:
                np.testing.assert_array_equal(raw_targets[name], png_targets[name], err_msg=name)
            if augment is not None:
                assert raw_targets["mask"].shape == (40, 48, 1)


def test_the_augmentation_moves_the_raw_mask(raw_build):
    """Not a no-op by accident: with the crop and flips some element's mask changes."""
    stored = read(raw_build.dataset_dir, "train", None)
    moved = read(raw_build.dataset_dir, "train", AUGMENT)
    assert any(
        a[1]["mask"].shape != b[1]["mask"].shape or not np.array_equal(a[1]["mask"], b[1]["mask"])
        for a, b in zip(stored, moved, strict=True)
    )


def test_switching_the_encoding_is_a_new_version_and_png_keeps_its_fingerprint(corpus, tmp_path):
    _, manifest, _ = corpus
    out = tmp_path / "out"
    first = build(config(manifest, out))
    assert build(config(manifest, out)).up_to_date
    # The default is not written into the config: a mask config from before
    # the choice keeps its fingerprint (and so its version).
    assert "encoding" not in first.info.config["targets"]["mask"]
    explicit = build(config(manifest, out, targets={**data.TARGETS, "mask": {"encoding": "png"}}))
    assert explicit.up_to_date and explicit.version == first.version
    second = build(config(manifest, out, targets=RAW_TARGETS))
    assert not second.up_to_date
    assert second.version != first.version
    assert second.info.config["targets"]["mask"]["encoding"] == "raw"
    assert build(config(manifest, out, targets=RAW_TARGETS)).up_to_date
    # Back to png: the png version (still on disk), not the raw one.
    assert build(config(manifest, out)).version == first.version


def rewrite_first_record(dataset_dir: str, info, change) -> str:
    """Rewrites the first record of the first train shard through `change`; returns the shard."""
    schema = Schema.from_json(info.schema)
    shard = info.splits["train"].shards[0]
    path = os.path.join(dataset_dir, shard.filename)
    serialized = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    serialized[0] = schema.encode(change(schema.decode(serialized[0])))
    with tf.io.TFRecordWriter(path) as writer:
        for record in serialized:
            writer.write(record)
    return shard.filename


@pytest.mark.parametrize("cut", [1, -1])
def test_verify_reports_a_raw_mask_of_the_wrong_length(raw_build, tmp_path, cut):
    from kiln.tools.verify import verify

    assert verify(raw_build.dataset_dir).ok
    folder = tmp_path / "copy"
    shutil.copytree(raw_build.dataset_dir, folder)

    def change(record):
        mask = record["mask"]
        return {**record, "mask": mask[:-1] if cut > 0 else mask + b"\x00"}

    shard = rewrite_first_record(str(folder), raw_build.info, change)
    problems = [str(p) for p in verify(str(folder)).problems]
    message = r"record 0: .*raw mask: its byte length is not height\*width.*\[3072\]"
    assert any(shard in p and re.search(message, p) for p in problems), problems


@pytest.mark.parametrize("augment", [None, AUGMENT])
def test_the_reader_names_a_raw_mask_of_the_wrong_length(raw_build, tmp_path, augment):
    folder = tmp_path / "copy"
    shutil.copytree(raw_build.dataset_dir, folder)
    rewrite_first_record(str(folder), raw_build.info, lambda r: {**r, "mask": r["mask"][:-5]})
    size = data.HEIGHT * data.WIDTH
    message = rf"raw mask: its byte length is not height\*width.*\b{size - 5}\b.*\b{size}\b"
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"(?s){message}"):
        read(str(folder), "train", augment)


def test_preview_draws_the_raw_mask_as_the_png_one(png_build, raw_build):
    from kiln.tools import contact_sheet

    from_png = contact_sheet.gather(png_build.dataset_dir, "train", n=3, epochs=1, seed=0)
    from_raw = contact_sheet.gather(raw_build.dataset_dir, "train", n=3, epochs=1, seed=0)
    assert from_raw.stored_targets is not None and from_png.stored_targets is not None
    for png_row, raw_row in (
        (from_png.stored_targets, from_raw.stored_targets),
        (from_png.epoch_targets[0], from_raw.epoch_targets[0]),
    ):
        for png_cell, raw_cell in zip(png_row, raw_row, strict=True):
            np.testing.assert_array_equal(raw_cell["mask"], png_cell["mask"])
    png_sheet, _ = contact_sheet.compose(from_png, zoom=2, text=False)
    raw_sheet, _ = contact_sheet.compose(from_raw, zoom=2, text=False)
    np.testing.assert_array_equal(raw_sheet, png_sheet)


def test_tfds_reads_a_raw_mask_of_one_size_as_h_w_1(raw_build):
    import tensorflow_datasets as tfds  # test-only dependency (the dev extra)

    from kiln.schemas.tfds_metadata import TFDS_FEATURES_FILENAME

    with open(os.path.join(raw_build.dataset_dir, TFDS_FEATURES_FILENAME)) as f:
        written = json.load(f)
    assert tfds.features.FeatureConnector.from_json(written).to_json() == written
    builder = tfds.builder_from_directory(raw_build.dataset_dir)
    feature = builder.info.features["segmentation/mask"]
    assert isinstance(feature, tfds.features.Tensor)
    assert feature.shape == (data.HEIGHT, data.WIDTH, 1) and feature.np_dtype == np.uint8
    expected = records(raw_build)
    # kiln's unshuffled order (see tests/test_tfds_interop.py): element i of the
    # reader is example i of TFDS.
    same_order = tfds.ReadConfig(interleave_cycle_length=16, interleave_block_length=1)
    seen = 0
    for split in raw_build.info.splits:
        stored = read(raw_build.dataset_dir, split, None)
        dataset = builder.as_dataset(split=split, shuffle_files=False, read_config=same_order)
        examples = list(tfds.as_numpy(dataset))
        assert len(examples) == len(stored)
        for example, (image, targets) in zip(examples, stored, strict=True):
            mask = example["segmentation/mask"]
            assert mask.shape == (data.HEIGHT, data.WIDTH, 1)
            np.testing.assert_array_equal(mask, targets["mask"])  # the reader's stored mask
            np.testing.assert_array_equal(  # same order: the same image
                example["image/encoded"], np.round(image * 255).astype(np.uint8)
            )
            record = expected[example["image/key"].decode()]
            np.testing.assert_array_equal(
                mask[:, :, 0],
                np.frombuffer(record["mask"], np.uint8).reshape(data.HEIGHT, data.WIDTH),
            )
            seen += 1
    assert seen == len(expected)


def test_tfds_json_of_a_raw_mask_is_what_tfds_writes():
    import tensorflow_datasets as tfds

    from kiln.schemas.tfds_metadata import _semantic_mask_json

    class Info:  # the two things `_semantic_mask_json` reads of a DatasetInfo
        def __init__(self, image_size):
            self.image_size = image_size
            self.targets_config = kiln.schemas.TargetsConfig.model_validate(
                {"mask": {"encoding": "raw"}}
            )

    for image_size, shape in (((48, 64), (48, 64, 1)), (None, (None,))):
        ours = _semantic_mask_json(Info(image_size))
        tensor = tfds.features.Tensor(shape=shape, dtype=np.uint8, encoding="bytes")
        theirs = tfds.features.FeaturesDict({"mask": tensor}).to_json()
        assert ours == theirs["content"]["features"]["mask"]


def test_tfds_reads_raw_masks_of_varying_sizes_flat(tmp_path):
    import tensorflow_datasets as tfds

    rows = [data.manifest_row(index, tmp_path) for index in range(6)]
    # Image 0 has no objects: made smaller, with its mask, it is a second size.
    small = data.image_of([])[:30, :40]
    data.write_png(tmp_path / "images" / "000.png", small)
    data.write_png(tmp_path / "masks" / "000.png", np.full((30, 40), data.IGNORE, np.uint8))
    manifest = data.write_manifest(tmp_path, rows)
    result = build(config(manifest, tmp_path / "out", targets=RAW_TARGETS))
    assert result.info.image_size is None
    builder = tfds.builder_from_directory(result.dataset_dir)
    assert builder.info.features["segmentation/mask"].shape == (None,)
    expected = records(result)
    assert {(r["height"], r["width"]) for r in expected.values()} == {(30, 40), (48, 64)}
    seen = 0
    for split in result.info.splits:
        for example in tfds.as_numpy(builder.as_dataset(split=split)):
            record = expected[example["image/key"].decode()]
            flat = example["segmentation/mask"]
            assert flat.shape == (record["height"] * record["width"],)
            mask = flat.reshape(example["image/height"], example["image/width"])
            np.testing.assert_array_equal(
                mask,
                np.frombuffer(record["mask"], np.uint8).reshape(record["height"], record["width"]),
            )
            seen += 1
        # The reader reads the same masks.
        for _, targets in read(result.dataset_dir, split, None):
            assert targets["mask"].shape[2] == 1
    assert seen == len(expected)


def test_an_unknown_mask_encoding_is_a_config_error_naming_the_key(tmp_path):
    from kiln.pipeline import config as config_module

    with pytest.raises(ConfigError, match=r"targets\.mask\.encoding"):
        config_module.load(
            {
                "name": "x",
                "source": {"type": "manifest", "path": "m.jsonl"},
                "output": str(tmp_path),
                "targets": {"mask": {"encoding": "jpeg"}},
            },
            check_paths=False,
        )


def test_a_kiln_json_from_before_the_choice_reads_as_png():
    from kiln.reader.targets import TargetSpec
    from kiln.schemas import TargetsConfig

    old = {"boxes": {"min_visibility": 0.25, "fields": {}}, "mask": {"ignore_value": 255}}
    assert TargetSpec.from_json(old).mask_encoding == "png"
    assert TargetsConfig.model_validate(old).mask.encoding == "png"
    raw = {**old, "mask": {"ignore_value": 255, "encoding": "raw"}}
    assert TargetSpec.from_json(raw).mask_encoding == "raw"


def classes_of(image: np.ndarray) -> np.ndarray:
    """The class mask the corpus's colours say: each pixel's class id, IGNORE elsewhere."""
    pixels = np.round(image * 255.0).astype(np.int64)
    mask = np.full(image.shape[:2], data.IGNORE, np.int64)
    for class_id, name in enumerate(data.CLASSES):
        mask[np.all(pixels == data.COLOURS[name], axis=-1)] = class_id
    return mask[..., None]


@pytest.mark.parametrize("size", [[40, 48], [56, 56], [72, 60]])
def test_the_moved_mask_is_the_moved_images_classes(png_build, raw_build, size):
    """Crop, flips and a nearest resize move the mask with the image pixel for
    pixel, whether the output is shorter than the stored mask (rows moved
    first) or at least as tall ([56, 56], [72, 60]: the window's columns
    moved first), and square (both axes' indices at once) or not."""
    augment = [
        {"random_resized_crop": {"size": size, "scale_range": [0.2, 1.0], "method": "nearest"}},
        "random_flip_left_right",
        "random_flip_up_down",
    ]
    for build_result in (png_build, raw_build):
        elements = read(build_result.dataset_dir, "train", augment)
        assert elements
        for image, targets in elements:
            assert targets["mask"].shape == (*size, 1)
            np.testing.assert_array_equal(targets["mask"], classes_of(image))
