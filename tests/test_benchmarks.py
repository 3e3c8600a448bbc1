"""Smoke test of the benchmark harness (`make bench`): it runs and reports every row.

`python -m benchmarks.run --quick` on a tiny generated corpus, in a fresh
process as `make bench` runs it. Asserts that every measurement was taken
and every table row and target is written; never a timing (timings are the
benchmark's job, not the test suite's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BUILD_ROWS = [
    "baseline",
    "kiln",
    "kiln_scaled_decode",
    "kiln_one_thread",
    "baseline_opencv_threads",
    "baseline_threads",
]
READER_ROWS = ["a", "kiln_plain", "b", "c", "d"]


def run_quick(module: str, tmp_path, markdown) -> subprocess.CompletedProcess:
    """``python -m MODULE --quick``, scratch and page in `tmp_path`, as `make bench` runs it."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            module,
            "--quick",
            "--out",
            str(tmp_path / "bench"),
            "--markdown",
            str(markdown),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,  # the pytest.ini limit is 900
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )


def test_quick_benchmark_writes_every_row(tmp_path):
    markdown = tmp_path / "BENCHMARKS.md"
    completed = run_quick("benchmarks.run", tmp_path, markdown)
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads((tmp_path / "bench" / "results.json").read_text())

    build = results["build"]
    assert sorted(build["rows"]) == sorted(BUILD_ROWS)
    for row in build["rows"].values():
        assert row["images"] == build["images"] and len(row["runs"]) == build["repeats"]
        assert row["images_per_second"] > 0 and row["peak_rss_mb"] > 0
    # 32 is twice the quick corpus: its second half are linked copies, all built.
    assert [s["images"] for s in build["scaling"]] == [8, 16, 32]
    incremental = build["incremental"]["rows"]
    # The smallest size again with the added images of a new class, and
    # with a class folder of a tenth of the images renamed.
    assert [(row["images"], row["new_class"], row["renamed_class"]) for row in incremental] == [
        (16, False, False),
        (32, False, False),
        (16, True, False),
        (16, False, True),
    ]
    for row in incremental:
        assert row["incremental_seconds"] > 0 and row["full_seconds"] > 0
        assert row["runs"][0]["full_seconds"] == row["full_seconds"]
    # Every record of the new-class build moved up one class id: relabelled.
    relabelled = incremental[2]["runs"][0]["incremental"]
    assert relabelled["relabelled"] > 0 and relabelled["changed"] > 0
    # The renamed class folder's records moved, nothing was decoded.
    moved = incremental[3]["runs"][0]["incremental"]
    assert moved["moved"] == incremental[3]["changes"] == 2
    assert moved["processed"] == 0
    reader = results["reader"]
    assert sorted(reader["rows"]) == ["jpeg", "raw"]
    for rows in reader["rows"].values():
        assert set(READER_ROWS) <= set(rows)
        assert all(rows[key]["images_per_second"] > 0 for key in READER_ROWS)
        assert set(rows["ratios"]) == {"b_over_a", "b_over_c", "b_over_d"}
    assert reader["layer"]["images_per_second"] > 0
    detection = results["detection"]
    assert sorted(detection["rows"]) == ["classification", "coco", "manifest"]
    for row in detection["rows"].values():
        assert row["images"] == detection["images"] and row["images_per_second"] > 0
    machine = results["machine"]
    assert machine["cores"] >= 1 and machine["cpu"]
    assert all(
        machine["versions"][name]
        for name in ("python", "tensorflow", "apache-beam", "opencv", "numpy")
    )
    # The cost of targets, with the class mask stored as PNG and raw.
    assert sorted(reader["targets"]) == ["b_targets", "b_targets_raw"]
    assert all(row["cost_vs_b"] > 0 for row in reader["targets"].values())
    # Every target is judged, met or not: build (4), incremental (4), reader per
    # encoding (3 x 2), the reader's cost with targets (2: PNG and raw class
    # mask), and per peers' dataset kiln vs the limit and vs each kind of peer
    # that ran (the peers are installed by `make bench`, not `make test`).
    peers = results["peers"]["datasets"]
    assert sorted(peers) == ["224x224", "341x256"]
    ran = {key for key, row in peers["224x224"].items() if row["not_run"] is None}
    # (kiln float32 is judged in the default process and with pool_host_memory().)
    per_dataset = 2 + 2 * bool(ran & {"grain", "dali"}) + ("grain_uint8" in ran)
    assert len(results["targets"]) == 4 + 4 + 3 * 2 + 2 + 2 * per_dataset
    assert all(isinstance(t["met"], bool) for t in results["targets"])
    # Any of them may be missed on some machine: each has its "why not met" note.
    from benchmarks import report

    assert {t["key"] for t in results["targets"]} <= set(report.WHY_NOT_MET)

    listing = results["listing"]
    assert sorted((row["kind"], row["rows"]) for row in listing["rows"]) == [
        ("missing", 1000),
        ("missing", 4000),
        ("real", 1000),
        ("real", 4000),
    ]
    for row in listing["rows"]:
        assert row["files"] + row["dropped"] == row["rows"] and row["rows_per_second"] > 0
        assert row["files"] == (2 if row["kind"] == "missing" else row["rows"])
    assert sorted(listing["extrapolation"]) == ["missing", "real"]

    startup = {row["key"]: row for row in results["startup"]["rows"]}
    assert {"tensorflow", "help", "missing_config", "typo_config", "inspect"} <= set(startup)
    assert {f"help_{name}" for name in ("build", "inspect", "preview", "verify")} <= set(startup)
    assert "exit_after_summary" in startup
    assert all(row["median_seconds"] > 0 for row in startup.values())

    page = markdown.read_text()
    assert "## Start-up: what a command costs before it does anything" in page
    assert all(f"| {row['title']} |" in page for row in startup.values())
    assert "## Listing: manifests of 1,000 and 4,000 rows" in page
    assert "## Build: the detection demo, 8 scenes" in page
    shown = list(build["rows"].values()) + list(detection["rows"].values())
    targets_rows = list(reader["targets"].values())
    for row in shown + [reader["rows"]["jpeg"][k] for k in READER_ROWS] + targets_rows:
        assert f"| {row['title']} |" in page
    for target in results["targets"]:
        assert f"| {target['name']} |" in page
    assert "## Reader against its peers" in page
    assert "python -m benchmarks.run --quick" in page and machine["cpu"] in page
    # The CPU's vector extensions move the ratios against OpenCV's kernels.
    from benchmarks import machine as bench_machine

    assert "vector_extensions" in machine and bench_machine.cpu_name(machine) in page


