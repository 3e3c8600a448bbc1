"""Inputs that other teams and scrapers fill, built as a nightly job would:
each hostile input ends as a reported bad input or a one-line config error,
never a hang, an exhausted machine, or a listing of what lies outside the
source. Each build runs `kiln build` in a subprocess with a timeout (and, where
the input attacks memory, an address-space limit), so a regression fails
here instead of hanging the suite."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import cv2
import numpy as np
import pytest
import yaml

import kiln
from compressed_data import HOSTILE_MESSAGES, hostile_files

SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))


def build(config: dict, folder, *, timeout: float = 180, memory_gib: int | None = None):
    """`kiln build` of `config` (written to `folder`/kiln.yaml) in a
    subprocess, killed after `timeout` seconds, its address space limited to
    `memory_gib` GiB if given."""
    path = folder / "kiln.yaml"
    path.write_text(yaml.safe_dump(config))

    def limit_memory():
        if memory_gib is not None:
            size = memory_gib << 30
            resource.setrlimit(resource.RLIMIT_AS, (size, size))

    return subprocess.run(
        [sys.executable, "-m", "kiln", "build", "--config", str(path)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=SOURCE_ROOT),
        preexec_fn=limit_memory,
        timeout=timeout,
    )


def write_images(folder, classes=("cat", "dog"), per_class=6) -> list[str]:
    """Small random PNGs in `folder`/<class>/; their paths relative to `folder`."""
    rng = np.random.default_rng(0)
    written = []
    for name in classes:
        (folder / name).mkdir(parents=True)
        for i in range(per_class):
            cv2.imwrite(
                str(folder / name / f"{i}.png"), rng.integers(0, 255, (24, 24, 3), np.uint8)
            )
            written.append(f"{name}/{i}.png")
    return written


def base_config(source: dict, **overrides) -> dict:
    return {
        "name": "hostile",
        "source": source,
        "output": "out",
        "image": {"channels": 3},
        "encoding": {"format": "png"},
        "splits": {"fractions": {"train": 0.5, "validation": 0.5}},
        "errors": {"max_fraction": 0.9},
        **overrides,
    }


def errors_of(folder) -> dict[str, dict]:
    """The published version's errors.jsonl rows by key."""
    dataset = folder / "out" / "hostile"
    version = (dataset / "LATEST").read_text().strip()
    lines = (dataset / version / "errors.jsonl").read_text().splitlines()
    return {row["key"]: row for row in map(json.loads, lines)}


def coco_of(images: list[str]) -> dict:
    """A COCO file's content naming `images`, without annotations."""
    return {
        "images": [
            {"id": i, "file_name": p, "width": 24, "height": 24} for i, p in enumerate(images)
        ],
        "annotations": [],
        "categories": [{"id": 1, "name": "thing"}],
    }


def coco_config_error(text: str, folder, *, timeout: float) -> list[str]:
    """A build of the COCO file `text` (`folder`/instances.json, images in
    `folder`/images) with 4 GiB of address space: it must stop with a config
    error (exit 2) of one line naming ``source.annotations``; those lines."""
    (folder / "instances.json").write_text(text)
    config = base_config(
        {"type": "coco", "annotations": "instances.json", "images": "images"},
        targets={"boxes": {}},
    )
    completed = build(config, folder, timeout=timeout, memory_gib=4)
    assert completed.returncode == 2, completed.stderr[-2000:]
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "source.annotations" in lines[0], lines[0]
    return lines


def test_a_coco_file_nested_100000_levels_deep_is_a_config_error_in_little_memory(tmp_path):
    # 200 KB of "[": ijson keeps the prefix of every open level, so reading
    # it took tens of gigabytes (the kernel's OOM killer ended the build).
    coco = coco_of(write_images(tmp_path / "images"))
    text = json.dumps(coco)[:-1] + ', "notes": ' + "[" * 100_000 + "]" * 100_000 + "}"
    lines = coco_config_error(text, tmp_path, timeout=120)
    assert "instances.json: nested too deeply" in lines[0]
    assert "notes.item.item" in lines[0]
    assert not (tmp_path / "out" / "hostile").exists() or not any(
        (tmp_path / "out" / "hostile").glob("*/kiln.json")
    )


