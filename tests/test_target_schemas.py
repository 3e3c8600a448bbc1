"""Record schemas of declared targets: shapes, encode -> parse/decode round trips, JSON.

Builds of such records are tested end to end in tests/test_targets_build.py;
here the schema alone: every target kind round-trips through `Schema.encode`,
`Schema.parse` (one record and a batch) and `Schema.decode`, and a schema
survives `to_json` -> `from_json`.
"""

import hashlib

import cv2
import numpy as np
import pydantic
import pytest
import tensorflow as tf

from kiln.schemas import (
    CLASSIFICATION,
    RECORD,
    DatasetInfo,
    Feature,
    Schema,
    SchemaError,
    TargetsConfig,
    decode_mask,
    decode_masks,
    schema_for,
)

EVERYTHING = TargetsConfig.model_validate(
    {
        "label": {},
        "labels": {},
        "boxes": {"min_visibility": 0.5, "fields": {"iscrowd": "int", "score": "float"}},
        "mask": {"ignore_value": 255},
        "instance_masks": {},
        "keypoints": {
            "names": ["nose", "left_eye", "right_eye"],
            "flip_pairs": [["left_eye", "right_eye"]],
        },
        "extra": {"weather": "string", "altitude": "float", "year": "int"},
    }
)


def png(mask: np.ndarray) -> bytes:
    ok, data = cv2.imencode(".png", mask)
    assert ok
    return data.tobytes()


