"""Builds from COCO and VOC sources (real pipelines on the DirectRunner), read back.

A small COCO file written here (crowd RLE, polygons, compressed RLE, an
image without annotations, a dangling annotation, an undeclared category)
and the detection demo (`kiln demo-data --targets`, built from its COCO
file and from its JSONL manifest: the same boxes and keypoints either way)
are built with `kiln.pipeline.build` and decoded with the dataset's schema.
"""

from __future__ import annotations

import json
import os

import cv2
import numpy as np
import pytest
from pycocotools import mask as coco_mask

from kiln.errors import ConfigError
from kiln.pipeline import build, demo_targets
from targets_data import error_rows, records

KEYPOINTS = {"names": list(demo_targets.KEYPOINTS), "flip_pairs": [["left", "right"]]}


def png_pixels(data: bytes) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)


def write_png(path, pixels: np.ndarray) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    assert cv2.imwrite(str(path), pixels)


def small_coco(folder) -> str:
    """Three images, their annotations, and what is wrong with some of them."""
    images = folder / "images"
    write_png(images / "a" / "10.png", np.full((48, 64, 3), 90, np.uint8))
    write_png(images / "7.png", np.full((32, 32, 3), 30, np.uint8))
    write_png(images / "empty.png", np.full((20, 20, 3), 60, np.uint8))
    write_png(images / "11.png", np.full((16, 16, 3), 10, np.uint8))
    square = np.zeros((32, 32), np.uint8, order="F")
    square[4:12, 8:24] = 1
    compressed = coco_mask.encode(np.asfortranarray(square))
    compressed["counts"] = compressed["counts"].decode()
    document = {
        "images": [
            {"id": 10, "file_name": "a/10.png", "width": 64, "height": 48},
            {"id": 7, "file_name": "7.png", "width": 32, "height": 32},
            {"id": 12, "file_name": "empty.png", "width": 20, "height": 20},
            {"id": 11, "file_name": "11.png", "width": 16, "height": 16},
        ],
        "annotations": [
            {
                "id": 1,
                "image_id": 10,
                "category_id": 1,
                "bbox": [10, 10, 20, 16],
                "iscrowd": 0,
                "segmentation": [[10, 10, 30, 10, 30, 26, 10, 26]],
            },
            {
                "id": 2,
                "image_id": 10,
                "category_id": 3,
                # A crowd: uncompressed RLE, column-major, 0-runs first.
                "bbox": [40, 0, 2, 48],
                "iscrowd": 1,
                "segmentation": {"size": [48, 64], "counts": [40 * 48, 2 * 48, 22 * 48]},
            },
            {
                "id": 3,
                "image_id": 7,
                "category_id": 3,
                "bbox": [8, 4, 16, 8],
                "segmentation": compressed,
            },
            # No image 99: five annotations of one missing image.
            *(
                {"id": i, "image_id": 99, "category_id": 1, "bbox": [0, 0, 1, 1]}
                for i in (4, 6, 7, 8, 9)
            ),
            {
                "id": 5,
                "image_id": 11,
                "category_id": 42,  # not declared
                "bbox": [1, 1, 4, 4],
                "segmentation": [[1, 1, 5, 1, 5, 5, 1, 5]],
            },
        ],
        "categories": [
            {"id": 1, "name": "person"},
            {"id": 3, "name": "cat"},
            {"id": 2, "name": "bicycle"},
        ],
    }
    path = folder / "instances.json"
    path.write_text(json.dumps(document))
    return str(path)


def coco_config(annotations, images, output, **overrides) -> dict:
    config = {
        "name": "coco",
        "source": {"type": "coco", "annotations": str(annotations), "images": str(images)},
        "output": str(output),
        "encoding": {"format": "png"},
        "targets": {"boxes": {"fields": {"iscrowd": "int"}}, "instance_masks": {}},
        "errors": {"max_fraction": 0.6},
    }
    config.update(overrides)
    return config


