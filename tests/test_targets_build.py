"""Builds with targets (real pipelines on the DirectRunner), read back with the dataset's schema.

The corpus (tests/targets_data.py) knows every box, mask, keypoint and
extra column exactly; each test builds it through `kiln.pipeline.build` and
decodes the records with `Schema.from_json(info.schema).decode`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import pathlib
import re
import struct
import zlib

import cv2
import numpy as np
import pytest
import tensorflow as tf

import targets_data as data
from conftest import backdated
from kiln.errors import ConfigError
from kiln.pipeline import build, build_report, command
from kiln.pipeline.statistics import ObjectSums
from kiln.schemas import Schema
from kiln.schemas.metadata import OBJECT_SIZE_EDGES
from targets_data import records


def png_pixels(data_bytes: bytes) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(data_bytes, np.uint8), cv2.IMREAD_UNCHANGED)


def image_pixels(record) -> np.ndarray:
    return cv2.cvtColor(png_pixels(record["image"]), cv2.COLOR_BGR2RGB)


def config(manifest: str, output: pathlib.Path, **overrides) -> dict:
    # A semantic mask's pixel values are ids into source.classes, which it
    # needs: the corpus's masks use the ids of data.CLASSES.
    with_mask = "mask" in overrides.get("targets", data.TARGETS)
    base = {
        "name": "objects",
        "source": {"type": "manifest", "path": manifest}
        | ({"classes": data.CLASSES} if with_mask else {}),
        "output": str(output),
        "encoding": {"format": "png"},
        "targets": data.TARGETS,
        "sharding": {"num_shards": 2},
    }
    base.update(overrides)
    return base


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("targets-corpus")
    manifest, rows = data.corpus(folder, 12)
    return folder, manifest, rows


@pytest.fixture(scope="module")
def plain_build(corpus, tmp_path_factory):
    _, manifest, _ = corpus
    return build(config(manifest, tmp_path_factory.mktemp("out")))


def serialized_records(result) -> list[bytes]:
    """Every record of every split as stored, sorted."""
    out = []
    for split in result.info.splits.values():
        paths = [os.path.join(result.dataset_dir, shard.filename) for shard in split.shards]
        out.extend(serialized.numpy() for serialized in tf.data.TFRecordDataset(paths))
    return sorted(out)


def test_a_compressed_jsonl_manifest_is_jsonl(corpus, plain_build, tmp_path):
    # `manifest.jsonl.gz` holds JSONL once decompressed: read as CSV (its last
    # suffix), targets were refused ("a CSV manifest holds label ... only").
    folder, manifest, _ = corpus
    packed = folder / "manifest.jsonl.gz"
    packed.write_bytes(gzip.compress(pathlib.Path(manifest).read_bytes()))

    result = build(config(str(packed), tmp_path / "out"))

    assert result.info.dropped == plain_build.info.dropped
    assert serialized_records(result) == serialized_records(plain_build)


def test_every_target_round_trips_exactly_without_transforms(corpus, plain_build):
    _, _, rows = corpus
    info = plain_build.info
    assert info.class_names == data.CLASSES
    assert info.targets["boxes"]["fields"] == {"iscrowd": "int"}
    got = records(plain_build)
    assert sorted(got) == sorted(row["path"] for row in rows)
    for index, row in enumerate(rows):
        record = got[row["path"]]
        objects = data.objects_of(index)
        assert record["label"] == data.CLASSES.index(row["label"])
        assert record["labels"].tolist() == sorted(data.CLASSES.index(n) for n in row["labels"])
        expected_boxes = np.array(
            [
                [y0 / 48, x0 / 64, y1 / 48, x1 / 64]
                for x0, y0, x1, y1 in (o["box"] for o in objects)
            ],
            np.float32,
        ).reshape(-1, 4)
        np.testing.assert_array_equal(record["boxes"], expected_boxes)
        assert record["classes"].tolist() == [data.CLASSES.index(o["class"]) for o in objects]
        assert record["iscrowd"].tolist() == [o["iscrowd"] for o in objects]
        keypoints = record["keypoints"]
        assert keypoints.shape == (len(objects), 2, 2)
        for k, obj in enumerate(objects):
            x0, y0, x1, y1 = obj["box"]
            np.testing.assert_allclose(
                keypoints[k],
                [[(y0 + 0.5) / 48, (x0 + 0.5) / 64], [(y1 - 0.5) / 48, (x1 - 0.5) / 64]],
                rtol=1e-6,
            )
        assert record["keypoint_visibility"].tolist() == [[2, 2]] * len(objects)
        np.testing.assert_array_equal(png_pixels(record["mask"]), data.semantic_mask_of(objects))
        assert len(record["instance_masks"]) == len(objects)
        for k, obj in enumerate(objects):
            expected = np.zeros((48, 64), np.uint8)
            x0, y0, x1, y1 = obj["box"]
            expected[y0:y1, x0:x1] = 1
            np.testing.assert_array_equal(png_pixels(record["instance_masks"][k]), expected)
        assert record["weather"] == row["weather"].encode()
        assert record["altitude"] == pytest.approx(row["altitude"])
        assert record["year"] == row["year"]
        np.testing.assert_array_equal(image_pixels(record), data.image_of(objects))


def png_rows(data_bytes: bytes) -> tuple[dict, list[bytes]]:
    """A PNG's header fields and its raw rows (each led by its filter byte)."""
    assert data_bytes[:8] == b"\x89PNG\r\n\x1a\n"
    offset, header, compressed = 8, {}, b""
    while offset < len(data_bytes):
        length, kind = struct.unpack(">I4s", data_bytes[offset : offset + 8])
        body = data_bytes[offset + 8 : offset + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            header = {
                "size": (height, width),
                "depth": depth,
                "colour": colour,
                "interlace": interlace,
            }
        elif kind == b"IDAT":
            compressed += body
        offset += 12 + length
    raw = zlib.decompress(compressed)
    stride = header["size"][1] + 1
    return header, [raw[i : i + stride] for i in range(0, len(raw), stride)]


def test_masks_are_stored_as_unfiltered_single_channel_pngs(plain_build):
    # The reader decodes a mask per element: kiln writes them without a row
    # filter (filter byte 0 on every row), which tf.io.decode_png reads ~3x
    # faster than OpenCV's default Sub filter with run-length deflate.
    for record in records(plain_build).values():
        for encoded in [record["mask"], *record["instance_masks"]]:
            header, rows = png_rows(encoded)
            assert header == {"size": (48, 64), "depth": 8, "colour": 0, "interlace": 0}
            assert len(rows) == 48
            assert {row[0] for row in rows} == {0}
            decoded = tf.io.decode_png(encoded, channels=1).numpy()[..., 0]
            np.testing.assert_array_equal(decoded, png_pixels(encoded))


def test_a_size_a_float_scale_leaves_just_under_a_bucket_edge_counts_at_the_edge():
    # A 40-pixel box from x = 41, letterboxed by 0.8: 31.999999999999993 wide
    # in float, shown as 32.0; it belongs in the 32-64 bucket.
    width = (41 + 40) * 0.8 - 41 * 0.8
    assert width < 32
    sums = ObjectSums()
    sums.add([(0, np.sqrt(width * width))], [])
    entry = sums.statistics().classes["0"]
    assert entry.size_min == entry.size_max == 32.0
    assert entry.size_histogram[OBJECT_SIZE_EDGES.index(32.0)] == 1


def test_kiln_json_counts_objects_per_class_with_exact_size_statistics(corpus, plain_build):
    info = plain_build.info
    stats = info.objects["train"]
    all_objects = [o for index in range(12) for o in data.objects_of(index)]
    for name in data.CLASSES:
        sizes = [
            np.sqrt((o["box"][2] - o["box"][0]) * (o["box"][3] - o["box"][1]))
            for o in all_objects
            if o["class"] == name
        ]
        entry = stats.classes[name]
        assert entry.count == len(sizes)
        assert entry.size_min == pytest.approx(min(sizes))
        assert entry.size_max == pytest.approx(max(sizes))
        assert entry.size_mean == pytest.approx(np.mean(sizes))
        assert sum(entry.size_histogram) == len(sizes)
    assert stats.images_without_objects == 3  # images 0, 4 and 8
    assert stats.dropped == {}
    # Images per class: an image counts once for each class it carries.
    counts = info.splits["train"].class_counts
    for name in data.CLASSES:
        carrying = sum(
            1
            for index in range(12)
            if name in {o["class"] for o in data.objects_of(index)}
            or (not data.objects_of(index) and name == "red")
        )
        assert counts[name] == carrying


def test_targets_follow_a_resize_and_a_pad(corpus, tmp_path):
    _, manifest, rows = corpus
    result = build(
        config(
            manifest,
            tmp_path,
            transforms=[{"resize": {"size": [96, 128]}}, {"pad": {"size": [104, 136]}}],
        )
    )
    got = records(result)
    for index, row in enumerate(rows):
        record = got[row["path"]]
        image = image_pixels(record)
        assert image.shape == (104, 136, 3)
        mask = png_pixels(record["mask"])
        assert mask.shape == (104, 136)
        objects = data.objects_of(index)
        assert len(record["boxes"]) == len(objects)
        for k, obj in enumerate(objects):
            instance = png_pixels(record["instance_masks"][k]).astype(bool)
            assert instance.shape == (104, 136)
            ys, xs = np.nonzero(instance)
            # The stored box encloses the stored instance mask, to a pixel.
            box = record["boxes"][k] * [104, 136, 104, 136]
            from_mask = [ys.min(), xs.min(), ys.max() + 1, xs.max() + 1]
            np.testing.assert_allclose(box, from_mask, atol=1.0)
            # ... and where the original box went: scaled by 2, moved by the padding.
            x0, y0, x1, y1 = obj["box"]
            np.testing.assert_allclose(
                box, [2 * y0 + 4, 2 * x0 + 4, 2 * y1 + 4, 2 * x1 + 4], atol=1e-4
            )
            # The mask agrees with the image: its pixels have the object's colour.
            colour = np.array(data.COLOURS[obj["class"]], float)
            pixels = image[instance].astype(float)
            nearer = np.linalg.norm(pixels - colour, axis=1) < np.linalg.norm(
                pixels - data.BACKGROUND, axis=1
            )
            assert nearer.mean() >= 0.75
            assert set(np.unique(mask[instance])) <= {data.CLASSES.index(obj["class"])}
            # Keypoints land on the corner pixels' centres.
            np.testing.assert_allclose(
                record["keypoints"][k] * [104, 136],
                [[2 * y0 + 5, 2 * x0 + 5], [2 * y1 + 3, 2 * x1 + 3]],
                atol=1e-4,
            )
        # Padding got the ignore value in the semantic mask.
        assert (mask[:4] == data.IGNORE).all() and (mask[:, -4:] == data.IGNORE).all()


def test_min_visibility_drops_and_counts_objects_a_crop_cuts_off(tmp_path):
    rows = [data.manifest_row(index, tmp_path) for index in (3, 7)]
    manifest = data.write_manifest(tmp_path, rows)
    # A 24x24 centre crop of 48x64 keeps columns 20..43: the middle column's
    # objects mostly, the outer columns' objects hardly or not at all.
    result = build(config(manifest, tmp_path / "out", transforms=[{"center_crop": {"size": 24}}]))
    got = records(result)
    kept = sum(len(r["classes"]) for r in got.values())
    dropped = result.info.objects["train"].dropped.get("min_visibility", 0)
    assert kept + dropped == 6  # 3 objects in each image
    assert dropped >= 2
    # The report names exactly the objects the crop cut off: the listed
    # objects without them are the stored ones, in order.
    report = dropped_object_rows(result)
    assert len(report) == dropped
    assert {row["reason"] for row in report} == {"min_visibility"}
    for row in rows:
        named = {r["object"] for r in report if r["key"] == row["path"]}
        left = [o["class"] for i, o in enumerate(row["objects"]) if i not in named]
        stored = [data.CLASSES[c] for c in got[row["path"]]["classes"]]
        assert left == stored, (row["path"], named)
    for record in got.values():
        boxes = record["boxes"]
        assert ((boxes >= 0) & (boxes <= 1)).all()
        assert len(record["instance_masks"]) == len(boxes) == len(record["keypoints"])


BAD_OBJECTS = {
    # key suffix -> (object changes, expected reason)
    "reversed": ({"bbox": [30, 10, 20, 20]}, "bad_box"),
    "nan": ({"bbox": [float("nan"), 10, 20, 20]}, "bad_box"),
    "far_outside": ({"bbox": [200, 10, 220, 20]}, "bad_box"),
    "zero_width": ({"bbox": [20, 10, 20, 20]}, "bad_box"),  # a line
    "unknown_class": ({"class": "purple"}, "unknown_class"),
    "keypoint_nan": ({"keypoints": [float("nan"), 12.5, 2, 20.5, 20.5, 1]}, "bad_keypoints"),
    # Beyond the slack a box has (10% of the 64x48 image's size): no point of the image.
    "keypoint_far": ({"keypoints": [20.5, 20.5, 2, 71, 12.5, 1]}, "bad_keypoints"),
    "mask_size": ({"mask": "masks/small.png"}, "mask_size_mismatch"),
    "missing_mask": ({"mask": "masks/none.png"}, "missing_mask"),
    "corrupt_mask": ({"mask": "masks/corrupt.png"}, "corrupt_mask"),
    "polygon": ({"segmentation": [[1, 1, 5, 1]]}, "bad_polygon"),
    "rle_size": ({"segmentation": {"size": [10, 10], "counts": [100]}}, "mask_size_mismatch"),
    # The mask of something at the left edge, the box of the object in the middle.
    "box_mask": ({"segmentation": [[0, 30, 8, 30, 8, 40, 0, 40]]}, "box_mask_mismatch"),
    # A polygon wholly outside the image: an empty mask under a box inside it.
    "empty_mask": ({"segmentation": [[100, 100, 120, 100, 120, 120]]}, "box_mask_mismatch"),
}


def bad_corpus(folder: pathlib.Path) -> tuple[str, dict[str, str]]:
    """Good images plus one image per bad case: its second object is bad."""
    data.write_png(folder / "masks" / "small.png", np.zeros((10, 10), np.uint8))
    (folder / "masks" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    rows, expected = [], {}
    for index in range(6):
        rows.append(data.manifest_row(index, folder))
    for number, (case, (changes, reason)) in enumerate(sorted(BAD_OBJECTS.items())):
        row = data.manifest_row(2 + 4 * number, folder)  # images with 2 objects
        assert len(row["objects"]) == 2
        bad = dict(row["objects"][1])
        if "mask" in changes or "segmentation" in changes:
            bad.pop("mask", None)
            bad.pop("segmentation", None)
        bad.update(changes)
        row["objects"][1] = bad
        row["path"] = f"images/bad_{case}.png"
        os.link(folder / "images" / f"{2 + 4 * number:03d}.png", folder / row["path"])
        rows.append(row)
        expected[row["path"]] = reason
    # A structural problem is a bad row, found while listing.
    structural = data.manifest_row(1, folder)
    structural["objects"][0]["bbox"] = [1, 2, 3]
    structural["path"] = "images/001.png"
    rows[1] = structural
    return data.write_manifest(folder, rows), expected


def dropped_object_rows(result) -> list[dict]:
    with open(os.path.join(result.dataset_dir, "dropped_objects.jsonl")) as f:
        return [json.loads(line) for line in f]


def sha256_of(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def error_rows(result_or_dir) -> list[dict]:
    folder = result_or_dir if isinstance(result_or_dir, str) else result_or_dir.dataset_dir
    with open(os.path.join(folder, "errors.jsonl")) as f:
        return [json.loads(line) for line in f]


def build_bad_corpus(folder: pathlib.Path, **overrides):
    """A build of `bad_corpus` (the build and what it expects, key -> reason)."""
    manifest, expected = bad_corpus(folder)
    source = {"type": "manifest", "path": manifest, "classes": data.CLASSES}
    return build(config(manifest, folder / "out", source=source, **overrides)), expected


def test_every_bad_annotation_drops_its_image_with_a_reason(tmp_path):
    result, expected = build_bad_corpus(tmp_path, errors={"max_fraction": 0.8})
    rows = {row["key"]: row for row in error_rows(result)}
    for key, reason in expected.items():
        assert rows[key]["reason"] == reason, rows[key]
        assert rows[key]["stage"] == "targets"
        assert "objects[1]" in rows[key]["message"]
    # A mask file that cannot be used is named: where it is in errors.jsonl.
    masks = tmp_path / "masks"
    assert rows["images/bad_mask_size.png"]["message"] == (
        f"objects[1].mask ({masks / 'small.png'}): the mask is 10x10 (HxW) but its image is "
        f"{result.info.image_size[0]}x{result.info.image_size[1]}"
    )
    assert rows["images/bad_corrupt_mask.png"]["message"].startswith(
        f"objects[1].mask ({masks / 'corrupt.png'}): not a PNG"
    )
    assert re.fullmatch(
        r"objects\[1\]: its box \[\d+, \d+, \d+, \d+\] and the box of its instance mask's "
        r"pixels \[0, 30, 8, 40\] overlap by an IoU of 0\.00, less than 0\.5 \(a box or mask "
        r"of another object, or a box in another convention\)",
        rows["images/bad_box_mask.png"]["message"],
    ), rows["images/bad_box_mask.png"]["message"]
    # A keypoint is named by the name the config gives it.
    assert rows["images/bad_keypoint_nan.png"]["message"] == (
        "objects[1].keypoints: tl (index 0) is labelled (visibility 2) but at [nan, 12.5]"
    )
    assert re.fullmatch(
        r"objects\[1\]\.bbox: \[20\.0, 10\.0, 20\.0, 20\.0\] has zero width or height",
        rows["images/bad_zero_width.png"]["message"],
    )
    assert re.fullmatch(
        r"objects\[1\]: its instance mask is empty but its box \[\d+, \d+, \d+, \d+\] covers "
        r"pixel centres \(a polygon or mask outside the image, or of another image\)",
        rows["images/bad_empty_mask.png"]["message"],
    ), rows["images/bad_empty_mask.png"]["message"]
    assert rows["images/bad_keypoint_far.png"]["message"] == (
        "objects[1].keypoints: br (index 1) is labelled (visibility 1) but at [71.0, 12.5], "
        "more than 10% of the 64x48 (WxH) image's size beyond it"
    )
    assert rows["manifest.jsonl:2"]["reason"] == "bad_row"
    assert "objects[0].bbox: expected 4 numbers" in rows["manifest.jsonl:2"]["message"]
    assert set(records(result)) == {f"images/{i:03d}.png" for i in (0, 2, 3, 4, 5)}
    assert result.info.dropped["bad_box"] == 4


def test_bad_annotations_count_against_max_fraction(tmp_path):
    from kiln.pipeline import BuildError

    manifest, _ = bad_corpus(tmp_path)
    with pytest.raises(BuildError, match=r"more than errors.max_fraction.*bad_box: 4"):
        build(
            config(
                manifest,
                tmp_path / "out",
                source={"type": "manifest", "path": manifest, "classes": data.CLASSES},
            )
        )


def test_drop_object_keeps_the_image_and_counts_the_object(tmp_path):
    targets = {**data.TARGETS, "bad_objects": "drop_object"}
    result, expected = build_bad_corpus(
        tmp_path,
        targets=targets,
        errors={"max_fraction": 0.2},  # the bad row
    )
    got = records(result)
    for key in expected:
        assert len(got[key]["classes"]) == 1  # the good object stays
    assert [row["reason"] for row in error_rows(result)] == ["bad_row"]
    dropped = result.info.objects["train"].dropped
    by_reason: dict[str, int] = {}
    for reason in expected.values():
        by_reason[reason] = by_reason.get(reason, 0) + 1
    assert dropped == dict(sorted(by_reason.items()))

    # Each dropped object is named, with its image, its index and why.
    report = dropped_object_rows(result)
    assert {row["key"]: (row["object"], row["reason"]) for row in report} == {
        key: (1, reason) for key, reason in expected.items()
    }
    assert len(report) == len(expected)
    assert all(row["split"] == "train" and "objects[1]" in row["message"] for row in report)
    assert result.info.dropped_objects_sha256 == sha256_of(
        os.path.join(result.dataset_dir, "dropped_objects.jsonl")
    )
    assert (
        "  objects dropped from stored images: 14 (bad_box: 4, bad_keypoints: 2, bad_polygon: 1, "
        "box_mask_mismatch: 2, corrupt_mask: 1, mask_size_mismatch: 2, missing_mask: 1, "
        "unknown_class: 1); see "
        f"{result.dataset_dir}/dropped_objects.jsonl"
    ) in command.summary(result).splitlines()
    scheduler = build_report.succeeded(result, 1.0)  # kiln build --report
    assert scheduler["objects_dropped"] == dropped
    assert scheduler["objects_dropped_file"] == f"{result.dataset_dir}/dropped_objects.jsonl"
    # Named without the data's folder: the index's bytes do not depend on it.
    missing = next(row for row in report if row["reason"] == "missing_mask")
    assert missing["message"].startswith("objects[1].mask: cannot read none.png: ")
    for name in ("dropped_objects.jsonl", "index.jsonl"):
        with open(os.path.join(result.dataset_dir, name)) as f:
            assert str(tmp_path) not in f.read()


def digests(result) -> dict[str, str]:
    out = {}
    for name in sorted(os.listdir(result.dataset_dir)):
        with open(os.path.join(result.dataset_dir, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def test_same_bytes_across_worker_settings(corpus, plain_build, tmp_path):
    _, manifest, _ = corpus
    second = build(
        config(manifest, tmp_path / "second"),
        ["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
    )
    third = build(config(manifest, tmp_path / "third"), image_threads=1)
    assert second.version == third.version == plain_build.version
    assert digests(second) == digests(plain_build) == digests(third)


def test_a_mask_file_edited_in_place_is_rebuilt_into_a_new_version(tmp_path):
    rows = [data.manifest_row(index, tmp_path) for index in (1, 2)]
    manifest = data.write_manifest(tmp_path, rows)
    backdated(tmp_path)  # a mask written just before a build is not verified by the next
    first = build(config(manifest, tmp_path / "out"))
    assert build(config(manifest, tmp_path / "out")).up_to_date
    mask = tmp_path / "masks" / "001.png"
    pixels = png_pixels(mask.read_bytes())
    pixels[0, :] = 2
    data.write_png(mask, pixels)
    second = build(config(manifest, tmp_path / "out"))
    assert not second.up_to_date  # the stamp sees mask files too
    assert second.version != first.version  # the version hashes their content


def test_a_mask_value_outside_the_class_list_drops_its_image(tmp_path):
    """A mask pixel that is neither a class id nor the ignore value (a class
    missing from source.classes) was stored as is: a loss with a logit per
    class fails or turns NaN on it, and kiln.json counted nothing for it."""
    rows = [data.manifest_row(index, tmp_path) for index in range(4)]
    mask = tmp_path / "masks" / "002.png"
    pixels = png_pixels(mask.read_bytes())
    pixels[0, :3] = [3, 7, 3]  # CLASSES has 3 entries: ids 0..2; 255 is ignored
    data.write_png(mask, pixels)
    manifest = data.write_manifest(tmp_path, rows)
    result = build(
        config(
            manifest,
            tmp_path / "out",
            source={"type": "manifest", "path": manifest, "classes": data.CLASSES},
            targets={"mask": {"ignore_value": data.IGNORE}},
            errors={"max_fraction": 0.5},
        )
    )
    assert error_rows(result) == [
        {
            "key": "images/002.png",
            "message": (
                f"mask ({mask}): pixel value(s) 3, 7 are not class ids (the class list has 3 "
                f"classes: 0..2) nor the ignore value 255; list every class the masks use in "
                f"source.classes"
            ),
            "reason": "unknown_class",
            "stage": "targets",
            "uri": str(tmp_path / "images" / "002.png"),
        }
    ]
    assert set(records(result)) == {f"images/{i:03d}.png" for i in (0, 1, 3)}


@pytest.mark.parametrize(
    "source, targets, message",
    [
        (
            {"type": "image_folder", "root": "."},
            {"boxes": {}},
            "targets.boxes: an image_folder source gives one class per image only",
        ),
        (
            {"type": "manifest", "path": "m.csv"},
            {"mask": {}},
            "targets.mask: a CSV manifest holds label, labels and extra columns only",
        ),
        (
            {"type": "manifest", "path": "m.jsonl"},
            {"mask": {}, "keypoints": {"names": ["a"]}},
            "targets: keypoints needs boxes",
        ),
    ],
)
def test_config_refuses_targets_the_source_cannot_give(tmp_path, source, targets, message):
    from kiln.pipeline import config as config_module

    with pytest.raises(ConfigError, match=message):
        config_module.load(
            {"name": "x", "source": source, "output": str(tmp_path), "targets": targets},
            check_paths=False,
        )


def test_stratify_needs_classes_the_listing_knows(tmp_path):
    """The listing stratifies by the classes an image's label, labels or
    objects name: a mask's are known only once the job decodes it. Without
    any, every file was in one group, and the build claimed "stratified"."""
    from kiln.pipeline import config as config_module

    def load(targets):
        return config_module.load(
            {
                "name": "x",
                # A mask's ids index source.classes (test_a_mask_needs_its_class_list).
                "source": {"type": "manifest", "path": "m.jsonl", "classes": ["bg", "a"]},
                "output": str(tmp_path),
                "splits": {
                    "fractions": {"train": 0.5, "test": 0.5},
                    "stratify": True,
                    "split_by": "key",
                },
                "targets": targets,
            },
            check_paths=False,
        )

    with pytest.raises(ConfigError, match=r"splits.stratify: .*\(mask\) name none before"):
        load({"mask": {}})
    for targets in ({"label": {}, "boxes": {}}, {"labels": {}}, {"boxes": {}, "mask": {}}):
        assert load(targets).config.splits.stratify


def test_a_mask_needs_its_class_list(tmp_path):
    """The class list defaults to the class names the rows use, sorted, and
    a mask's pixel values index it: with masks only, the list was empty, and
    the build stored every mask with 0 classes in kiln.json; with labels or
    objects, it matched the ids the masks were drawn with by chance only."""
    from kiln.pipeline import config as config_module

    def load(targets, classes=None):
        source = {"type": "manifest", "path": "m.jsonl", "classes": classes}
        return config_module.load(
            {"name": "x", "source": source, "output": str(tmp_path), "targets": targets},
            check_paths=False,
        )

    message = r"targets.mask: .* declare source.classes, in the masks' id order"
    with pytest.raises(ConfigError, match=message):
        load({"mask": {}})
    with pytest.raises(ConfigError, match=message):
        load({"mask": {"ignore_value": None}, "extra": {"weather": "string"}})
    assert load({"mask": {}}, classes=["background", "road"]).config.targets.mask
    for targets in (
        {"label": {}, "mask": {}},
        {"labels": {}, "mask": {}},
        {"boxes": {}, "mask": {}},
    ):
        with pytest.raises(ConfigError, match=r"targets.mask: .* by chance only") as raised:
            load(targets)
        assert str(raised.value).count("\n") == 0 and "source.classes" in str(raised.value)
        assert load(targets, classes=["background", "road"]).config.targets.mask


def test_csv_manifest_carries_labels_and_extras(tmp_path):
    data.write_png(tmp_path / "a.png", data.image_of([]))
    data.write_png(tmp_path / "b.png", data.image_of(data.objects_of(1)))
    manifest = tmp_path / "m.csv"
    manifest.write_text("path,labels,weather\na.png,,sunny\nb.png,red|blue,rain\nc.png,x,y\n")
    result = build(
        {
            "name": "multi",
            "source": {"type": "manifest", "path": str(manifest)},
            "output": str(tmp_path / "out"),
            "encoding": {"format": "png"},
            "targets": {"labels": {}, "extra": {"weather": "string"}},
            "errors": {"max_fraction": 0.5},
        }
    )
    assert result.info.class_names == ["blue", "red", "x"]
    got = records(result)
    assert got["a.png"]["labels"].tolist() == []
    assert got["b.png"]["labels"].tolist() == [0, 1]
    assert got["b.png"]["weather"] == b"rain"
    assert "label" not in got["a.png"]
    assert [row["reason"] for row in error_rows(result)] == ["missing"]


def test_tfds_reads_a_detection_build(corpus, plain_build):
    import tensorflow_datasets as tfds  # test-only dependency (the dev extra)

    from kiln.schemas.tfds_metadata import TFDS_FEATURES_FILENAME

    with open(os.path.join(plain_build.dataset_dir, TFDS_FEATURES_FILENAME)) as f:
        written = json.load(f)
    assert tfds.features.FeatureConnector.from_json(written).to_json() == written
    builder = tfds.builder_from_directory(plain_build.dataset_dir)
    objects = builder.info.features["objects"]
    assert isinstance(objects["bbox"], tfds.features.BBoxFeature)
    assert objects["label"].names == data.CLASSES
    assert builder.info.features["image/class/labels"].feature.names == data.CLASSES
    assert isinstance(builder.info.features["segmentation/mask"], tfds.features.Image)
    expected = records(plain_build)
    seen = 0
    for example in tfds.as_numpy(builder.as_dataset(split="train")):
        record = expected[example["image/key"].decode()]
        np.testing.assert_array_equal(example["objects"]["bbox"], record["boxes"])
        np.testing.assert_array_equal(example["objects"]["label"], record["classes"])
        np.testing.assert_array_equal(example["objects"]["iscrowd"], record["iscrowd"])
        np.testing.assert_array_equal(example["objects"]["keypoints"], record["keypoints"])
        np.testing.assert_array_equal(
            example["objects"]["keypoints/visibility"], record["keypoint_visibility"]
        )
        np.testing.assert_array_equal(example["image/class/labels"], record["labels"])
        np.testing.assert_array_equal(
            example["segmentation/mask"][:, :, 0], png_pixels(record["mask"])
        )
        masks = example["objects"]["mask"]
        assert masks.shape[0] == len(record["classes"])
        for k, encoded in enumerate(record["instance_masks"]):
            np.testing.assert_array_equal(masks[k][:, :, 0], png_pixels(encoded))
        assert example["extra/weather"] == record["weather"]
        seen += 1
    assert seen == len(expected)


def test_the_reader_reads_images_without_objects(corpus, plain_build):
    """Image 0, 4 and 8 of the corpus have no object: no instance mask to decode."""
    import kiln.reader

    _, _, rows = corpus
    empty = {row["path"].split("/")[-1] for row in rows if not row["objects"]}
    assert empty
    seen = set()
    for split in plain_build.info.splits:
        dataset = kiln.reader.load(
            plain_build.dataset_dir,
            split,
            batch_size=None,
            augment=None,
            shuffle=False,
            as_supervised=False,
        )
        for features in dataset.as_numpy_iterator():
            key = features["key"].decode().split("/")[-1]
            masks = features["instance_masks"]
            assert masks.shape == (len(features["classes"]), data.HEIGHT, data.WIDTH, 1)
            if key in empty:
                seen.add(key)
    assert seen == empty


def test_verify_and_inspect_a_detection_build(plain_build):
    from kiln.tools.inspection import inspect_dataset, render
    from kiln.tools.verify import verify

    result = verify(plain_build.dataset_dir)
    assert result.ok, [str(p) for p in result.problems]
    assert result.num_records == 12
    summary = inspect_dataset(plain_build.dataset_dir)
    assert summary["targets"]["boxes"]["min_visibility"] == 0.25
    text = render(summary)
    assert "targets: label, labels, boxes, mask, instance_masks, keypoints" in text
    counts = {name: c.count for name, c in plain_build.info.objects["train"].classes.items()}
    for name, count in counts.items():
        assert any(line.split()[:2] == [name, str(count)] for line in text.splitlines())
    most = max(len(record["classes"]) for record in records(plain_build).values())
    assert plain_build.info.objects["train"].most_objects == most
    assert f"at most {most} in one image" in text


def test_inspect_names_dropped_objects_and_verify_checks_their_report(tmp_path):
    import shutil

    from kiln.tools.inspection import inspect_dataset, render
    from kiln.tools.verify import verify

    result, expected = build_bad_corpus(
        tmp_path,
        targets={**data.TARGETS, "bad_objects": "drop_object"},
        errors={"max_fraction": 0.2},
    )
    assert verify(result.dataset_dir).ok
    summary = inspect_dataset(result.dataset_dir)
    assert len(summary["dropped_objects"]) == len(expected) and not summary["warnings"]
    text = render(summary)
    assert "objects dropped from stored images (rows in dropped_objects.jsonl):" in text
    assert "    bad_box  4" in text
    # An example per reason: the image, its split and what was wrong with the object.
    assert re.search(r"images/bad_polygon\.png \(train\): objects\[1\]\.segmentation", text)

    folder = tmp_path / "copy"
    shutil.copytree(result.dataset_dir, folder)
    report = folder / "dropped_objects.jsonl"
    report.write_text("".join(report.read_text().splitlines(keepends=True)[1:]))
    problems = [str(p) for p in verify(str(folder)).problems]
    assert any("dropped_objects.jsonl: modified after it was written" in p for p in problems)
    assert any("kiln.json says {'train': {" in p for p in problems), problems
    report.unlink()
    problems = [str(p) for p in verify(str(folder)).problems]
    assert any("dropped_objects.jsonl: missing" in p for p in problems), problems


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: {**r, "boxes": r["boxes"] + 0.9}, r"a box is outside \[0, 1\]"),
        (lambda r: {**r, "boxes": r["boxes"][:, [2, 1, 0, 3]]}, "a box has min > max"),
        (
            lambda r: {**r, "instance_masks": r["instance_masks"][:-1]},
            "boxes but .* instance_masks",
        ),
        (lambda r: {**r, "classes": r["classes"] + 7}, "is not a class id"),
        (lambda r: {**r, "mask": r["instance_masks"][0][:60]}, "record 0"),
    ],
)
def test_verify_finds_broken_targets(plain_build, tmp_path, change, message):
    import shutil

    from kiln.tools.verify import verify

    folder = tmp_path / "copy"
    shutil.copytree(plain_build.dataset_dir, folder)
    schema = Schema.from_json(plain_build.info.schema)
    shard = plain_build.info.splits["train"].shards[0]
    path = str(folder / shard.filename)
    serialized = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    decoded = [schema.decode(s) for s in serialized]
    first = next(i for i, r in enumerate(decoded) if len(r["classes"]) >= 2)
    decoded[first], decoded[0] = decoded[0], change(decoded[first])
    serialized[first], serialized[0] = serialized[0], schema.encode(decoded[0])
    with tf.io.TFRecordWriter(path) as writer:
        for record in serialized:
            writer.write(record)
    problems = [str(p) for p in verify(str(folder)).problems]
    assert any(shard.filename in p and re.search(message, p) for p in problems), problems


def exif_record(tmp_path, orientation: int) -> tuple[dict, list[dict]]:
    """The record of scene 3's stored pixels tagged with EXIF `orientation`,
    annotated as stored (the contract's default), and the scene's objects."""
    import io

    from PIL import Image

    row = data.manifest_row(3, tmp_path)
    objects = data.objects_of(3)
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    Image.fromarray(data.image_of(objects)).save(buffer, "PNG", exif=exif.tobytes())
    (tmp_path / row["path"]).write_bytes(buffer.getvalue())
    manifest = data.write_manifest(tmp_path, [row])
    return next(iter(records(build(config(manifest, tmp_path / "out"))).values())), objects


def test_exif_orientation_moves_the_targets_with_the_pixels(tmp_path):
    # Tagged "rotate 90 degrees clockwise to view" (6).
    record, objects = exif_record(tmp_path, 6)
    assert (record["height"], record["width"]) == (64, 48)  # upright
    # Clockwise: upright x = 48 - stored y, upright y = stored x.
    expected = [
        [x0 / 64, (48 - y1) / 48, x1 / 64, (48 - y0) / 48]
        for x0, y0, x1, y1 in (o["box"] for o in objects)
    ]
    np.testing.assert_allclose(record["boxes"], expected, atol=1e-6)
    upright_mask = np.rot90(data.semantic_mask_of(objects), k=-1)
    np.testing.assert_array_equal(png_pixels(record["mask"]), upright_mask)
    np.testing.assert_array_equal(image_pixels(record), np.rot90(data.image_of(objects), k=-1))
    for k, obj in enumerate(objects):
        x0, y0, x1, y1 = obj["box"]
        # tl (x0 + 0.5, y0 + 0.5) -> upright (x, y) = (48 - y0 - 0.5, x0 + 0.5)
        np.testing.assert_allclose(
            record["keypoints"][k][0], [(x0 + 0.5) / 64, (48 - y0 - 0.5) / 48], atol=1e-6
        )


def test_a_mirroring_exif_orientation_swaps_the_flip_pairs_keypoints(tmp_path):
    """A photo tagged "mirror to view" (2), annotated on its stored pixels: the
    stored image is the mirror image of the one viewers show, so the point
    named ``tl`` there is where ``br``'s name belongs after the mirror
    (``flip_pairs: [[tl, br]]``), as the reader's flips swap them."""
    record, objects = exif_record(tmp_path, 2)
    assert (record["height"], record["width"]) == (48, 64)
    np.testing.assert_array_equal(image_pixels(record), data.image_of(objects)[:, ::-1])
    for k, obj in enumerate(objects):
        x0, y0, x1, y1 = obj["box"]
        # Mirrored: x -> 64 - x; then tl takes br's point and br tl's.
        np.testing.assert_allclose(
            record["keypoints"][k],
            [[(y1 - 0.5) / 48, (64 - x1 + 0.5) / 64], [(y0 + 0.5) / 48, (64 - x0 - 0.5) / 64]],
            atol=1e-6,
        )


def test_a_transform_without_geometry_is_refused_for_geometric_targets(tmp_path):
    from kiln import transforms
    from kiln.pipeline import config as config_module

    if "tgt_data_recolour" not in transforms.names():

        @transforms.register("tgt_data_recolour")
        def recolour(image):  # declares no geometry
            return image

    spec = {
        "name": "x",
        "source": {"type": "manifest", "path": "m.jsonl"},
        "output": str(tmp_path),
        "transforms": ["tgt_data_recolour"],
    }
    with pytest.raises(ConfigError, match=r"transforms\[0\]\.tgt_data_recolour: .*boxes"):
        config_module.load({**spec, "targets": {"boxes": {}}}, check_paths=False)
    # Targets that do not move with the pixels allow it.
    loaded = config_module.load(
        {**spec, "targets": {"labels": {}, "extra": {"a": "int"}}}, check_paths=False
    )
    assert loaded.targets.labels is not None


def test_label_only_targets_are_the_classification_config(tmp_path):
    from kiln.pipeline import config as config_module

    spec = {"name": "x", "source": {"type": "manifest", "path": "m.csv"}, "output": str(tmp_path)}
    plain = config_module.load(spec, check_paths=False)
    spelled = config_module.load({**spec, "targets": {"label": {}}}, check_paths=False)
    assert spelled.config.targets is None
    assert "targets" not in spelled.to_json()
    assert spelled.fingerprint == plain.fingerprint
    boxes = config_module.load({**spec, "targets": {"label": {}, "labels": {}}}, check_paths=False)
    assert boxes.to_json()["targets"]["labels"] == {"separator": "|"}
    assert boxes.fingerprint != plain.fingerprint


def test_rle_segmentation_is_decoded_in_the_job(tmp_path):
    from pycocotools import mask as coco_mask  # the coco extra, in dev

    row = data.manifest_row(2, tmp_path)  # two objects
    x0, y0, x1, y1 = data.objects_of(2)[1]["box"]
    instance = np.zeros((data.HEIGHT, data.WIDTH), np.uint8)
    instance[y0:y1, x0:x1] = 1
    rle = coco_mask.encode(np.asfortranarray(instance))
    row["objects"][1].pop("segmentation", None)
    row["objects"][1].pop("mask", None)
    row["objects"][1]["segmentation"] = {
        "size": list(rle["size"]),
        "counts": rle["counts"].decode(),
    }
    manifest = data.write_manifest(tmp_path, [row])
    source = {"type": "manifest", "path": manifest, "classes": data.CLASSES}  # the mask's ids
    record = next(iter(records(build(config(manifest, tmp_path / "out", source=source))).values()))
    np.testing.assert_array_equal(png_pixels(record["instance_masks"][1]), instance)
