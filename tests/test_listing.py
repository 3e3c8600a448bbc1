"""The launcher's listing: bounded memory however many rows, the same output, no files left.

Issue 13 found a 1,000,000-row manifest taking 2.3 GB in the launcher: the
listing kept Python objects per row (about 1.4 KB of them). It now streams the
rows to a temporary SQLite file (`kiln.pipeline.listing`). Here a manifest
is listed at 30,000 and at 300,000 rows, each in a fresh process, as the
launcher lists it (list, stamp, write the job's JSONL); the extra 270,000
rows may cost at most 60 MB of peak memory. Both outputs are checked
against what the listing must give for those rows, written out
independently here: the job's listing line by line and the stamp.

The rows are shuffled (the listing sorts them by key, and keys sort as
strings: ``img/10.png`` before ``img/2.png``); every tenth names a real file
(hard links of one file, so 30,000 files cost no disk), the rest are missing.

The listing's temporary folder goes when the build ends, whether it built,
found the dataset up to date or failed.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys

import pytest

from conftest import make_config
from kiln.errors import ConfigError
from kiln.pipeline import BuildError, build, listing, sources, versioning
from kiln.pipeline.listing import Listing, ListingWriter

CLASSES = ["class0", "class1", "class2"]
SIZE, MTIME = 7, 1_000_000_000.5

# What the launcher does with a listing, in a process of its own.
CHILD = """
import json, resource, sys
from kiln.pipeline import sources, versioning
manifest, output = sys.argv[1:]
source = sources.ManifestSource(type="manifest", path=manifest)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with source.list_files(splits_from_source=False) as listing:
    stamp = versioning.stamp("config", listing.stamp_entries(), processing="p")
    listing.write(output)
    counts = [listing.num_files, listing.num_dropped, listing.total]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_kb": peak - before, "stamp": stamp, "counts": counts}))
"""


def make_manifest(folder, rows: int) -> tuple[str, list[str], list[str]]:
    """A shuffled manifest of `rows` rows; returns it, the real keys and the missing keys."""
    os.makedirs(folder / "real")
    original = folder / "real" / "original"
    original.write_bytes(b"x" * SIZE)
    os.utime(original, (MTIME, MTIME))
    real, missing = [], []
    for i in range(rows):
        if i % 10 == 0:
            key = f"real/{i}.png"
            os.link(original, folder / key)
            real.append(key)
        else:
            missing.append(f"img/{i}.png")
    keys = real + missing
    random.Random(0).shuffle(keys)
    manifest = folder / "manifest.csv"
    with open(manifest, "w") as f:
        f.write("path,label\n")
        f.writelines(f"{key},{label(key)}\n" for key in keys)
    return str(manifest), sorted(real), sorted(missing)


def label(key: str) -> str:
    return CLASSES[int(key.split("/")[1].split(".")[0]) % 3]


def expected_listing(root: str, real: list[str], missing: list[str]) -> tuple[list[str], str]:
    """The job's listing lines and the stamp these rows must give (`listing.Listing`).
    The real files are hard links of one: one inode, one ctime (that of the
    last link made), their status-change identity."""
    status = os.stat(f"{root}/real/original")
    identity = f"{status.st_ino}:{status.st_ctime_ns}"
    files = [
        {
            "key": key,
            "label": CLASSES.index(label(key)),
            "size": SIZE,
            "mtime": MTIME,
            "split": None,
            "uri": f"{root}/{key}",
            "inode_ctime": identity,
        }
        for key in real
    ]
    lines = [
        json.dumps({"files": files[start : start + listing.FILES_PER_LINE]}, sort_keys=True)
        for start in range(0, len(files), listing.FILES_PER_LINE)
    ]
    for key in missing:
        uri = f"{root}/{key}"
        lines.append(
            json.dumps(
                {
                    "dropped": {
                        "key": key,
                        "uri": uri,
                        "stage": "list",
                        "reason": "missing",
                        "message": f"listed in manifest.csv but not found "
                        f"([Errno 2] No such file or directory: '{uri}')",
                    }
                },
                sort_keys=True,
            )
        )
    entries = [["file", key, label(key), None, SIZE, MTIME, identity] for key in real] + [
        # A missing file's message names its path: left out (`listing.dropped_entry`).
        [["dropped", "missing", key], key, ""]
        for key in missing
    ]
    return lines, versioning.stamp("config", entries, processing="p")


def list_in_child(folder, rows: int) -> dict:
    manifest, real, missing = make_manifest(folder, rows)
    output = folder / "listing.jsonl"
    completed = subprocess.run(
        [sys.executable, "-c", CHILD, manifest, str(output)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])

    lines, stamp = expected_listing(str(folder), real, missing)
    assert result["counts"] == [len(real), len(missing), rows]
    assert result["stamp"] == stamp
    with open(output) as f:
        for number, (line, expected) in enumerate(zip(f, lines, strict=True)):
            assert line == expected + "\n", f"line {number + 1}"
    shutil.rmtree(folder)  # 30,000 hard links: not left for pytest's retention
    return result


def test_a_manifest_lists_in_memory_that_does_not_grow_with_its_rows(tmp_path):
    small = list_in_child(tmp_path / "small", 30_000)
    large = list_in_child(tmp_path / "large", 300_000)
    extra_mb = (large["growth_kb"] - small["growth_kb"]) / 1024
    assert extra_mb < 60, f"270,000 more rows took {extra_mb:.0f} MB more at peak"


# Lists a manifest, says which temporary files it holds open, and is killed.
KILLED_CHILD = """
import os, signal, sys
from kiln.pipeline import sources
source = sources.ManifestSource(type="manifest", path=sys.argv[1])
listing = source.list_files(splits_from_source=False)
print(os.path.realpath(sys.argv[2]), flush=True)
for fd in os.listdir("/proc/self/fd"):
    try:
        print(os.readlink(f"/proc/self/fd/{fd}"), flush=True)
    except OSError:
        pass