def test_a_small_coco_file_builds_and_reads_back(tmp_path):
    annotations = small_coco(tmp_path)
    # 2 of 5 inputs dropped: the missing image 99 counts once, not once per annotation.
    result = build(
        coco_config(
            annotations, tmp_path / "images", tmp_path / "out", errors={"max_fraction": 0.4}
        )
    )
    info = result.info
    assert info.class_names == ["bicycle", "cat", "person"]
    got = records(result)
    assert sorted(got) == ["7.png", "a/10.png", "empty.png"]

    first = got["a/10.png"]
    np.testing.assert_allclose(
        first["boxes"], [[10 / 48, 10 / 64, 26 / 48, 30 / 64], [0, 40 / 64, 1, 42 / 64]]
    )
    assert first["classes"].tolist() == [2, 1] and first["iscrowd"].tolist() == [0, 1]
    polygon, crowd = (png_pixels(m) for m in first["instance_masks"])
    assert polygon.shape == crowd.shape == (48, 64)
    crowd_expected = np.zeros((48, 64), np.uint8)
    crowd_expected[:, 40:42] = 1
    np.testing.assert_array_equal(crowd, crowd_expected)
    # The polygon as pycocotools rasterizes it (kiln's own kernel, close to it).
    expected = coco_mask.decode(
        coco_mask.merge(coco_mask.frPyObjects([[10, 10, 30, 10, 30, 26, 10, 26]], 48, 64))
    )
    assert (polygon & expected).sum() / (polygon | expected).sum() > 0.9

    square = png_pixels(got["7.png"]["instance_masks"][0])
    assert square.sum() == 8 * 16 and square[4:12, 8:24].all()
    assert got["empty.png"]["boxes"].shape == (0, 4)  # an image without annotations

    errors = error_rows(result)
    dangling = errors["instances.json:annotations[3]"]
    assert dangling["reason"] == "dangling_annotation"
    assert dangling["message"] == (
        "image_id 99 is not the id of any entry of 'images'; named by 5 annotations: "
        "annotations[3], annotations[4], annotations[5], annotations[6], annotations[7]"
    )
    # The undeclared category drops its image (bad_objects: drop_image).
    assert errors["11.png"]["reason"] == "unknown_class"
    assert "undeclared category_id 42" in errors["11.png"]["message"]
    assert info.dropped == {"dangling_annotation": 1, "unknown_class": 1}

    from kiln.tools.inspection import inspect_dataset, render

    text = render(inspect_dataset(result.dataset_dir))
    assert f"source:    coco {annotations} (images in {tmp_path / 'images'})" in text


def test_a_coco_file_exported_again_in_another_order_builds_the_same_version(tmp_path):
    """Annotation tools write the same annotations in other orders from one
    export to the next: an image's objects follow their ids, so the records,
    their bytes and the version are the same, and a nightly rebuild finds
    nothing changed (a diff gate is not tripped by the order)."""
    annotations = small_coco(tmp_path)
    first = build(coco_config(annotations, tmp_path / "images", tmp_path / "out"))
    document = json.loads(open(annotations).read())
    image_10 = document["annotations"][:2]
    # Image 10's two objects the other way round, the problems where they were.
    document["annotations"][:2] = image_10[::-1]
    (tmp_path / "again").mkdir()
    reordered = tmp_path / "again" / "instances.json"
    reordered.write_text(json.dumps(document))
    again = build(coco_config(reordered, tmp_path / "images", tmp_path / "out-again"))

    def shards(result):
        return {
            split: [shard.sha256 for shard in info.shards]
            for split, info in result.info.splits.items()
        }

    assert records(again)["a/10.png"]["classes"].tolist() == [2, 1]  # ids 1, 2: person, cat
    assert shards(again) == shards(first)
    assert again.version == first.version

    # Over the first build's output, the reordered file is up to date: no job runs
    # (the objects' annotation names, for messages, are not in the stamp).
    (tmp_path / "instances.json").write_text(json.dumps(document))
    nightly = build(coco_config(annotations, tmp_path / "images", tmp_path / "out"))
    assert nightly.up_to_date and nightly.version == first.version


