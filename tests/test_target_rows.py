"""Structural checks of a manifest row's targets (`kiln.pipeline.target_rows`), the
function the JSONL and COCO sources share."""

from __future__ import annotations

import json

import pytest

from kiln.pipeline import target_rows
from kiln.pipeline.target_rows import AnnotationError
from kiln.schemas import TargetsConfig

TARGETS = TargetsConfig.model_validate(
    {
        "labels": {},
        "boxes": {"fields": {"iscrowd": "int", "score": "float"}},
        "mask": {},
        "instance_masks": {},
        "keypoints": {"names": ["a", "b"]},
        "extra": {"weather": "string", "altitude": "float", "year": "int"},
    }
)


def resolve(path: str) -> str:
    return "/data/" + path


def good_row(**changes) -> dict:
    row = {
        "path": "1.jpg",
        "labels": ["cat", "dog"],
        "objects": [
            {
                "bbox": [1, 2, 30, 40.5],
                "class": "cat",
                "iscrowd": 0,
                "score": 0.5,
                "keypoints": [3, 4, 2, 0, 0, 0],
                "mask": "m/1_0.png",
            },
            {
                "bbox": [5, 5, 9, 9],
                "class": 7,
                "iscrowd": 1,
                "score": 1,
                "keypoints": [5, 5, 1, 6, 6, 2],
                "segmentation": {"size": [10, 10], "counts": "abc"},
            },
        ],
        "mask": "m/1.png",
        "weather": "sunny",
        "altitude": 3,
        "year": 2024,
        "ignored": {"anything": True},
    }
    row.update(changes)
    return row


def test_a_good_row_becomes_canonical_targets():
    targets = target_rows.row_targets(good_row(), TARGETS, resolve)
    assert targets == {
        "labels": ["cat", "dog"],
        "objects": [
            {
                "bbox": [1.0, 2.0, 30.0, 40.5],
                "class": "cat",
                "fields": {"iscrowd": 0, "score": 0.5},
                "keypoints": [3.0, 4.0, 2.0, 0.0, 0.0, 0.0],
                "mask": "/data/m/1_0.png",
            },
            {
                "bbox": [5.0, 5.0, 9.0, 9.0],
                "class": "7",
                "fields": {"iscrowd": 1, "score": 1.0},
                "keypoints": [5.0, 5.0, 1.0, 6.0, 6.0, 2.0],
                "segmentation": {"size": [10, 10], "counts": "abc"},
            },
        ],
        "mask": "/data/m/1.png",
        "extra": {"altitude": 3.0, "weather": "sunny", "year": 2024},
    }
    text = target_rows.canonical(targets)
    assert json.loads(text) == targets and " " not in text
    assert sorted(target_rows.class_names(targets)) == ["7", "cat", "cat", "dog"]
    assert list(target_rows.mask_uris(targets)) == [
        ("mask", "/data/m/1.png"),
        ("objects[0].mask", "/data/m/1_0.png"),
    ]


def test_undeclared_kinds_are_not_read():
    only_boxes = TargetsConfig.model_validate({"boxes": {}})
    targets = target_rows.row_targets(good_row(), only_boxes, resolve)
    assert set(targets) == {"objects"}
    assert set(targets["objects"][0]) == {"bbox", "class", "fields"}


def test_non_finite_coordinates_pass_structure_for_the_job_to_report():
    row = good_row()
    row["objects"][0]["bbox"] = [float("nan"), 1, 2, 3]
    targets = target_rows.row_targets(row, TARGETS, resolve)
    assert "NaN" in target_rows.canonical(targets)


def object_change(index: int, **changes) -> dict:
    row = good_row()
    row["objects"][index] = {**row["objects"][index], **changes}
    return row


def without(row: dict, *names: str, index: int | None = None) -> dict:
    target = row if index is None else row["objects"][index]
    for name in names:
        target.pop(name)
    return row


