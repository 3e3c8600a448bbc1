"""What the listing makes of the names and rows it reads: what it cannot use drops one
input with its reason, never the whole build.

- Names that are not text. A local file name need not be UTF-8 (Linux allows any bytes
  but '/' and NUL; Python gives the undecodable ones as surrogate escapes), and a JSON
  string can hold a lone surrogate (``"\\udce9"``). Neither can be a key, a record, a line
  of errors.jsonl or a part of the version's hash: such an input is dropped while listing
  (``bad_name`` for a folder's file, ``bad_row`` for a row), shown with what is not text
  escaped. So is a name with a control character (a newline, an escape), which would
  break a report's line or act on a terminal.
- A source folder whose own path is not UTF-8 (or holds a control character): its
  files build, and every row of errors.jsonl shows the path escaped.
- Class names: one rule for every source (`target_rows.class_name`).
- Rows: a JSONL object that gives a key twice; a CSV record the csv module refuses, and a
  quoted field that runs on over lines.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from conftest import make_config
from kiln.errors import ConfigError
from kiln.pipeline import build, error_report
from kiln.pipeline.config import load as load_config
from kiln.pipeline.sources import CocoSource, ImageFolderSource, ManifestSource, VocSource
from kiln.schemas import TargetsConfig
from kiln.transforms import encode_image


def png(value: int) -> bytes:
    return encode_image(np.full((16, 16, 3), value, np.uint8), format="png")


def write(root: str | bytes, relative: bytes, data: bytes) -> None:
    """Writes `data` at `root`/`relative`, a path given as bytes (any name Linux allows)."""
    path = os.path.join(os.fsencode(root), relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def listed(source, **kwargs) -> tuple[list[str], dict[str, tuple[str, str, str]], list[str]]:
    """(keys of the files, dropped rows by key as (reason, uri, message), class names);
    the listing's hash and its error report are made, as the build makes them."""
    with source.list_files(splits_from_source=kwargs.pop("splits", False), **kwargs) as listing:
        files = [f.key for f in listing.files()]
        dropped = list(listing.dropped())
        listing.listing_hash()
        listing.dropped_entries_hash()
        error_report.render(dropped)
        return files, {d.key: (d.reason, d.uri, d.message) for d in dropped}, listing.class_names


def test_a_name_that_is_not_utf8_drops_its_file_with_the_bytes_escaped(tmp_path):
    root = tmp_path / "images"
    write(root, b"cat/ok.png", png(1))
    write(root, b"cat/caf\xe9.png", png(2))  # Latin-1, not UTF-8
    write(root, b"d\xf6g/x.png", png(3))  # a class folder
    write(root, b"cat/sub\xff/y.png", png(4))  # a folder below a class folder
    write(root, b"loose\xe9.png", png(5))  # at the root

    files, dropped, class_names = listed(ImageFolderSource(type="image_folder", root=str(root)))

    assert files == ["cat/ok.png"] and class_names == ["cat"]
    assert dropped == {
        "cat/caf\\xe9.png": (
            "bad_name",
            f"{root}/cat/caf\\xe9.png",
            "file name is not valid UTF-8: caf\\xe9.png",
        ),
        "d\\xf6g/x.png": (
            "bad_name",
            f"{root}/d\\xf6g/x.png",
            "class folder name is not valid UTF-8: d\\xf6g",
        ),
        "cat/sub\\xff/y.png": (
            "bad_name",
            f"{root}/cat/sub\\xff/y.png",
            "folder name is not valid UTF-8: sub\\xff",
        ),
        "loose\\xe9.png": (
            "bad_name",
            f"{root}/loose\\xe9.png",
            "file name is not valid UTF-8: loose\\xe9.png",
        ),
    }


@pytest.mark.parametrize(
    "name, shown, why",
    [
        (b"tr\xe4in", "tr\\xe4in", "is not valid UTF-8"),
        (b"tr\x1bain", "tr\\x1bain", "holds a control character (U+001B)"),
    ],
)
def test_a_split_folder_whose_name_is_not_text_is_named(tmp_path, name, shown, why):
    root = tmp_path / "images"
    write(root, b"train/cat/ok.png", png(1))
    write(root, name + b"/cat/x.png", png(2))

    files, dropped, _ = listed(ImageFolderSource(type="image_folder", root=str(root)), splits=True)

    assert files == ["train/cat/ok.png"]
    assert dropped[f"{shown}/cat/x.png"][::2] == ("bad_name", f"split folder name {why}: {shown}")


def test_a_build_drops_a_name_that_is_not_utf8_and_writes_its_report(tmp_path):
    root = tmp_path / "images"
    for i in range(9):
        write(root, f"cat/{i}.png".encode(), png(10 * i))
    write(root, b"cat/caf\xe9.png", png(99))

    result = build(
        make_config(
            str(root),
            output=str(tmp_path / "out"),
            transforms=[],
            splits={"fractions": {"train": 1.0}},
            sharding={"num_shards": 1},
            errors={"max_fraction": 0.2},
        )
    )

    assert result.info.dropped == {"bad_name": 1}
    assert result.info.splits["train"].num_examples == 9
    with open(os.path.join(result.dataset_dir, "errors.jsonl"), encoding="utf-8") as f:
        assert [json.loads(line) for line in f] == [
            {
                "key": "cat/caf\\xe9.png",
                "uri": f"{root}/cat/caf\\xe9.png",
                "stage": "list",
                "reason": "bad_name",
                "message": "file name is not valid UTF-8: caf\\xe9.png",
            }
        ]


