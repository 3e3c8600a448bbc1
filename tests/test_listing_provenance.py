"""What the listing knows and no file entry carries is in the version and the stamp.

A COCO file's class list comes from its ``categories``, which no image's
entry holds: a category no annotation uses still shifts every class id (as
does a VOC class that only a dropped file names).
Real builds on the DirectRunner: a change to it makes the rebuild build
(not "up to date"), and the incremental build equals a full build of the
same inputs byte for byte, under the same version id.
"""

from __future__ import annotations

import json
import os
import shutil

import cv2
import numpy as np
import pytest

from conftest import backdated
from kiln.pipeline import build, demo_targets
from test_targets_incremental import assert_same_dataset


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("coco-provenance") / "data"
    demo_targets.generate(folder, num_images=6, seed=3)
    return folder


@pytest.fixture
def demo(pristine, tmp_path):
    """A copy of the detection demo, written long before the builds."""
    data = tmp_path / "data"
    shutil.copytree(pristine, data)
    return backdated(data)


def write_png(path, pixels: np.ndarray) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    assert cv2.imwrite(str(path), pixels)


def coco_config(data, output) -> dict:
    return {
        "name": "coco",
        "source": {
            "type": "coco",
            "annotations": str(data / demo_targets.COCO),
            "images": str(data / "images"),
        },
        "output": str(output),
        "encoding": {"format": "png"},
        "targets": {"boxes": {}, "instance_masks": {}, "bad_objects": "drop_object"},
        "errors": {"max_fraction": 0.5},
    }


def edit_coco(data, change) -> None:
    """Rewrites the COCO file with `change` applied to its document, its
    modification time kept: only its content differs."""
    path = data / demo_targets.COCO
    before = os.stat(path)
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def add_blob(document) -> None:
    document["categories"].append({"id": 9, "name": "blob", "supercategory": "shape"})


def rename_blob(document) -> None:
    (blob,) = (c for c in document["categories"] if c["name"] == "blob")
    blob["name"] = "zz_blob"


@pytest.mark.parametrize(
    ("before", "change", "new_class"),
    [
        pytest.param(None, add_blob, "blob", id="unused-category-added"),
        pytest.param(add_blob, rename_blob, "zz_blob", id="unused-category-renamed"),
    ],
)
def test_a_category_no_annotation_uses_changes_the_class_list_and_the_version(
    demo, tmp_path, before, change, new_class
):
    if before is not None:
        edit_coco(demo, before)
    config = coco_config(demo, tmp_path / "out")
    base = build(config)
    assert build(config).up_to_date  # unchanged inputs: nothing to do
    assert new_class not in base.info.class_names

    edit_coco(demo, change)
    incremental = build(config)

    assert not incremental.up_to_date
    assert incremental.version != base.version
    assert new_class in incremental.info.class_names
    assert incremental.info.class_names == sorted(incremental.info.class_names)
    full = build(dict(config, output=str(tmp_path / "full")))
    assert_same_dataset(incremental, full)
    # A full rebuild into the same output publishes those bytes too.
    again = build(config, full=True, rehash=True)
    assert again.version == full.version and again.info == full.info


def voc_xml(image: str, name: str, corner: int = 2) -> str:
    return (
        f"<annotation><filename>{image}</filename><object><name>{name}</name><bndbox>"
        f"<xmin>{corner}</xmin><ymin>{corner}</ymin><xmax>20</xmax><ymax>20</ymax>"
        "</bndbox></object></annotation>"
    )


@pytest.fixture
def voc(tmp_path):
    """Four images, each with its XML file, and a fifth XML file naming the
    first image again with another object (``dup.xml``): that image is
    dropped (``duplicate_key``), and the class only it names (``other``) is
    in the class list all the same."""
    root = tmp_path / "voc"
    annotations, images = root / "Annotations", root / "images"
    annotations.mkdir(parents=True)
    for i in range(4):
        write_png(images / f"{i}.png", np.full((24, 24, 3), 40 * i, np.uint8))
        (annotations / f"{i}.xml").write_text(voc_xml(f"{i}.png", "thing"))
    (annotations / "dup.xml").write_text(voc_xml("0.png", "other", corner=3))
    return backdated(root)


