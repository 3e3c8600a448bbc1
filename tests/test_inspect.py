"""`kiln inspect`: the summary of a real build, as text and JSON, and its errors."""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import time
import tracemalloc

import pytest

from conftest import make_config
from kiln import cli
from kiln.schemas import ERRORS_FILENAME, METADATA_FILENAME, MetadataError
from kiln.tools import inspection


@pytest.fixture(scope="module")
def built(build_dataset):
    return build_dataset()


def test_summary_matches_the_build(built, demo_corpus):
    info = built.info
    summary = inspection.inspect_dataset(built.dataset_root)  # follows LATEST
    assert summary["dataset_dir"] == built.dataset_dir
    assert (summary["name"], summary["version"]) == (info.name, info.version)
    assert list(summary["splits"]) == ["train", "validation", "test"]
    for name, split in info.splits.items():
        got = summary["splits"][name]
        assert got["num_examples"] == split.num_examples
        assert got["num_shards"] == len(split.shards)
        assert got["num_bytes"] == sum(s.num_bytes for s in split.shards)
        assert [s["filename"] for s in got["shards"]] == split.filenames
        assert got["class_counts"] == split.class_counts
        assert got["statistics"]["mean"] == split.statistics.mean
    assert summary["class_names"] == ["circle", "square", "star", "triangle"]
    assert sum(summary["class_counts"].values()) == sum(
        s.num_examples for s in info.splits.values()
    )
    assert summary["encoding"] == {
        "format": "png",
        "quality": None,
        "channels": 3,
        "image_size": [32, 32],
        "smallest_size": None,  # one size: image_size says it
        "compression": None,
    }
    assert summary["transforms"] == info.config["transforms"]
    assert summary["dropped"] == {reason: 1 for reason in demo_corpus.broken.values()}
    assert {row["key"]: row["reason"] for row in summary["errors"]} == demo_corpus.broken
    assert summary["tfds"] is True
    assert summary["duplicates"] == 0 and summary["duplicate_groups"] == []
    assert summary["warnings"] == []


