"""Config mistakes found before any work, from a new user's review: a misspelt
split in ``sharding.num_shards``, YAML 1.2 numbers (``1e-9``), transforms that
make images larger than kiln handles, a COCO file given as a manifest; and from
a later review: a semantic mask without its class list, COCO keypoint names and
image folder classes that name nothing (misspelt keys and values: test_build_config).

Each is one line naming the key and what is wrong; the builds are real
(`kiln.cli.main`, the DirectRunner) on small copies of the demo corpus.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
import yaml

from conftest import make_config
from kiln import cli
from kiln.errors import ConfigError
from kiln.pipeline import build, config, demo_targets
from kiln.pipeline.sources import ImageFolderSource


def write_config(tmp_path, data, name="config.yaml") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return str(path)


def refused(capsys, path) -> str:
    """`kiln build`'s one line of stderr for a config it refuses (exit 2)."""
    assert cli.main(["build", "--config", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.strip()


# --- sharding.num_shards names a split the build does not have ----------------------


def test_a_misspelt_split_in_num_shards_is_a_config_error(demo_corpus, tmp_path, capsys):
    data = make_config(
        demo_corpus.out_dir,
        output=str(tmp_path / "out"),
        splits={"fractions": {"train": 1}},
        sharding={"num_shards": {"tran": 2}},
    )
    path = write_config(tmp_path, data)
    assert refused(capsys, path) == (
        f"kiln build: error: config error in {path}: sharding.num_shards.tran: not a split of this "
        f"build; did you mean 'train'? (splits.fractions names train)"
    )
    assert not (tmp_path / "out").exists()


def test_every_unknown_split_is_named_and_default_splits_are_known(demo_corpus, tmp_path):
    three = make_config(
        demo_corpus.out_dir,
        output=str(tmp_path / "out"),
        sharding={"num_shards": {"train": 3, "valdation": 1, "test": 1, "holdout": 2}},
    )
    with pytest.raises(ConfigError) as raised:
        config.load(three)
    assert str(raised.value) == (
        "config error in config: 2 problems:\n"
        "  sharding.num_shards.valdation: not a split of this build; did you mean "
        "'validation'? (splits.fractions names test, train, validation)\n"
        "  sharding.num_shards.holdout: not a split of this build (splits.fractions names "
        "test, train, validation)"
    )
    # Without splits.fractions every image is in train: that is a known split list too.
    default = make_config(
        demo_corpus.out_dir, output=str(tmp_path / "out"), sharding={"num_shards": {"test": 2}}
    )
    del default["splits"]
    with pytest.raises(ConfigError) as raised:
        config.load(default)
    assert str(raised.value) == (
        "config error in config: sharding.num_shards.test: not a split of this build "
        "(without splits.fractions every image is in train)"
    )
    default["sharding"] = {"num_shards": {"train": 2}}
    assert config.load(default).config.sharding.num_shards == {"train": 2}


def test_a_count_for_no_split_of_the_source_warns_after_listing(demo_corpus, tmp_path, caplog):
    """With ``splits.from_source`` the names are known once listed: the build
    goes on (as before) and says which count matched no split."""
    files = sorted(
        f"{name}/{file}"
        for name in os.listdir(demo_corpus.out_dir)
        for file in os.listdir(os.path.join(demo_corpus.out_dir, name))
        if not file.startswith("broken")
    )[:12]
    for index, key in enumerate(files):
        destination = tmp_path / "by_split" / ("val" if index % 4 == 0 else "train") / key
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(demo_corpus.out_dir, key), destination)
    data = make_config(
        str(tmp_path / "by_split"),
        output=str(tmp_path / "out"),
        splits={"from_source": True},
        sharding={"num_shards": {"trian": 2, "val": 1}},
    )
    with caplog.at_level(logging.WARNING, logger="kiln.pipeline.launcher"):
        result = build(data)
    assert sorted(result.info.splits) == ["train", "val"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        "sharding.num_shards.trian: the source has no split 'trian'; did you mean 'train'? "
        "(its splits: train, val); that count is not used"
    ) in warnings
    assert not any("num_shards.val" in warning for warning in warnings)


# --- YAML 1.2 floats ---------------------------------------------------------------


@pytest.mark.parametrize(
    "written, read",
    [
        ("1e-9", 1e-9),
        ("1E12", 1e12),
        ("-2.5e+3", -2500.0),
        ("1.5e2", 150.0),
        ("64", 64),
    ],
)
def test_yaml_12_floats_in_a_config_file_are_numbers(demo_corpus, tmp_path, written, read):
    data = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    text = yaml.safe_dump({k: v for k, v in data.items() if k != "sharding"}, sort_keys=False)
    path = write_config(tmp_path, text + f"sharding:\n  target_shard_mb: {written}\n")
    if read > 0:
        spec = config.load(path)
        assert spec.config.sharding.target_shard_mb == read
        assert type(spec.config.sharding.target_shard_mb) is float
    else:
        with pytest.raises(ConfigError) as raised:
            config.load(path)
        assert str(raised.value).endswith("sharding.target_shard_mb: must be > 0.0, got -2500.0")


def test_ints_stay_ints_and_words_like_numbers_stay_strings(demo_corpus, tmp_path):
    data = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    data.pop("splits")
    data.pop("sharding")
    text = yaml.safe_dump(data, sort_keys=False)
    for salt in ("1e", "e5", "1e5x", "0x1e"):
        path = write_config(
            tmp_path,
            text
            + f"splits: {{fractions: {{train: 1}}, salt: {salt}}}\n"
            + "image: {max_pixels: 1000000, min_size: 1}\n",
        )
        if salt == "0x1e":  # a YAML integer, as before: the salt is a string
            with pytest.raises(ConfigError, match=r"splits.salt: expected a string, got 30$"):
                config.load(path)
            continue
        spec = config.load(path)
        assert spec.config.splits.salt == salt
        assert spec.config.image.max_pixels == 1_000_000


# --- transforms that make images larger than kiln handles ----------------------------


@pytest.mark.parametrize(
    "changes, message",
    [
        # The review's case: 28 GiB allocated for every file before it is dropped.
        (
            {"transforms": [{"pad": {"size": 100000}}]},
            "transforms[0].pad.size: makes 100000x100000 (HxW) images, more pixels than "
            "image.max_pixels (89478485) allows an image; make them smaller, or raise "
            "image.max_pixels",
        ),
        (
            {
                "transforms": [{"resize": {"shorter_side": 32}}, {"letterbox": {"size": 64}}],
                "image": {"max_pixels": 4000},
            },
            "transforms[1].letterbox.size: makes 64x64 (HxW) images, more pixels than "
            "image.max_pixels (4000) allows an image",
        ),
        (
            {"transforms": [{"resize": {"shorter_side": 20000}}, {"resize": {"size": 64}}]},
            "transforms[0].resize.shorter_side: makes images of at least 20000x20000 pixels, "
            "more pixels than image.max_pixels (89478485)",
        ),
        (
            {
                "transforms": [{"resize": {"size": [16, 70000]}}, "equalize"],
                "encoding": {"format": "jpeg"},
            },
            "transforms[0].resize.size: makes 16x70000 (HxW) images, longer than the 65500 "
            "pixels per side that encoding.format jpeg stores (every file would be dropped); "
            "make them smaller, or store png (up to 1000000) or raw",
        ),
        (
            {"transforms": [{"resize": {"longer_side": 1000001}}], "encoding": {"format": "png"}},
            "transforms[0].resize.longer_side: makes images 1000001 pixels long, longer than "
            "the 1000000 pixels per side that encoding.format png stores (every file would be "
            "dropped); make them smaller, or store raw",
        ),
        # A pad to a size makes that size: a crop larger than it fits no image.
        (
            {"transforms": [{"pad": {"size": 48}}, {"center_crop": {"size": 64}}]},
            "transforms[1].center_crop: a 64x64 (HxW) crop fits none of the 48x48 (HxW) "
            "images that transforms[0].pad makes",
        ),
    ],
    ids=["pad", "letterbox", "shorter_side", "jpeg_side", "png_side", "crop_after_pad"],
)
def test_transforms_making_too_large_images_are_refused(demo_corpus, tmp_path, changes, message):
    data = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"), **changes)
    path = write_config(tmp_path, data)
    with pytest.raises(ConfigError) as raised:
        config.load(path)
    assert str(raised.value).startswith(f"config error in {path}: {message}"), raised.value
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "changes",
    [
        # The size depends on the input: not refused.
        {"transforms": [{"pad": {"to_square": True}}], "image": {"max_pixels": 4000}},
        {"transforms": [{"resize": {"longer_side": 3000}}], "image": {"max_pixels": 4000}},
        # Larger than jpeg stores, but resized after: only the stored size counts for that.
        {
            "transforms": [{"resize": {"size": [8, 70000]}}, {"resize": {"size": 32}}],
            "encoding": {"format": "jpeg"},
        },
        # raw pixels have no per-side limit.
        {"transforms": [{"resize": {"size": [1, 70000]}}], "encoding": {"format": "raw"}},
    ],
    ids=["to_square", "longer_side_pixels", "resized_after", "raw"],
)
def test_sizes_that_depend_on_the_input_or_fit_are_accepted(demo_corpus, tmp_path, changes):
    data = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"), **changes)
    config.load(write_config(tmp_path, data))


