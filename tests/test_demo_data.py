"""The demo-data generator: deterministic, decodable, with broken files that fail as declared."""

import io

import cv2
import numpy as np
import pytest
from PIL import Image, ImageOps

from conftest import read_tree
from kiln import cli
from kiln.pipeline import demo_data
from kiln.transforms import DecodeError, decode_image


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "data"
    summary = demo_data.generate(out, num_images=120, seed=5)
    return summary, read_tree(out)


def test_same_seed_writes_byte_identical_files(demo, tmp_path):
    summary, files = demo
    again = demo_data.generate(tmp_path / "again", num_images=120, seed=5)
    assert read_tree(tmp_path / "again") == files
    assert again.class_counts == summary.class_counts and again.broken == summary.broken
    demo_data.generate(tmp_path / "other", num_images=120, seed=6)
    other = read_tree(tmp_path / "other")
    assert len(other) == len(files)
    assert sum(data != files.get(path) for path, data in other.items()) > 110  # other images


def test_the_first_images_do_not_depend_on_how_many_are_written(demo, tmp_path):
    _, files = demo
    demo_data.generate(tmp_path, num_images=30, seed=5)
    fewer = read_tree(tmp_path)
    assert len(fewer) == 30 + 3
    assert all(files[path] == data for path, data in fewer.items())


def test_classes_counts_and_layout(demo):
    summary, files = demo
    assert list(summary.class_counts) == sorted(summary.class_counts) == list(demo_data.CLASSES)
    assert len(summary.class_counts) >= 3
    assert summary.class_counts == {"circle": 30, "square": 30, "star": 30, "triangle": 30}
    assert summary.num_images == 120
    good = [path for path in files if path not in summary.broken]
    assert len(good) == 120
    for path in good:
        class_name, name = path.split("/")
        assert name.startswith(class_name + "_") and name.endswith((".jpg", ".png"))
    assert (
        "wrote 120 images in 4 classes (circle 30, square 30, star 30, triangle 30) "
        "and 3 broken files" in summary.describe()
    )


def test_broken_files_fail_to_decode_with_the_declared_reasons(demo):
    summary, files = demo
    assert summary.broken == {
        "circle/broken_empty.jpg": "empty",
        "square/broken_truncated.jpg": "corrupt",
        "triangle/broken_not_an_image.png": "not_an_image",
    }
    for path, reason in summary.broken.items():
        with pytest.raises(DecodeError) as caught:
            decode_image(files[path])
        assert caught.value.reason == reason, path


def test_every_other_file_decodes_and_the_set_is_varied(demo):
    summary, files = demo
    shapes, formats, gray = set(), set(), 0
    for path, data in files.items():
        if path in summary.broken:
            continue
        image = decode_image(data)
        assert image.dtype == np.uint8 and image.shape[2] == 3
        assert 48 <= image.shape[0] <= 160 and 48 <= image.shape[1] <= 160
        shapes.add(image.shape[:2])
        formats.add(path.rsplit(".", 1)[1])
        stored = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        gray += stored.ndim == 2
    assert formats == {"jpg", "png"}
    assert len(shapes) > 60 and sum(h != w for h, w in shapes) > 50
    assert 2 <= gray <= 30


def test_sideways_jpegs_carry_exif_orientation_and_decode_upright(demo):
    summary, files = demo
    oriented = {}
    for path, data in files.items():
        if path.endswith(".jpg") and path not in summary.broken:
            orientation = Image.open(io.BytesIO(data)).getexif().get(0x0112)
            if orientation:
                oriented[path] = orientation
    assert len(oriented) >= 2 and set(oriented.values()) <= {3, 6, 8}
    for path, orientation in oriented.items():
        decoded = decode_image(files[path])
        # OpenCV's own colour mode applies EXIF orientation: it must agree exactly.
        opencv = cv2.imdecode(np.frombuffer(files[path], np.uint8), cv2.IMREAD_COLOR_RGB)
        np.testing.assert_array_equal(decoded, opencv)
        opened = Image.open(io.BytesIO(files[path]))
        pillow = np.asarray(ImageOps.exif_transpose(opened).convert("RGB"))
        assert np.abs(decoded.astype(int) - pillow.astype(int)).mean() < 2, path
        if orientation in (6, 8):
            stored = cv2.imdecode(np.frombuffer(files[path], np.uint8), cv2.IMREAD_UNCHANGED)
            assert decoded.shape[:2] == stored.shape[1::-1]