def record(num_objects: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    height, width = 6, 8
    boxes = np.sort(rng.random((num_objects, 4)).astype(np.float32), axis=1)
    mask = rng.integers(0, 3, (height, width), dtype=np.uint8)
    instance = [
        png((rng.random((height, width)) > 0.5).astype(np.uint8)) for _ in range(num_objects)
    ]
    return {
        "image": b"\x89PNG...",
        "height": height,
        "width": width,
        "channels": 3,
        "label": 1,
        "key": f"images/{seed}.png",
        "sha256": hashlib.sha256(str(seed).encode()).hexdigest(),
        "labels": np.array([0, 2][: 1 + seed % 2], dtype=np.int64),
        "boxes": boxes,
        "classes": rng.integers(0, 3, num_objects),
        "iscrowd": rng.integers(0, 2, num_objects),
        "score": rng.random(num_objects).astype(np.float32),
        "keypoints": rng.random((num_objects, 3, 2)).astype(np.float32),
        "keypoint_visibility": rng.integers(0, 3, (num_objects, 3)),
        "mask": png(mask),
        "instance_masks": instance,
        "weather": "sunny",
        "altitude": 12.5,
        "year": 2024,
    }


def test_a_build_without_targets_keeps_the_record_schema():
    assert schema_for(None) is RECORD
    assert schema_for(CLASSIFICATION) is RECORD
    # The JSON kiln.json records for RECORD has no shapes: unchanged bytes.
    assert all("shape" not in f for f in RECORD.to_json()["features"])


def test_schema_for_declares_one_feature_per_target():
    schema = schema_for(EVERYTHING)
    shapes = {f.name: (f.key, f.dtype, f.shape) for f in schema.features}
    assert shapes["boxes"] == ("objects/bbox", "float32", (None, 4))
    assert shapes["classes"] == ("objects/label", "int64", (None,))
    assert shapes["iscrowd"] == ("objects/iscrowd", "int64", (None,))
    assert shapes["score"] == ("objects/score", "float32", (None,))
    assert shapes["keypoints"] == ("objects/keypoints", "float32", (None, 3, 2))
    assert shapes["keypoint_visibility"] == ("objects/keypoints/visibility", "int64", (None, 3))
    assert shapes["labels"] == ("image/class/labels", "int64", (None,))
    assert shapes["mask"] == ("segmentation/mask", "bytes", ())
    assert shapes["instance_masks"] == ("objects/mask", "bytes", (None,))
    assert shapes["weather"] == ("extra/weather", "bytes", ())
    assert shapes["altitude"] == ("extra/altitude", "float32", ())
    assert shapes["year"] == ("extra/year", "int64", ())
    boxes_only = schema_for(TargetsConfig.model_validate({"boxes": {}}))
    assert "label" not in boxes_only.names
    assert boxes_only.names[:4] == ("image", "height", "width", "channels")


@pytest.mark.parametrize("num_objects", [0, 1, 3])
def test_every_target_round_trips_through_decode_and_parse(num_objects):
    schema = schema_for(EVERYTHING)
    original = record(num_objects, seed=num_objects)
    serialized = schema.encode(original)
    assert schema.encode(original) == serialized  # deterministic

    decoded = schema.decode(serialized)
    parsed = {name: value.numpy() for name, value in schema.parse(tf.constant(serialized)).items()}
    for result in (decoded, parsed):
        np.testing.assert_array_equal(result["boxes"], original["boxes"])
        assert np.asarray(result["boxes"]).shape == (num_objects, 4)
        np.testing.assert_array_equal(result["classes"], original["classes"])
        np.testing.assert_array_equal(result["iscrowd"], original["iscrowd"])
        np.testing.assert_array_equal(result["score"], original["score"])
        np.testing.assert_array_equal(result["keypoints"], original["keypoints"])
        assert np.asarray(result["keypoints"]).shape == (num_objects, 3, 2)
        np.testing.assert_array_equal(
            result["keypoint_visibility"], original["keypoint_visibility"]
        )
        np.testing.assert_array_equal(result["labels"], original["labels"])
        assert list(result["instance_masks"]) == original["instance_masks"]
        assert result["mask"] == original["mask"]
        assert result["year"] == 2024 and result["altitude"] == 12.5
    assert decoded["weather"] == b"sunny"
    mask = decode_mask(tf.constant(decoded["mask"])).numpy()
    assert mask.shape == (6, 8) and mask.dtype == np.uint8
    np.testing.assert_array_equal(mask, cv2.imdecode(np.frombuffer(original["mask"], np.uint8), 0))
    if num_objects:
        masks = decode_masks(tf.constant(decoded["instance_masks"])).numpy()
        assert masks.shape == (num_objects, 6, 8) and set(np.unique(masks)) <= {0, 1}


def test_decode_masks_of_a_record_without_objects_is_empty():
    """An image without objects (common in detection data) stores no
    instance mask: `decode_masks` gives ``[0, 0, 0]``, eagerly and in
    tf.data, as it gives ``[N, H, W]`` for the others."""
    schema = schema_for(EVERYTHING)
    serialized = [schema.encode(record(n, seed=n)) for n in (0, 3)]
    empty = decode_masks(schema.parse(tf.constant(serialized[0]))["instance_masks"])
    assert empty.shape == (0, 0, 0) and empty.dtype == tf.uint8
    dataset = tf.data.Dataset.from_tensor_slices(serialized).map(
        lambda one: decode_masks(schema.parse(one)["instance_masks"])
    )
    assert [tuple(masks.shape) for masks in dataset] == [(0, 0, 0), (3, 6, 8)]


def test_a_batch_parses_to_ragged_tensors_of_the_item_shape():
    schema = schema_for(EVERYTHING)
    records = [record(n, seed=n) for n in (2, 0, 3)]
    parsed = schema.parse(tf.constant([schema.encode(r) for r in records]))
    boxes = parsed["boxes"]
    assert isinstance(boxes, tf.RaggedTensor)
    assert boxes.shape.as_list() == [3, None, 4]
    assert boxes.row_lengths().numpy().tolist() == [2, 0, 3]
    keypoints = parsed["keypoints"]
    assert keypoints.shape.as_list() == [3, None, 3, 2]
    for i, r in enumerate(records):
        np.testing.assert_array_equal(boxes[i].numpy(), r["boxes"])
        np.testing.assert_array_equal(keypoints[i].numpy(), r["keypoints"])
        np.testing.assert_array_equal(parsed["classes"][i].numpy(), r["classes"])


def test_schema_json_round_trips():
    schema = schema_for(EVERYTHING)
    assert Schema.from_json(schema.to_json()) == schema
    assert Schema.from_json(RECORD.to_json()) == RECORD
    with pytest.raises(SchemaError, match="not a record schema"):
        Schema.from_json({"features": [{"name": "x"}]})


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("boxes", np.zeros((2, 3), np.float32), r"expected shape \[N, 4\], got \[2, 3\]"),
        ("classes", np.array([0.5]), "expected integers"),
        ("instance_masks", b"one", "expected a list of bytes"),
        ("keypoints", np.zeros((1, 2, 2)), r"expected shape \[N, 3, 2\]"),
    ],
)
def test_encoding_names_the_field_of_a_wrong_shape_or_type(name, value, message):
    schema = schema_for(EVERYTHING)
    bad = {**record(2), name: value}
    with pytest.raises(SchemaError, match=message):
        schema.encode(bad)


