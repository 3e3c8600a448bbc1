"""``image.jpeg_scaled_decode``: real builds with it on and off, side by side.

JPEGs decoded at 1/2, 1/4 or 1/8 keep the sizes a full decode gives and
nearly its pixels (not the same: the option was used), EXIF-turned photos
come out upright, other formats and builds without the option are what
they were, the option makes a new version that reuses no record, and
boxes, keypoints and masks follow the reduced pixels.
"""

from __future__ import annotations

import io
import json
import os
import pathlib

import numpy as np
import pytest
from PIL import Image

import targets_data
from kiln.pipeline import build
from test_build import read_all
from test_decode_scale import photo
from test_targets_build import records as target_records

TRANSFORMS = [{"resize": {"shorter_side": 64}}, {"center_crop": {"size": 56}}]
# (height, width, EXIF orientation): odd sizes, reduced by 2, 4 and 8.
PHOTOS = [
    (180, 241, 1),
    (263, 351, 1),
    (517, 390, 1),
    (600, 800, 5),
    (333, 445, 6),
    (270, 359, 7),
    (640, 480, 8),
    (130, 200, 1),  # 65 at 1/2: reduced by 2
    (100, 140, 1),  # 50 at 1/2, less than 64: decoded in full
]


def save(image: np.ndarray, path: pathlib.Path, orientation: int = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"quality": 92}
    if orientation != 1:
        exif = Image.Exif()
        exif[0x0112] = orientation
        options["exif"] = exif.tobytes()
    Image.fromarray(image).save(path, "JPEG" if path.suffix == ".jpg" else "PNG", **options)