@pytest.mark.slow  # starts fake-gcs-server
def test_quick_folder_listing_benchmark_writes_every_row(tmp_path):
    from benchmarks import folder_listing_bench

    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# page\n\n## Listing: manifests of 1 rows\n\ntext\n\n## Later\n")
    completed = run_quick("benchmarks.folder_listing_bench", tmp_path, markdown)
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads((tmp_path / "bench" / "folder_listing.json").read_text())
    quick = folder_listing_bench.QUICK
    latency = f"emulator +{folder_listing_bench.LATENCY_MS} ms"
    expected = {"local": quick.files, "emulator": quick.objects, latency: quick.objects}
    assert sorted((row["store"], row["phase"]) for row in results["rows"]) == sorted(
        [("local", "walk"), ("local", "list")]
        + [
            (store, phase)
            for store in ("emulator", latency)
            for phase in ("match", "walk", "list", "folders", "job")
        ]
    )
    for row in results["rows"]:
        assert row["files"] == expected[row["store"]] and row["files_per_second"] > 0
    page = markdown.read_text()
    assert "With `source.listing: job` (issue 15), the launcher's share is `folders`" in page
    # Its own section, right after the manifests' listing section.
    assert page.index("## Listing: manifests") < page.index(folder_listing_bench.SECTION_TITLE)
    assert page.index(folder_listing_bench.SECTION_TITLE) < page.index("## Later")


def test_revision_ab_measures_both_checkouts(tmp_path):
    """`benchmarks.revision_ab` builds with the other revision's kiln (its
    own guard raises when a build imported the wrong checkout) and reports
    wall and CPU medians for A, that revision and this checkout."""
    lines = _compare_with_head("revision_ab", tmp_path)
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:5]}
    assert set(rows) == {"A", "HEAD", "this"}
    for wall, cpu, *_ in rows.values():
        assert float(wall) > 0 and float(cpu) > 0
    assert lines[5].startswith("this / HEAD: wall ")
    # The checkout of the other revision is removed with its worktree entry.
    worktrees = subprocess.run(
        ["git", "-C", ROOT, "worktree", "list"], capture_output=True, text=True, check=True
    ).stdout
    assert str(tmp_path) not in worktrees
    assert not [p for p in (tmp_path / "ab").iterdir() if p.name.startswith("revision-")]


def test_reader_ab_measures_both_checkouts(tmp_path):
    """`benchmarks.reader_ab` reads with the other revision's kiln.reader (its
    own guard raises when a worker imported the wrong checkout) and reports
    the targets' cost in wall and CPU time for that revision and this checkout."""
    lines = _compare_with_head("reader_ab", tmp_path)
    rows = {line.split()[0]: line.split()[1:] for line in lines[-2:]}
    assert set(rows) == {"HEAD", "this"}
    for pairs, plain, targets, wall_cost, *_, cpu_cost in rows.values():
        assert int(pairs) == 1 and float(plain) > 0 and float(targets) > 0
        assert float(wall_cost.rstrip("x")) > 0 and float(cpu_cost.rstrip("x")) > 0
    worktrees = subprocess.run(
        ["git", "-C", ROOT, "worktree", "list"], capture_output=True, text=True, check=True
    ).stdout
    assert str(tmp_path) not in worktrees
    assert not [p for p in (tmp_path / "ab").iterdir() if p.name.startswith("revision-")]


