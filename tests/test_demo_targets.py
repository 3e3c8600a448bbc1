"""`kiln demo-data --targets`: exact boxes, masks and keypoints, twice (manifest and COCO).

Every check here reads the files back as a user's tools would: the image as
stored (OpenCV, no EXIF orientation applied: targets are in stored pixels),
the mask PNGs, the manifest's JSON, and the COCO file through kiln's own
COCO reader and pycocotools' rasterization.
"""

from __future__ import annotations

import json
import os
import pathlib

import cv2
import numpy as np
import pytest
import yaml
from pycocotools import mask as coco_mask

from conftest import read_tree
from kiln import cli
from kiln.pipeline import build, demo_targets
from kiln.pipeline.coco import CocoFile, CocoRow

NUM_IMAGES = 40


def stored_pixels(data: bytes) -> np.ndarray:
    """The pixel array as stored: OpenCV applies no EXIF orientation in this mode."""
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("detection") / "data"
    summary = demo_targets.generate(out, num_images=NUM_IMAGES, seed=3)
    files = read_tree(out)
    rows = [json.loads(line) for line in files["manifest.jsonl"].decode().splitlines()]
    return out, summary, files, rows


def good_rows(rows):
    return [row for row in rows if "/scene_" in row["path"]]


def test_same_seed_same_bytes_and_the_first_scenes_do_not_depend_on_the_count(demo, tmp_path):
    _, summary, files, _ = demo
    again = demo_targets.generate(tmp_path / "again", num_images=NUM_IMAGES, seed=3)
    assert read_tree(tmp_path / "again") == files
    assert again == dataclass_with_out(summary, str(tmp_path / "again"))
    demo_targets.generate(tmp_path / "fewer", num_images=10, seed=3, include_broken=False)
    fewer = read_tree(tmp_path / "fewer")
    images = [path for path in fewer if path.startswith(("images/", "masks/"))]
    assert images and all(fewer[path] == files[path] for path in images)
    assert not any("broken" in path for path in fewer)


def dataclass_with_out(summary, out_dir):
    return demo_targets.DemoTargetsSummary(
        out_dir, summary.num_images, summary.object_counts, summary.broken
    )