def one_image_coco(tmp_path, annotations: list[dict], **overrides) -> tuple[dict, dict]:
    """``a.png`` (40x40, image id 1) with `annotations` of category ``thing``,
    written to ``instances.json``: the document and the build config (bad
    objects dropped one by one)."""
    write_png(tmp_path / "images" / "a.png", np.full((40, 40, 3), 50, np.uint8))
    document = {
        "images": [{"id": 1, "file_name": "a.png", "width": 40, "height": 40}],
        "annotations": annotations,
        "categories": [{"id": 1, "name": "thing"}],
    }
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(document))
    spec = coco_config(
        path,
        tmp_path / "images",
        tmp_path / "out",
        targets={"boxes": {}, "bad_objects": "drop_object"},
        **overrides,
    )
    return document, spec


def test_a_bad_box_exported_again_in_another_order_keeps_the_version(tmp_path):
    """A box of negative width is carried as the file writes it, for its
    message; where the file writes it (its annotation's position) is not part
    of the version, so another order is up to date."""
    document, spec = one_image_coco(
        tmp_path,
        [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [4, 4, 10, 10]},
            {"id": 2, "image_id": 1, "category_id": 1, "bbox": [30, 10, -20, 15]},
        ],
    )
    first = build(spec)
    with open(os.path.join(first.dataset_dir, "dropped_objects.jsonl")) as f:
        (row,) = map(json.loads, f)
    assert row["message"] == (
        "objects[1] (annotations[1], id 2).bbox: [30, 10, -20, 15] has a negative width or "
        "height ([x, y, width, height])"
    )

    document["annotations"].reverse()
    (tmp_path / "instances.json").write_text(json.dumps(document))
    again = build(spec)
    assert again.up_to_date and again.version == first.version


def test_a_coco_file_that_cannot_be_read_stops_the_build(tmp_path):
    (tmp_path / "images").mkdir()
    write_png(tmp_path / "images" / "1.png", np.zeros((8, 8, 3), np.uint8))
    (tmp_path / "instances.json").write_text('{"images": [{"id": 1, "file_name": "1.png"}')
    with pytest.raises(ConfigError, match=r"source.annotations: .*not valid JSON"):
        build(coco_config(tmp_path / "instances.json", tmp_path / "images", tmp_path / "out"))


def test_an_ambiguous_category_stops_the_build_before_any_work(tmp_path):
    annotations = small_coco(tmp_path)
    document = json.loads((tmp_path / "instances.json").read_text())
    document["categories"].append({"id": 1, "name": "human"})
    (tmp_path / "instances.json").write_text(json.dumps(document))
    with pytest.raises(ConfigError) as raised:
        build(coco_config(annotations, tmp_path / "images", tmp_path / "out"))
    assert str(raised.value).endswith(
        ": source.annotations: instances.json:categories[3]: category id 1 is declared twice "
        "(also categories[0])"
    )


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        (None, "targets.boxes"),
        ({"label": {}}, "targets.boxes"),
        ({"boxes": {}, "mask": {}}, "targets.mask"),
        ({"boxes": {}, "extra": {"weather": "string"}}, "targets.extra"),
    ],
)
def test_the_config_refuses_targets_coco_cannot_give(tmp_path, targets, message):
    annotations = small_coco(tmp_path)
    config = coco_config(annotations, tmp_path / "images", tmp_path / "out")
    if targets is None:
        del config["targets"]
    else:
        config["targets"] = targets
    with pytest.raises(ConfigError, match=message):
        build(config)


def test_the_config_names_every_path_that_is_the_wrong_kind(tmp_path):
    annotations = small_coco(tmp_path)
    config = coco_config(tmp_path / "images", annotations, tmp_path / "out")  # swapped
    with pytest.raises(ConfigError) as raised:
        build(config)
    assert str(raised.value) == (
        f"config error in config: source.annotations: {tmp_path / 'images'} is a folder; "
        f"a coco source reads one instances JSON file (e.g. annotations/instances_train2017"
        f".json); source.images: "
        f"{annotations} is a file, not the folder of the images"
    )
    config = coco_config(annotations, tmp_path / "images", tmp_path / "out")
    config["source"] = {**config["source"], "type": "voc"}
    with pytest.raises(ConfigError, match=r"source.annotations: .* is a file; a voc source"):
        build(config)


