"""`kiln preview`: contact sheets of a real build, read through the real reader."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from kiln import cli
from kiln.schemas import RECORD
from kiln.tools import contact_sheet

# As the reader tests' TRAIN_AUGMENT (the same build is shared in a full run).
AUGMENT = [
    {"random_resized_crop": {"size": [24, 24], "scale_range": [0.5, 1.0]}},
    "random_flip_left_right",
    {"random_brightness": {"max_delta": 0.2}},
]


@pytest.fixture(scope="module")
def built(build_dataset):
    return build_dataset(augment=AUGMENT)


@pytest.fixture(scope="module")
def preview(built):
    return contact_sheet.gather(built.dataset_root, "train", n=4, epochs=3, seed=0)


def stored_pixels(result, split: str) -> dict[str, np.ndarray]:
    """key -> decoded stored image, read from the shards with TF alone (not the reader)."""
    files = [os.path.join(result.dataset_dir, s.filename) for s in result.info.splits[split].shards]
    out = {}
    for serialized in tf.data.TFRecordDataset(files):
        record = RECORD.parse(serialized)
        out[record["key"].numpy().decode()] = tf.io.decode_png(record["image"]).numpy()
    return out


def test_stored_row_is_the_stored_pixels(built, preview):
    pixels = stored_pixels(built, "train")
    assert len(preview.keys) == 4 and len(set(preview.keys)) == 4
    for key, image, label in zip(preview.keys, preview.stored, preview.labels, strict=True):
        np.testing.assert_array_equal(image, pixels[key], err_msg=key)
        assert preview.class_names[label] == key.split("/")[0]  # demo keys are class/name
    assert preview.random
    assert [next(iter(op)) for op in preview.augment] == [
        "random_resized_crop",
        "random_flip_left_right",
        "random_brightness",
    ]


def test_augmented_rows_change_every_epoch_and_repeat_with_the_seed(built, preview):
    assert len(preview.epochs) == 3
    for row in preview.epochs:
        assert [image.shape for image in row] == [(24, 24, 3)] * 4  # the crop's output size
    for column in range(4):
        images = [row[column] for row in preview.epochs]
        assert not np.array_equal(images[0], images[1])
        assert not np.array_equal(images[1], images[2])
    assert contact_sheet.unchanged_columns(preview.epochs) == []

    again = contact_sheet.gather(built.dataset_dir, "train", n=4, epochs=3, seed=0)
    for row, row_again in zip(preview.epochs, again.epochs, strict=True):
        for image, image_again in zip(row, row_again, strict=True):
            np.testing.assert_array_equal(image, image_again)
    other = contact_sheet.gather(built.dataset_dir, "train", n=4, epochs=1, seed=1)
    assert other.keys == preview.keys
    assert not np.array_equal(other.epochs[0][0], preview.epochs[0][0])


def test_unchanged_columns_finds_elements_identical_in_every_epoch():
    a, b, c = (np.full((2, 2, 3), value, np.uint8) for value in (1, 2, 3))
    rows = [[a, b, c], [a, c, c], [a, b, c]]
    assert contact_sheet.unchanged_columns(rows) == [0, 2]
    # Same pixels in a different shape is a change (a crop of another size).
    assert contact_sheet.unchanged_columns([[a], [np.full((1, 4, 3), 1, np.uint8)]]) == []
    assert contact_sheet.unchanged_columns([[a, b], [b, a]]) == []
    with pytest.raises(ValueError, match="at least two epochs"):
        contact_sheet.unchanged_columns([[a, b]])


def test_sheet_holds_every_image_in_its_cell(preview):
    sheet, layout = contact_sheet.compose(preview, zoom=1, text=False)
    assert (layout.rows, layout.columns) == (4, 4)
    assert (layout.cell_height, layout.cell_width) == (32, 32)  # the largest image: stored
    assert sheet.shape == (layout.height, layout.width, 3) == (4 + 4 * 36, 4 + 4 * 36, 3)
    rows = [preview.stored] + preview.epochs
    for row_index, row in enumerate(rows):
        for column, image in enumerate(row):
            box = layout.image_box(row_index, column, *image.shape[:2])
            np.testing.assert_array_equal(sheet[box], image)

    # Zoomed with text: whole-number zoom repeats pixels; text stays in the margins.
    sheet, layout = contact_sheet.compose(preview, zoom=2)
    assert layout.header_width > 0 and layout.caption_height > 0  # OpenCV is installed here
    assert sheet.shape == (layout.height, layout.width, 3)
    for row_index, row in enumerate(rows):
        for column, image in enumerate(row):
            box = layout.image_box(row_index, column, *image.shape[:2])
            np.testing.assert_array_equal(sheet[box][::2, ::2], image)
    caption = sheet[: layout.caption_height, layout.header_width :]
    assert (caption != caption[0, 0]).any(), "label names were not drawn"


def test_cli_writes_the_sheet_and_a_legend(built, preview, tmp_path, capsys):
    out = str(tmp_path / "sheet.png")
    assert cli.main(["preview", built.dataset_root, "--n", "4", "--epochs", "3", "-o", out]) == 0
    with open(out, "rb") as f:
        written = tf.io.decode_png(f.read()).numpy()
    expected, layout = contact_sheet.compose(preview)
    np.testing.assert_array_equal(written, expected)  # same seed (0), same sheet
    stdout = capsys.readouterr().out
    assert f"({layout.width}x{layout.height})" in stdout
    for column, key in enumerate(preview.keys):
        assert f"column {column + 1}: {preview.label_names[column]}" in stdout and key in stdout


def test_cli_says_so_when_augmentation_never_changes(built, tmp_path, capsys):
    out = str(tmp_path / "sheet.png")
    never = '[{"random_flip_left_right": {"probability": 0.0}}]'
    assert (
        cli.main(
            [
                "preview",
                built.dataset_dir,
                "--n",
                "3",
                "--epochs",
                "2",
                "--augment",
                never,
                "-o",
                out,
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "every element came out identical in all 2 epochs" in err
    assert "baked in at trace time" in err
    assert os.path.exists(out)  # the sheet is written all the same, to look at


def test_cli_strict_fails_on_columns_that_never_changed(built, tmp_path, capsys):
    """A flip with probability 0.5 leaves some columns alone in 2 epochs by
    chance: a warning (exit 0), silent under --quiet; --strict makes it a
    failure, one line labelled as one (docs/cli.md: error|failed|busy)."""
    out = str(tmp_path / "sheet.png")
    flip = '["random_flip_left_right"]'
    argv = ["preview", built.dataset_dir, "--n", "8", "--epochs", "2", "--augment", flip]
    assert cli.main([*argv, "-o", out]) == 0
    warned = capsys.readouterr().err
    assert warned.startswith("kiln preview: warning: column(s) ")
    assert cli.main([*argv, "-o", out, "--quiet"]) == 0
    assert capsys.readouterr() == ("", "")
    assert cli.main([*argv, "-o", out, "--quiet", "--strict"]) == 1
    failed = capsys.readouterr()
    assert failed.out == "" and failed.err.count("\n") == 1
    assert failed.err == warned.replace("kiln preview: warning: ", "kiln preview: error: ", 1)


def test_cli_other_splits_get_the_inference_form(built, tmp_path, capsys):
    out = str(tmp_path / "sheet.png")
    assert (
        cli.main(
            [
                "preview",
                built.dataset_dir,
                "--split",
                "validation",
                "--n",
                "2",
                "--epochs",
                "2",
                "-o",
                out,
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    # The inference form is the same every epoch: one row, and the ops it applies named.
    assert "2 elements x 1 row as read" in captured.out
    assert (
        "augmentation deterministic (inference form): applied: random_resized_crop; "
        "not applied outside training: random_flip_left_right, random_brightness"
    ) in captured.out
    assert "no random augmentation" in captured.err
    preview = contact_sheet.gather(built.dataset_dir, "validation", n=2, epochs=3)
    assert not preview.random and len(preview.epochs) == 1
    assert preview.applied == ["random_resized_crop"]


def test_cli_training_draws_the_random_ops_on_another_split(built, tmp_path, capsys):
    out = str(tmp_path / "sheet.png")
    args = ["preview", built.dataset_dir, "--split", "validation", "--n", "2", "--epochs", "2"]
    assert cli.main([*args, "--training", "-o", out]) == 0
    captured = capsys.readouterr()
    assert "2 elements x 2 epoch(s), seed 0; augmentation random" in captured.out
    assert "no random augmentation" not in captured.err
    preview = contact_sheet.gather(built.dataset_dir, "validation", n=2, epochs=2, training=True)
    assert preview.random and len(preview.epochs) == 2
    assert preview.epochs[0][0].tobytes() != preview.epochs[1][0].tobytes()
    # And --no-training shows train in the inference form, without the note.
    assert cli.main([*args[:3], "train", *args[4:], "--no-training", "-o", out]) == 0
    captured = capsys.readouterr()
    assert "1 row as read; augmentation deterministic" in captured.out
    assert "no random augmentation" not in captured.err


def test_cli_batch_ops_are_shown_on_one_batch(built, tmp_path):
    out = str(tmp_path / "sheet.png")
    mixing = '[{"random_crop": {"size": 24}}, {"mixup": {"alpha": 0.4}}]'
    assert (
        cli.main(
            [
                "preview",
                built.dataset_dir,
                "--n",
                "4",
                "--epochs",
                "2",
                "--augment",
                mixing,
                "-o",
                out,
            ]
        )
        == 0
    )
    preview = contact_sheet.gather(
        built.dataset_dir, n=4, epochs=2, augment=[{"random_crop": {"size": 24}}, "mixup"]
    )
    assert contact_sheet.unchanged_columns(preview.epochs) == []


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--augment", "[oops"], "--augment: expected 'default', 'none' or a JSON list"),
        (["--augment", '["no_such_op"]'], "unknown augmentation op 'no_such_op'"),
        (["--split", "nope"], "has no split 'nope'"),
        (["--n", "0"], "--n must be at least 1"),
        (["--plugin", "no.such.module"], "--plugin: cannot import module 'no.such.module'"),
        # float() reads nan and inf (exit 70: cannot convert float NaN to integer), and a
        # huge zoom asked numpy for petabytes (exit 70: _ArrayMemoryError).
        (["--zoom", "nan"], "--zoom must be positive and finite, got nan"),
        (["--zoom", "inf"], "--zoom must be positive and finite, got inf"),
        (["--zoom", "1e6"], "--zoom: zoom 1e+06 makes a sheet of "),
        # One image can only mix with itself: not "randomness baked in at trace time".
        (
            ["--n", "1", "--augment", '["cutmix"]'],
            "batch ops need at least 2 images in a preview, got 1: cutmix mixes each image "
            "with another of its batch",
        ),
    ],
)
def test_cli_usage_errors_are_one_line(built, tmp_path, capsys, arguments, message):
    out = str(tmp_path / "sheet.png")
    assert cli.main(["preview", built.dataset_dir, "-o", out, *arguments]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kiln preview: error: ") and message in err[0]
    assert not os.path.exists(out)


@pytest.mark.parametrize("damage", ["flipped byte", "cut short"])
def test_a_damaged_shard_is_a_failed_preview_not_an_internal_error(built, tmp_path, capsys, damage):
    # A shard damaged after the build was exit 70, "internal error:
    # ...DataLossError: {{function_node __wrapped__IteratorGetNext...}}
    # corrupted record at 4806 [Op:IteratorGetNext]": a bug of kiln's, to a user.
    import shutil

    copy = tmp_path / "version"
    shutil.copytree(built.dataset_dir, copy)
    for shard in built.info.splits["train"].shards:  # whichever the preview reads first
        data = bytearray((copy / shard.filename).read_bytes())
        if damage == "flipped byte":
            data[20] ^= 0xFF  # in the first record, which the preview reads
        else:
            data = data[:100]
        (copy / shard.filename).write_bytes(bytes(data))
    out = tmp_path / "sheet.png"
    assert cli.main(["preview", str(copy), "-o", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    why = "(the file is damaged)" if damage == "flipped byte" else "(the file is truncated)"
    assert captured.err.startswith(
        f"kiln preview: failed: {copy}: a shard of split 'train' cannot be read: "
    ), captured.err
    assert captured.err.endswith(f"{why}; nothing was written; kiln verify {copy} names the file\n")
    assert captured.err.count("\n") == 1
    assert not out.exists()


def test_a_sheet_that_cannot_be_written_is_one_line_not_an_internal_error(built, tmp_path, capsys):
    """`-o` that TensorFlow could not write once the dataset was read and
    augmented (a full disk, a read-only folder) was exit 70, "internal
    error: ...PermissionDeniedError", with a traceback file, a bug of kiln's
    to a user; `-o` under a file said that file's folder "does not exist"."""
    # A full disk: the sheet's file is /dev/full, which takes no byte (ENOSPC).
    full = tmp_path / "full.png"
    os.symlink("/dev/full", full)
    assert cli.main(["preview", built.dataset_dir, "--n", "2", "-o", str(full)]) == 1
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == (
        "",
        f"kiln preview: failed: -o {full}: cannot write the sheet: No space left on device\n",
    )
    # Found before anything is read: a file where the folder should be.
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    out = a_file / "sheet.png"
    assert cli.main(["preview", built.dataset_dir, "-o", str(out)]) == 2
    assert capsys.readouterr().err == (f"kiln preview: error: -o {out}: {a_file} is not a folder\n")