def test_boxes_masks_and_keypoints_are_exact(demo):
    out, summary, files, rows = demo
    good = good_rows(rows)
    assert len(good) == NUM_IMAGES == summary.num_images
    counts = dict.fromkeys(demo_targets.SHAPES, 0)
    formats, orientations = set(), 0
    for row in good:
        image = stored_pixels(files[row["path"]])
        semantic = stored_pixels(files[row["mask"]])
        assert semantic.shape == image.shape[:2] and semantic.dtype == np.uint8
        formats.add(row["path"].rsplit(".", 1)[1])
        orientations += b"Exif" in files[row["path"]][:200]
        covered = np.zeros(semantic.shape, bool)
        for found in row["objects"]:
            counts[found["class"]] += 1
            mask = stored_pixels(files[found["mask"]])
            assert mask.shape == semantic.shape and set(np.unique(mask)) == {0, 1}
            ys, xs = np.nonzero(mask)
            # The box is the tight box of the mask's pixels, continuous coordinates.
            assert found["bbox"] == [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
            # The semantic mask holds the class id (index of CLASSES) on the object.
            class_id = demo_targets.CLASSES.index(found["class"])
            assert (semantic[mask == 1] == class_id).all()
            assert not (covered & (mask == 1)).any()  # objects never overlap
            covered |= mask == 1
            # Keypoints: the centre lies on the object, left and right on its
            # box's left and right edges (to within a pixel).
            (cx, cy, cv), (lx, ly, lv), (rx, ry, rv) = np.reshape(found["keypoints"], (3, 3))
            assert (cv, lv, rv) == (2, 2, 2)
            assert mask[int(cy), int(cx)] == 1
            x_min, _, x_max, _ = found["bbox"]
            assert abs(lx - x_min) <= 1 and abs(rx - x_max) <= 1
            if row["path"].endswith(".png") and image.ndim == 3:
                # Drawn without anti-aliasing: one colour over exactly the mask.
                assert len(np.unique(image[mask == 1].reshape(-1, 3), axis=0)) == 1
        assert (semantic[~covered] == 0).all()
    assert formats == {"png", "jpg"} and orientations >= 1
    assert counts == summary.object_counts and all(counts.values())


def test_the_coco_file_holds_the_same_objects(demo):
    out, _, files, rows = demo
    by_path = {row["path"].removeprefix("images/"): row for row in rows}
    coco = CocoFile(str(out / demo_targets.COCO), keypoint_names=demo_targets.KEYPOINTS)
    assert coco.class_names() == list(demo_targets.SHAPES)
    found_rows, problems = [], []
    for found in coco.rows():
        (found_rows if isinstance(found, CocoRow) else problems).append(found)
    assert [p.reason for p in problems] == ["dangling_annotation"]
    assert len(found_rows) == len(rows)
    compared = 0
    for coco_row in found_rows:
        row = by_path[coco_row.row["path"]]
        if "/broken_" in row["path"]:
            continue
        height, width = stored_pixels(files[row["mask"]]).shape
        for coco_object, manifest_object in zip(
            coco_row.row["objects"], row["objects"], strict=True
        ):
            assert coco_object["class"] == manifest_object["class"]
            assert coco_object["bbox"] == manifest_object["bbox"]
            assert coco_object["keypoints"] == manifest_object["keypoints"]
            mask = stored_pixels(files[manifest_object["mask"]])
            segmentation = coco_object["segmentation"]
            rle = coco_mask.frPyObjects(segmentation, height, width)
            decoded = coco_mask.decode(coco_mask.merge(rle) if isinstance(rle, list) else rle)
            if isinstance(segmentation, dict):  # circles: RLE of the mask itself
                np.testing.assert_array_equal(decoded, mask)
            else:  # polygons through the vertices: pycocotools' own rasterization
                iou = (decoded & mask).sum() / (decoded | mask).sum()
                assert iou > 0.8, (row["path"], iou)
            compared += 1
    assert compared >= NUM_IMAGES


def test_broken_scenes_carry_one_broken_annotation_each(demo):
    out, summary, files, rows = demo
    assert summary.broken == demo_targets.BROKEN
    broken = {row["path"].split("/")[-1].rsplit(".", 1)[0]: row for row in rows}
    first = {name: broken[name]["objects"][0] for name in demo_targets.BROKEN}
    x_min, _, x_max, _ = first["broken_inverted_box"]["bbox"]
    assert x_max < x_min
    assert first["broken_unknown_class"]["class"] not in demo_targets.CLASSES
    assert first["broken_missing_mask"]["mask"] not in files
    assert len(first["broken_short_polygon"]["segmentation"][0]) == 4
    mask = stored_pixels(files[broken["broken_mask_size"]["mask"]])
    image = stored_pixels(files[broken["broken_mask_size"]["path"]])
    assert mask.shape != image.shape[:2]
    coco = json.loads(files[demo_targets.COCO])
    image_ids = {image["id"] for image in coco["images"]}
    category_ids = {category["id"] for category in coco["categories"]}
    assert [a for a in coco["annotations"] if a["image_id"] not in image_ids]
    assert [a for a in coco["annotations"] if a["category_id"] not in category_ids]


def test_rle_is_cocos_column_major_run_lengths():
    mask = np.zeros((3, 4), bool)
    mask[0, 0] = mask[1:, 2] = True
    rle = demo_targets.uncompressed_rle(mask)
    assert rle == {"size": [3, 4], "counts": [0, 1, 6, 2, 3]}
    decoded = coco_mask.decode(coco_mask.frPyObjects(rle, 3, 4))
    np.testing.assert_array_equal(decoded, mask)


def test_command_writes_the_detection_demo(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["demo-data", str(out), "--targets", "--num-images", "3"]) == 0
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("wrote 3 images of ") and "manifest.jsonl and instances.json" in line
    assert {"manifest.jsonl", "instances.json"} <= set(os.listdir(out))
    # Again into the same folder: replaced, not refused.
    assert cli.main(["demo-data", str(out), "--targets", "--num-images", "2", "--no-broken"]) == 0
    assert len(os.listdir(out / "images")) == 2
    assert cli.main(["demo-data", str(out), "--targets", "--photos"]) == 2


def test_a_folder_with_other_files_is_never_touched(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "holiday.jpg").write_bytes(b"precious")
    with pytest.raises(FileExistsError, match="not written by kiln demo-data --targets"):
        demo_targets.generate(tmp_path, num_images=2)
    assert read_tree(tmp_path) == {"images/holiday.jpg": b"precious"}


def test_each_mode_says_what_to_do_with_the_other_modes_folder(tmp_path, capsys):
    """The classification demo and the detection demo (``--targets``) refuse
    each other's folder: written by kiln demo-data, but another dataset. The
    line says which, and what to do; neither folder is touched."""
    detection, shapes = tmp_path / "detection", tmp_path / "shapes"
    assert cli.main(["demo-data", str(detection), "--targets", "--num-images", "2", "--quiet"]) == 0
    assert cli.main(["demo-data", str(shapes), "--num-images", "4", "--quiet"]) == 0
    before = read_tree(tmp_path)
    assert cli.main(["demo-data", str(detection), "--num-images", "4"]) == 2
    assert capsys.readouterr().err == (
        f"kiln demo-data: error: {detection} holds the detection demo that kiln demo-data "
        f"--targets writes, not class folders; pass --targets to write that demo again, or "
        f"choose another folder\n"
    )
    assert cli.main(["demo-data", str(shapes), "--targets", "--num-images", "2"]) == 2
    assert capsys.readouterr().err == (
        f"kiln demo-data: error: {shapes} holds the class folders that kiln demo-data writes "
        f"without --targets, not the detection demo of --targets; drop --targets to write "
        f"that demo again, or choose another folder\n"
    )
    assert read_tree(tmp_path) == before
    # A stranger's folder is still just that.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    for args in (["--targets"], []):
        assert cli.main(["demo-data", str(tmp_path / "mine"), *args]) == 2
        assert "notes.txt was not written by kiln demo-data" in capsys.readouterr().err


def test_configs_demo_detection_builds_the_demo(tmp_path):
    top = pathlib.Path(__file__).resolve().parent.parent
    demo_targets.generate(tmp_path / "demo-detection", num_images=12, seed=1)
    config = yaml.safe_load((top / "configs" / "demo-detection.yaml").read_text())
    config["source"]["path"] = str(tmp_path / "demo-detection" / demo_targets.MANIFEST)
    config["output"] = str(tmp_path / "datasets")
    config["errors"] = {"max_fraction": 0.5}  # 5 broken scenes of 17
    result = build(config)
    info = result.info
    assert sum(split.num_examples for split in info.splits.values()) == 12
    assert info.class_names == list(demo_targets.CLASSES)
    assert set(info.targets["keypoints"]["names"]) == set(demo_targets.KEYPOINTS)
    assert sorted(info.dropped) == [
        "bad_box",
        "bad_polygon",
        "mask_size_mismatch",
        "missing_mask",
        "unknown_class",
    ]