@pytest.fixture(scope="module")
def detection_demo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("detection-demo")
    demo_targets.generate(folder / "data", num_images=10, seed=2)
    return folder


def test_the_detection_demo_builds_the_same_from_coco_and_from_the_manifest(detection_demo):
    data = detection_demo / "data"
    common = {
        "output": str(detection_demo / "out"),
        "encoding": {"format": "png"},
        "errors": {"max_fraction": 0.5},
    }
    from_manifest = build(
        {
            "name": "from-manifest",
            "source": {
                "type": "manifest",
                "path": str(data / demo_targets.MANIFEST),
                "classes": list(demo_targets.CLASSES),
            },
            "targets": {"boxes": {}, "instance_masks": {}, "keypoints": KEYPOINTS},
            **common,
        }
    )
    from_coco = build(
        {
            "name": "from-coco",
            "source": {
                "type": "coco",
                "annotations": str(data / demo_targets.COCO),
                "images": str(data / "images"),
            },
            "targets": {"boxes": {}, "instance_masks": {}, "keypoints": KEYPOINTS},
            **common,
        }
    )
    manifest_records = records(from_manifest)
    coco_records = {"images/" + key: record for key, record in records(from_coco).items()}
    good = sorted(key for key in manifest_records if "/scene_" in key)
    assert len(good) == 10 and good == sorted(k for k in coco_records if "/scene_" in k)
    shift = len(demo_targets.CLASSES) - len(demo_targets.SHAPES)  # the manifest's background
    for key in good:
        ours, theirs = coco_records[key], manifest_records[key]
        np.testing.assert_array_equal(ours["boxes"], theirs["boxes"])
        np.testing.assert_array_equal(ours["keypoints"], theirs["keypoints"])
        assert (ours["classes"] + shift).tolist() == theirs["classes"].tolist()
        for coco_mask_png, manifest_mask_png in zip(
            ours["instance_masks"], theirs["instance_masks"], strict=True
        ):
            rasterized, drawn = png_pixels(coco_mask_png), png_pixels(manifest_mask_png)
            iou = (rasterized & drawn).sum() / (rasterized | drawn).sum()
            assert iou > 0.8, (key, iou)

    # The broken scenes, as each source reports them (by name without extension).
    coco_errors = {stem(k): row["reason"] for k, row in error_rows(from_coco).items()}
    assert coco_errors["broken_inverted_box"] == "bad_box"
    # COCO's negative width, shown as the file writes it, naming the annotation.
    document = json.loads((data / demo_targets.COCO).read_text())
    (image,) = (i for i in document["images"] if stem(i["file_name"]) == "broken_inverted_box")
    index, annotation = next(
        (n, a) for n, a in enumerate(document["annotations"]) if a["image_id"] == image["id"]
    )
    assert annotation["bbox"][2] < 0
    (inverted,) = (r for k, r in error_rows(from_coco).items() if "broken_inverted_box" in k)
    assert inverted["message"] == (
        f"objects[0] (annotations[{index}], id {annotation['id']}).bbox: "
        f"{json.dumps(annotation['bbox'])} has a negative width or height ([x, y, width, height])"
    )
    assert coco_errors["broken_unknown_class"] == "unknown_class"
    assert coco_errors["broken_short_polygon"] == "bad_polygon"
    assert list(coco_errors.values()).count("dangling_annotation") == 1
    manifest_errors = {stem(k): row["reason"] for k, row in error_rows(from_manifest).items()}
    assert manifest_errors["broken_inverted_box"] == "bad_box"
    assert manifest_errors["broken_unknown_class"] == "unknown_class"
    assert manifest_errors["broken_missing_mask"] == "missing_mask"
    assert manifest_errors["broken_short_polygon"] == "bad_polygon"


def stem(key: str) -> str:
    return key.rsplit("/", 1)[-1].rsplit(".", 1)[0]