def test_a_name_with_a_control_character_drops_its_file_shown_escaped(tmp_path):
    root = tmp_path / "images"
    write(root, b"cat/ok.png", png(1))
    write(root, b"cat/two\nlines.png", png(2))
    write(root, b"cat/\x1b[31mred.png", png(3))  # a terminal's colour escape
    write(root, b"cat/sub\rfolder/y.png", png(4))  # a folder below a class folder
    write(root, b"dog\t/x.png", png(5))  # a class folder: the class name rule would strip it
    write(root, b"loose\x7f.png", png(6))  # at the root: bad_name before the layout

    files, dropped, class_names = listed(ImageFolderSource(type="image_folder", root=str(root)))

    assert files == ["cat/ok.png"] and class_names == ["cat"]
    assert dropped == {
        "cat/two\\nlines.png": (
            "bad_name",
            f"{root}/cat/two\\nlines.png",
            "file name holds a control character (U+000A): two\\nlines.png",
        ),
        "cat/\\x1b[31mred.png": (
            "bad_name",
            f"{root}/cat/\\x1b[31mred.png",
            "file name holds a control character (U+001B): \\x1b[31mred.png",
        ),
        "cat/sub\\rfolder/y.png": (
            "bad_name",
            f"{root}/cat/sub\\rfolder/y.png",
            "folder name holds a control character (U+000D): sub\\rfolder",
        ),
        "dog\\t/x.png": (
            "bad_name",
            f"{root}/dog\\t/x.png",
            "class folder name holds a control character (U+0009): dog\\t",
        ),
        "loose\\x7f.png": (
            "bad_name",
            f"{root}/loose\\x7f.png",
            "file name holds a control character (U+007F): loose\\x7f.png",
        ),
    }


def test_a_manifest_path_with_a_control_character_is_a_bad_row(tmp_path):
    images = tmp_path / "images"
    write(images, b"a.png", png(1))
    write(images, b"b\nc.png", png(2))
    write(images, b"\x1bd.png", png(3))
    rows = [
        {"path": "images/a.png", "label": "cat"},
        {"path": "images/b\nc.png", "label": "cat"},
        {"path": "images/\x1bd.png", "label": "cat"},
    ]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    # A quoted CSV field may hold a line break.
    (tmp_path / "m.csv").write_text(
        'path,label\nimages/a.png,cat\n"images/b\nc.png",cat\n"images/\x1bd.png",cat\n'
    )

    for name, lines in (("m.jsonl", (2, 3)), ("m.csv", (3, 5))):
        manifest = tmp_path / name
        files, dropped, _ = listed(ManifestSource(type="manifest", path=str(manifest)))

        assert files == ["images/a.png"], name
        assert dropped == {
            f"{name}:{lines[0]}": (
                "bad_row",
                str(manifest),
                'path: "images/b\\nc.png" holds a control character (U+000A)',
            ),
            f"{name}:{lines[1]}": (
                "bad_row",
                str(manifest),
                'path: "images/\\u001bd.png" holds a control character (U+001B)',
            ),
        }, name


def test_a_build_below_a_folder_whose_path_is_not_text_reports_it_escaped(tmp_path):
    # The config sits in the folder, so its relative root is below it: the
    # only way a source's own path can be any bytes.
    folder = os.path.join(os.fsencode(tmp_path), b"caf\xe9 \x1b[1m")
    root = os.path.join(folder, b"images")
    for i in range(9):
        write(root, f"cat/{i}.png".encode(), png(10 * i))
    write(root, b"cat/bad.png", b"\x89PNG\r\n\x1a\n" + bytes(40))  # dropped by the job
    config = make_config(
        "images",
        output=str(tmp_path / "out"),
        transforms=[],
        splits={"fractions": {"train": 1.0}},
        sharding={"num_shards": 1},
        errors={"max_fraction": 0.2},
    )
    config_path = os.path.join(folder, b"config.yaml")
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f)  # JSON is YAML

    result = build(os.fsdecode(config_path))

    assert result.info.dropped == {"corrupt": 1}
    assert result.info.splits["train"].num_examples == 9
    shown = f"{tmp_path}/caf\\xe9 \\x1b[1m/images"
    assert result.info.provenance["source"]["root"] == shown
    with open(os.path.join(result.dataset_dir, "errors.jsonl"), encoding="utf-8") as f:
        assert [json.loads(line) for line in f] == [
            {
                "key": "cat/bad.png",
                "uri": f"{shown}/cat/bad.png",
                "stage": "decode",
                "reason": "corrupt",
                "message": "PNG header is damaged or truncated (the first chunk is not a "
                "13-byte IHDR)",
            }
        ]