@pytest.mark.parametrize(
    "file_name",
    [
        "x" * 100_000_000,
        # Commas and escaped quotes in it: a delimiter every other byte
        # (this one took ~18 s, an 80 MB one 11.5 s: its square).
        'a,"' * 33_000_000,
    ],
    ids=["letters", "delimiters"],
)
def test_a_coco_file_with_a_100_mb_string_is_a_config_error_at_once(tmp_path, file_name):
    # ijson's C parser lexes a string again from its start after each read
    # that ends inside it: a 100 MB file_name (an image embedded in the file,
    # a corrupt file) did not finish reading in 10 minutes.
    coco = coco_of(write_images(tmp_path / "images"))
    coco["images"][3]["file_name"] = file_name
    lines = coco_config_error(json.dumps(coco), tmp_path, timeout=90)
    assert "instances.json: a token of more than 1048576 bytes" in lines[0]


def test_a_link_to_a_folder_inside_a_class_folder_is_one_entry_never_entered(tmp_path):
    # A scraper's class folder holding links: one to "/" (walking it took
    # the whole filesystem, /proc included: the build never ended), one to a
    # private folder (its file names were listed in the published
    # errors.jsonl), and a tree of links whose paths double at every level.
    root = tmp_path / "root"
    write_images(root)
    private = tmp_path / "private"
    (private / "inner").mkdir(parents=True)
    (private / "payroll-2024.xlsx").write_bytes(b"secret")
    (private / "inner" / "passwords.txt").write_bytes(b"secret")
    (root / "cat" / "everything").symlink_to("/")
    (root / "cat" / "private").symlink_to(private)
    (root / "dog" / "nested").mkdir()
    (root / "dog" / "nested" / "private").symlink_to(private)
    doubling = root / "dog" / "doubling"
    for level in range(40):
        (doubling / str(level)).mkdir(parents=True)
        (doubling / str(level) / "a").symlink_to(doubling / str(level + 1))
        (doubling / str(level) / "b").symlink_to(doubling / str(level + 1))
    (doubling / "40").mkdir()

    completed = build(base_config({"type": "image_folder", "root": "root"}), tmp_path, timeout=120)
    assert completed.returncode == 0, completed.stderr[-2000:]
    errors = errors_of(tmp_path)
    assert errors["cat/everything"]["reason"] == "outside_source"
    assert "it resolves to /)" in errors["cat/everything"]["message"]
    assert errors["cat/private"]["reason"] == "outside_source"
    assert errors["dog/nested/private"]["reason"] == "unexpected_location"
    published = "\n".join(json.dumps(row) for row in errors.values())
    assert "payroll" not in published and "passwords" not in published
    assert not any(key.startswith("cat/everything/") for key in errors)
    # The real folders inside the class folder are still walked: each is misplaced.
    assert errors["dog/doubling/0/a"]["reason"] == "unexpected_location"
    # Each link is one entry (two per level), not 2**40 paths through them.
    assert not any(key.startswith("dog/doubling/0/a/") for key in errors)
    assert len(errors) == 3 + 2 * 40, sorted(errors)


def run_config_text(text: str, folder, timeout: float = 120):
    (folder / "kiln.yaml").write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "kiln", "build", "--config", str(folder / "kiln.yaml")],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=SOURCE_ROOT),
        timeout=timeout,
    )


