"""A declared class list keeps its order: a class's id is its place in
``source.classes`` as written, never its place in the sorted names. A
semantic mask's pixel values are ids written by whoever drew the masks, so a
list sorted behind the user's back would swap classes without a word. Real
builds read back with `kiln.reader`; a name listed twice is a config error."""

import json

import cv2
import numpy as np
import pytest
import yaml

import kiln.reader
from conftest import make_config
from kiln import cli
from kiln.pipeline import build

DECLARED = ["background", "road", "car"]  # the masks' ids: 0, 1, 2; not sorted
SIZE = 32


def street_scene(index: int) -> tuple[np.ndarray, np.ndarray]:
    """An image and its class mask: road (id 1) on the left half, a car
    (id 2, red) in a square that moves with `index`, background (0) else."""
    mask = np.zeros((SIZE, SIZE), np.uint8)
    mask[:, : SIZE // 2] = 1
    x = 4 + index % 8
    mask[8:20, x + 8 : x + 20] = 2
    image = np.zeros((SIZE, SIZE, 3), np.uint8)
    image[mask == 1] = (128, 128, 128)  # BGR
    image[mask == 2] = (0, 0, 255)
    return image, mask


@pytest.fixture
def street(tmp_path):
    rows = []
    for i in range(6):
        image, mask = street_scene(i)
        cv2.imwrite(str(tmp_path / f"scene{i}.png"), image)
        cv2.imwrite(str(tmp_path / f"scene{i}_mask.png"), mask)
        rows.append({"path": f"scene{i}.png", "mask": f"scene{i}_mask.png"})
    manifest = tmp_path / "scenes.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return manifest


def test_a_semantic_masks_ids_index_the_class_list_as_declared(street, tmp_path):
    config = make_config(
        tmp_path,
        source={"type": "manifest", "path": str(street), "classes": DECLARED},
        targets={"mask": {}},
        transforms=[],
        splits={"fractions": {"train": 1.0}},
        sharding={"num_shards": {"train": 1}},
        output=str(tmp_path / "out"),
    )
    result = build(config)

    assert list(result.info.class_names) == DECLARED
    info = kiln.reader.info(result.dataset_dir)
    assert list(info.class_names) == DECLARED
    dataset = kiln.reader.load(
        result.dataset_dir, "train", augment=None, shuffle=False, as_supervised=False
    )
    seen = 0
    for example in dataset:
        index = int(example["key"].numpy().decode()[len("scene") : -len(".png")])
        drawn = street_scene(index)[1]
        mask = example["mask"].numpy()[..., 0]
        # Where the masks' author drew a road (1), kiln's mask says "road"; a car (2): "car".
        assert {info.class_names[i] for i in np.unique(mask[drawn == 1])} == {"road"}
        assert {info.class_names[i] for i in np.unique(mask[drawn == 2])} == {"car"}
        seen += 1
    assert seen == 6
    assert dict(result.info.splits["train"].class_counts) == {"background": 6, "road": 6, "car": 6}


def test_a_declared_class_list_orders_the_labels_of_an_image_folder(demo_corpus, tmp_path):
    declared = ["triangle", "star", "circle", "square"]
    result = build(
        make_config(
            demo_corpus.out_dir,
            source={"type": "image_folder", "root": str(demo_corpus.out_dir), "classes": declared},
            transforms=[],
            splits={"fractions": {"train": 1.0}},
            sharding={"num_shards": {"train": 1}},
            output=str(tmp_path / "out"),
        )
    )

    assert list(result.info.class_names) == declared
    dataset = kiln.reader.load(
        result.dataset_dir, "train", augment=None, shuffle=False, as_supervised=False
    )
    for example in dataset:
        folder = example["key"].numpy().decode().split("/", 1)[0]
        assert declared[int(example["label"])] == folder


def test_a_class_listed_twice_is_a_config_error(tmp_path, capfd):
    for name in ("cat", "dog"):
        (tmp_path / "images" / name).mkdir(parents=True)
        cv2.imwrite(str(tmp_path / "images" / name / "a.png"), street_scene(0)[0])
    config = make_config(
        tmp_path,
        source={
            "type": "image_folder",
            "root": str(tmp_path / "images"),
            "classes": ["cat", "dog", "cat"],
        },
        output=str(tmp_path / "out"),
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))

    assert cli.main(["build", "--config", str(path)]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1
    assert "source.classes" in err and "'cat' is listed twice (item 0)" in err
    assert not (tmp_path / "out").exists()


@pytest.fixture
def numbered(tmp_path):
    """A CSV manifest of 12 images labelled 0 to 11."""
    lines = ["path,label"]
    for i in range(12):
        cv2.imwrite(str(tmp_path / f"digit{i}.png"), street_scene(i)[0])
        lines.append(f"digit{i}.png,{i}")
    manifest = tmp_path / "digits.csv"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


@pytest.mark.parametrize("declared", [False, True])
def test_numbered_classes_sorted_as_text_are_warned_about(numbered, tmp_path, caplog, declared):
    """Found, the names 0..11 sort as text (class 2 gets id 4), as in Keras:
    the build says so, naming the order that makes ids equal numbers.
    Declared in that order, each id is its number and nothing is said."""
    numeric = [str(i) for i in range(12)]
    source = {"type": "manifest", "path": str(numbered)}
    if declared:
        source["classes"] = numeric
    config = make_config(
        tmp_path,
        source=source,
        transforms=[],
        splits={"fractions": {"train": 1.0}},
        sharding={"num_shards": {"train": 1}},
        output=str(tmp_path / "out"),
    )
    caplog.set_level("WARNING", logger="kiln.pipeline.launcher")

    result = build(config)

    names = list(result.info.class_names)
    warned = "the class names are numbers, sorted as text (0, 1, 10, 11, 2," in caplog.text
    if declared:
        assert names == numeric and not warned
    else:
        assert names == sorted(numeric) and names.index("2") == 4
        assert warned and "declare source.classes in numeric order ([0, 1, 2, 3," in caplog.text
    dataset = kiln.reader.load(
        result.dataset_dir, "train", augment=None, shuffle=False, as_supervised=False
    )
    for example in dataset:
        number = example["key"].numpy().decode()[len("digit") : -len(".png")]
        assert names[int(example["label"])] == number