def test_a_build_of_masks_below_a_folder_whose_path_is_not_text(tmp_path):
    # The rows' targets name their mask files by path: below such a folder,
    # the listing's targets, its stamp and the job's elements hold the path.
    folder = os.path.join(os.fsencode(tmp_path), b"m\xe9")
    mask = np.zeros((16, 16, 1), np.uint8)
    mask[4:8, 4:8] = 1
    rows = []
    for i in range(6):
        write(folder, f"images/{i}.png".encode(), png(10 * i))
        write(folder, f"masks/{i}.png".encode(), encode_image(mask, format="png"))
        rows.append({"path": f"images/{i}.png", "label": "cat", "mask": f"masks/{i}.png"})
    write(folder, b"images/bad.png", b"not an image")
    rows.append({"path": "images/bad.png", "label": "cat", "mask": "masks/0.png"})
    write(folder, b"m.jsonl", "".join(json.dumps(row) + "\n" for row in rows).encode())
    config = make_config(
        "unused",
        output=str(tmp_path / "out"),
        source={"type": "manifest", "path": "m.jsonl", "classes": ["background", "cat"]},
        targets={"label": {}, "mask": {}},
        transforms=[],
        splits={"fractions": {"train": 1.0}},
        sharding={"num_shards": 1},
        errors={"max_fraction": 0.2},
    )
    config_path = os.path.join(folder, b"config.yaml")
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f)

    result = build(os.fsdecode(config_path))

    assert result.info.dropped == {"not_an_image": 1}
    assert result.info.splits["train"].num_examples == 6
    with open(os.path.join(result.dataset_dir, "errors.jsonl"), encoding="utf-8") as f:
        ((key, uri),) = [(row["key"], row["uri"]) for row in map(json.loads, f)]
    assert (key, uri) == ("images/bad.png", f"{tmp_path}/m\\xe9/images/bad.png")


def test_every_field_of_a_dropped_row_is_escaped_wherever_it_is_made():
    row = error_report.DroppedFile(
        "a\nb.png", "decode", "corrupt", "/data/caf\udce9/a\nb.png", "line 1\nline 2\x1b\x85"
    )

    assert row == error_report.DroppedFile(
        "a\\nb.png", "decode", "corrupt", "/data/caf\\xe9/a\\nb.png", "line 1\\nline 2\\x1b\\x85"
    )
    assert error_report.as_text(row.message) == row.message  # escaping twice changes nothing
    assert error_report.render([row]).decode("utf-8").count("\n") == 1


def test_a_json_row_with_a_lone_surrogate_is_a_bad_row(tmp_path):
    images = tmp_path / "images"
    for name in ("a.png", "b.png", "c.png"):
        write(images, name.encode(), png(1))
    manifest = tmp_path / "m.jsonl"
    # json.dumps writes a lone surrogate as the escape "\udce9", which is valid JSON.
    rows = [
        {"path": "images/a.png", "label": "cat"},
        {"path": "images/\udce9.png", "label": "cat"},
        {"path": "images/b.png", "label": "bad\ud800"},
        {"path": "images/c.png", "label": "dog"},
    ]
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")

    files, dropped, class_names = listed(ManifestSource(type="manifest", path=str(manifest)))

    assert files == ["images/a.png", "images/c.png"] and class_names == ["cat", "dog"]
    assert dropped == {
        "m.jsonl:2": (
            "bad_row",
            str(manifest),
            'path: "images/\\udce9.png" is not valid Unicode text (a lone surrogate)',
        ),
        "m.jsonl:3": (
            "bad_row",
            str(manifest),
            "'label': \"bad\\ud800\" is not valid Unicode text (a lone surrogate)",
        ),
    }


def test_targets_with_a_lone_surrogate_are_a_bad_row(tmp_path):
    images = tmp_path / "images"
    for name in ("a.png", "b.png", "c.png", "d.png"):
        write(images, name.encode(), png(1))
    targets = TargetsConfig.model_validate({"labels": {}, "boxes": {}, "extra": {"note": "string"}})
    good = {"labels": ["cat"], "objects": [], "note": "fine"}
    rows = [
        {"path": "images/a.png", **good},
        {"path": "images/b.png", **good, "labels": ["\udce9"]},
        {"path": "images/c.png", **good, "objects": [{"bbox": [0, 0, 1, 1], "class": "\ud800"}]},
        {"path": "images/d.png", **good, "note": "caf\udce9"},
    ]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")

    files, dropped, class_names = listed(
        ManifestSource(type="manifest", path=str(manifest)), targets=targets
    )

    assert files == ["images/a.png"] and class_names == ["cat"]
    assert {key: message for key, (_, _, message) in dropped.items()} == {
        "m.jsonl:2": 'labels[0]: "\\udce9" is not valid Unicode text (a lone surrogate)',
        "m.jsonl:3": 'objects[0].class: "\\ud800" is not valid Unicode text (a lone surrogate)',
        "m.jsonl:4": 'note: "caf\\udce9" is not valid Unicode text (a lone surrogate)',
    }


def test_a_voc_file_whose_name_is_not_utf8_is_reported_escaped(tmp_path):
    annotations, images = tmp_path / "Annotations", tmp_path / "JPEGImages"
    write(images, b"1.jpg", png(1))
    write(annotations, b"good.xml", b"<annotation><filename>1.jpg</filename></annotation>")
    write(annotations, b"caf\xe9.xml", b"<annotation>")  # cut short, and not a UTF-8 name

    source = VocSource(type="voc", annotations=str(annotations), images=str(images))
    targets = TargetsConfig.model_validate({"boxes": {}})
    files, dropped, _ = listed(source, targets=targets)

    assert files == ["1.jpg"]
    ((key, (reason, uri, _)),) = dropped.items()
    assert (key, reason, uri) == ("caf\\xe9.xml", "bad_row", f"{annotations}/caf\\xe9.xml")


