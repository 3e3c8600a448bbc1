"""Schema round trips (encode -> serialize -> parse with the derived spec -> decode), metadata."""

import hashlib
import json

import numpy as np
import pytest
import tensorflow as tf

from kiln import schemas
from kiln.schemas import RECORD, DatasetInfo, MetadataError, SchemaError
from kiln.transforms import encode_image

RNG = np.random.default_rng(3)
_y, _x = np.mgrid[0:12, 0:20]
SMOOTH = np.stack([40 + _x * 4, 60 + _y * 6, 200 - _x * 3], axis=-1).clip(0, 255).astype(np.uint8)
NOISE = RNG.integers(0, 256, (12, 20, 3), dtype=np.uint8)


def make_record(image, encoding, label=2, key="circle/circle_0001.png"):
    encoded = encode_image(image, format=encoding)
    return {
        "image": encoded,
        "height": image.shape[0],
        "width": image.shape[1],
        "channels": image.shape[2],
        "label": label,
        "key": key,
        "sha256": hashlib.sha256(encoded).hexdigest(),
    }


CASES = [
    ("png", NOISE, 0),
    ("png", NOISE[:, :, :1], 0),
    ("raw", NOISE, 0),
    ("raw", NOISE[:, :, 2:], 0),
    # JPEG 4:2:0 at quality 95 on a 12x20 image: small errors where chroma
    # blocks meet the border; a swapped channel or wrong shape is off by 100+.
    ("jpeg", SMOOTH, 12),
    ("jpeg", SMOOTH[:, :, :1], 12),
]
CASE_IDS = ["png-rgb", "png-gray", "raw-rgb", "raw-gray", "jpeg-rgb", "jpeg-gray"]


def assert_pixels_close(decoded, image, tolerance):
    assert decoded.shape == image.shape and decoded.dtype == np.uint8
    assert np.abs(decoded.astype(int) - image.astype(int)).max() <= tolerance


@pytest.mark.parametrize("encoding, image, tolerance", CASES, ids=CASE_IDS)
def test_batch_round_trip_with_parse_example(encoding, image, tolerance):
    images = [image, np.ascontiguousarray(image[::-1]), np.ascontiguousarray(image[:, ::-1])]
    records = [make_record(im, encoding, label=i, key=f"k/{i}") for i, im in enumerate(images)]
    serialized = tf.constant([RECORD.encode(r) for r in records])

    parsed = RECORD.parse(serialized)  # vector in: tf.io.parse_example
    assert set(parsed) == set(RECORD.names)
    np.testing.assert_array_equal(parsed["label"].numpy(), [0, 1, 2])
    assert [k.decode() for k in parsed["key"].numpy()] == ["k/0", "k/1", "k/2"]
    assert [s.decode() for s in parsed["sha256"].numpy()] == [r["sha256"] for r in records]
    for index, original in enumerate(images):
        decoded = schemas.decode_image(
            parsed["image"][index],
            parsed["height"][index],
            parsed["width"][index],
            image.shape[2],
            encoding,
        )
        assert_pixels_close(decoded.numpy(), original, tolerance)


@pytest.mark.parametrize("encoding, image, tolerance", CASES, ids=CASE_IDS)
def test_single_round_trip_in_a_tf_data_graph(encoding, image, tolerance):
    record = make_record(image, encoding, label=5)
    channels = image.shape[2]

    def parse_and_decode(serialized):  # traced once: graph mode, like the reader
        parsed = RECORD.parse(serialized)  # scalar in: tf.io.parse_single_example
        pixels = schemas.decode_image(
            parsed["image"], parsed["height"], parsed["width"], channels, encoding
        )
        return pixels, parsed["label"], parsed["channels"]

    dataset = tf.data.Dataset.from_tensor_slices([RECORD.encode(record)]).map(parse_and_decode)
    assert dataset.element_spec[0].shape.as_list() == [None, None, channels]
    ((pixels, label, stored_channels),) = list(dataset.as_numpy_iterator())
    assert_pixels_close(pixels, image, tolerance)
    assert label == 5 and stored_channels == channels