def non_ascii_corpus(demo_corpus, root):
    """The demo's circles, squares and stars in class folders named in French
    and Chinese (OpenCV's fonts draw them "caf?" and "?")."""
    import shutil

    for folder, demo_class in [("café", "circle"), ("dog", "square"), ("猫", "star")]:
        shutil.copytree(os.path.join(demo_corpus.out_dir, demo_class), root / folder)
        for broken in (root / folder).glob("broken_*"):
            broken.unlink()
    return root


def test_class_names_that_are_not_ascii_are_drawn_as_their_ids(demo_corpus, tmp_path, capsys):
    import cv2

    from conftest import make_config
    from kiln.pipeline import build

    root = non_ascii_corpus(demo_corpus, tmp_path / "images")
    result = build(make_config(root, output=str(tmp_path / "out")))
    assert result.info.class_names == ["café", "dog", "猫"]

    out = str(tmp_path / "sheet.png")
    assert cli.main(["preview", result.dataset_root, "--n", "8", "-o", out]) == 0
    stdout = capsys.readouterr().out
    with open(out, "rb") as f:
        sheet = tf.io.decode_png(f.read()).numpy()
    preview = contact_sheet.gather(result.dataset_root, "train", n=8, epochs=3, seed=0)
    _, layout = contact_sheet.compose(preview)

    def caption(column, text):
        """The caption strip of `column` with `text` drawn as the sheet draws it."""
        strip = np.full((layout.caption_height + 4, layout.width, 3), 40, np.uint8)
        _, x = layout.cell_origin(0, column)
        font, scale = cv2.FONT_HERSHEY_SIMPLEX, contact_sheet._FONT_SCALE
        cv2.putText(strip, text, (x, layout.caption_height), font, scale, (235,) * 3, 1, 16)
        return strip[:, x : x + layout.cell_width]

    drawn = {"café": "#0 cafe", "dog": "dog", "猫": "#2"}
    question_marks = {"café": "caf?", "猫": "?"}
    for column, label in enumerate(preview.labels):
        name = result.info.class_names[label]
        _, x = layout.cell_origin(0, column)
        on_sheet = sheet[: layout.caption_height + 4, x : x + layout.cell_width]
        np.testing.assert_array_equal(on_sheet, caption(column, drawn[name]), err_msg=name)
        if name in question_marks:
            assert not np.array_equal(on_sheet, caption(column, question_marks[name])), name
    assert {result.info.class_names[label] for label in preview.labels} == set(drawn)

    # The legend maps the ids back, its keys lined up after the wide 猫.
    legend = stdout.splitlines()[1:]
    assert legend[-1] == (
        "  drawn (the sheet's font is ASCII only): 'café' as '#0 cafe', '猫' as '#2'"
    )
    for column, (key, label) in enumerate(zip(preview.keys, preview.labels, strict=True)):
        line = legend[column]
        assert line.startswith(f"  column {column + 1}: {result.info.class_names[label]}")
        before_key = line[: line.index(key)]  # 猫 takes two columns on a terminal
        columns = sum(2 if "\u4e00" <= c <= "\u9fff" else 1 for c in before_key)
        assert columns == len("  column 1: café  "), line


