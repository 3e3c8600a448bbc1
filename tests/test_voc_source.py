"""The VOC source: one XML file per image, read back as manifest rows and listed."""

from __future__ import annotations

import json

import pytest

from kiln.errors import ConfigError
from kiln.pipeline import voc
from kiln.pipeline.config import load as load_config
from kiln.pipeline.sources import VocSource
from kiln.pipeline.voc import VocProblem, VocRow
from kiln.schemas import TargetsConfig

GOOD = b"""<annotation>
  <folder>VOC2012</folder>
  <filename>2007_000027.jpg</filename>
  <size><width>486</width><height>500</height><depth>3</depth></size>
  <object>
    <name>person</name><pose>Unspecified</pose>
    <truncated>1</truncated><difficult>0</difficult>
    <bndbox><xmin>174</xmin><ymin>101</ymin><xmax>349</xmax><ymax>351</ymax></bndbox>
    <part><name>head</name><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>2</xmax><ymax>2</ymax>
    </bndbox></part>
  </object>
  <object>
    <name> dog </name>
    <bndbox><xmin>1</xmin><ymin>1.5</ymin><xmax>10</xmax><ymax>20</ymax></bndbox>
  </object>
</annotation>
"""

BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lollollollollollollollollollol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<annotation><filename>&lol9;</filename></annotation>
"""


def test_a_voc_file_becomes_a_manifest_row():
    row = voc.parse(GOOD)
    assert row == {
        "path": "2007_000027.jpg",
        "objects": [
            # 1-based inclusive pixel indices -> continuous corners; parts ignored.
            {
                "class": "person",
                "bbox": [173, 100, 349, 351],
                "difficult": 0,
                "truncated": 1,
                "occluded": 0,
            },
            {
                "class": "dog",
                "bbox": [0, 0.5, 10, 20],
                "difficult": 0,
                "truncated": 0,
                "occluded": 0,
            },
        ],
        # <size>, for the job to compare with the image (targets.annotations_frame).
        "size as declared": {"width": 486, "height": 500, "by": "<size>"},
    }


def test_a_folder_reads_every_xml_file_in_order_and_reports_bad_ones(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.xml").write_bytes(GOOD)
    (tmp_path / "sub" / "a.xml").write_bytes(GOOD.replace(b"2007_000027", b"other"))
    (tmp_path / "c.xml").write_bytes(b"<annotation><filename>x.jpg</filename>")  # cut short
    (tmp_path / "d.xml").write_bytes(b"<annotation><object><name>a</name></object></annotation>")
    (tmp_path / "e.xml").write_bytes(GOOD.replace(b"<xmin>174</xmin>", b"<xmin>wide</xmin>", 1))
    (tmp_path / "f.xml").write_bytes(BILLION_LAUGHS)
    (tmp_path / "g.xml").write_bytes(
        GOOD.replace(b"<bndbox><xmin>1</xmin><ymin>1.5", b"<box><xmin>1</xmin><ymin>1.5").replace(
            b"<ymax>20</ymax></bndbox>", b"<ymax>20</ymax></box>"
        )
    )
    (tmp_path / "notes.txt").write_text("not an annotation")
    (tmp_path / ".hidden.xml").write_bytes(GOOD)

    found = list(voc.read_folder(str(tmp_path)))
    assert [f.where for f in found] == [
        "b.xml",
        "c.xml",
        "d.xml",
        "e.xml",
        "f.xml",
        "g.xml",
        "sub/a.xml",
    ]
    rows = [f for f in found if isinstance(f, VocRow)]
    assert [r.row["path"] for r in rows] == ["2007_000027.jpg", "other.jpg"]
    problems = {f.where: f.message for f in found if isinstance(f, VocProblem)}
    assert problems["c.xml"].startswith("not well-formed XML")
    assert problems["d.xml"] == "<filename> is missing or empty"
    assert problems["e.xml"] == "objects[0]: <xmin> must be a number, got 'wide'"
    # In VOC's words, not the manifest's ("bbox: expected 4 numbers [x_min, ...], got null").
    assert problems["g.xml"] == "objects[1]: no <bndbox>"
    # expat refuses the entity expansion bomb instead of building gigabytes.
    assert problems["f.xml"].startswith("not well-formed XML")


def test_a_file_in_an_xml_namespace_is_named_so(tmp_path):
    """Its <filename> is there, but as {namespace}filename: the message says why
    it is not found."""
    namespaced = GOOD.replace(b"<annotation>", b'<annotation xmlns="http://example.com/voc">', 1)
    assert namespaced != GOOD
    (tmp_path / "a.xml").write_bytes(namespaced)
    (problem,) = voc.read_folder(str(tmp_path))
    assert isinstance(problem, VocProblem)
    assert problem.message == (
        "<filename> is missing or empty: the file puts its elements in the XML namespace "
        "'http://example.com/voc' (an xmlns attribute), where VOC's have none; remove it"
    )


def test_a_linked_folder_inside_the_annotations_folder_is_a_problem_not_entered(tmp_path):
    """A link can lead anywhere (``/`` would walk the machine and parse every
    .xml on it): named, not entered. The annotations folder itself may be a link."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret.xml").write_bytes(GOOD)
    folder = tmp_path / "annotations"
    folder.mkdir()
    (folder / "b.xml").write_bytes(GOOD)
    (folder / "more").symlink_to(elsewhere, target_is_directory=True)
    (folder / "root").symlink_to("/", target_is_directory=True)
    linked_top = tmp_path / "linked-annotations"
    linked_top.symlink_to(folder, target_is_directory=True)

    for top in (folder, linked_top):
        found = list(voc.read_folder(str(top)))
        assert [f.where for f in found] == ["b.xml", "more", "root"]
        assert isinstance(found[0], VocRow)
        for problem in found[1:]:
            assert isinstance(problem, VocProblem)
            assert problem.message.startswith("a linked folder: not entered")


