"""Progress of local builds, `kiln build --quiet` and `--report FILE`, on real builds."""

from __future__ import annotations

import io
import json
import os

import yaml

from conftest import NUM_DEMO_IMAGES, make_config
from kiln import cli
from kiln.pipeline import build, progress


def test_status_line():
    assert progress.status_line(0, 400, 0.0) == "0/400 files (0.0%)"
    assert progress.status_line(100, 400, 10.0) == "100/400 files (25.0%), 10.0 files/s, 0:30 left"
    assert (
        progress.status_line(10, 40_000, 1.0) == "10/40000 files (0.0%), 10.0 files/s, 1:06:39 left"
    )
    # A retried bundle counts again: never more than the total.
    assert (
        progress.status_line(420, 400, 20.0)
        == "400/400 files (100.0%), 20.0 files/s; writing shards and statistics"
    )


def test_display_redraws_one_line_from_the_count_file(tmp_path):
    path = str(tmp_path / "count")
    stream = io.StringIO()
    clock = iter([0.0, 2.0, 4.0]).__next__
    display = progress.ProgressDisplay(path, total=8, stream=stream, prefix="p: ", clock=clock)
    display.__enter__()
    display._stop.set()  # drive the drawing by hand, not by the thread's timer
    display._thread.join()
    with open(path, "wb") as f:
        f.write(b"....")
    display.draw()  # t=2: 4 of 8
    with open(path, "ab") as f:
        f.write(b"....")
    display.__exit__(None, None, None)  # t=4: 8 of 8, then a newline
    assert stream.getvalue() == (
        "\rp: 4/8 files (50.0%), 2.0 files/s, 0:02 left"
        "\rp: 8/8 files (100.0%), 2.0 files/s; writing shards and statistics\n"
    )


def test_build_shows_every_file_counted(demo_corpus, tmp_path, capsys):
    config = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    result = build(config, show_progress=True)
    err = capsys.readouterr().err
    total = NUM_DEMO_IMAGES + len(demo_corpus.broken)  # dropped files count as done too
    final = err.rstrip("\n").split("\r")[-1]
    assert final.startswith(f"kiln build: {total}/{total} files (100.0%)"), err
    assert err.endswith("\n")
    # The counting step changes no output: the same version as a build without it.
    quiet = build(make_config(demo_corpus.out_dir, output=str(tmp_path / "quiet")))
    assert quiet.version == result.version
    assert not any(name.startswith("progress") for name in os.listdir(result.dataset_dir))


def write_config(path, config) -> str:
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return str(path)


def test_quiet_and_report(demo_corpus, tmp_path, capsys):
    config = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    config_path = write_config(tmp_path / "config.yaml", config)
    report_path = str(tmp_path / "reports" / "build.json")

    assert cli.main(["build", "--config", config_path, "--quiet", "--report", report_path]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""  # --quiet: no summary; and no progress off a terminal
    assert "files (" not in captured.err
    with open(report_path) as f:
        report = json.load(f)
    assert report["status"] == "built" and report["exit_code"] == 0
    assert report["name"] == "shapes"
    assert sum(s["num_examples"] for s in report["splits"].values()) == NUM_DEMO_IMAGES
    assert report["dropped"] == {reason: 1 for reason in demo_corpus.broken.values()}
    assert report["dropped_total"] == len(demo_corpus.broken)
    assert report["counters"]["records_written"] == NUM_DEMO_IMAGES
    assert os.path.isdir(report["dataset_dir"])

    assert cli.main(["build", "--config", config_path, "--report", report_path]) == 0
    assert "is up to date" in capsys.readouterr().out
    with open(report_path) as f:
        again = json.load(f)
    assert again["status"] == "up_to_date" and again["version"] == report["version"]

    strict = write_config(tmp_path / "strict.yaml", dict(config, errors={"max_fraction": 0.0}))
    assert cli.main(["build", "--config", strict, "--report", report_path]) == 1
    with open(report_path) as f:
        failed = json.load(f)
    assert failed["status"] == "failed" and failed["exit_code"] == 1
    assert failed["error"].startswith(f"dropped {len(demo_corpus.broken)} of")
    assert capsys.readouterr().err.startswith("kiln build: failed: dropped")

    broken = write_config(tmp_path / "broken.yaml", dict(config, encoding={"format": "gif"}))
    assert cli.main(["build", "--config", broken, "--report", report_path]) == 2
    with open(report_path) as f:
        usage = json.load(f)
    assert usage["status"] == "usage_error" and usage["exit_code"] == 2
    assert "encoding.format" in usage["error"]
    assert capsys.readouterr().err.count("\n") == 1  # one line