def test_a_benchmark_run_alone_rewrites_only_its_own_section():
    from benchmarks import page

    text = "# kiln\n\n## A\n\na\n\n## B: old\n\nold b\n\n## C\n\nc\n"
    replaced = page.replace_section(text, "## B", "## B: new\n\nnew b\n\n")
    assert replaced == "# kiln\n\n## A\n\na\n\n## B: new\n\nnew b\n\n## C\n\nc\n"
    assert page.find_section(replaced, "## B") == "## B: new\n\nnew b\n\n"
    assert page.find_section(replaced, "## D") is None
    # Absent: right after the section named, else at the end.
    inserted = page.replace_section(text, "## D", "## D\n\nd\n", after="## A")
    assert inserted.index("## A") < inserted.index("## D") < inserted.index("## B")
    assert page.replace_section(text, "## D", "## D\n\nd\n").endswith("## C\n\nc\n\n## D\n\nd\n")


def test_a_kept_section_moved_into_a_new_page_adds_no_blank_lines():
    # make bench writes a new page and moves the image folder's listing
    # section (measured by another command) into it, found with the blank
    # lines before the next heading: regenerating must not pile them up.
    from benchmarks import page

    new = "# kiln\n\n## A\n\na\n\n## C\n\nc\n"
    old = "# kiln\n\n## A\n\nold a\n\n## B\n\nb\n\n## C\n\nold c\n"
    for _ in range(3):
        kept = page.find_section(old, "## B")
        old = page.replace_section(new, "## B", kept, after="## A")
        assert old == "# kiln\n\n## A\n\na\n\n## B\n\nb\n\n## C\n\nc\n"
    assert page.replace_section(new, "## B", "## B\n\nb\n\n", after="## C").endswith(
        "## C\n\nc\n\n## B\n\nb\n"
    )


def test_the_opencv_peer_jitters_colour_as_kiln_does():
    """The Grain peer's colour matrix is kiln's `color_twist` (same work, same result)."""
    import cv2
    import numpy as np
    import tensorflow as tf
    from benchmarks import peers_bench

    from kiln.reader.ops import color_twist

    rng = np.random.default_rng(3)
    image = rng.uniform(0.1, 0.9, (17, 23, 3)).astype(np.float32)
    brightness, contrast, saturation, hue = 0.1, 1.3, 0.7, 0.08
    mean_luma = float(np.dot(image.reshape(-1, 3).mean(axis=0), (0.299, 0.587, 0.114))) * 255
    matrix = peers_bench.color_matrix(brightness, contrast, saturation, hue, mean_luma)
    theirs = np.clip(cv2.transform(image * 255.0, matrix) / 255.0, 0.0, 1.0)
    ours = color_twist(
        tf.constant(image),
        brightness=tf.constant(brightness),
        contrast=tf.constant(contrast),
        saturation=tf.constant(saturation),
        hue=tf.constant(hue),
    ).numpy()
    np.testing.assert_allclose(theirs, ours, atol=2e-4)
    assert np.abs(ours - image).max() > 0.05  # the jitter did change the image


def test_quick_peers_benchmark_reports_every_loader(tmp_path):
    """Every loader is measured, or reported not run with the reason (the
    peers are installed for `make bench` only, from requirements-peers.txt)."""
    from benchmarks import peers_bench

    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# page\n\n## Reader: batches of 128\n\ntext\n\n## Later\n")
    completed = run_quick("benchmarks.peers_bench", tmp_path, markdown)
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads((tmp_path / "bench" / "peers.json").read_text())
    # Both stored sizes, every loader on each.
    assert sorted(results["datasets"]) == ["224x224", "341x256"]
    page = markdown.read_text()
    for loaders in results["datasets"].values():
        assert list(loaders) == [p.key for p in peers_bench.PEERS]
        for key, row in loaders.items():
            if row["not_run"] is None:
                assert row["images_per_second"] > 0 and len(row["runs"]) == 1
            else:
                assert key not in ("limit", "kiln", "kiln_uint8")
                assert row["images_per_second"] is None
            assert f"| {row['title']} |" in page
    assert "kiln float32 vs the best float32 peer " in page
    # Its own section, right after the reader's.
    assert page.index("## Reader: batches") < page.index(peers_bench.SECTION_TITLE)
    assert page.index(peers_bench.SECTION_TITLE) < page.index("## Later")


def _compare_with_head(module: str, tmp_path) -> list[str]:
    """The stdout lines of ``python -m benchmarks.<module> HEAD --quick``."""
    completed = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", "HEAD", "--quick"]
        + ["--out", str(tmp_path / "ab")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout.splitlines()