def test_a_config_number_of_5000_digits_is_a_config_error_naming_its_line(tmp_path):
    # Python refuses to convert more than 4300 digits: it was an internal error (exit 70).
    write_images(tmp_path / "images")
    text = yaml.safe_dump(base_config({"type": "image_folder", "root": "images"}))
    text += "sharding:\n  target_shard_mb: 1" + "0" * 5000 + "\n"
    completed = run_config_text(text, tmp_path)
    assert completed.returncode == 2, completed.stderr[-2000:]
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    line = text.count("\n")
    assert f"kiln.yaml: not valid YAML (line {line}): a number of 5001 digits" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_jsonl_row_nested_too_deeply_or_with_a_huge_number_is_a_bad_row(tmp_path):
    # A row of 100,000 "[" was an internal error (RecursionError, exit 70).
    images = write_images(tmp_path / "images")
    rows = [json.dumps({"path": f"images/{p}", "label": p.split("/")[0]}) for p in images[2:]]
    rows.append('{"path": "images/cat/0.png", "label": ' + "[" * 100_000 + "]" * 100_000 + "}")
    rows.append('{"path": "images/cat/1.png", "label": "cat", "n": 1' + "0" * 5000 + "}")
    (tmp_path / "manifest.jsonl").write_text("\n".join(rows) + "\n")
    completed = build(base_config({"type": "manifest", "path": "manifest.jsonl"}), tmp_path)
    assert completed.returncode == 0, completed.stderr[-2000:]
    errors = errors_of(tmp_path)
    deep, long = errors[f"manifest.jsonl:{len(rows) - 1}"], errors[f"manifest.jsonl:{len(rows)}"]
    assert (deep["reason"], deep["message"]) == ("bad_row", "nested more deeply than Python reads")
    assert long["reason"] == "bad_row"
    assert long["message"].startswith("holds a number too long to read (Exceeds the limit")


def test_a_manifest_line_of_a_gibibyte_is_one_line_too_long_row_read_in_little_memory(tmp_path):
    # A GiB of NUL bytes between two line breaks (a file truncated or
    # preallocated by a crashed export; sparse here, so the disk stays
    # empty). It was read whole, decoded, and its text escaped into the
    # listing: the build died of MemoryError (exit 70) under the limit, or
    # took the machine's memory without it.
    images = write_images(tmp_path / "images")
    rows = [json.dumps({"path": f"images/{p}", "label": p.split("/")[0]}) for p in images]
    with open(tmp_path / "manifest.jsonl", "wb") as f:
        f.write(("\n".join(rows[:3]) + "\n").encode())
        f.seek(1 << 30, os.SEEK_CUR)
        f.write(("\n{not json\n" + "\n".join(rows[3:]) + "\n").encode())
    completed = build(
        base_config({"type": "manifest", "path": "manifest.jsonl"}), tmp_path, memory_gib=4
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    errors = errors_of(tmp_path)
    assert {key: row["reason"] for key, row in errors.items()} == {
        "manifest.jsonl:4": "line_too_long",
        "manifest.jsonl:5": "bad_row",
    }
    assert errors["manifest.jsonl:4"]["message"] == (
        f"the line is {1 << 30} bytes long, more than the {16 << 20} bytes a line may hold "
        f"(one row per line): skipped unread"
    )


def test_compressed_annotations_asking_for_gibibytes_to_decompress_are_config_errors(tmp_path):
    # lzma's decoder allocated the dictionary a .lzma header declares, 4 GiB
    # for a file of some hundred bytes: under this limit a MemoryError (the
    # config error said only that), without one 4 GiB taken from the machine.
    # A zstd frame can declare a 2 GiB window.
    images = write_images(tmp_path / "images")
    rows = "path,label\n" + "".join(f"images/{p},{p.split('/')[0]}\n" for p in images)
    (tmp_path / "manifest.csv.lzma").write_bytes(hostile_files(rows.encode())[".lzma"])
    coco = json.dumps(coco_of(images)).encode()
    (tmp_path / "instances.json.zst").write_bytes(hostile_files(coco)[".zst"])
    configs = {
        "manifest.csv.lzma": base_config({"type": "manifest", "path": "manifest.csv.lzma"}),
        "instances.json.zst": base_config(
            {"type": "coco", "annotations": "instances.json.zst", "images": "images"},
            targets={"boxes": {}},
        ),
    }

    for name, config in configs.items():
        completed = build(config, tmp_path, timeout=120, memory_gib=4)
        assert completed.returncode == 2, completed.stderr[-2000:]
        lines = completed.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert f"{tmp_path / name}: {HOSTILE_MESSAGES[os.path.splitext(name)[1]]}" in lines[0], (
            lines[0]
        )
