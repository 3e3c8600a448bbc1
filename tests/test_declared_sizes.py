"""Declared image sizes (COCO ``images[].width/height``, VOC ``<size>``) and
``targets.annotations_frame``: real builds on the DirectRunner, read back.

A phone photo is stored 64x48 with EXIF orientation 6 (shown 48x64 upright).
Annotation tools that show it upright (CVAT, Label Studio, Roboflow) export
width 48, height 64 and boxes in the upright frame. Under the default frame
(``stored``) such an image is dropped (``size_mismatch``) with the setting
that reads it right; under ``upright`` its boxes and masks land on the
object's pixels. An image resized after it was annotated fits neither frame.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from kiln.pipeline import build
from targets_data import error_rows, records

STORED = (48, 64)  # the phone photo's stored pixels, HxW
RED = (255, 0, 0)


def tight_box(binary: np.ndarray) -> list[int]:
    """[x_min, y_min, x_max, y_max] (continuous) of the True pixels."""
    ys, xs = np.nonzero(binary)
    return [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]


def pixels_of(record: dict) -> np.ndarray:
    return tf.io.decode_png(record["image"]).numpy()


def red_of(pixels: np.ndarray) -> np.ndarray:
    return (pixels[..., 0] > 128) & (pixels[..., 1] < 100)


def stored_box(record: dict) -> list[float]:
    """The record's first box in pixels of its image, [x_min, y_min, x_max, y_max]."""
    height, width = pixels_of(record).shape[:2]
    y0, x0, y1, x1 = np.asarray(record["boxes"][0], np.float64)
    return np.round([x0 * width, y0 * height, x1 * width, y1 * height], 3).tolist()


def phone_photo(path, red_columns: tuple[int, int], size=STORED) -> list[int]:
    """A JPEG stored ``size`` (HxW) with EXIF orientation 6 and a red block in
    rows 4..14 and `red_columns` of its stored pixels; returns the block's box
    in the upright image, as a tool showing it upright draws it."""
    pixels = np.zeros((*size, 3), np.uint8)
    pixels[4:14, red_columns[0] : red_columns[1]] = RED
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = 6
    image.save(path, quality=100, exif=exif)
    upright = np.asarray(Image.open(path).transpose(Image.Transpose.ROTATE_270))
    return tight_box(red_of(upright))


def plain_png(path, size=(20, 30)) -> list[int]:
    """A PNG without orientation and a red block; its box."""
    pixels = np.zeros((*size, 3), np.uint8)
    pixels[3:9, 5:15] = RED
    Image.fromarray(pixels).save(path)
    return tight_box(red_of(pixels))


def polygon_of(box: list[int]) -> list[list[int]]:
    x0, y0, x1, y1 = box
    return [[x0, y0, x1, y0, x1, y1, x0, y1]]


def phone_coco(folder, count: int, red_columns=(30, 50), stored: int = 0) -> str:
    """`count` phone photos annotated upright (declared 48x64, boxes and
    polygons upright), `stored` more annotated on the stored pixels
    (declared 64x48), and two plain PNGs."""
    images_dir = folder / "images"
    images_dir.mkdir(parents=True)
    images, annotations = [], []
    for index in range(count + stored + 2):
        if index < count:
            name = f"phone{index}.jpg"
            box = phone_photo(images_dir / name, red_columns)
            width, height = STORED[0], STORED[1]  # upright: 48 wide, 64 high
        elif index < count + stored:
            name = f"stored{index}.jpg"
            phone_photo(images_dir / name, red_columns)
            box = [red_columns[0], 4, red_columns[1], 14]
            width, height = STORED[1], STORED[0]
        else:
            name = f"plain{index}.png"
            box = plain_png(images_dir / name)
            width, height = 30, 20
        images.append({"id": index, "file_name": name, "width": width, "height": height})
        x0, y0, x1, y1 = box
        annotations.append(
            {
                "id": index,
                "image_id": index,
                "category_id": 1,
                "bbox": [x0, y0, x1 - x0, y1 - y0],
                "segmentation": polygon_of(box),
            }
        )
    path = folder / "instances.json"
    document = {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": 1, "name": "thing"}],
    }
    path.write_text(json.dumps(document))
    return str(path)