# --- class names: one rule for every source ------------------------------------------

# A label as written -> the class it is, or the start of the bad row's message.
LABELS = {
    "cat": "cat",
    " cat ": "cat",  # stripped, as a CSV cell always was
    "dog\t": "dog",
    7: "7",  # an integer is its text
    "": "'label' is empty",
    "  ": "'label' is only whitespace",
    "multi\nline": "'label' holds a control character (U+000A)",
    "tab\there": "'label' holds a control character (U+0009)",
    "nul\x00": "'label' holds a control character (U+0000)",
    "c1\x85c1": "'label' holds a control character (U+0085)",
    True: "'label': expected a class name, got true",
    None: "'label': expected a class name, got null",
    # A broken row's megabytes of text, not a class (labels files, kiln.json).
    "x" * 1024: "x" * 1024,
    "y" * 1025: "'label' is 1025 characters long, more than a class name's 1024",
}


def test_a_jsonl_label_is_read_by_the_class_name_rule(tmp_path):
    rows = [{"path": f"images/{i}.png", "label": label} for i, label in enumerate(LABELS)]
    rows.append({"path": "images/no_label.png"})
    for row in rows:
        write(tmp_path, row["path"].encode(), png(1))
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    source = ManifestSource(type="manifest", path=str(tmp_path / "m.jsonl"))
    with source.list_files(splits_from_source=False) as listing:
        classes = {f.key: listing.class_names[f.label] for f in listing.files()}
        messages = {d.key: d.message for d in listing.dropped()}

    expected_classes, expected_messages = {}, {}
    for i, read in enumerate(LABELS.values()):
        if read.startswith("'label'"):
            expected_messages[f"m.jsonl:{i + 1}"] = read
        else:
            expected_classes[f"images/{i}.png"] = read
    assert classes == expected_classes
    assert sorted(messages) == sorted([*expected_messages, f"m.jsonl:{len(rows)}"])
    for key, start in expected_messages.items():
        assert messages[key].startswith(start), (key, messages[key])
    assert messages[f"m.jsonl:{len(rows)}"] == "'label' is missing: expected a class name"


def test_csv_and_jsonl_read_the_same_class_names(tmp_path):
    for i in range(4):
        write(tmp_path, f"images/{i}.png".encode(), png(i))
    labels = [" cat", "cat ", "dog", "tab\there"]
    (tmp_path / "m.jsonl").write_text(
        "".join(
            json.dumps({"path": f"images/{i}.png", "label": label}) + "\n"
            for i, label in enumerate(labels)
        )
    )
    (tmp_path / "m.csv").write_text(
        "path,label\n" + "".join(f'images/{i}.png,"{label}"\n' for i, label in enumerate(labels))
    )

    results = []
    for name in ("m.jsonl", "m.csv"):
        source = ManifestSource(type="manifest", path=str(tmp_path / name))
        with source.list_files(splits_from_source=False) as listing:
            files = [(f.key, listing.class_names[f.label]) for f in listing.files()]
            dropped = [(d.reason, d.message) for d in listing.dropped()]
            results.append((files, dropped))

    jsonl, csv = results
    assert (
        jsonl[0]
        == csv[0]
        == [("images/0.png", "cat"), ("images/1.png", "cat"), ("images/2.png", "dog")]
    )
    assert jsonl[1] == [("bad_row", "'label' holds a control character (U+0009): \"tab\\there\"")]
    assert csv[1] == [("bad_row", 'label holds a control character (U+0009): "tab\\there"')]


def test_target_class_names_follow_the_rule(tmp_path):
    for i in range(4):
        write(tmp_path, f"images/{i}.png".encode(), png(i))
    targets = TargetsConfig.model_validate({"labels": {}, "boxes": {}})
    rows = [
        {"labels": [" cat", "dog "], "objects": [{"bbox": [0, 0, 1, 1], "class": " cat "}]},
        {"labels": ["a\nb"], "objects": []},
        {"labels": [], "objects": [{"bbox": [0, 0, 1, 1], "class": " "}]},
        {"labels": [], "objects": [{"bbox": [0, 0, 1, 1], "class": ""}]},
    ]
    (tmp_path / "m.jsonl").write_text(
        "".join(json.dumps({"path": f"images/{i}.png", **row}) + "\n" for i, row in enumerate(rows))
    )
    (tmp_path / "m.csv").write_text("path,labels\nimages/0.png, cat | dog \nimages/1.png,a\x1fb\n")

    files, dropped, class_names = listed(
        ManifestSource(type="manifest", path=str(tmp_path / "m.jsonl")), targets=targets
    )
    assert files == ["images/0.png"] and class_names == ["cat", "dog"]
    assert {key: message for key, (_, _, message) in dropped.items()} == {
        "m.jsonl:2": 'labels[0] holds a control character (U+000A): "a\\nb"',
        "m.jsonl:3": 'objects[0].class is only whitespace: " "',
        "m.jsonl:4": "objects[0].class is empty",
    }

    only_labels = TargetsConfig.model_validate({"labels": {}})
    files, dropped, class_names = listed(
        ManifestSource(type="manifest", path=str(tmp_path / "m.csv")), targets=only_labels
    )
    assert files == ["images/0.png"] and class_names == ["cat", "dog"]
    assert dropped["m.csv:3"][2] == 'labels holds a control character (U+001F): "a\\u001fb"'


