"""The COCO source: a COCO instances JSON read as manifest rows, streaming, and listed.

A small COCO file written here holds what real ones do (crowd objects with
uncompressed RLE, polygons, compressed RLE, keypoints, an image without
annotations) and what broken ones do (an annotation of an image that is not
declared, a category that is not declared, a repeated image id); its rows
and problems are read back exactly. A large generated file (100,000
annotations) is read with the memory of a small one, measured with tracemalloc.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import random
import tracemalloc

import pytest

from kiln.errors import ConfigError
from kiln.pipeline import coco as coco_module
from kiln.pipeline.coco import CocoFile, CocoFileError, CocoProblem, CocoRow
from kiln.pipeline.config import load as load_config
from kiln.pipeline.sources import CocoSource
from kiln.schemas import TargetsConfig

CATEGORIES = [
    {"id": 1, "name": "person", "keypoints": ["nose", "left_eye", "right_eye"]},
    {"id": 3, "name": "cat"},
    {"id": 2, "name": "bicycle"},  # declared, never used: still a class
]
IMAGES = [
    {"id": 10, "file_name": "a/10.jpg", "width": 64, "height": 48},
    {"id": 7, "file_name": "7.jpg", "width": 32, "height": 32},
    {"id": 12, "file_name": "empty.jpg", "width": 20, "height": 20},  # no annotations
    {"id": 7, "file_name": "again.jpg", "width": 8, "height": 8},  # repeated id
    {"file_name": "no_id.jpg"},
]
POLYGON = [[10.0, 10.0, 30.0, 10.0, 30.0, 25.5, 10.0, 25.5]]
CROWD_RLE = {"size": [48, 64], "counts": [100, 20, 3052]}
COMPRESSED_RLE = {"size": [32, 32], "counts": "PPYo0"}
ANNOTATIONS = [
    {
        "id": 1,
        "image_id": 10,
        "category_id": 1,
        "bbox": [10, 10, 20, 15.5],
        "iscrowd": 0,
        "segmentation": POLYGON,
        "keypoints": [12, 14, 2, 11, 12, 1, 0, 0, 0],
        "num_keypoints": 2,
    },
    {"id": 2, "image_id": 7, "category_id": 3, "bbox": [1.5, 2, 4, 4], "segmentation": []},
    {
        "id": 3,
        "image_id": 10,
        "category_id": 1,
        "bbox": [40, 2, 8, 30],
        "iscrowd": 1,
        "segmentation": CROWD_RLE,
    },
    {"id": 4, "image_id": 99, "category_id": 3, "bbox": [0, 0, 1, 1]},  # no image 99
    {"id": 5, "image_id": 7, "category_id": 42, "bbox": [3, 3, 2, 2]},  # no category 42
    {
        "id": 6,
        "image_id": 7,
        "category_id": 3,
        "bbox": [0, 0, 5],  # not four numbers: passed on for the row validation
        "segmentation": COMPRESSED_RLE,
    },
    {"id": 7, "category_id": 3, "bbox": [0, 0, 1, 1]},  # no image_id
    {"id": 8, "image_id": 1, "category_id": 3, "bbox": [0, 0, 1, 1]},  # below every image id
]


def write_coco(path, *, categories_first: bool = False, **arrays) -> str:
    """A COCO file with the arrays above (overridable), categories last as in
    the official files unless `categories_first`."""
    content = {
        "images": arrays.get("images", IMAGES),
        "annotations": arrays.get("annotations", ANNOTATIONS),
        "categories": arrays.get("categories", CATEGORIES),
    }
    order = ["info", "images", "annotations", "categories"]
    if categories_first:
        order = ["categories", "info", "images", "annotations"]
    document = {"info": {"description": "test"}} | content
    path.write_text(json.dumps({key: document[key] for key in order}, indent=1))
    return str(path)


def read_all(coco: CocoFile) -> tuple[list[CocoRow], list[CocoProblem]]:
    rows, problems = [], []
    for found in coco.rows():
        (rows if isinstance(found, CocoRow) else problems).append(found)
    return rows, problems


def test_rows_and_problems_read_back(tmp_path):
    coco = CocoFile(write_coco(tmp_path / "instances.json"))
    rows, problems = read_all(coco)

    assert coco.class_names() == ["bicycle", "cat", "person"]
    # Rows in image id order; the repeated id keeps its first entry.
    assert [row.where for row in rows] == ["instances.json:images[0]", "instances.json:images[2]"]
    assert rows[0].row == {
        "path": "a/10.jpg",
        "objects": [
            # Objects in annotation id order; boxes from xywh to corners.
            {"class": "person", "bbox": [10, 10, 30, 25.5], "iscrowd": 0, "segmentation": POLYGON},
            {"class": "person", "bbox": [40, 2, 48, 32], "iscrowd": 1, "segmentation": CROWD_RLE},
        ],
        # The image's width and height, for the job to compare with the image.
        "size as declared": {"width": 64, "height": 48, "by": "images[].width/height"},
    }
    assert rows[1].row == {
        "path": "empty.jpg",
        "objects": [],
        "size as declared": {"width": 20, "height": 20, "by": "images[].width/height"},
    }

    reasons = sorted((p.where, p.reason) for p in problems)
    assert reasons == [
        ("instances.json:annotations[3]", "dangling_annotation"),
        ("instances.json:annotations[6]", "bad_row"),
        ("instances.json:annotations[7]", "dangling_annotation"),
        # Image 7 has a box of three numbers.
        ("instances.json:images[1]", "bad_row"),
        ("instances.json:images[3]", "bad_row"),
        ("instances.json:images[4]", "bad_row"),
    ]
    by_where = {p.where: p for p in problems}
    # The box as written, the object, the annotation and its id.
    seven = by_where["instances.json:images[1]"]
    assert seven.message == (
        "objects[2] (annotations[5], id 6).bbox: expected 4 numbers [x, y, width, height], "
        "got [0, 0, 5]"
    )
    # Its entry is the image's row, as a row the validation drops.
    assert json.loads(seven.entry) == {
        "path": "7.jpg",
        "objects": [
            {"class": "cat", "bbox": [1.5, 2, 5.5, 6], "iscrowd": 0},
            {"class": "undeclared category_id 42", "bbox": [3, 3, 5, 5], "iscrowd": 0},
            {"class": "cat", "bbox": [0, 0, 5], "iscrowd": 0, "segmentation": COMPRESSED_RLE},
        ],
    }
    assert by_where["instances.json:annotations[3]"].message == (
        "image_id 99 is not the id of any entry of 'images'; named by 1 annotation: annotations[3]"
    )
    assert "also the id of images[1]" in by_where["instances.json:images[3]"].message
    # A problem's entry is the entry itself, canonical: not its position.
    assert json.loads(by_where["instances.json:annotations[3]"].entry) == {
        "annotations": [ANNOTATIONS[3]]
    }


def test_the_annotations_of_one_missing_image_are_one_problem(tmp_path):
    images = [{"id": 1, "file_name": "1.png"}]
    annotations = [
        {"id": 10 + i, "image_id": image_id, "category_id": 3, "bbox": [0, 0, 1, 1]}
        for i, image_id in enumerate([5, 1, 5, "x", 5, 0, *[8] * 12])
    ]
    path = write_coco(tmp_path / "i.json", images=images, annotations=annotations)
    rows, problems = read_all(CocoFile(path))
    assert [len(r.row["objects"]) for r in rows] == [1]
    # One problem per missing image id (0, 5, 8, "x"), in image id order.
    assert [(p.where, p.reason) for p in problems] == [
        ("i.json:annotations[5]", "dangling_annotation"),
        ("i.json:annotations[0]", "dangling_annotation"),
        ("i.json:annotations[6]", "dangling_annotation"),
        ("i.json:annotations[3]", "dangling_annotation"),
    ]
    zero, five, eight, x = problems
    assert five.message == (
        "image_id 5 is not the id of any entry of 'images'; named by 3 annotations: "
        "annotations[0], annotations[2], annotations[4]"
    )
    assert x.message.startswith('image_id "x" is not the id')
    # A large group names its first annotations only.
    assert eight.message.endswith(
        "named by 12 annotations: "
        + ", ".join(f"annotations[{i}]" for i in range(6, 16))
        + ", ... (the first 10)"
    )
    # The entry holds every annotation of the group, sorted: the same whatever their order.
    assert json.loads(five.entry) == {"annotations": [annotations[i] for i in (0, 2, 4)]}
    assert len(json.loads(eight.entry)["annotations"]) == 12
    shuffled = [annotations[i] for i in (4, 1, 3, 2, 0, 5, *range(17, 5, -1))]
    path = write_coco(tmp_path / "shuffled.json", images=images, annotations=shuffled)
    assert sorted(p.entry for p in read_all(CocoFile(path))[1]) == sorted(p.entry for p in problems)


def test_keypoints_follow_the_asked_names(tmp_path):
    # left_ear is a cat's keypoint: a person lacks it.
    cat = {"id": 3, "name": "cat", "keypoints": ["left_ear"]}
    categories = [CATEGORIES[0], cat, CATEGORIES[2]]
    coco = CocoFile(
        write_coco(tmp_path / "instances.json", categories=categories),
        keypoint_names=["right_eye", "nose", "left_ear"],
    )
    rows, _ = read_all(coco)
    person = rows[0].row["objects"]
    # Reordered by name; a name the category lacks is "not labelled".
    assert person[0]["keypoints"] == [0, 0, 0, 12.5, 14.5, 2, 0, 0, 0]
    # An annotation without keypoints has none labelled.
    assert person[1]["keypoints"] == [0] * 9
    # Without asked names, rows carry no keypoints.
    rows, _ = read_all(CocoFile(write_coco(tmp_path / "plain.json")))
    assert "keypoints" not in rows[0].row["objects"][0]


def test_keypoint_names_no_category_has_stop_the_reading(tmp_path):
    categories = [
        {"id": 1, "name": "person", "keypoints": ["head", "left_hand", "right_hand"]},
        {"id": 3, "name": "cat", "keypoints": ["head", "tail"]},
        {"id": 2, "name": "bicycle"},
    ]
    path = write_coco(tmp_path / "instances.json", categories=categories)
    coco = CocoFile(path, keypoint_names=["nose", "left_eye", "right_eye"])
    with pytest.raises(CocoFileError) as raised:
        read_all(coco)
    assert str(raised.value) == (
        "instances.json: no category has any of the keypoints targets.keypoints.names asks "
        "for (nose, left_eye, right_eye); its categories' keypoints are head, left_hand, "
        "right_hand, tail"
    )
    # A name of another category is "not labelled" for a person.
    rows, _ = read_all(CocoFile(path, keypoint_names=["left_hand", "tail"]))
    assert rows[0].row["objects"][0]["keypoints"] == [11.5, 12.5, 1, 0, 0, 0]


def test_a_keypoint_name_no_category_has_is_refused_with_a_did_you_mean(tmp_path):
    """One misspelt name among found ones (`centre` for `center`) was read as
    "not labelled" in every object: the keypoint was dropped without a word."""
    categories = [
        {"id": 1, "name": "person", "keypoints": ["center", "left", "right"]},
        {"id": 3, "name": "cat", "keypoints": ["center", "tail"]},
    ]
    path = write_coco(tmp_path / "instances.json", categories=categories)
    with pytest.raises(CocoFileError) as raised:
        read_all(CocoFile(path, keypoint_names=["centre", "left", "right"]))
    assert str(raised.value) == (
        "instances.json: targets.keypoints.names: 'centre' is a keypoint of no category; "
        "did you mean 'center'? (its categories' keypoints are center, left, right, tail)"
    )
    with pytest.raises(CocoFileError) as raised:
        read_all(CocoFile(path, keypoint_names=["center", "lfet", "wing"]))
    assert str(raised.value) == (
        "instances.json: targets.keypoints.names: 'lfet' (did you mean 'left'?), 'wing' are "
        "keypoints of no category (its categories' keypoints are center, left, right, tail)"
    )
    # Categories without keypoint names take the annotations' triplets in order.
    plain = [{"id": 1, "name": "person"}, {"id": 3, "name": "cat"}]
    path = write_coco(tmp_path / "plain.json", categories=plain)
    rows, _ = read_all(CocoFile(path, keypoint_names=["a", "b", "c"]))
    assert rows[0].row["objects"][0]["keypoints"] == [12.5, 14.5, 2, 11.5, 12.5, 1, 0, 0, 0]


def test_keypoints_that_do_not_match_their_category_are_a_bad_row_naming_them(tmp_path):
    """Triplets are matched to names by position: one missing would store the
    others under the wrong names, even when the count fits the asked names."""
    annotations = [
        # 2 triplets for the 3 names of "person", as many as the asked names.
        {"id": 1, "image_id": 10, "category_id": 1, "bbox": [1, 1, 9, 9],
         "keypoints": [5, 5, 2, 8, 8, 2]},
        {"id": 2, "image_id": 7, "category_id": 1, "bbox": [1, 1, 9, 9],
         "keypoints": [5, 5, 2, 8, 8, 2, 9, 9, 1]},
    ]  # fmt: skip
    path = write_coco(tmp_path / "instances.json", annotations=annotations)
    source = CocoSource(type="coco", annotations=path, images=image_folder(tmp_path))
    targets = TargetsConfig.model_validate(
        {"boxes": {}, "keypoints": {"names": ["right_eye", "nose"]}}
    )
    files, dropped, _ = listed(source, targets)
    assert sorted(files) == ["7.jpg", "empty.jpg"]
    assert dropped["instances.json:images[0]"].reason == "bad_row"
    assert dropped["instances.json:images[0]"].message == (
        "objects[0] (annotations[0], id 1).keypoints: 6 numbers, expected 9 ([x, y, v] for "
        "each of the 3 keypoints of category 1, 'person': nose, left_eye, right_eye)"
    )
    # Without asked keypoints the list is not read.
    files, dropped, _ = listed(source, BOXES)
    assert sorted(files) == ["7.jpg", "a/10.jpg", "empty.jpg"]


def test_the_source_reports_keypoint_names_no_category_has_as_a_config_error(tmp_path):
    path = write_coco(tmp_path / "instances.json")
    source = CocoSource(type="coco", annotations=path, images=image_folder(tmp_path))
    targets = TargetsConfig.model_validate({"boxes": {}, "keypoints": {"names": ["ear"]}})
    with pytest.raises(ConfigError, match=r"^source.annotations: instances.json: no category"):
        source.list_files(splits_from_source=False, targets=targets)


def test_the_order_of_the_arrays_does_not_matter(tmp_path):
    last = read_all(CocoFile(write_coco(tmp_path / "last.json")))
    first = read_all(CocoFile(write_coco(tmp_path / "first.json", categories_first=True)))
    assert [r.row for r in first[0]] == [r.row for r in last[0]]
    assert [(p.reason, p.entry) for p in first[1]] == [(p.reason, p.entry) for p in last[1]]


def test_an_images_objects_are_in_annotation_id_order_however_the_file_orders_them(tmp_path):
    """A tool that exports the same annotations in another order (by image,
    by category, as edited) gives the same rows: the objects of an image in
    annotation id order, so the records, and the version, stay the same."""
    written = read_all(CocoFile(write_coco(tmp_path / "written.json")))
    reordered = read_all(
        CocoFile(write_coco(tmp_path / "reordered.json", annotations=ANNOTATIONS[::-1]))
    )
    assert [r.row for r in reordered[0]] == [r.row for r in written[0]]
    assert sorted((p.reason, p.entry) for p in reordered[1]) == sorted(
        (p.reason, p.entry) for p in written[1]
    )
    # Ids decide, not the position: integers in order, then strings (as SQLite
    # orders them), then the annotations without an id, in file order.
    images = [{"id": 1, "file_name": "1.png"}]
    annotations = [
        {"id": id_, "image_id": 1, "category_id": 3, "bbox": [x, 0, 1, 1]}
        for x, id_ in enumerate([30, "a", 5, None, 12, None])
    ]
    rows, _ = read_all(
        CocoFile(write_coco(tmp_path / "ids.json", images=images, annotations=annotations))
    )
    assert [o["bbox"][0] for o in rows[0].row["objects"]] == [2, 4, 0, 1, 3, 5]


def test_string_ids_join_too(tmp_path):
    images = [{"id": "b", "file_name": "b.png"}, {"id": 3, "file_name": "3.png"}]
    annotations = [
        {"id": 1, "image_id": "b", "category_id": 3, "bbox": [0, 0, 2, 2]},
        {"id": 2, "image_id": 3, "category_id": 3, "bbox": [1, 1, 2, 2]},
        {"id": 3, "image_id": "3", "category_id": 3, "bbox": [1, 1, 2, 2]},  # "3" is not 3
    ]
    rows, problems = read_all(
        CocoFile(write_coco(tmp_path / "i.json", images=images, annotations=annotations))
    )
    assert [(r.row["path"], len(r.row["objects"])) for r in rows] == [("3.png", 1), ("b.png", 1)]
    assert [(p.where, p.reason) for p in problems] == [
        ("i.json:annotations[2]", "dangling_annotation")
    ]


@pytest.mark.parametrize(
    ("categories", "message"),
    [
        (
            [{"id": 3, "name": "cat"}, {"id": 4, "name": "dog"}, {"id": 3, "name": "lynx"}],
            r"^i\.json:categories\[2\]: category id 3 is declared twice \(also categories\[0\]\)$",
        ),
        (
            [{"id": 1, "name": "person", "keypoints": ["nose"]}, {"id": 1, "name": "person"}],
            r"^i\.json:categories\[1\]: category id 1 is declared twice \(also categories\[0\]\)$",
        ),
        ([{"id": 3, "name": "cat"}, {"id": 4}], r"^i\.json:categories\[1\]: 'name' must be"),
        ([{"name": "cat"}], r"^i\.json:categories\[0\]: 'id' must be"),
        ([{"id": 1, "name": "a", "keypoints": "nose"}], r"categories\[0\]: 'keypoints' must be"),
        (["cat"], r"^i\.json:categories\[0\]: expected a JSON object$"),
    ],
)
def test_a_broken_or_ambiguous_category_stops_the_reading(tmp_path, categories, message):
    coco = CocoFile(write_coco(tmp_path / "i.json", categories=categories))
    with pytest.raises(CocoFileError, match=message):
        coco.class_names()
    with pytest.raises(CocoFileError, match=message):
        read_all(CocoFile(write_coco(tmp_path / "i.json", categories=categories)))


def test_an_exact_repeat_of_a_category_is_ignored(tmp_path):
    categories = [*CATEGORIES, dict(CATEGORIES[0]), {"id": 3, "name": "cat"}]
    coco = CocoFile(write_coco(tmp_path / "i.json", categories=categories))
    assert coco.class_names() == ["bicycle", "cat", "person"]
    assert [r.row for r in read_all(coco)[0]] == [
        r.row for r in read_all(CocoFile(write_coco(tmp_path / "plain.json")))[0]
    ]


def test_two_category_ids_of_one_name_are_one_class_with_a_warning(tmp_path, caplog):
    categories = [*CATEGORIES, {"id": 4, "name": " cat"}]  # "cat" once stripped
    annotations = [
        {"id": 1, "image_id": 10, "category_id": 3, "bbox": [0, 0, 2, 2]},
        {"id": 2, "image_id": 10, "category_id": 4, "bbox": [0, 0, 1, 1]},
    ]
    path = write_coco(tmp_path / "i.json", categories=categories, annotations=annotations)
    coco = CocoFile(path)
    with caplog.at_level(logging.WARNING, logger="kiln.pipeline.coco"):
        assert coco.class_names() == ["bicycle", "cat", "person"]
    assert [r.getMessage() for r in caplog.records] == [
        "i.json:categories[3]: category id 4 has the name 'cat' of category id 3 (categories[1]): "
        "their annotations are one class"
    ]
    rows = {r.row["path"]: r.row for r in read_all(coco)[0]}
    assert [o["class"] for o in rows["a/10.jpg"]["objects"]] == ["cat", "cat"]
    # One name per id, however often an id is repeated exactly: no warning.
    caplog.clear()
    repeated = [*CATEGORIES, dict(CATEGORIES[1])]
    with caplog.at_level(logging.WARNING, logger="kiln.pipeline.coco"):
        CocoFile(write_coco(tmp_path / "r.json", categories=repeated)).class_names()
    assert caplog.records == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"images": [{"id": 1, "file_name": "a.jpg"}], "annotations": [{"id": 1,', "not valid"),
        ('{"annotations": [], "categories": []}', "no 'images' array"),
        ("[1, 2, 3]", "no 'images' array"),
    ],
)
def test_a_file_that_cannot_be_used_is_an_error(tmp_path, text, message):
    path = tmp_path / "broken.json"
    path.write_text(text)
    with pytest.raises(CocoFileError, match=message):
        read_all(CocoFile(str(path)))


def test_a_missing_file_is_an_error(tmp_path):
    with pytest.raises(CocoFileError, match="cannot read"):
        read_all(CocoFile(str(tmp_path / "nope.json")))


def write_large_coco(path, *, images: int, annotations: int) -> None:
    """A COCO file written piece by piece: annotations in shuffled image order."""
    with open(path, "w") as f:
        f.write('{"images": [')
        f.write(
            ",".join(
                json.dumps({"id": i, "file_name": f"{i:08d}.jpg", "width": 640, "height": 480})
                for i in range(images)
            )
        )
        f.write('], "annotations": [')
        for a in range(annotations):
            image_id = (a * 7919) % (images + 5)  # a few dangling ids beyond the images
            box = [a % 600, a % 400, 10.5, 20]
            item = {"id": a, "image_id": image_id, "category_id": a % 3 + 1, "bbox": box}
            f.write(("," if a else "") + json.dumps(item))
        f.write('], "categories": ' + json.dumps(CATEGORIES) + "}")


def read_with_tracemalloc(path, images: int, annotations: int) -> int:
    """Reads a generated file, checks what it read; the peak of Python's allocations."""
    tracemalloc.start()
    try:
        rows = objects = dangling = missing_images = 0
        boxes_of_7 = set()
        for found in CocoFile(str(path)).rows():
            if isinstance(found, CocoRow):
                rows += 1
                objects += len(found.row["objects"])
                if found.row["path"] == "00000007.jpg":
                    boxes_of_7 = {o["bbox"][0] for o in found.row["objects"]}
            else:
                assert found.reason == "dangling_annotation"
                missing_images += 1
                dangling += len(json.loads(found.entry)["annotations"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    image_ids = [(a * 7919) % (images + 5) for a in range(annotations)]
    expected_dangling = sum(1 for image_id in image_ids if image_id >= images)
    assert (rows, objects + dangling, dangling) == (images, annotations, expected_dangling)
    assert missing_images == 5  # one problem per missing image, whatever its annotations
    assert boxes_of_7 == {a % 600 for a, image_id in enumerate(image_ids) if image_id == 7}
    return peak


def test_a_large_file_is_read_with_bounded_memory(tmp_path):
    # Measured with tracemalloc (Python's allocations; SQLite's page cache is
    # bounded by its own setting), which slows the reading down several
    # times: 100,000 annotations keep the test under a minute.
    small, large = tmp_path / "small.json", tmp_path / "large.json"
    write_large_coco(small, images=1_000, annotations=10_000)
    write_large_coco(large, images=10_000, annotations=100_000)
    small_peak = read_with_tracemalloc(small, 1_000, 10_000)
    large_peak = read_with_tracemalloc(large, 10_000, 100_000)
    size = large.stat().st_size
    # json.load of the large file alone takes several times its size in Python
    # objects; the stream holds an insert batch and one image's rows, so ten
    # times the annotations cost (almost) nothing more.
    assert size > 7_000_000
    assert large_peak < 8_000_000, f"peak {large_peak / 1e6:.1f} MB for a {size / 1e6:.0f} MB file"
    assert large_peak < small_peak + 1_000_000, (small_peak, large_peak)


# --- the source: listing with targets ------------------------------------------------


def listed(source, targets: TargetsConfig, *, splits_from_source: bool = False):
    """(files by key with their targets, dropped rows by key, class names)."""
    with source.list_files(splits_from_source=splits_from_source, targets=targets) as listing:
        files = {f.key: f for f in listing.files()}
        dropped = {d.key: d for d in listing.dropped()}
        return files, dropped, listing.class_names


def image_folder(tmp_path) -> str:
    images = tmp_path / "images"
    for image in IMAGES:
        if "file_name" in image:
            (images / image["file_name"]).parent.mkdir(parents=True, exist_ok=True)
            (images / image["file_name"]).write_bytes(b"listing does not decode images")
    return str(images)


BOXES = TargetsConfig.model_validate({"boxes": {"fields": {"iscrowd": "int"}}})


def test_the_source_lists_every_image_with_its_targets(tmp_path):
    annotations = write_coco(tmp_path / "instances.json")
    source = CocoSource(type="coco", annotations=annotations, images=image_folder(tmp_path))
    files, dropped, class_names = listed(source, BOXES)

    # The class list is the declared categories, not the classes the rows use.
    assert class_names == ["bicycle", "cat", "person"]
    assert sorted(files) == ["a/10.jpg", "empty.jpg"]
    first = json.loads(files["a/10.jpg"].targets)
    # Each object names its annotation for the job's messages (not part of
    # what it means: `target_rows.unnamed`).
    named = "annotation as named"
    assert first["objects"] == [
        {
            "bbox": [10.0, 10.0, 30.0, 25.5],
            "class": "person",
            "fields": {"iscrowd": 0},
            named: "annotations[0], id 1",
        },
        {
            "bbox": [40.0, 2.0, 48.0, 32.0],
            "class": "person",
            "fields": {"iscrowd": 1},
            named: "annotations[2], id 3",
        },
    ]
    assert files["a/10.jpg"].uri == os.path.join(str(tmp_path), "images", "a", "10.jpg")
    assert files["a/10.jpg"].label == -1
    assert json.loads(files["empty.jpg"].targets) == {
        "objects": [],
        "size as declared": {"by": "images[].width/height", "height": 20, "width": 20},
    }
    assert {key: d.reason for key, d in dropped.items()} == {
        "instances.json:annotations[3]": "dangling_annotation",
        "instances.json:annotations[6]": "bad_row",
        "instances.json:annotations[7]": "dangling_annotation",
        "instances.json:images[3]": "bad_row",
        "instances.json:images[4]": "bad_row",
        # Image 7 has a box of three numbers: its row fails the row validation.
        "instances.json:images[1]": "bad_row",
    }
    assert dropped["instances.json:images[1]"].message.startswith(
        "objects[2] (annotations[5], id 6).bbox: expected 4 numbers [x, y, width, height]"
    )


def test_a_missing_box_names_its_annotation(tmp_path):
    annotations = [
        {"id": 1, "image_id": 10, "category_id": 1, "bbox": [0, 0, 2, 2]},
        {"image_id": 10, "category_id": 1, "bbox": None},
        {"id": "b", "image_id": 7, "category_id": 3},
    ]
    path = write_coco(tmp_path / "instances.json", annotations=annotations)
    source = CocoSource(type="coco", annotations=path, images=image_folder(tmp_path))
    files, dropped, _ = listed(source, BOXES)
    assert sorted(files) == ["empty.jpg"]
    assert dropped["instances.json:images[0]"].message == (
        "objects[1] (annotations[1]).bbox: expected 4 numbers [x, y, width, height], got null"
    )
    assert dropped["instances.json:images[1]"].message == (
        'objects[0] (annotations[2], id "b").bbox: expected 4 numbers [x, y, width, height], '
        "got no 'bbox'"
    )


def test_a_box_of_negative_size_keeps_its_annotation_as_written(tmp_path):
    annotations = [
        {"id": 1, "image_id": 10, "category_id": 1, "bbox": [30, 10, -20, 15.5]},
        {"id": 2, "image_id": 10, "category_id": 1, "bbox": [1, 2, 3, 4]},
    ]
    path = write_coco(tmp_path / "instances.json", annotations=annotations)
    source = CocoSource(type="coco", annotations=path, images=image_folder(tmp_path))
    files, _, _ = listed(source, BOXES)
    # Converted like any box (the job refuses it, per object), and named as the file writes it.
    assert json.loads(files["a/10.jpg"].targets)["objects"] == [
        {
            "bbox": [30.0, 10.0, 10.0, 25.5],
            "class": "person",
            "fields": {"iscrowd": 0},
            "bbox as written": {"bbox": [30, 10, -20, 15.5]},
            "annotation as named": "annotations[0], id 1",
        },
        {
            "bbox": [1.0, 2.0, 4.0, 6.0],
            "class": "person",
            "fields": {"iscrowd": 0},
            "annotation as named": "annotations[1], id 2",
        },
    ]


def test_the_source_passes_every_declared_field_on(tmp_path):
    annotations = [
        {"id": 1, "image_id": 10, "category_id": 1, "bbox": [0, 0, 2, 2], "area": 4.0},
        {"id": 2, "image_id": 10, "category_id": 1, "bbox": [0, 0, 1, 1], "area": 1, "iscrowd": 1},
        {"id": 3, "image_id": 7, "category_id": 3, "bbox": [0, 0, 1, 1]},  # no area
    ]
    path = write_coco(tmp_path / "instances.json", annotations=annotations)
    source = CocoSource(type="coco", annotations=path, images=image_folder(tmp_path))
    targets = TargetsConfig.model_validate(
        {"boxes": {"fields": {"iscrowd": "int", "area": "float"}}}
    )
    files, dropped, _ = listed(source, targets)
    assert [o["fields"] for o in json.loads(files["a/10.jpg"].targets)["objects"]] == [
        {"area": 4.0, "iscrowd": 0},  # iscrowd 0 when absent
        {"area": 1.0, "iscrowd": 1},
    ]
    # A declared field an annotation lacks is a bad row, as in a JSONL manifest,
    # its annotation named.
    assert dropped["instances.json:images[1]"].message == (
        "objects[0] (annotations[2], id 3).area: missing (targets.boxes.fields)"
    )
    # Undeclared keys stay out of the rows.
    rows, _ = read_all(CocoFile(path))
    assert "area" not in rows[1].row["objects"][0]


def test_a_bad_row_names_the_annotation_of_its_object(tmp_path):
    # An image's objects are in annotation id order, not the file's: "objects[0]"
    # alone would send the reader to the image's first annotation in the file.
    annotations = [
        {"id": 7, "image_id": 10, "category_id": 1, "bbox": [0, 0, 2, 2], "segmentation": POLYGON},
        {"id": 5, "image_id": 10, "category_id": 1, "bbox": [0, 0, 2, 2], "segmentation": []},
        {"id": 9, "image_id": 7, "category_id": 3, "bbox": [0, 0, 1, 1], "segmentation": POLYGON},
        {
            "id": 2,
            "image_id": 7,
            "category_id": 3,
            "bbox": [0, 0, 1, 1],
            "segmentation": POLYGON,
            "iscrowd": True,
        },
    ]
    path = write_coco(tmp_path / "instances.json", annotations=annotations)
    source = CocoSource(type="coco", annotations=path, images=image_folder(tmp_path))
    targets = TargetsConfig.model_validate(
        {"boxes": {"fields": {"iscrowd": "int"}}, "instance_masks": {}}
    )
    files, dropped, _ = listed(source, targets)
    assert sorted(files) == ["empty.jpg"]
    assert dropped["instances.json:images[0]"].message == (
        "objects[0] (annotations[1], id 5): give either 'mask' (a PNG path) or "
        "'segmentation' (polygons or RLE)"
    )
    assert dropped["instances.json:images[1]"].message == (
        "objects[0] (annotations[3], id 2).iscrowd: expected an integer, got true"
    )


def test_crowd_regions_without_the_iscrowd_field_are_counted_in_a_warning(tmp_path, caplog):
    # Annotation 3 (image 10) is a crowd region; annotation 6's image is a bad row.
    annotations = [
        *ANNOTATIONS,
        {"id": 9, "image_id": 7, "category_id": 3, "bbox": [0, 0, 1, 1], "iscrowd": 1},
    ]
    path = write_coco(tmp_path / "instances.json", annotations=annotations)
    source = CocoSource(type="coco", annotations=path, images=image_folder(tmp_path))
    with caplog.at_level(logging.WARNING, logger="kiln.pipeline.sources"):
        listed(source, TargetsConfig.model_validate({"boxes": {}}))
    assert [r.getMessage() for r in caplog.records] == [
        "instances.json: 1 annotation(s) are crowd regions (iscrowd 1), stored as ordinary "
        "objects: declare targets.boxes.fields: {iscrowd: int} to keep the flag, and skip "
        "them in training as COCO's evaluation does"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kiln.pipeline.sources"):
        files, _, _ = listed(source, BOXES)  # declared: kept, no warning
    assert caplog.records == []
    assert [o["fields"] for o in json.loads(files["a/10.jpg"].targets)["objects"]] == [
        {"iscrowd": 0},
        {"iscrowd": 1},
    ]


def test_an_image_listed_twice_is_named_by_its_entries(tmp_path):
    images = [
        {"id": 1, "file_name": "7.jpg"},
        {"id": 2, "file_name": "empty.jpg"},
        {"id": 3, "file_name": "7.jpg"},  # the same file, other objects
    ]
    annotations = [{"id": 1, "image_id": 3, "category_id": 3, "bbox": [0, 0, 1, 1]}]
    path = write_coco(tmp_path / "instances.json", images=images, annotations=annotations)
    source = CocoSource(type="coco", annotations=path, images=image_folder(tmp_path))
    files, dropped, _ = listed(source, BOXES)
    assert sorted(files) == ["empty.jpg"]
    assert dropped["7.jpg"].reason == "duplicate_key"
    assert dropped["7.jpg"].message == (
        "listed 2 times with different objects (instances.json:images[0], instances.json:images[2])"
    )


def test_the_source_asks_for_instance_masks_and_keypoints(tmp_path):
    annotations = [a for a in ANNOTATIONS if a["id"] in (1, 3)]  # both with segmentation
    path = write_coco(tmp_path / "instances.json", annotations=annotations)
    source = CocoSource(type="coco", annotations=path, images=image_folder(tmp_path))
    targets = TargetsConfig.model_validate(
        {
            "boxes": {},
            "instance_masks": {},
            "keypoints": {"names": ["nose", "left_eye", "right_eye"]},
        }
    )
    files, _, _ = listed(source, targets)
    person, crowd = json.loads(files["a/10.jpg"].targets)["objects"]
    assert person["segmentation"] == POLYGON and crowd["segmentation"] == CROWD_RLE
    assert person["keypoints"] == [12.5, 14.5, 2, 11.5, 12.5, 1, 0, 0, 0]
    assert crowd["keypoints"] == [0] * 9


def test_the_split_of_the_file_with_splits_from_source(tmp_path):
    path = write_coco(tmp_path / "instances.json")
    images = image_folder(tmp_path)
    source = CocoSource(type="coco", annotations=path, images=images, split="val")
    with source.list_files(splits_from_source=True, targets=BOXES) as listing:
        assert listing.split_names == ["val"]
    with pytest.raises(ConfigError, match=r"source.split: splits.from_source"):
        CocoSource(type="coco", annotations=path, images=images).list_files(
            splits_from_source=True, targets=BOXES
        )


def test_the_source_reports_an_ambiguous_category_as_a_config_error(tmp_path):
    categories = [*CATEGORIES, {"id": 3, "name": "dog"}]
    path = write_coco(tmp_path / "instances.json", categories=categories)
    source = CocoSource(type="coco", annotations=path, images=image_folder(tmp_path))
    with pytest.raises(ConfigError) as raised:
        source.list_files(splits_from_source=False, targets=BOXES)
    assert str(raised.value) == (
        "source.annotations: instances.json:categories[3]: category id 3 is declared twice "
        "(also categories[1])"
    )


def test_the_source_reports_a_file_it_cannot_read_as_a_config_error(tmp_path):
    (tmp_path / "instances.json").write_text('{"images": [')
    source = CocoSource(
        type="coco", annotations=str(tmp_path / "instances.json"), images=str(tmp_path)
    )
    with pytest.raises(ConfigError, match=r"source.annotations: .*not valid JSON"):
        source.list_files(splits_from_source=False, targets=BOXES)


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        (None, "targets.boxes: a coco source lists objects"),
        ({"label": {}}, "targets.boxes"),
        ({"boxes": {}, "mask": {}}, "targets.mask: a coco source gives boxes, instance_masks"),
        ({"boxes": {}, "extra": {"weather": "string"}}, "targets.extra"),
        ({"boxes": {}, "keypoints": {"names": ["a"]}}, None),
    ],
)
def test_the_config_accepts_only_targets_coco_can_give(tmp_path, targets, message):
    config = {
        "name": "coco",
        "source": {
            "type": "coco",
            "annotations": write_coco(tmp_path / "instances.json"),
            "images": image_folder(tmp_path),
        },
        "output": str(tmp_path / "out"),
    }
    if targets is not None:
        config["targets"] = targets
    if message is None:
        assert load_config(config).targets.keypoints.names == ["a"]
    else:
        with pytest.raises(ConfigError, match=message):
            load_config(config)


# --- keys given twice in a JSON object ---------------------------------------------------


def twice(entry: dict, key: str, value) -> str:
    """`entry` as JSON text that gives `key` again, `value` last (json would keep it)."""
    return json.dumps(entry)[:-1] + f", {json.dumps(key)}: {json.dumps(value)}}}"


def test_an_entry_that_gives_a_key_twice_is_a_bad_row_naming_it(tmp_path):
    images = [
        {"id": 10, "file_name": "a/10.jpg"},
        {"id": 7, "file_name": "7.jpg"},
        {"id": 12, "file_name": "empty.jpg"},
    ]
    annotations = [
        {"id": 1, "image_id": 10, "category_id": 1, "bbox": [0, 0, 2, 2]},
        {"id": 2, "image_id": 7, "category_id": 3, "bbox": [0, 0, 2, 2]},
        {"id": 3, "image_id": 7, "category_id": 3, "bbox": [1, 1, 2, 2], "segmentation": {}},
    ]
    text = (
        '{"images": ['
        + ", ".join([json.dumps(images[0]), json.dumps(images[1]), twice(images[2], "id", 10)])
        + '], "annotations": ['
        + ", ".join(
            [
                json.dumps(annotations[0]),
                twice(annotations[1], "bbox", [0, 0, 9, 9]),
                # In an object inside the annotation: an RLE's counts.
                json.dumps(annotations[2]).replace(
                    '"segmentation": {}',
                    '"segmentation": {"size": [8, 8], "counts": [64], "counts": [60, 4]}',
                ),
            ]
        )
        + '], "categories": '
        + json.dumps(CATEGORIES)
        + "}"
    )
    (tmp_path / "instances.json").write_text(text)
    source = CocoSource(
        type="coco", annotations=str(tmp_path / "instances.json"), images=image_folder(tmp_path)
    )

    files, dropped, _ = listed(source, BOXES)

    assert sorted(files) == ["a/10.jpg"]
    assert {key: (d.reason, d.message) for key, d in dropped.items()} == {
        # The first annotation of image 7 that gives a key twice names it.
        "instances.json:images[1]": (
            "bad_row",
            'objects[0] (annotations[1], id 2): duplicate key "bbox" in a JSON object',
        ),
        "instances.json:images[2]": ("bad_row", 'duplicate key "id" in a JSON object'),
    }


def test_a_nested_key_given_twice_names_its_annotation(tmp_path):
    annotation = {"id": 3, "image_id": 7, "category_id": 3, "bbox": [1, 1, 2, 2]}
    text = (
        '{"images": [{"id": 7, "file_name": "7.jpg"}], "annotations": ['
        + json.dumps(annotation)[:-1]
        + ', "segmentation": {"size": [8, 8], "counts": [64], "counts": [60, 4]}}'
        + '], "categories": '
        + json.dumps(CATEGORIES)
        + "}"
    )
    (tmp_path / "instances.json").write_text(text)

    rows, problems = read_all(CocoFile(str(tmp_path / "instances.json")))

    assert rows == []
    assert [(p.where, p.reason, p.message) for p in problems] == [
        (
            "instances.json:images[0]",
            "bad_row",
            'objects[0] (annotations[0], id 3): duplicate key "counts" in a JSON object',
        )
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"images": [{"id": 1, "file_name": "1.jpg"}], "categories": [], '
            '"images": [{"id": 2, "file_name": "2.jpg"}]}',
            'the top-level key "images" is given twice',
        ),
        (
            '{"categories": [{"id": 1, "name": "a"}], "images": [], '
            '"categories": [{"id": 2, "name": "b"}]}',
            'the top-level key "categories" is given twice',
        ),
        (
            '{"images": [{"id": 1, "file_name": "1.jpg"}], '
            '"categories": [{"id": 1, "name": "cat", "name": "dog"}]}',
            'instances.json:categories[0]: duplicate key "name" in a JSON object',
        ),
    ],
)
def test_a_key_given_twice_at_the_top_or_in_a_category_is_a_config_error(tmp_path, text, message):
    (tmp_path / "instances.json").write_text(text)
    source = CocoSource(
        type="coco", annotations=str(tmp_path / "instances.json"), images=str(tmp_path)
    )

    with pytest.raises(ConfigError) as raised:
        source.list_files(splits_from_source=False, targets=BOXES)

    assert str(raised.value).startswith("source.annotations: ")
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_gzipped_coco_file_is_read_as_the_plain_one_a_piece_at_a_time(tmp_path):
    # 64 MiB of JSON whitespace, some KB gzipped: Beam's reader decompressed
    # 16 MiB of the file at a time whole, so a gzip bomb took memory at once.
    plain = write_coco(tmp_path / "plain.json")
    text = open(plain).read()
    packed = tmp_path / "instances.json.gz"
    packed.write_bytes(gzip.compress(text[:-1].encode() + b" " * (64 << 20) + b"}"))
    expected = read_all(CocoFile(plain))

    tracemalloc.start()
    try:
        found = read_all(CocoFile(str(packed)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert [row.row for row in found[0]] == [row.row for row in expected[0]]
    assert [p.message for p in found[1]] == [p.message for p in expected[1]]
    assert peak < 16 << 20, peak


def lexed_token_lengths(data: bytes) -> list[int]:
    """After each byte of JSON text, the length of the token it ends inside
    (a string from its opening quote, or a run after the last delimiter
    outside strings): a byte-by-byte lexer to check `_TokenGuard` against."""
    lengths, in_string, escaped, run = [], False, False, 0
    for byte in data:
        if in_string:
            run += 1
            if escaped:
                escaped = False
            elif byte == ord("\\"):
                escaped = True
            elif byte == ord('"'):
                in_string, run = False, 0
        elif byte == ord('"'):
            in_string, run = True, 0
        elif byte in b",:[]{}":
            run = 0
        else:
            run += 1
        lengths.append(run)
    return lengths


def test_the_token_guard_measures_strings_whatever_they_hold_and_however_reads_split_them():
    # Strings of quotes, backslashes, spaces and delimiters, with numbers
    # between them: after every read, the guard's token is the lexer's.
    rng = random.Random(7)
    pieces = [
        [
            '"' + "".join(rng.choice('ab,[]{}:"\\ ') for _ in range(rng.randint(0, 40))) + '"',
            rng.randint(0, 10**9),
        ]
        for _ in range(300)
    ]
    data = json.dumps(pieces, separators=(",", ":")).encode()
    expected = lexed_token_lengths(data)
    assert max(expected) > 40  # strings with escapes, measured from their opening quote
    for trial in range(200):
        guard = coco_module._TokenGuard(io.BytesIO(data), "x.json")
        position = 0
        while chunk := guard.read(rng.randint(1, 9)):
            position += len(chunk)
            assert guard._run == expected[position - 1], (trial, position)
        assert position == len(data)


@pytest.mark.parametrize("content", ["x", 'a,b\\"[]{}:\\\\ '], ids=["letters", "delimiters"])
def test_a_string_of_more_than_1_mib_is_refused_whatever_it_holds(tmp_path, content):
    # yajl lexes a string again from its start after every read that ends
    # inside it, so a long one costs its square (80 MB of "a," took 11.5 s):
    # a string is refused past 1 MiB, commas, brackets and escaped quotes
    # in it or not. One just under stays a file name like any other.
    cap = 1 << 20
    short = content * ((cap - 300) // (len(json.dumps(content)) - 2))  # as written, < 1 MiB
    images = [{"id": 1, "file_name": short, "width": 4, "height": 4}]
    rows, _ = read_all(CocoFile(write_coco(tmp_path / "short.json", images=images)))
    assert [row.row["path"] for row in rows] == [short]
    long = short * 2
    images = [{"id": 1, "file_name": long, "width": 4, "height": 4}]
    with pytest.raises(CocoFileError, match=r"long\.json: a token of more than 1048576 bytes"):
        read_all(CocoFile(write_coco(tmp_path / "long.json", images=images)))


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_a_byte_order_mark_is_skipped(tmp_path, suffix):
    """Windows tools write UTF-8 with a byte order mark (and CRLF line ends)."""
    with open(write_coco(tmp_path / "written.json"), "rb") as f:
        text = f.read()
    paths = []
    for folder, data in (("plain", text), ("bom", b"\xef\xbb\xbf" + text.replace(b"\n", b"\r\n"))):
        (tmp_path / folder).mkdir()
        paths.append(tmp_path / folder / f"instances.json{suffix}")
        paths[-1].write_bytes(gzip.compress(data) if suffix else data)
    plain, path = paths
    assert read_all(CocoFile(str(path))) == read_all(CocoFile(str(plain)))
    assert CocoFile(str(path)).class_names() == ["bicycle", "cat", "person"]