def coco_config(folder, annotations, **targets) -> dict:
    return {
        "name": "phones",
        "source": {"type": "coco", "annotations": annotations, "images": str(folder / "images")},
        "output": str(folder / "out"),
        "encoding": {"format": "png"},
        "targets": {"boxes": {}, **targets},
        "errors": {"max_fraction": 0.9},
        "sharding": {"num_shards": 1},
    }


def test_upright_annotations_are_dropped_under_the_default_frame_naming_the_setting(tmp_path):
    """Boxes drawn upright that spill out of the stored frame: not read as
    [y_min, x_min, ...] boxes ("swap x and y" would store transposed boxes),
    but dropped, each with both sizes and targets.annotations_frame: upright."""
    annotations = phone_coco(tmp_path, 12, red_columns=(40, 60))
    result = build(coco_config(tmp_path, annotations))

    assert sorted(records(result)) == ["plain12.png", "plain13.png"]
    assert result.info.dropped == {"size_mismatch": 12}
    errors = error_rows(result)
    assert sorted(errors) == sorted(f"phone{i}.jpg" for i in range(12))
    message = errors["phone0.jpg"]["message"]
    assert errors["phone0.jpg"]["stage"] == "targets"
    assert message.startswith(
        "the annotations declare the image 48x64 (WxH, images[].width/height), its size "
        "upright: set targets.annotations_frame: upright"
    )
    assert "stored 64x48 with EXIF orientation 6" in message
    with open(os.path.join(result.dataset_dir, "kiln.json")) as f:
        # The default frame stays out of the config (and its fingerprint).
        assert "annotations_frame" not in json.load(f)["config"]["targets"]


def test_the_upright_frame_puts_boxes_and_masks_on_the_objects_pixels(tmp_path):
    annotations = phone_coco(tmp_path, 3, stored=1)
    result = build(
        coco_config(tmp_path, annotations, instance_masks={}, annotations_frame="upright")
    )

    got = records(result)
    assert sorted(got) == ["phone0.jpg", "phone1.jpg", "phone2.jpg", "plain4.png", "plain5.png"]
    # Annotated on the stored pixels (declared 64x48): the other setting, named.
    (error,) = error_rows(result).values()
    assert error["key"] == "stored3.jpg" and error["reason"] == "size_mismatch"
    assert error["message"] == (
        "the annotations declare the image 64x48 (WxH, images[].width/height), its size as "
        "stored: set targets.annotations_frame: stored (the annotations were drawn on the "
        "image as stored; the file is stored 64x48 with EXIF orientation 6, 48x64 upright, "
        "and targets.annotations_frame: upright reads them on the image upright)"
    )
    for key, record in got.items():
        pixels = pixels_of(record)
        red = red_of(pixels)
        if key.startswith("phone"):
            assert pixels.shape[:2] == (64, 48)  # stored upright
        assert stored_box(record) == tight_box(red), key
        mask = tf.io.decode_png(record["instance_masks"][0]).numpy()[..., 0]
        np.testing.assert_array_equal(mask.astype(bool), red, err_msg=key)
    with open(os.path.join(result.dataset_dir, "kiln.json")) as f:
        info = json.load(f)
    assert info["config"]["targets"]["annotations_frame"] == "upright"