def test_tables_line_up_after_wide_class_names(demo_corpus, tmp_path, capsys):
    """`kiln inspect` and `kiln diff` pad class names by terminal columns: 猫 takes two."""
    import shutil
    import unicodedata

    from conftest import make_config
    from kiln.pipeline import build

    def columns(text):  # what a terminal gives `text`
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)

    root = non_ascii_corpus(demo_corpus, tmp_path / "images")
    config = make_config(root, output=str(tmp_path / "out"))
    first = build(config)
    star = sorted((root / "猫").iterdir())[0]
    shutil.copy(star, root / "猫" / "again.png")  # one more star: a row in every diff table
    (root / "猫" / "again.png").write_bytes(star.read_bytes() + b"\0")  # not a duplicate
    second = build(config)

    def rows_of(lines, names):
        return [line for line in lines if line.strip().split(" ")[0] in names]

    assert cli.main(["inspect", second.dataset_root]) == 0
    table = rows_of(capsys.readouterr().out.splitlines(), {"café", "dog", "猫"})
    assert len(table) == 3
    # The first count ends in the same terminal column on every row.
    ends = {columns(line[: line.index("  (label")]) for line in table}
    assert len(ends) == 1, table

    assert cli.main(["diff", first.dataset_dir, second.dataset_root]) == 0
    lines = capsys.readouterr().out.splitlines()
    shares = [line for line in rows_of(lines, {"café", "dog", "猫"}) if " -> " in line]
    assert len(shares) == 3, lines  # the class shares table: old -> new
    assert len({columns(line[: line.index(" -> ")]) for line in shares}) == 1, shares
    changes = [line for line in rows_of(lines, {"café", "dog", "猫"}) if " -> " not in line]
    assert len(changes) >= 3, lines  # split / class rows: seven right-aligned counts each
    assert len({columns(line) for line in changes}) == 1, changes