def test_python_decode_returns_every_field():
    record = make_record(NOISE, "png")
    assert RECORD.decode(RECORD.encode(record)) == {
        **record,
        "key": record["key"].encode(),
        "sha256": record["sha256"].encode(),
    }


def test_encoding_is_deterministic_and_independent_of_field_order():
    record = make_record(NOISE, "png")
    reversed_record = dict(reversed(list(record.items())))
    assert RECORD.encode(record) == RECORD.encode(dict(record)) == RECORD.encode(reversed_record)


def test_parse_spec_derives_from_the_declaration():
    spec = RECORD.parse_spec()
    assert list(spec) == [RECORD.key(name) for name in RECORD.names]
    assert spec[RECORD.key("image")].dtype == tf.string
    assert spec[RECORD.key("label")].dtype == tf.int64
    assert {f["name"] for f in RECORD.to_json()["features"]} == set(RECORD.names)


# --- invalid input ------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r.pop("label"), r"field 'label' .* is missing"),
        (lambda r: r.update(label="3"), r"field 'label' .*expected an integer, got str"),
        (lambda r: r.update(height=True), r"field 'height' .*expected an integer, got bool"),
        (lambda r: r.update(image=123), r"field 'image' .*expected bytes or str, got int"),
        (lambda r: r.update(colour="red"), r"unknown field\(s\) \['colour'\]"),
    ],
)
def test_invalid_records_raise_schema_error_naming_the_field(change, message):
    record = make_record(NOISE, "raw")
    change(record)
    with pytest.raises(SchemaError, match=message):
        RECORD.encode(record)


def example_with(features):
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def test_python_decode_of_a_bad_record_names_the_field():
    good = tf.train.Example.FromString(RECORD.encode(make_record(NOISE, "raw")))
    features = dict(good.features.feature)

    missing = {k: v for k, v in features.items() if k != RECORD.key("width")}
    with pytest.raises(SchemaError, match=r"field 'width' .* is missing"):
        RECORD.decode(example_with(missing))

    wrong_kind = dict(features)
    wrong_kind[RECORD.key("label")] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"2"]))
    with pytest.raises(SchemaError, match=r"field 'label' .*expected int64_list, found bytes_list"):
        RECORD.decode(example_with(wrong_kind))

    two_values = dict(features)
    two_values[RECORD.key("label")] = tf.train.Feature(int64_list=tf.train.Int64List(value=[1, 2]))
    with pytest.raises(SchemaError, match=r"field 'label' .*expected one value, found 2"):
        RECORD.decode(example_with(two_values))


def test_decode_image_refuses_an_unknown_encoding():
    with pytest.raises(ValueError, match="unknown encoding 'webp'"):
        schemas.decode_image(
            tf.constant(b""), tf.constant(1, tf.int64), tf.constant(1, tf.int64), 3, "webp"
        )


# --- kiln.json -----------------------------------------------------------------------


def make_info():
    shards = [
        schemas.ShardInfo(
            schemas.shard_filename("shapes", "train", i, 2), 10 + i, 1000 + i, f"{i:064x}"
        )
        for i in range(2)
    ]
    return DatasetInfo(
        name="shapes",
        version="v-abc123",
        kiln_version="0.1.0",
        format_version=1,
        config={"name": "shapes", "transforms": [{"resize": {"shorter_side": 72}}]},
        config_fingerprint="f" * 64,
        schema=RECORD.to_json(),
        class_names=["circle", "square", "triangle"],
        encoding={"format": "png", "quality": None},
        channels=3,
        image_size=[64, 64],
        compression=None,
        splits={
            "train": schemas.SplitInfo(
                "train",
                21,
                shards,
                {"circle": 7, "square": 7, "triangle": 7},
                schemas.ChannelStatistics(21 * 64 * 64, [1.5, 2.5, 3.5], [0.5, 0.25, 0.125]),
            ),
            "test": schemas.SplitInfo("test", 0, [], {}),
        },
        augment=[{"random_flip_left_right": {}}],
        duplicates=2,
        dropped={"corrupt": 1},
    )