def test_images_resized_after_annotation_are_dropped_naming_both_sizes(tmp_path):
    """Declared 128x96, the file 64x48: its boxes (in the 128x96 frame) fit the
    small file and would be stored at twice their size."""
    images = tmp_path / "images"
    images.mkdir()
    entries, annotations = [], []
    for index in range(4):
        name = f"{index}.png"
        pixels = np.zeros((48, 64, 3), np.uint8)
        pixels[5:15, 6:20] = RED
        Image.fromarray(pixels).save(images / name)
        declared = (128, 96) if index < 3 else (64, 48)
        entries.append(
            {"id": index, "file_name": name, "width": declared[0], "height": declared[1]}
        )
        box = [12, 10, 28, 20] if index < 3 else [6, 5, 14, 10]
        annotations.append({"id": index, "image_id": index, "category_id": 1, "bbox": box})
    path = tmp_path / "instances.json"
    path.write_text(
        json.dumps(
            {
                "images": entries,
                "annotations": annotations,
                "categories": [{"id": 1, "name": "thing"}],
            }
        )
    )
    result = build(coco_config(tmp_path, str(path)))

    got = records(result)
    assert sorted(got) == ["3.png"]
    assert stored_box(got["3.png"]) == tight_box(red_of(pixels_of(got["3.png"])))
    errors = error_rows(result)
    assert sorted(errors) == ["0.png", "1.png", "2.png"]
    assert errors["0.png"]["reason"] == "size_mismatch"
    assert errors["0.png"]["message"] == (
        "the annotations declare the image 128x96 (WxH, images[].width/height), but it is "
        "64x48 as stored (the file is stored 64x48, without EXIF orientation): resized after "
        "it was annotated, or the annotations are another image's; their coordinates would "
        "not fit it"
    )


def voc_folder(folder) -> None:
    """A phone photo annotated upright (<size> 48x64) and a plain PNG."""
    (folder / "Ann").mkdir()
    (folder / "JPEG").mkdir()
    for name, box, size in (
        ("phone.jpg", phone_photo(folder / "JPEG" / "phone.jpg", (30, 50)), (48, 64)),
        ("plain.png", plain_png(folder / "JPEG" / "plain.png"), (30, 20)),
    ):
        x0, y0, x1, y1 = box
        (folder / "Ann" / f"{name}.xml").write_text(
            f"<annotation><filename>{name}</filename>"
            f"<size><width>{size[0]}</width><height>{size[1]}</height><depth>3</depth></size>"
            f"<object><name>thing</name><bndbox><xmin>{x0 + 1}</xmin><ymin>{y0 + 1}</ymin>"
            f"<xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object></annotation>"
        )


@pytest.mark.parametrize("frame", ["stored", "upright"])
def test_voc_sizes_are_checked_in_the_annotations_frame(tmp_path, frame):
    voc_folder(tmp_path)
    config = {
        "name": "voc",
        "source": {
            "type": "voc",
            "annotations": str(tmp_path / "Ann"),
            "images": str(tmp_path / "JPEG"),
        },
        "output": str(tmp_path / "out"),
        "encoding": {"format": "png"},
        # The default frame unwritten: a config of before the setting.
        "targets": {"boxes": {}}
        if frame == "stored"
        else {"boxes": {}, "annotations_frame": frame},
        "errors": {"max_fraction": 0.5},
    }
    result = build(config)

    got = records(result)
    if frame == "stored":
        assert sorted(got) == ["plain.png"]
        error = error_rows(result)["phone.jpg"]
        assert error["reason"] == "size_mismatch"
        assert error["message"].startswith(
            "the annotations declare the image 48x64 (WxH, <size>), its size upright: "
            "set targets.annotations_frame: upright"
        )
    else:
        assert sorted(got) == ["phone.jpg", "plain.png"]
    for key, record in got.items():
        assert stored_box(record) == tight_box(red_of(pixels_of(record))), key