def test_a_missing_jsonl_key_names_the_rows_misspelt_key(tmp_path):
    # A JSONL row's unknown keys are not read, so a misspelt key showed only as
    # the key it was meant to be, missing, in every row ("'objects' is
    # missing"), the misspelling in no message.
    for i in range(5):
        write(tmp_path, f"images/{i}.png".encode(), png(i))
    rows = [
        {"path": "images/0.png", "label": "cat"},
        {"path": "images/1.png", "lable": "cat"},
        {"pth": "images/2.png", "label": "cat"},
        {"path": "images/3.png", "labels": ["cat"]},
        {"path": "images/4.png", "category": "cat"},  # nothing close: as before
    ]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    files, dropped, _ = listed(ManifestSource(type="manifest", path=str(tmp_path / "m.jsonl")))
    assert files == ["images/0.png"]
    assert {key: message for key, (_, _, message) in dropped.items()} == {
        "m.jsonl:2": "'label' is missing: expected a class name; the row has 'lable' (misspelt?)",
        "m.jsonl:3": "'path' must be a non-empty string; the row has 'pth' (misspelt?)",
        "m.jsonl:4": "'label' is missing: expected a class name; the row has 'labels' (misspelt?)",
        "m.jsonl:5": "'label' is missing: expected a class name",
    }

    boxes = TargetsConfig.model_validate({"label": {}, "boxes": {}})
    targets_rows = [
        {"path": "images/0.png", "label": "cat", "objects": []},
        {"path": "images/1.png", "label": "cat", "objcts": []},
    ]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(row) + "\n" for row in targets_rows))
    files, dropped, _ = listed(
        ManifestSource(type="manifest", path=str(tmp_path / "t.jsonl")), targets=boxes
    )
    assert files == ["images/0.png"] and dropped["t.jsonl:2"][2] == (
        "'objects' is missing: expected a list of objects (\"objects\": [] for none); "
        "the row has 'objcts' (misspelt?)"
    )


def test_class_folders_follow_the_rule_without_losing_their_files(tmp_path):
    root = tmp_path / "images"
    write(root, b"cat/1.png", png(1))
    write(root, b"cat /2.png", png(2))  # one class with cat/
    write(root, b"tab\there/3.png", png(3))
    write(root, b" /4.png", png(4))

    files, dropped, class_names = listed(ImageFolderSource(type="image_folder", root=str(root)))

    assert class_names == ["cat"]
    assert files == ["cat /2.png", "cat/1.png"]  # each its own key
    assert {key: message for key, (_, _, message) in dropped.items()} == {
        "tab\\there/3.png": 'class folder name holds a control character (U+0009): "tab\\there"',
        " /4.png": 'class folder name is only whitespace: " "',
    }
    assert {reason for reason, _, _ in dropped.values()} == {"bad_name"}


def test_coco_category_names_follow_the_rule(tmp_path):

    write(tmp_path, b"images/1.png", png(1))
    boxes = TargetsConfig.model_validate({"boxes": {}})

    def coco(categories) -> CocoSource:
        (tmp_path / "i.json").write_text(
            json.dumps(
                {
                    "images": [{"id": 1, "file_name": "1.png"}],
                    "annotations": [
                        {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1]}
                    ],
                    "categories": categories,
                }
            )
        )
        return CocoSource(
            type="coco", annotations=str(tmp_path / "i.json"), images=str(tmp_path / "images")
        )

    source = coco([{"id": 1, "name": " cat "}, {"id": 2, "name": "dog"}])
    with source.list_files(splits_from_source=False, targets=boxes) as listing:
        (file,) = listing.files()
        assert listing.class_names == ["cat", "dog"]
        assert json.loads(file.targets)["objects"][0]["class"] == "cat"

    source = coco([{"id": 1, "name": "cat"}, {"id": 2, "name": "a\nb"}])
    with pytest.raises(ConfigError, match=r"categories\[1\]: 'name' holds a control character"):
        source.list_files(splits_from_source=False, targets=boxes)


@pytest.mark.parametrize(
    ("classes", "message"),
    [
        (["cat", "dog "], r"source.classes: item 1: 'dog ' has surrounding whitespace"),
        (["cat", " "], r"source.classes: item 1 is only whitespace"),
        (["a\nb"], r"source.classes: item 0 holds a control character \(U\+000A\)"),
    ],
)
def test_the_config_refuses_a_class_no_input_could_carry(tmp_path, classes, message):

    config = tmp_path / "c.yaml"
    config.write_text(
        json.dumps(
            {
                "name": "x",
                "source": {"type": "manifest", "path": "m.jsonl", "classes": classes},
                "output": "out",
            }
        )
    )
    with pytest.raises(ConfigError, match=message):
        load_config(str(config))


def test_a_build_of_untrimmed_jsonl_labels_writes_its_tfds_labels_file(tmp_path):
    for i in range(6):
        write(tmp_path, f"images/{i}.png".encode(), png(20 * i))
    labels = ["cat ", " cat", "dog", "dog\n", "cat", "dog"]
    (tmp_path / "m.jsonl").write_text(
        "".join(
            json.dumps({"path": f"images/{i}.png", "label": label}) + "\n"
            for i, label in enumerate(labels)
        )
    )
    result = build(
        make_config(
            str(tmp_path),
            source={"type": "manifest", "path": str(tmp_path / "m.jsonl")},
            output=str(tmp_path / "out"),
            transforms=[],
            splits={"fractions": {"train": 1.0}},
            sharding={"num_shards": 1},
        )
    )
    assert result.info.class_names == ["cat", "dog"]
    with open(os.path.join(result.dataset_dir, "image.class.label.labels.txt")) as f:
        assert f.read() == "cat\ndog\n"