os.kill(os.getpid(), signal.SIGKILL)
"""


def is_closed(listing: Listing) -> bool:
    try:
        _ = listing.disk_bytes
    except sqlite3.ProgrammingError:  # "Cannot operate on a closed database."
        return True
    return False


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads Linux's /proc")
def test_the_listing_is_deleted_when_the_build_ends_built_failed_or_killed(
    demo_corpus, tmp_path, monkeypatch
):
    # Every listing made, kept alive here: only closing one frees its file.
    made: list[Listing] = []
    finish = ListingWriter.finish
    monkeypatch.setattr(
        ListingWriter,
        "finish",
        lambda writer, *args: made.append(finish(writer, *args)) or made[-1],
    )

    config = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    assert not build(config).up_to_date
    assert build(config).up_to_date
    with pytest.raises(BuildError, match="dropped 3 of 63 input files"):
        build(dict(config, name="strict", errors={"max_fraction": 0.01}))
    manifest = tmp_path / "manifest.csv"
    manifest.write_text("path,label\n")
    with pytest.raises(ConfigError, match="no usable input image"):
        build(dict(config, source={"type": "manifest", "path": str(manifest)}))
    assert len(made) == 4 and all(is_closed(listing) for listing in made)

    # A killed process closes nothing, yet its listing leaves nothing on disk. (SQLite
    # creates the file once the rows outgrow its page cache: 60,000 rows do.)
    temp = tmp_path / "temp"
    temp.mkdir()
    manifest, _, _ = make_manifest(tmp_path / "killed", 60_000)
    completed = subprocess.run(
        [sys.executable, "-c", KILLED_CHILD, manifest, str(temp)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", SQLITE_TMPDIR=str(temp)),
    )
    assert completed.returncode == -signal.SIGKILL, completed.stderr[-3000:]
    folder, *held = completed.stdout.splitlines()
    assert any(path.startswith(folder + "/etilqs_") for path in held), held
    assert os.listdir(temp) == []


def test_links_out_of_an_image_folder_are_refused_file_by_file_and_folder_by_folder(tmp_path):
    # The confinement resolves a folder's links once for all its files and each file
    # that is a link itself: both kinds of escape must still be caught.
    outside = tmp_path / "outside"
    (outside / "folder").mkdir(parents=True)
    (outside / "secret.png").write_bytes(b"s")
    (outside / "folder" / "x.png").write_bytes(b"x")
    root = tmp_path / "images"
    for name in ("a", "c"):
        (root / name).mkdir(parents=True)
    (root / "a" / "1.png").write_bytes(b"1")
    (root / "a" / "2.png").symlink_to(outside / "secret.png")  # a file link out
    (root / "a" / "3.png").symlink_to(root / "a" / "1.png")  # a file link within
    (root / "a" / "4.png").write_bytes(b"4")  # after a link, in the same folder
    (root / "b").symlink_to(outside / "folder", target_is_directory=True)  # a folder out
    (root / "c" / "5.png").write_bytes(b"5")
    (root / "d").symlink_to(root / "c", target_is_directory=True)  # a folder within

    source = sources.ImageFolderSource(type="image_folder", root=str(root))
    with source.list_files(splits_from_source=False) as result:
        files = [f.key for f in result.files()]
        dropped = {d.key: (d.reason, d.message) for d in result.dropped()}
    assert files == ["a/1.png", "a/3.png", "a/4.png", "c/5.png", "d/5.png"]
    assert sorted(dropped) == ["a/2.png", "b/x.png"]
    assert dropped["a/2.png"][0] == dropped["b/x.png"][0] == "outside_source"
    assert f"it resolves to {outside / 'secret.png'}" in dropped["a/2.png"][1]
    assert f"it resolves to {outside / 'folder' / 'x.png'}" in dropped["b/x.png"][1]


def test_a_link_to_a_folder_above_it_is_reported_as_a_real_subfolder_is(tmp_path):
    # Followed, a link back to its own folder or one above it would list the
    # same files forever: it is not entered, but it is reported, not skipped
    # without a word (a real subfolder's files are reported too).
    root = tmp_path / "images"
    (root / "a" / "sub").mkdir(parents=True)
    (root / "b").mkdir()
    (root / "a" / "1.png").write_bytes(b"1")
    (root / "a" / "sub" / "2.png").write_bytes(b"2")  # a real subfolder
    (root / "b" / "3.png").write_bytes(b"3")
    (root / "a" / "again").symlink_to(root / "a", target_is_directory=True)  # itself
    (root / "b" / "up").symlink_to("..", target_is_directory=True)  # the root
    (root / "top").symlink_to(".", target_is_directory=True)  # the root, from the root

    source = sources.ImageFolderSource(type="image_folder", root=str(root))
    with source.list_files(splits_from_source=False) as result:
        files = [f.key for f in result.files()]
        dropped = {d.key: (d.reason, d.message) for d in result.dropped()}
    loop = "a symbolic link to a folder that holds it (not followed: it would loop)"
    assert files == ["a/1.png", "b/3.png"]
    assert dropped == {
        "a/sub/2.png": ("unexpected_location", "not in the layout root/<class>/<image>"),
        "a/again": ("unreadable", loop),
        "b/up": ("unreadable", loop),
        "top": ("unexpected_location", "not in the layout root/<class>/<image>"),
    }


def test_a_manifest_row_is_stat_ed_once_and_links_are_stamped_as_what_they_point_to(
    tmp_path, monkeypatch
):
    # Confinement lstat's each row's image; for a file that is not a link
    # that is its stat too, so the listing takes its stamp from it rather
    # than asking again (a million rows: seconds). A link's stamp is still
    # its target's, and a folder is still refused.
    root = tmp_path / "data"
    (root / "a").mkdir(parents=True)
    (root / "real").mkdir()
    (root / "a" / "1.png").write_bytes(b"1" * 10)
    (root / "real" / "2.png").write_bytes(b"2" * 20)
    (root / "a" / "link.png").symlink_to(root / "real" / "2.png")  # a file link within
    (root / "linked").symlink_to(root / "real", target_is_directory=True)  # a folder link
    (root / "a" / "folder.png").mkdir()
    os.utime(root / "real" / "2.png", (MTIME, MTIME))
    manifest = root / "manifest.csv"
    manifest.write_text(
        "path,label\na/1.png,x\na/link.png,y\nlinked/2.png,y\na/folder.png,x\na/gone.png,x\n"
    )
    stats = []
    real_stat = os.stat

    def counting_stat(path, *args, **kwargs):
        stats.append(os.fspath(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counting_stat)
    source = sources.ManifestSource(type="manifest", path=str(manifest))
    with source.list_files(splits_from_source=False) as result:
        files = {f.key: (f.size, f.mtime) for f in result.files()}
        dropped = {d.key: d.reason for d in result.dropped()}
    monkeypatch.undo()
    assert files == {
        "a/1.png": (10, real_stat(root / "a" / "1.png").st_mtime),
        "a/link.png": (20, MTIME),  # the target's, not the link's
        "linked/2.png": (20, MTIME),
    }
    assert dropped == {"a/folder.png": "unreadable", "a/gone.png": "missing"}
    rows = [str(root / name) for name in ("a/1.png", "linked/2.png", "a/folder.png")]
    assert [path for path in stats if path in rows] == []  # lstat'ed once, by confinement
    assert str(root / "a" / "link.png") in stats  # a link is stat'ed: its target's stamp