def test_a_mask_of_the_upright_size_names_the_orientation_and_the_setting(tmp_path):
    """A semantic mask saved upright (64x48 HxW) for a file stored 48x64 with
    EXIF orientation 6: the message says so; the upright frame reads it."""
    (tmp_path / "img").mkdir()
    pixels = np.zeros((48, 64, 3), np.uint8)
    pixels[4:14, 30:50] = RED
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = 6
    image.save(tmp_path / "img" / "a.jpg", quality=100, exif=exif)
    upright = np.asarray(
        Image.open(tmp_path / "img" / "a.jpg").transpose(Image.Transpose.ROTATE_270)
    )
    Image.fromarray(red_of(upright).astype(np.uint8)).save(tmp_path / "a_mask.png")
    other = np.zeros((16, 16, 3), np.uint8)
    Image.fromarray(other).save(tmp_path / "img" / "b.png")
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(tmp_path / "b_mask.png")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        "".join(
            json.dumps({"path": f"img/{key}", "mask": mask}) + "\n"
            for key, mask in (("a.jpg", "a_mask.png"), ("b.png", "b_mask.png"))
        )
    )

    def config(frame: str, output: str) -> dict:
        return {
            "name": "masks",
            "source": {"type": "manifest", "path": str(manifest), "classes": ["bg", "fg"]},
            "output": str(tmp_path / output),
            "encoding": {"format": "png"},
            "targets": {"mask": {}}
            if frame == "stored"
            else {"mask": {}, "annotations_frame": frame},
            "errors": {"max_fraction": 0.5},
        }

    stored = build(config("stored", "stored"))
    error = error_rows(stored)["img/a.jpg"]
    assert error["reason"] == "mask_size_mismatch"
    assert error["message"].endswith(
        "the mask is 64x48 (HxW) but its image is 48x64 as stored (targets.annotations_frame: "
        "stored); the file has EXIF orientation 6: upright it is 64x48 (HxW); masks drawn on "
        "the image as viewers show it need targets.annotations_frame: upright"
    )

    got = records(build(config("upright", "upright")))
    mask = tf.io.decode_png(got["img/a.jpg"]["mask"]).numpy()[..., 0]
    np.testing.assert_array_equal(mask.astype(bool), red_of(pixels_of(got["img/a.jpg"])))


def test_the_upright_frame_with_a_reduced_jpeg_decode(tmp_path):
    """``jpeg_scaled_decode`` decodes the photo at 1/4 and maps the upright
    annotations as the full decode does."""
    images = tmp_path / "images"
    images.mkdir()
    big = (192, 256)
    pixels = np.zeros((*big, 3), np.uint8)
    pixels[16:56, 120:200] = RED
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=100, subsampling=0, exif=exif)
    (images / "big.jpg").write_bytes(buffer.getvalue())
    upright = np.asarray(Image.open(images / "big.jpg").transpose(Image.Transpose.ROTATE_270))
    x0, y0, x1, y1 = tight_box(red_of(upright))
    path = tmp_path / "instances.json"
    path.write_text(
        json.dumps(
            {
                "images": [{"id": 1, "file_name": "big.jpg", "width": 192, "height": 256}],
                "annotations": [
                    {"id": 1, "image_id": 1, "category_id": 1, "bbox": [x0, y0, x1 - x0, y1 - y0]}
                ],
                "categories": [{"id": 1, "name": "thing"}],
            }
        )
    )
    boxes = {}
    for scaled in (False, True):
        config = coco_config(tmp_path, str(path), annotations_frame="upright")
        config["output"] = str(tmp_path / f"out-{scaled}")
        config["transforms"] = [{"resize": {"shorter_side": 48}}]
        config["image"] = {"jpeg_scaled_decode": scaled}
        record = records(build(config))["big.jpg"]
        assert pixels_of(record).shape[:2] == (64, 48)
        boxes[scaled] = stored_box(record)
    assert boxes[True] == boxes[False] == [x0 / 4, y0 / 4, x1 / 4, y1 / 4]


def test_a_coco_file_with_a_byte_order_mark_builds(tmp_path):
    """Windows tools write UTF-8 with a BOM (and CRLF line ends)."""
    annotations = phone_coco(tmp_path, 0)
    with open(annotations, "rb") as f:
        data = f.read()
    with open(annotations, "wb") as f:
        f.write(b"\xef\xbb\xbf" + data.replace(b", ", b",\r\n"))
    result = build(coco_config(tmp_path, annotations))
    got = records(result)
    assert sorted(got) == ["plain0.png", "plain1.png"]
    for record in got.values():
        assert stored_box(record) == tight_box(red_of(pixels_of(record)))
