"""`kiln build` refuses an ``augment:`` list that `kiln.reader.load` would refuse on the
dataset it builds, with the reader's own check (`Augmenter.check_dataset`).

Targets and channels are checked with the config (exit 2, before any work);
the stored size too when the transforms fix it, else after the job, before
publishing (exit 1, nothing published). Real builds on the DirectRunner.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import yaml

import kiln.reader
import targets_data as data
from conftest import make_config
from kiln import cli
from kiln.pipeline import ConfigError, config
from kiln.transforms import encode_image

DETECTION_TARGETS = {"boxes": {"min_visibility": 0.25}, "mask": {"ignore_value": 255}}


@pytest.fixture(scope="module")
def objects_manifest(tmp_path_factory):
    """Six 48x64 images with boxes and masks (tests/targets_data.py), in a JSONL manifest."""
    manifest, _ = data.corpus(tmp_path_factory.mktemp("objects"), 6)
    return manifest


def detection_config(manifest: str, output, **overrides) -> dict:
    return {
        "name": "objects",
        "source": {"type": "manifest", "path": manifest, "classes": data.CLASSES},
        "output": str(output),
        "encoding": {"format": "png"},
        "splits": {"fractions": {"train": 1.0}},
        "sharding": {"num_shards": 1},
        "targets": DETECTION_TARGETS,
        **overrides,
    }


def write(tmp_path, data_: dict, name: str = "config.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data_, sort_keys=False))
    return str(path)


FOLDER_CASES = [
    # (config changes, the problem after "config error in <file>: ")
    (
        {"image": {"channels": 1}, "augment": ["random_flip_left_right", "random_hue"]},
        "augment[1].random_hue: needs 3-channel (RGB) images; this dataset's images have 1 "
        "channel(s) (image.channels in its build config)",
    ),
    (
        # resize 40, center_crop 32 (BASE_CONFIG): every stored image is 32x32.
        {"augment": [{"random_crop": {"size": 40}}]},
        "augment[0].random_crop: size [40, 40] (height, width) does not fit in [32, 32], the "
        "size of the stored images (transforms[1].center_crop makes every image 32x32)",
    ),
    (
        {
            "transforms": [{"letterbox": {"size": [24, 30]}}, "equalize"],
            "augment": [{"random_resized_crop": {"size": 20}}, {"random_crop": {"size": 24}}],
        },
        "augment[1].random_crop: size [24, 24] (height, width) does not fit in [20, 20], the "
        "size of the output of augment[0].random_resized_crop",
    ),
]


@pytest.mark.parametrize("changes, problem", FOLDER_CASES, ids=["rgb", "crop", "after-crop"])
def test_config_refuses_a_list_load_would_refuse(demo_corpus, tmp_path, changes, problem):
    built = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"), **changes)
    path = write(tmp_path, built)
    with pytest.raises(ConfigError) as raised:
        config.load(path)
    assert str(raised.value) == f"config error in {path}: {problem}"


@pytest.mark.parametrize(
    "augment, problem",
    [
        (
            ["random_flip_left_right", {"random_brightness": {"max_delta": 0.2}}, "mixup"],
            "augment[2].mixup: batch op 'mixup' cannot mix this dataset's targets "
            "['boxes', 'mask']",
        ),
        (
            [{"random_zoom": {"factor_range": [0.5, 1.0], "fill_mode": "reflect"}}],
            "augment[0].random_zoom: fill_mode 'reflect' fills the uncovered border with "
            "copies of the image",
        ),
    ],
    ids=["mixup", "reflect"],
)
def test_config_refuses_ops_the_targets_cannot_take(objects_manifest, tmp_path, augment, problem):
    path = write(tmp_path, detection_config(objects_manifest, tmp_path / "out", augment=augment))
    with pytest.raises(ConfigError) as raised:
        config.load(path)
    assert str(raised.value).startswith(f"config error in {path}: {problem}"), raised.value
    # The command line: exit 2, one line, nothing written.
    assert cli.main(["build", "--config", path, "--quiet"]) == 2
    assert not (tmp_path / "out").exists()


def test_a_crop_only_the_job_can_find_too_large_fails_the_build(objects_manifest, tmp_path, capsys):
    # No transforms: every image keeps its 48x64, which only the job finds out.
    output = tmp_path / "out"
    too_large = [{"random_crop": {"size": [40, 72]}}]
    path = write(tmp_path, detection_config(objects_manifest, output, augment=too_large))
    config.load(path)  # the config alone cannot tell
    assert cli.main(["build", "--config", path, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "kiln build: failed: augment[0].random_crop: size [40, 72] (height, width) does not "
        "fit in [48, 64], the size of the images the job stored (all 48x64); kiln.reader.load "
        "would refuse this augment list on the dataset, so nothing was published."
    ), err
    assert err.count("\n") == 1
    # Nothing published: no version folder, no LATEST.
    assert sorted(os.listdir(output / "objects")) == [".lock"]


# Stored as they are (no transforms): (height, width), the least height and
# the least width on different images.
VARYING_SIZES = [(40, 90), (70, 30), (100, 100), (64, 48)]


@pytest.fixture(scope="module")
def varying_sizes(tmp_path_factory):
    """An image folder whose images keep sizes that vary (`VARYING_SIZES`)."""
    root = tmp_path_factory.mktemp("varying") / "images"
    rng = np.random.default_rng(0)
    for index, (height, width) in enumerate(VARYING_SIZES):
        folder = root / ("wide" if width > height else "tall")
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        (folder / f"{index}.png").write_bytes(encode_image(pixels, format="png"))
    return root


def varying_config(root, output, augment) -> dict:
    return {
        "name": "varying",
        "source": {"type": "image_folder", "root": str(root)},
        "output": str(output),
        "encoding": {"format": "png"},
        "sharding": {"num_shards": 1},
        "augment": augment,
    }


@pytest.mark.parametrize("crop", [1000, [41, 20], [30, 31]], ids=["1000", "height", "width"])
def test_a_crop_larger_than_the_smallest_of_images_of_varying_size_fails_the_build(
    varying_sizes, tmp_path, capsys, crop
):
    """With no one size the config can check (the stored sizes vary), a fixed
    crop that does not fit the smallest height or width, which the reader
    would refuse on the published dataset (kiln.json's ``smallest_size``),
    is refused by the build, naming the smallest size."""
    output = tmp_path / "out"
    augment = [{"random_crop": {"size": crop}}]
    path = write(
        tmp_path, varying_config(varying_sizes, output, ["random_flip_left_right", *augment])
    )
    config.load(path)  # the config alone cannot tell
    assert cli.main(["build", "--config", path, "--quiet"]) == 1
    err = capsys.readouterr().err
    height = min(h for h, _ in VARYING_SIZES)
    width = min(w for _, w in VARYING_SIZES)
    size = crop if isinstance(crop, list) else [crop, crop]
    assert err.startswith(
        f"kiln build: failed: augment[1].random_crop: size {size} (height, width) does not "
        f"fit in [{height}, {width}], the size of the smallest images the job stored (their "
        f"sizes vary: the least height {height}, the least width {width}); kiln.reader.load "
        f"would refuse this augment list on the dataset, so nothing was published."
    ), err
    assert err.count("\n") == 1
    assert sorted(os.listdir(output / "varying")) == [".lock"]


def test_a_crop_that_fits_the_smallest_of_images_of_varying_size_is_published(
    varying_sizes, tmp_path
):
    height = min(h for h, _ in VARYING_SIZES)
    width = min(w for _, w in VARYING_SIZES)
    augment = [{"random_crop": {"size": [height, width]}}]
    path = write(tmp_path, varying_config(varying_sizes, tmp_path / "out", augment))
    assert cli.main(["build", "--config", path, "--quiet"]) == 0
    # The least height and the least width, of different images, in kiln.json for load.
    assert kiln.reader.info(str(tmp_path / "out" / "varying")).smallest_size == [height, width]
    dataset = kiln.reader.load(str(tmp_path / "out" / "varying"), "train", training=True, seed=1)
    images = [image for image, _ in dataset.as_numpy_iterator()]
    assert len(images) == len(VARYING_SIZES)
    assert {image.shape[:2] for image in images} == {(height, width)}