def test_many_columns_wrap_into_bands(built, tmp_path, capsys):
    """More elements than --columns wrap into bands, one under the other, each
    with its own stored and augmented rows, instead of one very wide strip."""
    preview = contact_sheet.gather(built.dataset_dir, "train", n=5, epochs=2, seed=0)
    sheet, layout = contact_sheet.compose(preview, zoom=1, text=False, wrap=2)
    assert (layout.bands, layout.band_columns) == (3, 2)
    one_band = contact_sheet.compose(preview, zoom=1, text=False)[1]
    assert one_band.bands == 1 and layout.width < one_band.width and layout.height > one_band.height
    assert sheet.shape == (layout.height, layout.width, 3)
    boxes = set()
    for row_index, row in enumerate([preview.stored, *preview.epochs]):
        for column, image in enumerate(row):
            box = layout.image_box(row_index, column, *image.shape[:2])
            np.testing.assert_array_equal(sheet[box], image)
            boxes.add((box[0].start, box[1].start))
    assert len(boxes) == 3 * 5  # no two cells overlap
    # The stored row of the second band comes under the first band's last row.
    assert layout.cell_origin(0, 2)[0] > layout.cell_origin(2, 0)[0]

    out = str(tmp_path / "sheet.png")
    args = ["preview", built.dataset_dir, "--n", "5", "--epochs", "2", "--columns", "2"]
    assert cli.main([*args, "-o", out]) == 0
    with open(out, "rb") as f:
        written = tf.io.decode_png(f.read()).numpy()
    np.testing.assert_array_equal(written, contact_sheet.compose(preview, wrap=2)[0])
    assert "5 elements x 2 epoch(s)" in capsys.readouterr().out
    assert cli.main([*args, "--columns", "0", "-o", out]) == 2
    assert "--columns must be at least 1" in capsys.readouterr().err