def test_kiln_build_refuses_a_pad_beyond_max_pixels_before_reading_a_file(
    demo_corpus, tmp_path, capsys
):
    # Small numbers: the same mistake, harmless if it were built.
    data = make_config(
        demo_corpus.out_dir,
        output=str(tmp_path / "out"),
        image={"max_pixels": 40000},
        transforms=[{"resize": {"longer_side": 150}}, {"pad": {"size": 250}}],
    )
    path = write_config(tmp_path, data)
    assert refused(capsys, path) == (
        f"kiln build: error: config error in {path}: transforms[1].pad.size: makes 250x250 (HxW) "
        f"images, more pixels than image.max_pixels (40000) allows an image; make them "
        f"smaller, or raise image.max_pixels"
    )
    assert not (tmp_path / "out").exists()


# --- a COCO instances file given as a manifest -----------------------------------------


def test_a_coco_file_given_as_a_manifest_says_to_use_the_coco_source(tmp_path, capsys):
    demo_targets.generate(tmp_path / "demo", num_images=3, seed=0)
    instances = str(tmp_path / "demo" / demo_targets.COCO)
    data = {
        "name": "scenes",
        "source": {"type": "manifest", "path": instances},
        "output": str(tmp_path / "out"),
        "targets": {"boxes": {}},
    }
    path = write_config(tmp_path, data)
    with open(instances, encoding="utf-8") as f:
        lines = sum(1 for _ in f)
    line = refused(capsys, path)
    assert line.startswith(
        f"kiln build: error: config error in {path}: source.path: {instances}: no usable input "
        f"image ({lines} dropped while listing, e.g. instances.json:1: "
    ), line
    assert line.endswith(
        "; it looks like a COCO instances file: use source.type: coco, with annotations: "
        "(this file) and images: (the images' folder), see docs/detection-sources.md"
    ), line