def test_an_oversized_file_is_refused_unread(tmp_path):
    (tmp_path / "big.xml").write_bytes(b" " * (voc.MAX_FILE_BYTES + 1))
    (found,) = voc.read_folder(str(tmp_path))
    assert isinstance(found, VocProblem) and "larger than" in found.message


def test_the_source_lists_each_file_as_an_image_with_its_boxes(tmp_path):
    annotations, images = tmp_path / "Annotations", tmp_path / "JPEGImages"
    annotations.mkdir()
    images.mkdir()
    (annotations / "one.xml").write_bytes(GOOD)
    (annotations / "two.xml").write_bytes(GOOD.replace(b"2007_000027", b"missing"))
    (annotations / "bad.xml").write_bytes(b"<annotation>")
    # A second object without a name: its row fails the row validation.
    unnamed = GOOD.replace(b"2007_000027", b"unnamed").replace(b"<name> dog </name>", b"")
    (annotations / "unnamed.xml").write_bytes(unnamed)
    (images / "2007_000027.jpg").write_bytes(b"listing does not decode images")
    source = VocSource(type="voc", annotations=str(annotations), images=str(images))
    targets = TargetsConfig.model_validate({"boxes": {"fields": {"difficult": "int"}}})
    with source.list_files(splits_from_source=False, targets=targets) as listing:
        (file,) = listing.files()
        rows = {d.key: d for d in listing.dropped()}
        dropped = {key: d.reason for key, d in rows.items()}
        class_names = listing.class_names
    assert class_names == ["dog", "person"]  # the names found
    assert json.loads(file.targets)["objects"] == [
        {"bbox": [173.0, 100.0, 349.0, 351.0], "class": "person", "fields": {"difficult": 0}},
        {"bbox": [0.0, 0.5, 10.0, 20.0], "class": "dog", "fields": {"difficult": 0}},
    ]
    assert dropped == {"bad.xml": "bad_row", "unnamed.xml": "bad_row", "missing.jpg": "missing"}
    # A bad file's row names the file itself, not the folder; objects count from 0.
    assert rows["bad.xml"].uri == str(annotations / "bad.xml")
    assert rows["unnamed.xml"].uri == str(annotations / "unnamed.xml")
    assert rows["unnamed.xml"].message == "objects[1].class is empty"


def listed_objects(tmp_path, fields):
    """key -> the objects' declared fields as listed, and key -> the message
    of each file dropped, for a folder of VOC files whose flags vary."""
    annotations, images = tmp_path / "Annotations", tmp_path / "JPEGImages"
    annotations.mkdir(exist_ok=True)
    images.mkdir(exist_ok=True)
    flags = {  # as converters write them: KITTI's truncation is a fraction
        "a": b"<truncated>0.00</truncated><difficult>0</difficult>",
        "b": b"<truncated>0.5</truncated><difficult>1</difficult>",
        "c": b"<difficult>yes</difficult>",
    }
    for name, written in flags.items():
        xml = (
            b"<annotation><filename>" + name.encode() + b".jpg</filename><object><name>car"
            b"</name>" + written + b"<bndbox><xmin>1</xmin><ymin>1</ymin><xmax>5</xmax>"
            b"<ymax>5</ymax></bndbox></object></annotation>"
        )
        (annotations / f"{name}.xml").write_bytes(xml)
        (images / f"{name}.jpg").write_bytes(b"listing does not decode images")
    source = VocSource(type="voc", annotations=str(annotations), images=str(images))
    targets = TargetsConfig.model_validate({"boxes": {"fields": fields}})
    with source.list_files(splits_from_source=False, targets=targets) as listing:
        kept = {
            f.key: [o["fields"] for o in json.loads(f.targets)["objects"]] for f in listing.files()
        }
        dropped = {d.key: d.message for d in listing.dropped()}
    return kept, dropped