def test_regenerating_replaces_an_earlier_demo_folder(tmp_path):
    demo_data.generate(tmp_path, num_images=12, seed=1)
    demo_data.generate(tmp_path, num_images=4, seed=1, include_broken=False)
    # The 12 earlier images and the broken files are gone, not mixed in.
    assert sorted(path.rsplit(".", 1)[0] for path in read_tree(tmp_path)) == [
        "circle/circle_0000",
        "square/square_0001",
        "star/star_0002",
        "triangle/triangle_0003",
    ]


def test_a_folder_with_other_files_is_never_touched(tmp_path):
    (tmp_path / "circle").mkdir()
    (tmp_path / "circle" / "holiday.jpg").write_bytes(b"precious")
    with pytest.raises(FileExistsError, match=r"holiday|circle.*not written by kiln demo-data"):
        demo_data.generate(tmp_path, num_images=4)
    assert (tmp_path / "circle" / "holiday.jpg").read_bytes() == b"precious"
    assert read_tree(tmp_path) == {"circle/holiday.jpg": b"precious"}


def test_command_prints_a_one_line_summary(tmp_path, capsys):
    assert cli.main(["demo-data", str(tmp_path / "out"), "--num-images", "8", "--no-broken"]) == 0
    output = capsys.readouterr().out.strip().splitlines()
    assert output == [
        f"wrote 8 images in 4 classes (circle 2, square 2, star 2, triangle 2) "
        f"to {tmp_path / 'out'}"
    ]
    assert len(read_tree(tmp_path / "out")) == 8


def test_command_refuses_a_foreign_folder_with_exit_code_2(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert cli.main(["demo-data", str(tmp_path)]) == 2
    assert "not written by kiln demo-data" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("flags", [(), ("--targets",)], ids=["folders", "targets"])
def test_a_folder_that_cannot_be_written_is_one_line_not_an_internal_error(tmp_path, capsys, flags):
    """OUT under a file (or in a read-only folder, on a full disk) was exit
    70, "internal error: NotADirectoryError", as for a bug of kiln's."""
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "demo"
    assert cli.main(["demo-data", str(out), "--num-images", "4", *flags]) == 1
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == (
        "",
        f"kiln demo-data: failed: cannot write {out}: Not a directory\n",
    )


def test_photos_are_deterministic_photo_like_jpegs(tmp_path):
    summary = demo_data.generate_photos(tmp_path / "a", num_images=4, size=(160, 120), seed=2)
    demo_data.generate_photos(tmp_path / "b", num_images=4, size=(160, 120), seed=2)
    files = read_tree(tmp_path / "a")
    assert files == read_tree(tmp_path / "b")
    assert summary.class_counts == {"circle": 1, "square": 1, "star": 1, "triangle": 1}
    assert sorted(files) == [
        "circle/photo_0000.jpg",
        "square/photo_0001.jpg",
        "star/photo_0002.jpg",
        "triangle/photo_0003.jpg",
    ]
    for data in files.values():
        image = decode_image(data)
        assert image.shape == (120, 160, 3)
        # Not flat colour: many distinct levels and local texture everywhere.
        assert len(np.unique(image.reshape(-1, 3), axis=0)) > 2000
        assert np.abs(np.diff(image.astype(int), axis=1)).mean() > 1.0


def test_a_full_size_photo_has_a_realistic_file_size(tmp_path):
    demo_data.generate_photos(tmp_path, num_images=1)
    (data,) = read_tree(tmp_path).values()
    assert decode_image(data).shape == (600, 800, 3)
    assert 40_000 <= len(data) <= 200_000