@pytest.mark.parametrize(
    "row, message",
    [
        (without(good_row(), "objects"), r"'objects' is missing: expected a list of objects"),
        (good_row(objects={}), "'objects' must be a list"),
        (good_row(objects=[3]), r"objects\[0\]: expected an object"),
        (object_change(0, bbox=[1, 2, 3]), r"objects\[0\].bbox: expected 4 numbers"),
        (object_change(1, bbox=[1, 2, 3, True]), r"objects\[1\].bbox: expected 4 numbers"),
        (object_change(0, bbox="1,2,3,4"), r"objects\[0\].bbox: expected 4 numbers"),
        (object_change(0, **{"class": ""}), r"objects\[0\].class is empty"),
        (object_change(0, **{"class": "a\tb"}), r"objects\[0\].class holds a control character"),
        (object_change(0, **{"class": " "}), r"objects\[0\].class is only whitespace"),
        (without(good_row(), "iscrowd", index=0), r"objects\[0\].iscrowd: missing"),
        (object_change(0, iscrowd=0.5), r"objects\[0\].iscrowd: expected an integer"),
        (object_change(0, score="high"), r"objects\[0\].score: expected a finite number"),
        (object_change(0, score=float("nan")), r"objects\[0\].score: expected a finite number"),
        (object_change(0, score=1e39), r"objects\[0\].score: 1e\+39 does not fit the record's"),
        (
            object_change(0, iscrowd=2**63),
            r"objects\[0\].iscrowd: 9223372036854775808 does not fit the record's 64-bit integer",
        ),
        (object_change(0, keypoints=[1, 2, 2]), r"objects\[0\].keypoints: expected 6 numbers"),
        (object_change(0, keypoints=None), r"objects\[0\].keypoints: expected 6 .*, got null"),
        # Missing is not null: the row does not say null.
        (
            without(good_row(), "keypoints", index=0),
            r"objects\[0\].keypoints: missing \(targets.keypoints\): 6 numbers, x, y, visibility "
            r"for each of 2 keypoints \(all 0 for an object none of whose keypoints is labelled\)",
        ),
        (
            without(good_row(), "bbox", index=1),
            r"objects\[1\].bbox: missing: every object needs 4 numbers",
        ),
        (object_change(0, keypoints=[1, 2, 3, 1, 1, 1]), "visibility of 'a' must be 0, 1 or 2"),
        (object_change(0, segmentation=[[1, 2, 3, 4, 5, 6]]), r"objects\[0\]: give either"),
        (without(good_row(), "mask", index=0), r"objects\[0\]: give either"),
        (object_change(1, segmentation=[[1, "a"]]), r"objects\[1\].segmentation\[0\]"),
        (object_change(1, segmentation={"size": [10], "counts": "x"}), r"segmentation.size"),
        (object_change(1, segmentation={"size": [2, 2], "counts": 5}), r"segmentation.counts"),
        (object_change(0, mask=3), r"objects\[0\].mask: expected a path"),
        (good_row(labels="cat"), "'labels' must be a list"),
        (good_row(labels=["cat", None]), r"labels\[1\]: expected a class name"),
        (without(good_row(), "mask"), "'mask' is missing"),
        (without(good_row(), "year"), "'year' is missing: expected an integer"),
        (good_row(year="2024"), "year: expected an integer"),
        (good_row(altitude=float("inf")), "altitude: expected a finite number"),
        (good_row(altitude=10**400), "altitude: expected a finite number"),
        (good_row(altitude=-1e39), "altitude: -1e[+]39 does not fit the record's float32"),
        (good_row(weather=1), "weather: expected a string"),
    ],
)
def test_a_malformed_row_names_the_field(row, message):
    with pytest.raises(AnnotationError, match=message):
        target_rows.row_targets(row, TARGETS, resolve)