def voc_config(root, output) -> dict:
    return {
        "name": "voc",
        "source": {
            "type": "voc",
            "annotations": str(root / "Annotations"),
            "images": str(root / "images"),
        },
        "output": str(output),
        "encoding": {"format": "png"},
        "targets": {"boxes": {}},
        "errors": {"max_fraction": 0.5},
    }


def rewrite_kept_time(path, text: str) -> None:
    before = os.stat(path)
    path.write_text(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_class_only_a_dropped_voc_file_names_is_in_the_version(voc, tmp_path):
    config = voc_config(voc, tmp_path / "out")
    base = build(config)
    assert base.info.class_names == ["other", "thing"]
    assert build(config).up_to_date

    rewrite_kept_time(voc / "Annotations" / "dup.xml", voc_xml("0.png", "zz_other", corner=3))
    incremental = build(config)

    assert not incremental.up_to_date
    assert incremental.info.class_names == ["thing", "zz_other"]
    assert_same_dataset(incremental, build(dict(config, output=str(tmp_path / "full"))))


def dangling_one_place_earlier(document) -> None:
    annotations = document["annotations"]
    i = next(
        i for i, a in enumerate(annotations) if a["image_id"] == demo_targets.COCO_DANGLING_IMAGE_ID
    )
    annotations[i - 1], annotations[i] = annotations[i], annotations[i - 1]


def a_box_of_three_numbers(document) -> None:
    document["annotations"][3]["bbox"] = [1, 2, 3]  # its image: bad_row, keyed images[k]


def images_reversed(document) -> None:
    document["images"].reverse()


def listing_errors(result) -> list[dict]:
    with open(os.path.join(result.dataset_dir, "errors.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [row for row in rows if row["stage"] == "list"]


@pytest.mark.parametrize(
    ("before", "change"),
    [
        pytest.param(None, dangling_one_place_earlier, id="dangling-annotation-moved"),
        pytest.param(a_box_of_three_numbers, images_reversed, id="bad-image-moved"),
    ],
)
def test_a_dropped_coco_item_moved_in_its_file_rewrites_errors_jsonl(
    demo, tmp_path, before, change
):
    if before is not None:
        edit_coco(demo, before)
    config = coco_config(demo, tmp_path / "out")
    base = build(config)
    assert build(config).up_to_date

    edit_coco(demo, change)
    incremental = build(config)

    assert not incremental.up_to_date
    assert incremental.version != base.version
    keys = {row["key"] for row in listing_errors(incremental)}
    assert keys != {row["key"] for row in listing_errors(base)}
    assert all(key.startswith(f"{demo_targets.COCO}:") for key in keys)
    assert_same_dataset(incremental, build(dict(config, output=str(tmp_path / "full"))))


def test_a_voc_file_renamed_renames_it_in_a_duplicate_key_message(voc, tmp_path):
    config = voc_config(voc, tmp_path / "out")
    base = build(config)
    (duplicate,) = listing_errors(base)
    assert duplicate["reason"] == "duplicate_key" and "dup.xml" in duplicate["message"]
    assert build(config).up_to_date

    os.rename(voc / "Annotations" / "dup.xml", voc / "Annotations" / "zz_dup.xml")
    incremental = build(config)

    assert not incremental.up_to_date
    (renamed,) = listing_errors(incremental)
    assert "zz_dup.xml" in renamed["message"] and renamed["key"] == duplicate["key"]
    assert_same_dataset(incremental, build(dict(config, output=str(tmp_path / "full"))))


def test_a_missing_file_keeps_its_version_when_the_data_moves(voc, tmp_path):
    """A message that names where a file is (``missing``: the system's error
    with its path) is left out of the version: moved data, same version."""
    os.remove(voc / "images" / "3.png")
    base = build(voc_config(voc, tmp_path / "out"))
    assert "missing" in {row["reason"] for row in listing_errors(base)}
    moved = tmp_path / "moved"
    shutil.copytree(voc, moved)
    again = build(voc_config(moved, tmp_path / "out-moved"))
    assert again.version == base.version
