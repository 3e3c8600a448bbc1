"""A COCO dataset from its official split files in one build (`source.parts`).

COCO, and the COCO exports of CVAT, Roboflow and detectron2's datasets, ship
one instances file per split with its own image folder
(``annotations/instances_train2017.json`` + ``train2017/``, ...). Small such
files are written here with a few PNGs and built on the DirectRunner into one
dataset with a split per part, read back, rebuilt incrementally and checked
as up to date.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import yaml

from kiln.errors import ConfigError
from kiln.pipeline import build
from kiln.pipeline.config import load as load_config
from targets_data import error_rows, records
from test_coco_build import write_png

HEIGHT, WIDTH = 32, 48
TARGETS = {"boxes": {"fields": {"iscrowd": "int"}}}


def write_part(folder, annotations_name, images_name, boxes, categories, extra=()):
    """An instances file `annotations/<annotations_name>` and its images in
    `<images_name>/`: image ``i`` is ``<i>.png`` with one object, its box
    ``boxes[i]`` (COCO's ``[x, y, width, height]``) of category ``1``."""
    images, annotations = [], []
    for index, box in enumerate(boxes):
        name = f"{index}.png"
        write_png(folder / images_name / name, np.full((HEIGHT, WIDTH, 3), 30 + index, np.uint8))
        images.append({"id": index + 1, "file_name": name, "width": WIDTH, "height": HEIGHT})
        annotations.append(
            {"id": 100 + index, "image_id": index + 1, "category_id": 1, "bbox": box}
        )
    document = {
        "images": images,
        "annotations": [*annotations, *extra],
        "categories": categories,
    }
    path = folder / "annotations" / annotations_name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return path


def coco_dataset(folder) -> None:
    """COCO's layout: train with person only, validation with dog (id 1 there) and person."""
    write_part(
        folder,
        "instances_train2017.json",
        "train2017",
        [[2, 3, 10, 8], [4, 4, 20, 12], [0, 0, 48, 32]],
        [{"id": 1, "name": "person"}],
    )
    write_part(
        folder,
        "instances_val2017.json",
        "val2017",
        [[6, 2, 12, 12], [1, 1, 5, 5]],
        [{"id": 1, "name": "dog"}, {"id": 2, "name": "person"}],
        # An annotation of an image the file does not declare.
        extra=[{"id": 900, "image_id": 77, "category_id": 2, "bbox": [0, 0, 2, 2]}],
    )


PARTS = [
    {
        "annotations": "data/annotations/instances_train2017.json",
        "images": "data/train2017",
        "split": "train",
    },
    {
        "annotations": "data/annotations/instances_val2017.json",
        "images": "data/val2017",
        "split": "validation",
    },
]


def write_config(tmp_path, parts=PARTS, **overrides) -> str:
    """A config file with paths relative to its folder, as a user writes it."""
    config = {
        "name": "coco",
        "source": {"type": "coco", "parts": parts},
        "splits": {"from_source": True},
        "output": "out",
        "encoding": {"format": "png"},
        "targets": TARGETS,
        "errors": {"max_fraction": 0.5},
        **overrides,
    }
    path = tmp_path / "coco.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def normalized(box, height=HEIGHT, width=WIDTH) -> list[float]:
    """A COCO box as the records store it: ``[y_min, x_min, y_max, x_max]``, normalized."""
    x, y, w, h = box
    return [y / height, x / width, (y + h) / height, (x + w) / width]


def test_two_parts_build_one_dataset_with_a_split_each(tmp_path):
    coco_dataset(tmp_path / "data")
    result = build(write_config(tmp_path))

    info = result.info
    # The union of the parts' categories, sorted: dog is only in the validation file.
    assert info.class_names == ["dog", "person"]
    assert sorted(info.splits) == ["train", "validation"]
    got = records(result)
    assert sorted(got) == [
        "train2017/0.png",
        "train2017/1.png",
        "train2017/2.png",
        "val2017/0.png",
        "val2017/1.png",
    ]
    np.testing.assert_allclose(got["train2017/1.png"]["boxes"], [normalized([4, 4, 20, 12])])
    assert got["train2017/1.png"]["classes"].tolist() == [1]  # person
    np.testing.assert_allclose(got["val2017/0.png"]["boxes"], [normalized([6, 2, 12, 12])])
    assert got["val2017/0.png"]["classes"].tolist() == [0]  # dog: category 1 of its own file
    by_split = {
        split: sorted(
            key for key in got if key.startswith("train2017/" if split == "train" else "val2017/")
        )
        for split in info.splits
    }
    assert {split: info.splits[split].num_examples for split in info.splits} == {
        split: len(keys) for split, keys in by_split.items()
    }
    # The dropped row names the part's file, in its key and its uri.
    dangling = error_rows(result)["instances_val2017.json:annotations[2]"]
    assert dangling["reason"] == "dangling_annotation"
    assert dangling["uri"] == str(tmp_path / "data" / "annotations" / "instances_val2017.json")

    from kiln.tools.inspection import inspect_dataset, render

    inspected = inspect_dataset(result.dataset_dir)
    data = tmp_path / "data"
    assert inspected["source"]["parts"] == [
        {
            "annotations": str(data / "annotations" / f"instances_{folder}.json"),
            "images": str(data / folder),
            "split": split,
        }
        for folder, split in (("train2017", "train"), ("val2017", "validation"))
    ]
    assert (
        f"source:    coco {data / 'annotations' / 'instances_train2017.json'} (images in "
        f"{data / 'train2017'}, split train), {data / 'annotations' / 'instances_val2017.json'} "
        f"(images in {data / 'val2017'}, split validation)"
    ) in render(inspected)


def test_a_missing_image_is_named_by_its_part(tmp_path):
    coco_dataset(tmp_path / "data")
    os.remove(tmp_path / "data" / "val2017" / "1.png")
    result = build(write_config(tmp_path))
    missing = error_rows(result)["val2017/1.png"]
    assert missing["reason"] == "missing"
    assert missing["message"].startswith("listed in instances_val2017.json but not found")


@pytest.mark.parametrize(
    "source, message",
    [
        (
            {"annotations": "data/annotations/instances_train2017.json", "images": "data/train"},
            "source: give either parts (one instances file per split) or annotations, images "
            "(one instances file), not both",
        ),
        (
            {"split": "train"},
            "source: give either parts (one instances file per split) or split",
        ),
    ],
)
def test_parts_and_a_single_file_together_stop_before_any_work(tmp_path, source, message):
    coco_dataset(tmp_path / "data")
    config = yaml.safe_load(open(write_config(tmp_path)))
    config["source"].update(source)
    (tmp_path / "coco.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(str(tmp_path / "coco.yaml"))
    assert not (tmp_path / "out").exists()


def test_neither_parts_nor_a_single_file_stops_before_any_work(tmp_path):
    config = yaml.safe_load(open(write_config(tmp_path)))
    del config["source"]["parts"]
    (tmp_path / "coco.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as raised:
        load_config(str(tmp_path / "coco.yaml"))
    assert (
        "source: a coco source needs annotations and images (one instances file), or parts "
        "(one instances file per split); annotations and images missing"
    ) in str(raised.value)


@pytest.mark.parametrize(
    "parts, message",
    [
        ([{"annotations": "a.json"}], "source.parts[0].images: required field is missing"),
        ([PARTS[0], {**PARTS[1], "split": "a-b"}], "source.parts[1].split: 'a-b' is not a valid"),
        ([], "source: parts lists no instances file; give one part per file"),
    ],
)
def test_a_broken_part_is_named_by_its_place(tmp_path, parts, message):
    with pytest.raises(ConfigError) as raised:
        load_config(write_config(tmp_path, parts))
    assert message in str(raised.value)


def test_a_part_path_that_is_not_found_is_named_with_where_it_was_looked_for(tmp_path):
    coco_dataset(tmp_path / "data")
    parts = [PARTS[0], {**PARTS[1], "images": "data/val"}]
    with pytest.raises(ConfigError) as raised:
        load_config(write_config(tmp_path, parts))
    assert (
        f"source.parts[1].images: folder not found or empty: {tmp_path / 'data' / 'val'} "
        f"(source.parts[1].images is 'data/val': relative paths in a config resolve against "
        f"the config file's folder"
    ) in str(raised.value)


def test_a_part_without_a_split_stops_the_build_with_splits_from_source(tmp_path):
    coco_dataset(tmp_path / "data")
    parts = [PARTS[0], {key: value for key, value in PARTS[1].items() if key != "split"}]
    with pytest.raises(ConfigError, match=r"source\.parts\[1\]\.split: splits\.from_source"):
        build(write_config(tmp_path, parts))
    assert os.listdir(tmp_path / "out" / "coco") == [".lock"]  # nothing built


def test_one_file_given_as_two_parts_stops_the_build(tmp_path):
    coco_dataset(tmp_path / "data")
    parts = [PARTS[0], {**PARTS[0], "split": "validation"}]
    with pytest.raises(ConfigError) as raised:
        build(write_config(tmp_path, parts))
    train = tmp_path / "data" / "annotations" / "instances_train2017.json"
    assert (
        f"source.parts[1].annotations: {train} is the file of source.parts[0] too; list each "
        f"instances file once"
    ) in str(raised.value)


def test_without_from_source_the_fractions_split_the_parts_images(tmp_path):
    coco_dataset(tmp_path / "data")
    result = build(write_config(tmp_path, splits={"fractions": {"train": 1.0}}))
    assert sorted(result.info.splits) == ["train"]
    assert len(records(result)) == 5


def test_a_file_two_parts_of_one_folder_list_with_other_splits_is_a_duplicate_key(tmp_path):
    data = tmp_path / "data"
    person = [{"id": 1, "name": "person"}]
    write_part(data, "train.json", "images", [[2, 3, 10, 8], [4, 4, 20, 12]], person)
    # The validation file lists 0.png too (and only it).
    write_part(data, "val.json", "images", [[2, 3, 10, 8]], person)
    parts = [
        {"annotations": "data/annotations/train.json", "images": "data/images", "split": "train"},
        {"annotations": "data/annotations/val.json", "images": "data/images", "split": "val"},
    ]
    result = build(write_config(tmp_path, parts))

    assert sorted(records(result)) == ["1.png"]  # keys relative to the shared folder
    duplicate = error_rows(result)["0.png"]
    assert duplicate["reason"] == "duplicate_key"
    assert duplicate["message"] == (
        "listed 2 times with different split (train.json:images[0], val.json:images[0])"
    )


def test_two_parts_listing_an_image_alike_under_other_annotation_ids_agree(tmp_path):
    # The job's messages name each object's annotation (its position and id
    # in its file); that is not what the image's targets say, so the two
    # listings of 0.png mean the same and it is built once.
    data = tmp_path / "data"
    person = [{"id": 1, "name": "person"}]
    write_part(data, "train.json", "images", [[2, 3, 10, 8], [4, 4, 20, 12]], person)
    more = write_part(data, "more.json", "images", [[2, 3, 10, 8]], person)
    document = json.loads(more.read_text())
    document["annotations"][0]["id"] = 700
    more.write_text(json.dumps(document))
    parts = [
        {"annotations": f"data/annotations/{name}", "images": "data/images", "split": "train"}
        for name in ("train.json", "more.json")
    ]
    result = build(write_config(tmp_path, parts))

    assert sorted(records(result)) == ["0.png", "1.png"]
    assert error_rows(result) == {}


def test_parts_whose_files_have_one_name_are_told_apart_by_their_folders(tmp_path):
    """Roboflow's export: ``train/_annotations.coco.json`` beside its images."""
    data = tmp_path / "data"
    person = [{"id": 1, "name": "person"}]
    dangling = [{"id": 900, "image_id": 77, "category_id": 1, "bbox": [0, 0, 2, 2]}]
    write_part(data / "train", "_annotations.coco.json", ".", [[2, 3, 10, 8]], person, dangling)
    write_part(data / "valid", "_annotations.coco.json", ".", [[2, 3, 10, 8]] * 2, person, dangling)
    os.remove(data / "valid" / "1.png")
    parts = [
        {
            "annotations": f"data/{split}/annotations/_annotations.coco.json",
            "images": f"data/{split}",
            "split": split,
        }
        for split in ("train", "valid")
    ]
    result = build(write_config(tmp_path, parts, errors={"max_fraction": 0.6}))

    assert sorted(records(result)) == ["train/0.png", "valid/0.png"]
    errors = error_rows(result)
    assert sorted(errors) == [
        "train/annotations/_annotations.coco.json:annotations[1]",
        "valid/1.png",
        "valid/annotations/_annotations.coco.json:annotations[2]",
    ]
    assert errors["valid/1.png"]["message"].startswith(
        "listed in valid/annotations/_annotations.coco.json but not found"
    )


def test_a_category_whose_keypoints_differ_between_parts_stops_the_build(tmp_path):
    data = tmp_path / "data"
    write_part(
        data,
        "instances_train2017.json",
        "train2017",
        [[2, 3, 10, 8]],
        [{"id": 1, "name": "person", "keypoints": ["nose", "left_eye"]}],
    )
    write_part(
        data,
        "instances_val2017.json",
        "val2017",
        [[2, 3, 10, 8]],
        [{"id": 1, "name": "person", "keypoints": ["nose", "right_eye"]}],
    )
    with pytest.raises(ConfigError) as raised:
        build(write_config(tmp_path))
    assert (
        "source.parts: category 'person' has the keypoints ['nose', 'left_eye'] in "
        "source.parts[0] (instances_train2017.json) and ['nose', 'right_eye'] in "
        "source.parts[1] (instances_val2017.json)"
    ) in str(raised.value)
    assert os.listdir(tmp_path / "out" / "coco") == [".lock"]  # nothing built


def test_an_edit_in_one_part_rebuilds_only_its_image_and_nothing_changed_is_up_to_date(
    tmp_path,
):
    coco_dataset(tmp_path / "data")
    config = write_config(tmp_path)
    base = build(config)

    again = build(config)
    assert again.up_to_date and again.version == base.version

    val = tmp_path / "data" / "annotations" / "instances_val2017.json"
    document = json.loads(val.read_text())
    document["annotations"][1]["bbox"] = [2, 1, 5, 5]  # val2017/1.png, one pixel to the right
    val.write_text(json.dumps(document))
    incremental = build(config)

    assert not incremental.up_to_date and incremental.version != base.version
    report = incremental.incremental
    assert report.used and report.base == base.version
    assert (report.processed, report.changed, report.reused) == (1, 1, 4)
    assert incremental.counters["images_decoded"] == 1
    np.testing.assert_allclose(
        records(incremental)["val2017/1.png"]["boxes"], [normalized([2, 1, 5, 5])]
    )


def test_an_image_outside_every_parts_folder_is_not_read(tmp_path):
    coco_dataset(tmp_path / "data")
    write_png(tmp_path / "data" / "secret" / "0.png", np.zeros((HEIGHT, WIDTH, 3), np.uint8))
    train = tmp_path / "data" / "annotations" / "instances_train2017.json"
    document = json.loads(train.read_text())
    document["images"][0]["file_name"] = "../secret/0.png"
    train.write_text(json.dumps(document))
    result = build(write_config(tmp_path))

    outside = error_rows(result)["secret/0.png"]
    assert outside["reason"] == "outside_source"
    data = tmp_path / "data"
    assert outside["message"] == (
        f"outside the source folder {data / 'train2017'} or {data / 'val2017'}; "
        f"list its folder in source.allowed_roots to read it"
    )


def test_keys_on_an_object_store_are_below_the_parts_common_prefix():
    from kiln.pipeline import sources

    folders = ["gs://bucket/coco/train2017", "gs://bucket/coco/val2017"]
    base = sources._common_folder(folders)
    assert base == "gs://bucket/coco"
    assert [sources._relative_folder(folder, base) for folder in folders] == [
        "train2017",
        "val2017",
    ]
    with pytest.raises(ConfigError, match="not in one bucket or file system"):
        sources._common_folder(["gs://one/train2017", "gs://two/val2017"])


def test_parts_on_an_object_store_build_as_local_ones(tmp_path):
    """``gs://`` paths through the in-memory ``memgs://`` store: the same code
    paths (keys below the common prefix, objects looked up by prefix)."""
    import object_store
    from conftest import put_folder

    coco_dataset(tmp_path / "data")
    local = build(write_config(tmp_path))
    bucket = f"{object_store.SCHEME}://bucket"
    object_store.reset()
    try:
        put_folder(tmp_path / "data", f"{bucket}/coco")
        parts = [
            {
                "annotations": f"{bucket}/coco/annotations/instances_{folder}.json",
                "images": f"{bucket}/coco/{folder}",
                "split": split,
            }
            for folder, split in (("train2017", "train"), ("val2017", "validation"))
        ]
        remote = build(write_config(tmp_path, parts, output=str(tmp_path / "remote")))
    finally:
        object_store.reset()

    assert sorted(records(remote)) == sorted(records(local))
    assert remote.version == local.version  # where the files are is not the dataset


def test_a_single_file_config_resolves_its_paths_against_its_folder_as_before(
    tmp_path, monkeypatch
):
    # Beside `parts`, a single file's annotations and images became optional
    # fields (`ConfigPath | None`); they must still resolve against the
    # config's folder, not the directory the build is started from.
    coco_dataset(tmp_path / "data")
    config = write_config(tmp_path)
    single = yaml.safe_load(open(config))
    single["source"] = {
        "type": "coco",
        "annotations": "data/annotations/instances_train2017.json",
        "images": "data/train2017",
        "split": "train",
    }
    (tmp_path / "coco.yaml").write_text(yaml.safe_dump(single))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    spec = load_config(config)
    assert spec.config.source.annotations == str(
        tmp_path / "data" / "annotations" / "instances_train2017.json"
    )
    assert spec.config.source.images == str(tmp_path / "data" / "train2017")
    result = build(config)
    assert sorted(records(result)) == ["0.png", "1.png", "2.png"]