def test_a_broken_jsonl_manifest_gets_no_coco_hint(tmp_path, capsys):
    # JSONL rows without a path.
    manifest = tmp_path / "rows.json"
    manifest.write_text(
        "".join(json.dumps({"file": f"{i}.png", "label": "cat"}) + "\n" for i in range(3))
    )
    # An images array, but in a list: not a COCO file.
    other = tmp_path / "other.json"
    other.write_text('[{"images": [1]}]\n')
    for path in (manifest, other):
        data = {
            "name": "rows",
            "source": {"type": "manifest", "path": str(path)},
            "output": str(tmp_path / "out"),
        }
        line = refused(capsys, write_config(tmp_path, data))
        assert "no usable input image" in line and "COCO" not in line, line


# --- a semantic mask whose class list would be made from the rows' names ----------------

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def demo_detection(tmp_path, **changes) -> dict:
    """configs/demo-detection.yaml on a small `kiln demo-data --targets` corpus."""
    demo_targets.generate(tmp_path / "demo", num_images=3, seed=0)
    with open(os.path.join(TOP, "configs", "demo-detection.yaml"), encoding="utf-8") as f:
        data = yaml.safe_load(f)
    data["source"]["path"] = str(tmp_path / "demo" / demo_targets.MANIFEST)
    data["output"] = str(tmp_path / "out")
    data.update(changes)
    return data