def test_a_voc_folder_builds_and_reads_back(tmp_path):
    annotations, images = tmp_path / "Annotations", tmp_path / "JPEGImages"
    annotations.mkdir()
    write_png(images / "a.png", np.zeros((40, 50, 3), np.uint8))
    (annotations / "a.xml").write_text(
        "<annotation><filename>a.png</filename>"
        "<object><name>dog</name><difficult>1</difficult>"
        "<bndbox><xmin>11</xmin><ymin>1</ymin><xmax>30</xmax><ymax>40</ymax></bndbox></object>"
        "</annotation>"
    )
    result = build(
        {
            "name": "voc",
            "source": {"type": "voc", "annotations": str(annotations), "images": str(images)},
            "output": str(tmp_path / "out"),
            "encoding": {"format": "png"},
            "targets": {"boxes": {"fields": {"difficult": "int"}}},
        }
    )
    (record,) = records(result).values()
    # Pixels 11..30 and 1..40 counted from 1: [10, 0, 30, 40] from 0, normalized.
    np.testing.assert_allclose(record["boxes"], [[0, 10 / 50, 1, 30 / 50]])
    assert record["difficult"].tolist() == [1] and result.info.class_names == ["dog"]


def test_a_coco_keypoint_marks_its_pixel_flipped_or_not(tmp_path):
    """COCO's keypoints are pixel indices: [10, 10] marks the pixel of column 10,
    row 10, whose centre is (10.5, 10.5) in kiln's continuous coordinates. Read
    so, the reader's horizontal flip keeps the keypoint on the flipped pixel."""
    import kiln.reader

    height, width = 24, 32
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[10, 10] = 255  # the marked pixel
    write_png(tmp_path / "images" / "a.png", pixels)
    document = {
        "images": [{"id": 1, "file_name": "a.png", "width": width, "height": height}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [5, 5, 15, 15],
             "keypoints": [10, 10, 2, 0, 0, 0], "num_keypoints": 1}
        ],
        "categories": [{"id": 1, "name": "p", "keypoints": ["tip", "tail"]}],
    }  # fmt: skip
    (tmp_path / "instances.json").write_text(json.dumps(document))
    result = build(
        coco_config(
            tmp_path / "instances.json",
            tmp_path / "images",
            tmp_path / "out",
            targets={"boxes": {}, "keypoints": {"names": ["tip", "tail"]}},
        )
    )
    (stored,) = records(result).values()
    # [y, x] as fractions of the image's size; the unlabelled one stays (0, 0).
    np.testing.assert_allclose(stored["keypoints"][0] * [height, width], [[10.5, 10.5], [0, 0]])
    assert stored["keypoint_visibility"][0].tolist() == [2, 0]

    (split,) = result.info.splits
    dataset = kiln.reader.load(
        result.dataset_dir, split, seed=3, repeat=8, augment=["random_flip_left_right"],
        training=True,
    )  # fmt: skip
    columns = set()
    for image, targets in dataset:
        rows, marked = np.nonzero(image.numpy()[..., 0] > 0.5)
        y, x = targets["keypoints"].numpy()[0][0] * [height, width]
        assert (int(np.floor(y)), int(np.floor(x))) == (rows[0], marked[0])
        columns.add(int(marked[0]))
    assert columns == {10, width - 1 - 10}  # both flipped and not