def test_a_jsonl_object_with_a_key_given_twice_is_a_bad_row(tmp_path):
    for name in ("a.png", "b.png", "c.png"):
        write(tmp_path, f"images/{name}".encode(), png(1))
    targets = TargetsConfig.model_validate({"label": {}, "boxes": {}})
    (tmp_path / "m.jsonl").write_text(
        '{"path": "images/a.png", "label": "dog", "objects": []}\n'
        '{"path": "images/b.png", "label": "dog", "label": "cat", "objects": []}\n'
        '{"path": "images/c.png", "label": "dog", "objects": [{"bbox": [0, 0, 1, 1], '
        '"class": "dog", "class": "cat"}]}\n'
    )

    files, dropped, _ = listed(
        ManifestSource(type="manifest", path=str(tmp_path / "m.jsonl")), targets=targets
    )

    assert files == ["images/a.png"]
    assert {key: (reason, message) for key, (reason, _, message) in dropped.items()} == {
        "m.jsonl:2": ("bad_row", 'duplicate key "label" in a JSON object'),
        "m.jsonl:3": ("bad_row", 'duplicate key "class" in a JSON object'),
    }


# --- CSV records the csv module refuses, and quoted fields that run on ---------------


def csv_listing(tmp_path, text: str, targets: TargetsConfig | None = None):
    for i in range(5):
        write(tmp_path, f"images/{i}.png".encode(), png(i))
    (tmp_path / "m.csv").write_text(text)
    kwargs = {} if targets is None else {"targets": targets}
    return listed(ManifestSource(type="manifest", path=str(tmp_path / "m.csv")), **kwargs)


def test_a_csv_field_beyond_the_csv_limit_is_a_bad_row_and_the_rest_is_read(tmp_path):
    huge = "x" * 200_000  # the csv module's field size limit is 131,072 characters
    files, dropped, _ = csv_listing(
        tmp_path,
        "path,label\n"
        "images/0.png,cat\n"
        f"images/1.png,{huge}\n"
        "images/2.png,cat\n"
        f'images/3.png,"{huge}\nstill,in,the,field"\n'
        "images/4.png,dog\n",
    )
    assert files == ["images/0.png", "images/2.png", "images/4.png"]
    messages = {key: message for key, (_, _, message) in dropped.items()}
    assert messages["m.csv:3"] == "not valid CSV: field larger than field limit (131072)"
    # Refused while still in its first line: the next line is read as a record of its own.
    assert messages["m.csv:5"] == "not valid CSV: field larger than field limit (131072)"
    assert messages["m.csv:6"] == "expected 2 fields, got 4"
    assert set(messages) == {"m.csv:3", "m.csv:5", "m.csv:6"}


def test_any_csv_error_is_a_bad_row(tmp_path):
    # A carriage return inside an unquoted field: the csv module refuses the record.
    files, dropped, _ = csv_listing(
        tmp_path, "path,label\nimages/0.png,cat\nimages/1.png,c\rat\nimages/2.png,dog\n"
    )
    assert files == ["images/0.png", "images/2.png"]
    assert list(dropped) == ["m.csv:3"]
    assert dropped["m.csv:3"][2].startswith("not valid CSV: new-line character seen in unquoted")


def test_a_csv_with_targets_reads_past_a_refused_record(tmp_path):
    targets = TargetsConfig.model_validate({"label": {}, "extra": {"note": "string"}})
    files, dropped, _ = csv_listing(
        tmp_path,
        f"path,label,note\nimages/0.png,cat,{'n' * 140_000}\nimages/1.png,cat,short\n",
        targets,
    )
    assert files == ["images/1.png"]
    assert dropped["m.csv:2"][2] == "not valid CSV: field larger than field limit (131072)"


def test_a_header_the_csv_module_refuses_is_a_config_error(tmp_path):

    with pytest.raises(ConfigError, match=r"m.csv: line 1: not valid CSV: field larger"):
        csv_listing(tmp_path, f"path,label{'x' * 140_000}\nimages/0.png,cat\n")


def test_an_unterminated_quote_drops_its_line_and_the_rows_after_it_are_read(tmp_path):
    # The quote runs on to the end of the file: the rows it swallowed are rows again.
    files, dropped, _ = csv_listing(
        tmp_path,
        'path,label\nimages/0.png,cat\n"images/1.png,cat\nimages/2.png,cat\nimages/3.png,dog\n',
    )
    assert files == ["images/0.png", "images/2.png", "images/3.png"]
    assert dropped == {
        "m.csv:3": (
            "bad_row",
            str(tmp_path / "m.csv"),
            "not valid CSV: unexpected end of data at line 5, in a quoted field that starts "
            "on this line: an unterminated quote? (lines 4 to 5 are read as rows of their own)",
        )
    }