def test_feature_shapes_are_checked():
    with pytest.raises(ValueError, match="shape must be"):
        Feature("x", "x", "float32", "", (4,))
    with pytest.raises(ValueError, match="bytes feature"):
        Feature("x", "x", "bytes", "", (None, 2))


@pytest.mark.parametrize(
    "targets, message",
    [
        ({"keypoints": {"names": ["a"]}, "mask": {}}, "keypoints needs boxes"),
        ({"instance_masks": {}, "label": {}}, "instance_masks needs boxes"),
        ({"extra": {"x": "int"}}, "declare at least one of"),
        ({"label": {}, "extra": {"path": "string"}}, "'path' is a reserved name"),
        ({"boxes": {"fields": {"classes": "int"}}}, "'classes' is a reserved name"),
        ({"boxes": {"fields": {"bbox": "int"}}}, "'bbox' is a reserved name"),
        (
            {"boxes": {}, "keypoints": {"names": ["a", "b"], "flip_pairs": [["a", "c"]]}},
            "'c' is not one of",
        ),
        ({"boxes": {"min_visibility": 1.5}}, "less than or equal to 1"),
        ({"label": {}, "extra": {"x": "date"}}, "'int', 'float' or 'string'"),
    ],
)
def test_targets_validation_names_the_problem(targets, message):
    with pytest.raises(pydantic.ValidationError, match=message):
        TargetsConfig.model_validate(targets)


def test_one_pair_written_without_its_brackets_is_one_problem_with_the_fix():
    keypoints = {"names": ["left", "right"], "flip_pairs": ["left", "right"]}
    with pytest.raises(pydantic.ValidationError) as raised:
        TargetsConfig.model_validate({"boxes": {}, "keypoints": keypoints})
    (error,) = raised.value.errors()  # not one "expected a tuple" per name
    assert error["loc"] == ("keypoints", "flip_pairs")
    assert error["msg"].endswith(
        "a list of [left, right] pairs, got [left, right]; did you mean [[left, right]]?"
    )


def test_dataset_info_leaves_absent_targets_out_of_kiln_json():
    info = DatasetInfo(
        name="d",
        version="v",
        kiln_version="0",
        format_version=2,
        config={},
        config_fingerprint="f",
        schema=RECORD.to_json(),
        class_names=["a"],
        encoding={"format": "png", "quality": None},
        channels=3,
        image_size=None,
        compression=None,
        splits={},
    )
    assert "targets" not in info.to_json() and "objects" not in info.to_json()
    assert info.targets_config == CLASSIFICATION
    with_targets = DatasetInfo.loads(
        DatasetInfo(**{**info.__dict__, "targets": EVERYTHING.to_json()}).dumps()
    )
    assert with_targets.targets_config == EVERYTHING


def test_flip_pairs_are_stored_in_one_order():
    """Pairs swap, so neither their order nor the order within each is part of
    the config: both follow ``names``, and one dataset has one fingerprint."""
    names = ["nose", "left_eye", "right_eye", "left_ear", "right_ear"]
    stored = [
        TargetsConfig.model_validate(
            {"boxes": {}, "keypoints": {"names": names, "flip_pairs": pairs}}
        ).model_dump(mode="json")["keypoints"]["flip_pairs"]
        for pairs in (
            [["left_eye", "right_eye"], ["left_ear", "right_ear"]],
            [["right_ear", "left_ear"], ["right_eye", "left_eye"]],
        )
    ]
    assert stored == [[["left_eye", "right_eye"], ["left_ear", "right_ear"]]] * 2