def test_a_semantic_mask_without_source_classes_is_refused(tmp_path, capsys):
    """Without `classes:`, the demo's class list was its rows' names sorted,
    [circle, square, star, triangle], and its masks' background (0) was
    stored as circle: the build succeeded with every mask mislabelled."""
    data = demo_detection(tmp_path)
    del data["source"]["classes"]
    path = write_config(tmp_path, data)
    line = refused(capsys, path)
    assert line.startswith(f"kiln build: error: config error in {path}: targets.mask: "), line
    assert "without source.classes" in line and "by chance only" in line, line
    assert line.endswith(
        "declare source.classes, in the masks' id order (e.g. [background, road, car])"
    )
    assert not (tmp_path / "out").exists()


# --- a misspelt COCO keypoint name ------------------------------------------------------


def test_a_misspelt_coco_keypoint_name_stops_the_build_before_the_job(tmp_path, capsys):
    """`centre` for the categories' `center` built with exit 0, every object's
    center keypoint stored as "not labelled"."""
    data = demo_detection(tmp_path)
    data["source"] = {
        "type": "coco",
        "annotations": str(tmp_path / "demo" / demo_targets.COCO),
        "images": str(tmp_path / "demo" / "images"),
    }
    del data["targets"]["mask"]  # COCO has no semantic masks
    data["targets"]["keypoints"]["names"] = ["centre", "left", "right"]
    path = write_config(tmp_path, data)
    assert refused(capsys, path) == (
        f"kiln build: error: config error in {path}: source.annotations: instances.json: "
        "targets.keypoints.names: "
        "'centre' is a keypoint of no category; did you mean 'center'? (its categories' "
        "keypoints are center, left, right)"
    )
    # Refused while the launcher lists the file, before the job: only its lock was taken.
    assert os.listdir(tmp_path / "out" / data["name"]) == [".lock"]


# --- an image folder's declared class that names no class folder -------------------------


def test_a_misspelt_image_folder_class_is_refused_before_the_job(demo_corpus, tmp_path, capsys):
    """`squares` for the folder `square` ran the whole job, then failed with
    exit 1: "dropped 228 of 303 ... unknown_label"."""
    root = demo_corpus.out_dir
    data = make_config(
        root,
        output=str(tmp_path / "out"),
        source={"type": "image_folder", "root": root, "classes": ["circle", "squares"]},
    )
    path = write_config(tmp_path, data)
    assert refused(capsys, path) == (
        f"kiln build: error: config error in {path}: source.classes: 'squares' names no class "
        f"folder of {root}; did you mean 'square'?"
    )
    assert os.listdir(tmp_path / "out" / data["name"]) == [".lock"]  # no job ran


def listed_classes(root, classes, from_source=False) -> list[str]:
    source = ImageFolderSource(type="image_folder", root=str(root), classes=classes)
    with source.list_files(splits_from_source=from_source) as listing:
        return list(listing.class_names)


def test_an_empty_class_folder_declares_its_class(tmp_path):
    for folder in ("flat/cat", "flat/bird", "split/train/cat", "split/test/dog"):
        os.makedirs(tmp_path / folder)
    for image in ("flat/cat/1.png", "split/train/cat/1.png"):
        (tmp_path / image).write_bytes(b"not decoded while listing")
    # bird's folder is empty: a class with no image yet.
    assert listed_classes(tmp_path / "flat", ["bird", "cat"]) == ["bird", "cat"]
    # With split folders a class folder in any split will do.
    assert listed_classes(tmp_path / "split", ["cat", "dog"], from_source=True) == ["cat", "dog"]
    with pytest.raises(ConfigError) as raised:
        listed_classes(tmp_path / "split", ["cat", "dgo", "eel"], from_source=True)
    assert str(raised.value) == (
        f"source.classes: 'dgo' (did you mean 'dog'?), 'eel' name no class folder of "
        f"{tmp_path / 'split'}/<split>"
    )