@pytest.fixture(scope="module")
def jpeg_corpus(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("scaled-jpegs") / "images"
    for index, (height, width, orientation) in enumerate(PHOTOS):
        save(photo(height, width, seed=index), root / f"c{index % 2}" / f"{index}.jpg", orientation)
    return root


@pytest.fixture(scope="module")
def png_corpus(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("scaled-pngs") / "images"
    for index, (height, width, _) in enumerate(PHOTOS[:4]):
        save(photo(height, width, seed=index), root / f"c{index % 2}" / f"{index}.png")
    return root


def config(root: pathlib.Path, output: pathlib.Path, scaled: bool | None) -> dict:
    image = {} if scaled is None else {"image": {"jpeg_scaled_decode": scaled}}
    return {
        "name": "photos",
        "source": {"type": "image_folder", "root": str(root)},
        "output": str(output),
        "transforms": TRANSFORMS,
        "encoding": {"format": "png"},
        "sharding": {"num_shards": 1},
        **image,
    }


@pytest.fixture(scope="module")
def jpeg_builds(jpeg_corpus, tmp_path_factory):
    """(without the option, with it), each into its own output."""
    return tuple(
        build(config(jpeg_corpus, tmp_path_factory.mktemp("out"), scaled))
        for scaled in (None, True)
    )


def by_key(result) -> dict[str, dict]:
    return {record["key"]: record for records in read_all(result).values() for record in records}


def test_jpegs_keep_their_sizes_and_nearly_their_pixels(jpeg_builds):
    full, scaled = (by_key(result) for result in jpeg_builds)
    assert sorted(full) == sorted(scaled) and len(full) == len(PHOTOS)
    differences = {}
    for key, record in full.items():
        other = scaled[key]["image"]
        assert other.shape == record["image"].shape == (56, 56, 3), key
        differences[key] = np.abs(other.astype(int) - record["image"].astype(int)).mean()
    # EXIF-turned photos (5 to 8) too: a wrong turn or flip is tens of levels off.
    assert max(differences.values()) < 2.0, differences
    # Reduced, so not the same pixels; the one too small to reduce is.
    assert differences["c0/8.jpg"] == 0.0
    assert all(difference > 0 for key, difference in differences.items() if key != "c0/8.jpg")
    counters = jpeg_builds[1].counters
    assert counters["images_decoded"] == len(PHOTOS) and counters["records_written"] == len(PHOTOS)


def test_the_option_is_in_the_config_and_version_only_when_on(jpeg_corpus, jpeg_builds, tmp_path):
    full, scaled = jpeg_builds
    assert full.version != scaled.version
    with open(os.path.join(scaled.dataset_dir, "kiln.json")) as f:
        assert json.load(f)["config"]["image"]["jpeg_scaled_decode"] is True
    with open(os.path.join(full.dataset_dir, "kiln.json")) as f:
        assert "jpeg_scaled_decode" not in json.load(f)["config"]["image"]
    # Written as false, the config is the one without it: the same version.
    off = build(config(jpeg_corpus, tmp_path, False))
    assert off.version == full.version
    assert by_key(off).keys() == by_key(full).keys()
    for key, record in by_key(off).items():
        assert record["encoded"] == by_key(full)[key]["encoded"]


def test_turning_it_on_rebuilds_every_record_of_the_base(jpeg_corpus, tmp_path):
    first = build(config(jpeg_corpus, tmp_path, None))
    second = build(config(jpeg_corpus, tmp_path, True))  # incremental from LATEST
    assert second.version != first.version and not second.up_to_date
    assert second.counters.get("records_reused", 0) == 0
    assert second.counters["images_decoded"] == len(PHOTOS)
    for key, record in by_key(second).items():
        assert record["encoded"] != by_key(first)[key]["encoded"] or key == "c0/8.jpg"
    # And off again: the first version's records, not the second's.
    third = build(config(jpeg_corpus, tmp_path, False))
    assert third.counters.get("records_reused", 0) == 0
    assert {key: r["encoded"] for key, r in by_key(third).items()} == {
        key: r["encoded"] for key, r in by_key(first).items()
    }


def test_other_formats_are_unaffected(png_corpus, tmp_path):
    full = build(config(png_corpus, tmp_path / "off", None))
    scaled = build(config(png_corpus, tmp_path / "on", True))
    assert {key: r["encoded"] for key, r in by_key(scaled).items()} == {
        key: r["encoded"] for key, r in by_key(full).items()
    }


def test_targets_follow_the_reduced_pixels(tmp_path):
    """The targets corpus's scenes at 4x as JPEGs, resized back by 4: the
    reduced decode (1/4) maps the targets exactly as the full path does."""
    scale = 4
    rows = []
    for index in range(8):
        row = targets_data.manifest_row(index, tmp_path)
        big = np.repeat(
            np.repeat(targets_data.image_of(targets_data.objects_of(index)), 4, 0), 4, 1
        )
        # Sensor-like noise: flat blocks could decode alike at any scale.
        noise = np.random.default_rng(index).integers(-12, 13, big.shape)
        big = np.clip(big + noise, 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(big).save(buffer, "JPEG", quality=95, subsampling=0)
        (tmp_path / "images" / f"{index:03d}.jpg").write_bytes(buffer.getvalue())
        row["path"] = f"images/{index:03d}.jpg"
        for item in row["objects"]:
            item["bbox"] = [v * scale for v in item["bbox"]]
            item["keypoints"] = [
                v * scale if k % 3 != 2 else v for k, v in enumerate(item["keypoints"])
            ]
            if "segmentation" in item:
                item["segmentation"] = [[v * scale for v in item["segmentation"][0]]]
            else:
                mask = np.asarray(Image.open(tmp_path / item["mask"]))
                item["mask"] = item["mask"].replace(".png", "_big.png")
                Image.fromarray(np.repeat(np.repeat(mask, 4, 0), 4, 1)).save(
                    tmp_path / item["mask"]
                )
        semantic = np.asarray(Image.open(tmp_path / row["mask"]))
        row["mask"] = row["mask"].replace(".png", "_big.png")
        Image.fromarray(np.repeat(np.repeat(semantic, 4, 0), 4, 1)).save(tmp_path / row["mask"])
        rows.append(row)
    manifest = targets_data.write_manifest(tmp_path, rows)

    def targets_build(scaled: bool, output: str):
        return build(
            {
                "name": "objects",
                "source": {
                    "type": "manifest",
                    "path": manifest,
                    "classes": targets_data.CLASSES,
                },
                "output": str(tmp_path / output),
                "encoding": {"format": "png"},
                "targets": targets_data.TARGETS,
                "transforms": [{"resize": {"shorter_side": targets_data.HEIGHT}}],
                "image": {"jpeg_scaled_decode": scaled},
                "sharding": {"num_shards": 1},
            }
        )

    full, scaled = (
        target_records(targets_build(False, "off")),
        target_records(targets_build(True, "on")),
    )
    assert sorted(full) == sorted(scaled) and len(full) == 8
    fields = ("boxes", "keypoints", "mask", "instance_masks", "classes")
    for key, record in full.items():
        other = scaled[key]
        for field in fields:
            if field in record:
                np.testing.assert_array_equal(
                    np.asarray(other[field]), np.asarray(record[field]), err_msg=f"{key} {field}"
                )
        assert other["image"] != record["image"]  # reduced: other pixels, the same targets


def test_targets_of_turned_photos_are_the_full_paths_where_a_pixel_is_half_covered(tmp_path):
    """A rectangle whose edges fall in the middle of the 4x4 blocks a 4x
    reduction averages: each such output pixel is half inside, and its
    centre's preimage lies exactly on an edge between two stored pixels.
    The full path turns the masks upright pixel for pixel, then resamples:
    the reduced path must pick the same pixel for every EXIF orientation,
    mirrored ones too (resampling through the turn's map put the tie on
    the other side, a mask edge one pixel off the full path's)."""
    height, width, scale = 96, 128, 4
    left, top, right, bottom = 18, 10, 70, 58  # 2 mod 4: half of a block
    rows = []
    for orientation in range(1, 9):
        image = np.full((height, width, 3), 30, np.uint8)
        image[top:bottom, left:right] = (200, 40, 40)
        save(image, tmp_path / "images" / f"{orientation}.jpg", orientation)
        mask = np.zeros((height, width), np.uint8)
        mask[top:bottom, left:right] = 1
        Image.fromarray(mask).save(tmp_path / f"{orientation}_mask.png")
        keypoints = [left + 0.5, top + 0.5, 2, right - 0.5, bottom - 0.5, 2]
        obj = {"bbox": [left, top, right, bottom], "class": "thing", "keypoints": keypoints}
        obj["mask"] = f"{orientation}_mask.png"
        rows.append({"path": f"images/{orientation}.jpg", "objects": [obj], "mask": obj["mask"]})
    manifest = targets_data.write_manifest(tmp_path, rows)

    def targets_build(scaled: bool) -> dict[str, dict]:
        result = build(
            {
                "name": "turned",
                "source": {"type": "manifest", "path": manifest, "classes": ["other", "thing"]},
                "output": str(tmp_path / f"out-{scaled}"),
                "encoding": {"format": "png"},
                "targets": {
                    "boxes": {},
                    "mask": {},
                    "instance_masks": {},
                    "keypoints": {"names": ["tl", "br"]},
                },
                "transforms": [{"resize": {"shorter_side": height // scale}}],
                "image": {"jpeg_scaled_decode": scaled},
                "sharding": {"num_shards": 1},
            }
        )
        return target_records(result)

    full, scaled = targets_build(False), targets_build(True)
    assert sorted(full) == sorted(scaled) and len(full) == 8
    for key, record in full.items():
        for field in ("boxes", "keypoints", "mask", "instance_masks"):
            np.testing.assert_array_equal(
                np.asarray(scaled[key][field]), np.asarray(record[field]), err_msg=f"{key} {field}"
            )