def csv_extras(tmp_path, text: str, column: str, images: int) -> tuple[dict, dict]:
    """The string extra `column` of each file a CSV manifest `text` lists (with
    `images` images written), and the dropped rows' messages, by key."""
    targets = TargetsConfig.model_validate({"label": {}, "extra": {column: "string"}})
    for i in range(images):
        write(tmp_path, f"images/{i}.png".encode(), png(i))
    (tmp_path / "m.csv").write_text(text)
    source = ManifestSource(type="manifest", path=str(tmp_path / "m.csv"))
    with source.list_files(splits_from_source=False, targets=targets) as listing:
        values = {f.key: json.loads(f.targets)["extra"][column] for f in listing.files()}
        return values, {d.key: d.message for d in listing.dropped()}


def test_an_unterminated_quote_in_a_string_column_loses_no_row_and_no_value(tmp_path):
    """A string column takes any text, line breaks too: an unterminated quote in it
    ran on, silently, until a later row's quoted field closed it, and the rows between
    were one value. A quote closed by text after it (``"b"x``) is not CSV: the line
    that opened the quote is the bad row, the others are read as they were written."""
    text = (
        "path,label,weather\n"
        "images/0.png,cat,sunny\n"
        'images/1.png,dog,"unterminated\n'
        "images/2.png,cat,fog\r\n"
        "images/3.png,cat,fog\n"
        'images/4.png,dog,"quoted"\n'
        'images/5.png,dog,"two\nlines"\n'  # a quoted line break is CSV: one value
    )
    weathers, dropped = csv_extras(tmp_path, text, "weather", 6)

    assert weathers == {
        "images/0.png": "sunny",
        "images/2.png": "fog",
        "images/3.png": "fog",
        "images/4.png": "quoted",
        "images/5.png": "two\nlines",
    }
    assert dropped == {
        "m.csv:3": "not valid CSV: ',' expected after '\"' at line 6, in a quoted field that "
        "starts on this line: an unterminated quote? (lines 4 to 6 are read as rows of their own)"
    }


def test_spaces_after_a_quote_closed_over_lines_read_as_before(tmp_path):
    # A quoted line break, closed, then a space: a row, as the csv module's
    # default reading takes it; not a runaway quote.
    text = 'path,label,note\nimages/0.png,cat,"first line\nsecond line" \nimages/1.png,dog,x\n'
    notes, dropped = csv_extras(tmp_path, text, "note", 2)
    assert dropped == {}
    assert notes == {"images/0.png": "first line\nsecond line ", "images/1.png": "x"}


def test_text_after_a_closing_quote_on_one_line_is_read_as_before(tmp_path):
    # The strict reading that ends a runaway quote is for quotes that run on
    # over lines: on one line, a space after a closing quote is read leniently.
    files, dropped, _ = csv_listing(tmp_path, 'path,label\n"images/0.png" ,cat\nimages/1.png,cat\n')
    assert dropped == {}
    assert files == ["images/0.png", "images/1.png"]  # paths are stripped


def test_a_quoted_field_over_lines_is_one_row_at_its_first_line(tmp_path):
    # A quoted line break is CSV: the row is good, unless its label is not a class name.
    files, dropped, _ = csv_listing(
        tmp_path,
        'path,label\n"images/0.png",cat\nimages/1.png,"cat\nimages/2.png,dog"\nimages/3.png,dog\n',
    )
    assert files == ["images/0.png", "images/3.png"]
    assert dropped["m.csv:3"][2] == (
        'label holds a control character (U+000A): "cat\\nimages/2.png,dog" '
        "(a quoted field runs on over 2 lines, to line 4: an unterminated quote?)"
    )


def test_a_split_column_the_build_does_not_use_is_named_once(tmp_path, caplog):
    """A manifest with a split column and splits.from_source off: the splits
    come from the fractions, and the listing says the column is ignored."""
    write(tmp_path, b"a/x.png", png(1))
    write(tmp_path, b"a/y.png", png(2))
    manifest = tmp_path / "manifest.csv"
    manifest.write_text("path,label,split\na/x.png,a,\na/y.png,a,test\n")
    source = ManifestSource(type="manifest", path=str(manifest))
    with caplog.at_level("WARNING", logger="kiln.pipeline.sources"):
        with source.list_files(splits_from_source=False) as listing:
            assert listing.num_files == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        f"{manifest}: rows name a split (manifest.csv:3: 'test') that the build does not use: "
        "the splits come from splits.fractions; splits.from_source: true takes the source's"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="kiln.pipeline.sources"):
        with source.list_files(splits_from_source=True) as listing:
            assert listing.num_dropped == 1  # the row without a split: missing_split
    assert not [r for r in caplog.records if "does not use" in r.getMessage()]