def test_only_the_declared_flags_are_checked_against_their_declared_type(tmp_path):
    """A fraction ``<truncated>0.00</truncated>`` dropped the file as a
    bad row even where the config did not declare ``truncated``, or
    declared it a float."""
    kept, dropped = listed_objects(tmp_path, {"difficult": "int"})
    assert kept == {"a.jpg": [{"difficult": 0}], "b.jpg": [{"difficult": 1}]}
    assert dropped == {"c.xml": 'objects[0].difficult: expected an integer, got "yes"'}

    kept, dropped = listed_objects(tmp_path, {"truncated": "float"})
    assert kept == {
        "a.jpg": [{"truncated": 0.0}],
        "b.jpg": [{"truncated": 0.5}],
        "c.jpg": [{"truncated": 0.0}],  # absent: 0
    }
    assert dropped == {}

    kept, dropped = listed_objects(tmp_path, {"truncated": "int"})
    assert kept == {"c.jpg": [{"truncated": 0}]}
    assert dropped == {
        "a.xml": "objects[0].truncated: expected an integer, got 0.0",
        "b.xml": "objects[0].truncated: expected an integer, got 0.5",
    }


def test_the_config_accepts_boxes_only_from_voc(tmp_path):
    (tmp_path / "a.xml").write_bytes(GOOD)
    config = {
        "name": "voc",
        "source": {"type": "voc", "annotations": str(tmp_path), "images": str(tmp_path)},
        "output": str(tmp_path.parent / "out"),
        "targets": {"boxes": {}, "instance_masks": {}},
    }
    with pytest.raises(ConfigError, match=r"targets.instance_masks: a voc source gives boxes only"):
        load_config(config)
    # Every target it cannot give at once, as every other config problem.
    config["targets"] = {
        "boxes": {"fields": {"area": "float"}},
        "labels": {},
        "extra": {"camera": "int"},
    }
    with pytest.raises(ConfigError) as refused:
        load_config(config)
    assert str(refused.value).splitlines()[1:] == [
        "  targets.labels: a voc source gives boxes only",
        "  targets.extra: a voc source gives boxes only",
        "  targets.boxes.fields.area: a voc object has no 'area'; it gives difficult, truncated, "
        "occluded only",
    ]


@pytest.mark.parametrize("field", ["area", "pose"])
def test_the_config_refuses_fields_a_voc_object_cannot_give(tmp_path, field):
    (tmp_path / "a.xml").write_bytes(GOOD)
    config = {
        "name": "voc",
        "source": {"type": "voc", "annotations": str(tmp_path), "images": str(tmp_path)},
        "output": str(tmp_path.parent / "out"),
        "targets": {"boxes": {"fields": {"difficult": "int", field: "float"}}},
    }
    with pytest.raises(ConfigError) as raised:
        load_config(config)
    assert str(raised.value).endswith(
        f"targets.boxes.fields.{field}: a voc object has no {field!r}; it gives difficult, "
        f"truncated, occluded only"
    )
    config["targets"] = {"boxes": {"fields": {"difficult": "int", "occluded": "float"}}}
    assert load_config(config).targets.boxes.fields == {"difficult": "int", "occluded": "float"}


def test_an_image_two_files_name_is_named_by_its_files(tmp_path):
    annotations, images = tmp_path / "Annotations", tmp_path / "JPEGImages"
    (annotations / "sub").mkdir(parents=True)
    images.mkdir()
    (annotations / "one.xml").write_bytes(GOOD)
    (annotations / "sub" / "two.xml").write_bytes(GOOD.replace(b"person", b"horse"))
    (annotations / "three.xml").write_bytes(GOOD.replace(b"2007_000027", b"other"))
    for name in ("2007_000027.jpg", "other.jpg"):
        (images / name).write_bytes(b"listing does not decode images")
    source = VocSource(type="voc", annotations=str(annotations), images=str(images))
    targets = TargetsConfig.model_validate({"boxes": {}})
    with source.list_files(splits_from_source=False, targets=targets) as listing:
        assert [f.key for f in listing.files()] == ["other.jpg"]
        (dropped,) = listing.dropped()
    assert (dropped.key, dropped.reason) == ("2007_000027.jpg", "duplicate_key")
    assert dropped.message == ("listed 2 times with different objects (one.xml, sub/two.xml)")