def test_dataset_info_round_trips_through_json():
    info = make_info()
    text = info.dumps()
    restored = DatasetInfo.loads(text)
    assert restored == info
    assert restored.dumps() == text  # canonical: same info, same bytes
    assert restored.split("train").filenames == [
        "shapes-train.tfrecord-00000-of-00002",
        "shapes-train.tfrecord-00001-of-00002",
    ]
    assert restored.num_classes == 3
    assert json.loads(text)["schema"] == RECORD.to_json()


def test_shard_filename_with_gzip():
    assert (
        schemas.shard_filename("x", "validation", 3, 12, "gzip")
        == "x-validation.tfrecord-00003-of-00012.gz"
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda text: text[:-20], r"^meta/kiln\.json: not valid JSON"),
        (lambda text: "[1, 2]", r"^meta/kiln\.json: expected a JSON object"),
        (
            lambda text: _edit(text, lambda d: d.pop("class_names")),
            r"missing field\(s\) \['class_names'\]",
        ),
        (lambda text: _edit(text, lambda d: d.pop("splits")), r"malformed metadata .*'splits'"),
        (
            lambda text: _edit(text, lambda d: d["splits"]["train"].update(num_examples="many")),
            r"malformed metadata \(ValueError: .*'many'",
        ),
        (
            lambda text: _edit(text, lambda d: d["splits"]["train"]["shards"][0].pop("sha256")),
            r"malformed metadata \(TypeError: .*sha256",
        ),
    ],
)
def test_malformed_metadata_raises_metadata_error_naming_the_problem(change, message):
    with pytest.raises(MetadataError, match=message):
        DatasetInfo.loads(change(make_info().dumps()), source="meta/kiln.json")


def _edit(text, mutate):
    data = json.loads(text)
    mutate(data)
    return json.dumps(data)


def test_unknown_split_lists_the_known_ones():
    with pytest.raises(
        MetadataError, match=r"has no split 'validation'; it has \['test', 'train'\]"
    ):
        make_info().split("validation")


@pytest.mark.parametrize("name, closest", [("training", "train"), ("testing", "test")])
def test_unknown_split_offers_the_closest(name, closest):
    """Keras' subset names ("training") miss kiln's split names by a suffix."""
    with pytest.raises(MetadataError) as error:
        make_info().split(name)
    assert str(error.value) == (
        f"dataset 'shapes' has no split {name!r}; it has ['test', 'train']; "
        f"did you mean {closest!r}?"
    )


CANONICAL_SAMPLES = [
    {"key": "part0/img_000123.jpg", "label": 3},
    ["file", "a/b.jpg", "cat", None, "a" * 64],
    {"z": [1, 2.5, -0.0, True, False, None], "a": {"é": 'naïve "quoted"\n', "b": (1, 2)}},
    "just a string with \u2028 and \x00",
    12345678901234567890,
    {"nested": [{"y": 1, "x": [{}, []]}], "float": 1e-300, "big": 1.5e300},
]


@pytest.mark.parametrize("data", CANONICAL_SAMPLES)
def test_canonical_json_is_the_text_json_dumps_gives(data):
    from kiln.schemas.metadata import canonical_json

    expected = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_json(data) == expected


def test_canonical_json_builds_no_encoder_per_call(monkeypatch):
    # The build hashes a few small entries per file: constructing an encoder
    # per call (what json.dumps does with these options) was half the cost.
    from kiln.schemas.metadata import canonical_json

    built = []
    original = json.JSONEncoder.__init__

    def counting(self, *args, **kwargs):
        built.append(kwargs)
        original(self, *args, **kwargs)

    monkeypatch.setattr(json.JSONEncoder, "__init__", counting)
    for data in CANONICAL_SAMPLES:
        canonical_json(data)
    assert built == []