@pytest.mark.parametrize(
    "name, text, targets",
    [
        ("m.csv", "path,label,splt\nimages/0.png,a,train\nimages/1.png,a,test\n", None),
        (
            "m.csv",
            "path,labels,Splits\nimages/0.png,a|b,train\nimages/1.png,a,test\n",
            {"labels": {}},
        ),
        (
            "m.jsonl",
            '{"path": "images/0.png", "label": "a", "split": "train"}\n'
            '{"path": "images/1.png", "label": "a", "spilt": "test"}\n',
            None,
        ),
    ],
    ids=["csv", "csv-targets", "jsonl"],
)
def test_a_misspelt_split_column_is_named_where_the_split_is_missing(tmp_path, name, text, targets):
    # With splits.from_source, a manifest whose column (or a JSONL row's key)
    # is misspelt lost every such row as "needs a split for every row", with
    # nothing naming the column the build did not read.
    for i in range(2):
        write(tmp_path, f"images/{i}.png".encode(), png(i))
    (tmp_path / name).write_text(text)
    kwargs = {} if targets is None else {"targets": TargetsConfig.model_validate(targets)}
    source = ManifestSource(type="manifest", path=str(tmp_path / name))
    said = "splits.from_source needs a split for every row; the row has '{}' (misspelt?)"
    if name == "m.csv":  # a column: every row lost, so no usable image
        with pytest.raises(ConfigError) as raised:
            listed(source, splits=True, **kwargs)
        column = text.split("\n")[0].split(",")[-1]
        assert str(raised.value).endswith(
            f"no usable input image (2 dropped while listing, e.g. m.csv:2: {said.format(column)})"
        ), raised.value
        return
    files, dropped, _ = listed(source, splits=True, **kwargs)
    assert files == ["images/0.png"]
    assert dropped == {
        "m.jsonl:2": ("missing_split", str(tmp_path / name), said.format("spilt"))
    }, dropped


CAFE_NFC = "caf\u00e9"  # a precomposed é: how most tools write text
CAFE_NFD = "cafe\u0301"  # e and a combining accent: how macOS names folders


def test_class_names_that_differ_only_in_unicode_normalization_are_one_class(tmp_path):
    root = tmp_path / "images"
    write(root, f"{CAFE_NFD}/1.png".encode(), png(1))
    write(root, f"{CAFE_NFC}/2.png".encode(), png(2))
    write(root, b"tea/3.png", png(3))

    files, dropped, class_names = listed(ImageFolderSource(type="image_folder", root=str(root)))

    assert class_names == [CAFE_NFC, "tea"] and not dropped
    assert sorted(files) == sorted([f"{CAFE_NFD}/1.png", f"{CAFE_NFC}/2.png", "tea/3.png"])

    # A manifest's labels, and the declared class list, match by the same rule.
    rows = [{"path": "images/tea/3.png", "label": CAFE_NFD}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    source = ManifestSource(
        type="manifest", path=str(tmp_path / "m.jsonl"), classes=[CAFE_NFC, "tea"]
    )
    with source.list_files(splits_from_source=False) as listing:
        assert [listing.class_names[f.label] for f in listing.files()] == [CAFE_NFC]


def test_split_folders_without_from_source_suggest_it(tmp_path):
    # root/train/<class>/<image> without splits.from_source said only "if
    # root/train holds that layout, make it source.root": a build of train alone.
    root = tmp_path / "images"
    for split in ("train", "val"):
        write(root, f"{split}/roses/1.png".encode(), png(1))
    source = ImageFolderSource(type="image_folder", root=str(root))
    with pytest.raises(ConfigError) as error:
        source.list_files(splits_from_source=False).close()
    assert str(error.value).endswith(
        "not in the layout root/<class>/<image>); if "
        f"{root}/train holds that layout, make it source.root; if 'train' is a split, "
        "set splits.from_source: true"
    ), str(error.value)


@pytest.mark.parametrize(
    "splits, deeper", [(False, "all/flowers"), (True, "all")], ids=["classes", "splits"]
)
def test_images_one_folder_too_deep_name_the_folder_that_holds_the_layout(tmp_path, splits, deeper):
    root = tmp_path / "images"
    for name in ("roses", "tulips"):
        write(root, f"all/flowers/{name}/1.png".encode(), png(1))
    source = ImageFolderSource(type="image_folder", root=str(root))

    with pytest.raises(ConfigError) as error:
        source.list_files(splits_from_source=splits).close()

    layout = "<split>/<class>/<image>" if splits else "<class>/<image>"
    assert str(error.value) == (
        f"source.root: {root}: no usable input image (2 dropped while listing, e.g. "
        f"all/flowers/roses/1.png: not in the layout root/{layout}); if {root}/{deeper} "
        f"holds that layout, make it source.root"
    )


def test_a_duplicate_key_names_what_its_rows_give_differently(tmp_path):
    """Two rows of one image that differ only in an extra column's value (a
    trailing space) were "different labels, splits or targets": the message
    names the field to reconcile."""
    targets = TargetsConfig.model_validate({"labels": {}, "extra": {"weather": "string"}})
    rows = [
        {"path": "images/0.png", "labels": ["cat"], "weather": "sun"},
        {"path": "images/1.png", "labels": ["cat"], "weather": "sun"},
        {"path": "images/1.png", "labels": ["cat"], "weather": "sun "},
        {"path": "images/2.png", "labels": ["cat"], "weather": "fog"},
        {"path": "images/2.png", "labels": ["dog"], "weather": "rain"},
    ]
    for i in range(3):
        write(tmp_path, f"images/{i}.png".encode(), png(i))
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    source = ManifestSource(type="manifest", path=str(tmp_path / "m.jsonl"))
    files, dropped, _ = listed(source, targets=targets)

    assert files == ["images/0.png"]
    assert dropped["images/1.png"][2] == (
        "listed 2 times with different extra.weather (lines 2, 3)"
    )
    assert dropped["images/2.png"][2] == (
        "listed 2 times with different extra.weather, labels (lines 4, 5)"
    )