def test_csv_rows_carry_labels_and_typed_extras():
    targets = TargetsConfig.model_validate(
        {"label": {}, "labels": {"separator": ";"}, "extra": {"year": "int", "note": "string"}}
    )
    assert target_rows.csv_columns(targets) == ["label", "labels", "note", "year"]
    cells = {"labels": "cat; dog", "year": " 2024 ", "note": " as is "}
    assert target_rows.csv_row_targets(cells, targets) == {
        "labels": ["cat", "dog"],
        "extra": {"note": " as is ", "year": 2024},
    }
    assert target_rows.csv_row_targets({**cells, "labels": ""}, targets)["labels"] == []
    with pytest.raises(AnnotationError, match="year: expected an integer, got 'soon'"):
        target_rows.csv_row_targets({**cells, "year": "soon"}, targets)
    with pytest.raises(AnnotationError, match="labels: empty class name"):
        target_rows.csv_row_targets({**cells, "labels": "cat;;dog"}, targets)
    # Numbers as JSON writes them: not Python's "1_000", "0x10" or " 1 2".
    for cell in ("1_000", "0x10", "1 2", "2024.0"):
        with pytest.raises(AnnotationError, match=f"year: expected an integer, got '{cell}'"):
            target_rows.csv_row_targets({**cells, "year": cell}, targets)


@pytest.mark.parametrize("cell", ["inf", "-Infinity", "nan", "1_000.5", "1e", "."])
def test_a_csv_float_cell_is_a_finite_number_as_json_writes_it(cell):
    targets = TargetsConfig.model_validate({"label": {}, "extra": {"altitude": "float"}})
    with pytest.raises(AnnotationError, match=f"altitude: expected a finite number, got '{cell}'"):
        target_rows.csv_row_targets({"label": "cat", "altitude": cell}, targets)


@pytest.mark.parametrize(
    ("cell", "value"), [("1.5", 1.5), (" -2e3 ", -2000.0), (".5", 0.5), ("7", 7.0)]
)
def test_a_csv_float_cell_reads_as_json_writes_it(cell, value):
    targets = TargetsConfig.model_validate({"label": {}, "extra": {"altitude": "float"}})
    assert target_rows.csv_row_targets({"altitude": cell}, targets) == {
        "extra": {"altitude": value}
    }


def test_a_kept_message_names_its_object_as_the_listing_does_now():
    # A record reused from a base build keeps its dropped objects' messages;
    # the same annotations may be elsewhere in this build's file.
    named = target_rows.ANNOTATION
    now = [{named: "annotations[7], id 3"}, {named: 'annotations[0], id "a) \\"b\\""'}, {}]
    tail = ": too little of its box is left"
    assert target_rows.renamed("objects[0] (annotations[2], id 3)" + tail, now) == (
        "objects[0] (annotations[7], id 3)" + tail
    )
    assert target_rows.renamed('objects[1] (annotations[4], id "a) \\"b\\"").bbox: x', now) == (
        'objects[1] (annotations[0], id "a) \\"b\\"").bbox: x'
    )
    assert target_rows.renamed("objects[1].bbox: x", now) == (
        'objects[1] (annotations[0], id "a) \\"b\\"").bbox: x'
    )
    # An object listed without a name, one the listing no longer has, no object.
    assert target_rows.renamed("objects[2] (annotations[9])" + tail, now) == "objects[2]" + tail
    assert target_rows.renamed("objects[3]" + tail, now) == "objects[3]" + tail
    assert target_rows.renamed("mask: wrong size", now) == "mask: wrong size"
    # What the objects mean leaves the names out, parsed or as text.
    assert target_rows.unnamed({"objects": [{"class": "a", named: "x"}], "mask": "m"}) == {
        "objects": [{"class": "a"}],
        "mask": "m",
    }
    objects = [
        {"bbox": [0, 0, 1, 1], "class": 'a "b"', "fields": {}, named: 'annotations[0], id "q\\"'},
        {"bbox": [1, 1, 2, 2], "class": "c", "fields": {"n": 1}},
        {"bbox": [2, 2, 3, 3], "class": "d", "fields": {}, named: "annotations[4], id 7"},
    ]
    for targets in ({"objects": objects, "mask": "m.png"}, {"objects": []}, {"labels": ["x"]}):
        text = target_rows.canonical(targets)
        assert target_rows.unnamed_text(text) == target_rows.canonical(target_rows.unnamed(targets))
    assert named not in target_rows.unnamed_text(target_rows.canonical({"objects": objects}))