def test_sheets_wrap_after_16_columns_by_default(built):
    preview = contact_sheet.gather(built.dataset_dir, "train", n=17, epochs=1, seed=0)
    assert len(preview.keys) == 17
    _, layout = contact_sheet.compose(preview, zoom=1, text=False)
    assert (layout.bands, layout.band_columns) == (2, contact_sheet.WRAP) == (2, 16)
    assert layout.width == 4 + 16 * (32 + 4)


def test_batch_ops_on_images_of_varying_sizes_are_refused_before_reading(
    build_dataset, tmp_path, capsys
):
    varying = build_dataset(transforms=[], sharding={"num_shards": 1})  # image_size null
    assert varying.info.image_size is None
    out = str(tmp_path / "sheet.png")
    assert cli.main(["preview", varying.dataset_dir, "--augment", '["mixup"]', "-o", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kiln preview: error: "), err
    assert "split 'train' stores images of varying sizes" in err[0]
    assert "Put random_resized_crop or random_crop with a size before it" in err[0]
    assert "batch_size" not in err[0]  # a reader argument that preview does not take
    assert not os.path.exists(out)
    # With a crop to one size first, they mix.
    mixing = '[{"random_crop": {"size": 32}}, "mixup"]'
    arguments = ["--n", "2", "--epochs", "2", "--augment", mixing, "-o", out]
    assert cli.main(["preview", varying.dataset_dir, *arguments]) == 0


def test_quiet_prints_nothing_when_all_is_well(built, tmp_path, capsys):
    out = str(tmp_path / "sheet.png")
    args = ["preview", built.dataset_dir, "--n", "2", "--epochs", "2", "--quiet", "-o", out]
    assert cli.main(args) == 0
    assert capsys.readouterr() == ("", "")
    assert os.path.exists(out)
    # Problems are still said: augmentation that never changes is exit 1.
    never = '[{"random_flip_left_right": {"probability": 0.0}}]'
    assert cli.main([*args, "--augment", never]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "every element came out identical" in captured.err
    assert cli.main([*args[:-2], "--split", "validation", "-o", out]) == 0  # no note
    assert capsys.readouterr() == ("", "")