def test_degenerate_objects_are_named_and_a_sub_pixel_one_is_kept(tmp_path):
    """A zero-area box is a bad box, named as the file writes it; a polygon
    wholly outside the image leaves an empty mask under a box that covers
    pixels (box_mask_mismatch); a sub-pixel object, whose polygon covers no
    pixel centre, keeps its empty mask."""
    write_png(tmp_path / "images" / "a.png", np.full((40, 40, 3), 50, np.uint8))

    def annotation(number, bbox, polygon):
        return {"id": number, "image_id": 1, "category_id": 1, "bbox": bbox,
                "segmentation": [polygon]}  # fmt: skip

    document = {
        "images": [{"id": 1, "file_name": "a.png", "width": 40, "height": 40}],
        "annotations": [
            annotation(1, [4, 4, 10, 10], [4, 4, 14, 4, 14, 14, 4, 14]),
            annotation(2, [20, 20, 0, 0], [20, 20, 21, 20, 21, 21]),  # a point
            annotation(3, [15, 10, 0, 20], [15, 10, 16, 10, 16, 30]),  # a line
            annotation(4, [12, 12, 16, 16], [100, 100, 120, 100, 120, 120]),  # outside
            annotation(5, [30.1, 30.1, 0.3, 0.3], [30.1, 30.1, 30.4, 30.1, 30.4, 30.4]),
        ],
        "categories": [{"id": 1, "name": "thing"}],
    }
    (tmp_path / "instances.json").write_text(json.dumps(document))
    result = build(
        coco_config(
            tmp_path / "instances.json",
            tmp_path / "images",
            tmp_path / "out",
            targets={"boxes": {}, "instance_masks": {}, "bad_objects": "drop_object"},
        )
    )
    with open(os.path.join(result.dataset_dir, "dropped_objects.jsonl")) as f:
        dropped = {row["object"]: (row["reason"], row["message"]) for row in map(json.loads, f)}
    assert dropped == {
        1: (
            "bad_box",
            "objects[1] (annotations[1], id 2).bbox: [20, 20, 0, 0] has zero width or height "
            "([x, y, width, height])",
        ),
        2: (
            "bad_box",
            "objects[2] (annotations[2], id 3).bbox: [15, 10, 0, 20] has zero width or height "
            "([x, y, width, height])",
        ),
        3: (
            "box_mask_mismatch",
            "objects[3] (annotations[3], id 4): its instance mask is empty but its box "
            "[12, 12, 28, 28] covers pixel centres (a polygon or mask outside the image, or of "
            "another image)",
        ),
    }
    (stored,) = records(result).values()
    np.testing.assert_allclose(
        stored["boxes"] * 40, [[4, 4, 14, 14], [30.1, 30.1, 30.4, 30.4]], atol=1e-4
    )
    assert png_pixels(stored["instance_masks"][1]).sum() == 0


def test_the_jobs_messages_name_each_object_by_its_annotation_even_in_a_reused_record(tmp_path):
    """An image's objects are in annotation id order, not the file's, so the
    job's messages about one object (a box far outside the image, a box the
    center crop leaves too little of) name its annotation as the file writes
    it; a record reused by a later build from the same annotations written in
    another order names them where they are now."""

    def annotation(number, image, bbox):
        return {"id": number, "image_id": image, "category_id": 1, "bbox": bbox}

    document, spec = one_image_coco(
        tmp_path,
        [
            annotation(9, 1, [0, 0, 6, 6]),  # objects[2]: the crop leaves none of it
            annotation(3, 1, [14, 14, 10, 10]),  # objects[0]: kept
            annotation(5, 1, [100, 100, 10, 10]),  # objects[1]: far outside the image
        ],
        transforms=[{"center_crop": {"size": 20}}],
    )

    def dropped(result):
        with open(os.path.join(result.dataset_dir, "dropped_objects.jsonl")) as f:
            return {row["object"]: (row["reason"], row["message"]) for row in map(json.loads, f)}

    def expected(positions):
        return {
            1: (
                "bad_box",
                f"objects[1] (annotations[{positions[5]}], id 5).bbox: [100.0, 100.0, 110.0, "
                f"110.0] lies outside the 40x40 (WxH) image (more than 10% of its size beyond "
                f"it, or not inside at all)",
            ),
            2: (
                "min_visibility",
                f"objects[2] (annotations[{positions[9]}], id 9): too little of its box is left "
                f"in the stored image after orientation and the transforms (less than "
                f"boxes.min_visibility 0.25 of its area, or none)",
            ),
        }

    base = build(spec)
    assert dropped(base) == expected({9: 0, 3: 1, 5: 2})

    # Exported again in another order, with one image more (a new version).
    write_png(tmp_path / "images" / "b.png", np.full((40, 40, 3), 90, np.uint8))
    document["images"].append({"id": 2, "file_name": "b.png", "width": 40, "height": 40})
    document["annotations"] = [annotation(11, 2, [14, 14, 10, 10]), *document["annotations"][::-1]]
    (tmp_path / "instances.json").write_text(json.dumps(document))
    again = build(spec)
    assert again.incremental.used and again.incremental.reused == 1  # a.png's record
    assert dropped(again) == expected({5: 1, 3: 2, 9: 3})