def test_duplicate_groups_are_in_the_summary(duplicates_build, capsys):
    result, groups = duplicates_build
    summary = inspection.inspect_dataset(result.dataset_dir)
    assert summary["duplicates"] == 3
    assert sorted(group["keys"] for group in summary["duplicate_groups"]) == sorted(groups)
    assert all(set(group) == {"sha256", "keys", "splits"} for group in summary["duplicate_groups"])
    assert summary["warnings"] == []
    assert cli.main(["inspect", result.dataset_dir, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["duplicate_groups"] == summary["duplicate_groups"]
    assert cli.main(["inspect", result.dataset_dir]) == 0
    out = capsys.readouterr().out
    assert (
        "duplicates: 3 source file(s) with the same content as another (rows in "
        "duplicates.jsonl):" in out
    )
    for keys in groups:
        assert any(all(key in line for key in keys) for line in out.splitlines()), keys


def test_text_summary(built, demo_corpus, capsys):
    assert cli.main(["inspect", built.dataset_dir]) == 0
    out = capsys.readouterr().out
    info = built.info
    assert out.startswith(f"shapes  version {info.version}")
    total = sum(split.num_examples for split in info.splits.values())
    requested = info.config["splits"]["fractions"]
    for name, split in info.splits.items():
        # The fraction reached, next to the one requested.
        fraction = [f"{split.num_examples / total:.1%}", "(asked", f"{requested[name] * 100:g}%)"]
        assert any(
            line.split()[:6] == [name, str(split.num_examples), str(len(split.shards)), *fraction]
            for line in out.splitlines()
        ), name
    # Hashed splits: the gap is chance, and the line says what balances it.
    (balance,) = [line for line in out.splitlines() if "of its share per split" in line]
    assert balance.startswith("  split by hash, not stratified: every class within ")
    assert balance.endswith(
        " examples of its share per split (splits.stratify: true balances them)"
    )
    for label, class_name in enumerate(info.class_names):
        counts = [
            str(info.splits[s].class_counts[class_name]) for s in ("train", "validation", "test")
        ]
        total = str(sum(s.class_counts[class_name] for s in info.splits.values()))
        assert f"{' '.join([class_name, *counts, total])} (label {label})" in " ".join(
            out.split()
        ), class_name
    assert "resize: interpolation=auto, shorter_side=40" in out
    assert "center_crop: size=32" in out
    for key in demo_corpus.broken:
        assert key in out
    assert f"dropped: {len(demo_corpus.broken)} file(s)" in out


def test_json_output_is_the_summary(built, capsys):
    assert cli.main(["inspect", built.dataset_root, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == inspection.inspect_dataset(built.dataset_root)


def test_not_a_dataset_is_one_line_and_exit_2(tmp_path, capsys):
    assert cli.main(["inspect", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kiln inspect: error: {tmp_path / 'nothing'}: no such dataset folder"]

    (tmp_path / "empty").mkdir()
    assert cli.main(["inspect", str(tmp_path / "empty")]) == 2
    assert "is not a kiln dataset" in capsys.readouterr().err


def test_a_dataset_whose_first_build_failed_says_so_and_names_the_error_report(
    demo_corpus, tmp_path, capsys
):
    from kiln.pipeline import BuildError, build

    # Every file of the demo corpus's broken ones is dropped: too many for max_fraction 0.
    config = make_config(demo_corpus.out_dir, output=str(tmp_path), errors={"max_fraction": 0})
    with pytest.raises(BuildError, match="nothing was published"):
        build(config)
    root = str(tmp_path / "shapes")
    (staging,) = [name for name in os.listdir(root) if name.startswith(".staging-")]
    report = os.path.join(root, staging, ERRORS_FILENAME)
    for command in ("inspect", "verify", "preview"):
        args = [command, root] + (
            ["-o", str(tmp_path / "sheet.png")] if command == "preview" else []
        )
        assert cli.main(args) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"{root} is a dataset folder with no published version yet" in line, command
        assert f"A failed build's error report is {report}." in line, command
    with pytest.raises(MetadataError, match="no published version yet"):
        inspection.inspect_dataset(root)


def test_inconsistent_error_report_is_flagged(built, tmp_path, capsys):
    copy = str(tmp_path / "copy")
    shutil.copytree(built.dataset_dir, copy)
    with open(os.path.join(copy, ERRORS_FILENAME)) as f:
        rows = f.readlines()
    with open(os.path.join(copy, ERRORS_FILENAME), "w") as f:
        f.writelines(rows[1:])
    summary = inspection.inspect_dataset(copy)
    assert len(summary["warnings"]) == 1 and ERRORS_FILENAME in summary["warnings"][0]
    assert cli.main(["inspect", copy]) == 0
    assert f"warning: {ERRORS_FILENAME} has" in capsys.readouterr().out

    os.remove(os.path.join(copy, ERRORS_FILENAME))
    summary = inspection.inspect_dataset(copy)
    assert summary["errors"] is None
    assert "is missing" in summary["warnings"][0]

    with open(os.path.join(copy, ERRORS_FILENAME), "w") as f:
        f.write("{not json\n")
    with pytest.raises(MetadataError, match=f"{ERRORS_FILENAME}:1: not valid JSON"):
        inspection.inspect_dataset(copy)

    os.remove(os.path.join(copy, METADATA_FILENAME))
    assert cli.main(["inspect", copy]) == 2


def test_splits_in_reading_order_with_the_shares_reached(built):
    # BASE_CONFIG asks for train 0.7, validation 0.15, test 0.15.
    from kiln.pipeline.command import summary as build_summary

    summary = inspection.inspect_dataset(built.dataset_root)
    total = sum(split["num_examples"] for split in summary["splits"].values())
    requested = {"train": 0.7, "validation": 0.15, "test": 0.15}
    for name, fraction in requested.items():
        split = summary["splits"][name]
        assert split["requested_share"] == fraction
        assert split["share"] == split["num_examples"] / total
    expected = {
        name: f"{100 * summary['splits'][name]['share']:.1f}% (asked {100 * fraction:g}%)"
        for name, fraction in requested.items()
    }
    for text in (inspection.render(summary), build_summary(built)):
        rows = [line.split() for line in text.splitlines() if line.startswith("  ")]
        named = [row for row in rows if row[0] in requested and row[1].isdigit()]
        assert [row[0] for row in named] == ["train", "validation", "test"], text
        for row in named:
            assert expected[row[0]] in " ".join(row), text


@pytest.mark.parametrize("dataset", ["built", "duplicates_build"])
def test_json_output_is_what_json_dump_writes(dataset, request, capsys):
    # --json streams the rows, character for character as json.dump of the
    # whole summary would write them.
    result = request.getfixturevalue(dataset)
    path = (result[0] if isinstance(result, tuple) else result).dataset_dir
    assert cli.main(["inspect", path, "--json"]) == 0
    expected = json.dumps(inspection.inspect_dataset(path), indent=2, sort_keys=True) + "\n"
    assert capsys.readouterr().out == expected


def test_streamed_rows_are_written_as_json_dump_writes_them(tmp_path):
    rows = [
        {"key": "a/1.jpg", "message": "line one\nline two \u2028 caf\u00e9", "nested": {"b": [1]}},
        {"key": "a/2.jpg", "empty": {}, "list": [], "none": None},
    ]
    full, empty = tmp_path / "full.jsonl", tmp_path / "empty.jsonl"
    full.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    empty.write_text("")
    summary = {"z": 1, "rows": rows, "none": None, "empty": [], "map": {"x": [1, {"y": "\u00e9"}]}}
    streamed = dict(
        summary,
        rows=inspection.ReportRows(str(full)),
        empty=inspection.ReportRows(str(empty)),
    )
    out = io.StringIO()
    inspection.write_json(streamed, out)
    assert out.getvalue() == json.dumps(summary, indent=2, sort_keys=True)


@pytest.mark.parametrize("form", [["--json"], []], ids=["json", "text"])
def test_the_output_streams_the_rows(built, tmp_path, monkeypatch, form):
    # Memory does not grow with the rows: the peak of Python allocations while
    # `kiln inspect --json` writes 40000 errors.jsonl rows (about 10 MB) to a
    # file, or the text summary counts them, is that of 1000, give or take far
    # less than their size (holding them as dicts would take over 40 MB more).
    def peak_while_inspecting(rows: int) -> int:
        copy = tmp_path / f"copy-{rows}"
        shutil.copytree(built.dataset_dir, copy)
        with open(copy / ERRORS_FILENAME, "w") as f:
            for i in range(rows):
                row = {"key": f"k/{i:06d}.jpg", "reason": "corrupt", "stage": "decode"}
                f.write(json.dumps({**row, "message": "x" * 200}) + "\n")
        with open(tmp_path / f"out-{rows}.json", "w") as out:
            monkeypatch.setattr(sys, "stdout", out)
            tracemalloc.start()
            try:
                assert cli.main(["inspect", str(copy), *form]) == 0
                return tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
                monkeypatch.undo()

    small, large = peak_while_inspecting(1000), peak_while_inspecting(40000)
    assert large - small < 2_000_000, (small, large)
    written = (tmp_path / "out-40000.json").read_text()
    if form:
        errors = json.loads(written)["errors"]
        assert len(errors) == 40000 and errors[-1]["key"] == "k/039999.jpg"
    else:  # the first rows as examples, and a warning that counted them all
        assert "      k/000000.jpg: " + "x" * 200 + "\n" in written
        assert "'corrupt': 40000" in written


def test_inspect_says_why_tfds_cannot_read_a_dataset(build_dataset, capsys):
    gzip = build_dataset(sharding={"compression": "gzip"})
    assert cli.main(["inspect", gzip.dataset_dir]) == 0
    why = "shards are gzip-compressed; TFDS reads uncompressed TFRecords only"
    assert f"TFDS: not readable: {why}\n" in capsys.readouterr().out
    summary = inspection.inspect_dataset(gzip.dataset_dir)
    assert summary["tfds"] is False and summary["tfds_unsupported"] == why


def test_inspect_names_the_folder_tfds_reads(built, capsys):
    # Given <output>/<name>, the line said "tfds.builder_from_directory(folder)",
    # and that folder is the one TFDS cannot read (it does not follow LATEST):
    # DatasetInfoFileError. It names the version folder, which TFDS reads.
    import ast

    import tensorflow_datasets as tfds

    assert cli.main(["inspect", built.dataset_root]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("TFDS: ")]
    call = "TFDS: readable with tfds.builder_from_directory("
    assert line == f"{call}{built.dataset_dir!r})"
    folder = ast.literal_eval(line.removeprefix(call)[:-1])
    builder = tfds.builder_from_directory(folder)
    assert builder.info.splits["train"].num_examples == built.info.splits["train"].num_examples


def test_images_of_varying_size_show_their_least_height_and_width(build_dataset, capsys):
    varying = build_dataset(transforms=[], sharding={"num_shards": 1})
    height, width = varying.info.smallest_size
    assert cli.main(["inspect", varying.dataset_dir]) == 0
    line = f"varying sizes (least height {height}, least width {width})"
    assert line in capsys.readouterr().out
    summary = inspection.inspect_dataset(varying.dataset_dir)
    assert summary["encoding"]["image_size"] is None
    assert summary["encoding"]["smallest_size"] == [height, width]


def incomplete_copy(dataset_dir, dataset_root, version="0123456789ab"):
    """What a build killed while it copied its version to an object store
    leaves: a version folder with shards and no kiln.json."""
    folder = os.path.join(dataset_root, version)
    shutil.copytree(dataset_dir, folder)
    os.remove(os.path.join(folder, METADATA_FILENAME))
    return folder


def test_incomplete_version_folders_are_named_until_the_next_build_deletes_them(
    demo_corpus, tmp_path, capsys
):
    from conftest import make_config
    from kiln.pipeline import build

    config = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    result = build(config)
    root = result.dataset_root
    incomplete = incomplete_copy(result.dataset_dir, root)
    os.mkdir(os.path.join(root, "notes"))  # not named like a version: never deleted, not named

    line = (
        "incomplete version folder(s), no kiln.json (left by an interrupted build or prune; "
        f"never read; the next kiln build deletes them): {incomplete}"
    )
    assert cli.main(["inspect", root]) == 0
    assert line in capsys.readouterr().out.splitlines()
    assert inspection.inspect_dataset(root)["incomplete_versions"] == [incomplete]
    # A version folder is only that version: nothing about its neighbours.
    assert cli.main(["inspect", result.dataset_dir]) == 0
    assert "incomplete version folder" not in capsys.readouterr().out
    # The folder itself is refused, saying what it is.
    assert cli.main(["inspect", incomplete]) == 2
    assert f"It is an incomplete version folder of the dataset {root}" in capsys.readouterr().err

    # What the line promises: the next build (up to date here) deletes it.
    assert build(config).up_to_date
    visible = sorted(name for name in os.listdir(root) if not name.startswith("."))
    assert visible == sorted(["LATEST", "notes", result.version])
    assert cli.main(["inspect", root]) == 0
    assert "incomplete version folder" not in capsys.readouterr().out


def stale_staging(dataset_root, age_seconds=2 * 3600 + 5 * 60, size=1000):
    """What a build killed with SIGKILL leaves: its staging folder, with a
    work file last written `age_seconds` ago."""
    folder = os.path.join(dataset_root, ".staging-0123456789ab-dead")
    os.makedirs(os.path.join(folder, ".work"))
    work_file = os.path.join(folder, ".work", "listing.sqlite")
    with open(work_file, "wb") as f:
        f.write(b"x" * size)
    then = time.time() - age_seconds
    os.utime(work_file, (then, then))
    os.utime(folder, (then, then))
    return folder, then


def test_staging_folders_are_named_with_whether_a_build_holds_the_lock(
    build_dataset, demo_corpus, tmp_path, capsys
):
    from conftest import make_config
    from kiln.pipeline import build
    from kiln.pipeline.lock import DatasetLock

    result = build_dataset()
    root = str(tmp_path / "out" / "shapes")
    shutil.copytree(result.dataset_root, root)
    staging, written = stale_staging(root)

    assert cli.main(["inspect", root]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("staging folder(s) of builds that did not finish (never read):")
    assert lines[at + 1 :] == [
        f"  {staging}  1 file(s), 1000 B, last written 2 h 5 min ago",
        "  no build holds the dataset's lock: left by a build that was killed, or kept for its "
        "errors.jsonl by one that dropped too many files. The next kiln build of the dataset "
        f"deletes them; to free the space now, while no build runs: rm -r {staging}",
    ]
    summary = inspection.inspect_dataset(root)
    assert summary["staging_folders"] == [
        {"path": staging, "num_files": 1, "num_bytes": 1000, "modified": written}
    ]
    assert summary["lock"]["held"] is False

    # While a build holds the lock, the folder may be its own: leave it.
    with DatasetLock(root) as held:
        assert cli.main(["inspect", root]) == 0
        out = capsys.readouterr().out
        summary = inspection.inspect_dataset(root)
    me = held._me.describe()
    assert (
        f"  a build of the dataset is running: it holds the lock ({me}); leave them: it "
        "deletes those of earlier builds itself, its own when it ends\n"
    ) in out
    assert "rm -r" not in out
    assert summary["lock"]["held"] is True and summary["lock"]["holder"]["pid"] == os.getpid()

    # A version folder is only that version: nothing about its neighbours.
    version_dir = os.path.join(root, result.version)
    assert cli.main(["inspect", version_dir]) == 0
    assert "staging folder" not in capsys.readouterr().out
    assert inspection.inspect_dataset(version_dir)["staging_folders"] == []

    # What the line promises: the next build (up to date here) deletes it.
    assert build(make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))).up_to_date
    assert not os.path.exists(staging)
    assert cli.main(["inspect", root]) == 0
    assert "staging folder" not in capsys.readouterr().out
    assert inspection.inspect_dataset(root)["lock"] is None


def test_examples_of_a_reason_are_its_first_rows_by_line_number():
    """errors.jsonl sorts keys as text (``m.jsonl:16`` before ``m.jsonl:6``);
    the examples inspect shows are the first lines of the file, in order."""
    rows = [
        {"key": f"m.jsonl:{line}", "reason": "bad_row", "message": "x"}
        for line in sorted(range(2, 40, 3), key=str)
    ] + [
        {"key": "b/1.png", "reason": "missing", "message": "y"},
        {"key": "scans/page5\u00b2", "reason": "missing", "message": "y"},  # a superscript 2
    ]

    counts, examples = inspection._examples_by_reason(iter(rows))

    assert counts == {"bad_row": 13, "missing": 2}
    assert [row["key"] for row in examples["bad_row"]] == ["m.jsonl:2", "m.jsonl:5", "m.jsonl:8"]
    assert [row["key"] for row in examples["missing"]] == ["b/1.png", "scans/page5\u00b2"]


def test_examples_of_a_reason_show_one_images_dropped_objects_in_their_order():
    # dropped_objects.jsonl: one image's objects by index, whatever order the
    # rows come in and whichever of them the first pass kept.
    rows = [
        {
            "key": "b.png",
            "object": index,
            "reason": "min_visibility",
            "message": f"objects[{index}]",
        }
        for index in (4, 3, 9, 1, 7)
    ] + [{"key": "a.png", "object": None, "reason": "min_visibility", "message": "earlier kiln"}]

    counts, examples = inspection._examples_by_reason(iter(rows))

    assert counts == {"min_visibility": 6}
    assert [(row["key"], row["object"]) for row in examples["min_visibility"]] == [
        ("a.png", None),
        ("b.png", 1),
        ("b.png", 3),
    ]
