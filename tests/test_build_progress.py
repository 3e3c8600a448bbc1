"""Progress of local builds, `kiln build --quiet` and `--report FILE`, on real builds."""

from __future__ import annotations

import io
import json
import os
import re
import struct
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest
import yaml

import kiln
import kiln.reader
from conftest import NUM_DEMO_IMAGES, backdated, make_config, run_kiln
from kiln import cli
from kiln.pipeline import build, progress
from kiln.transforms import encode_image
from test_build_publishing import small_corpus


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


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_display_redraws_one_line_from_the_count_file(tmp_path):
    path = str(tmp_path / "count")
    stream = Terminal()
    clock = iter([0.0, 2.0, 4.0, 6.0]).__next__
    display = progress.display(path, 12, enabled=True, stream=stream)
    assert isinstance(display, progress.ProgressDisplay)  # on a terminal: redrawn
    display.prefix, display.clock = "p: ", clock
    display.__enter__()
    display._stop.set()  # drive the drawing by hand, not by the thread's timer
    display._thread.join()
    with open(path, "wb") as f:
        f.write(b"....")
    display.draw()  # t=2: 4 of 12, the first files: no rate yet
    with open(path, "ab") as f:
        f.write(b"....")
    display.draw()  # t=4: 8 of 12: 4 files in the 2 s since the first ones
    with open(path, "ab") as f:
        f.write(b"....")
    display.__exit__(None, None, None)  # t=6: 12 of 12, then a newline
    assert stream.getvalue() == (
        "\rp: 4/12 files (33.3%)"
        "\rp: 8/12 files (66.7%), 2.0 files/s, 0:02 left"
        "\rp: 12/12 files (100.0%), 2.0 files/s; writing shards and statistics\n"
    )


def test_the_first_estimate_leaves_out_the_start_up():
    # 20 s of start-up (workers, imports), then 10 files/s: the old estimate
    # (files / time since the start) said 1 file/s and 16 minutes left.
    rate = progress.RateEstimate()
    assert rate.update(20.0, 5) is None  # the first files: nothing to measure from yet
    assert rate.update(20.5, 10) is None  # under a second of work: too short to tell
    assert rate.update(21.0, 15) == pytest.approx(10.0)
    assert progress.status_line(15, 1000, 21.0, 10.0) == (
        "15/1000 files (1.5%), 10.0 files/s, 1:38 left"
    )


def test_off_a_terminal_a_plain_line_every_so_often(tmp_path):
    path = str(tmp_path / "count")
    stream = io.StringIO()
    assert isinstance(progress.display(path, 8, enabled=True, every=0), progress._NoDisplay)
    assert isinstance(progress.display(path, 8, enabled=False, stream=stream), progress._NoDisplay)
    display = progress.display(path, 8, enabled=True, every=0.01, stream=stream)
    assert isinstance(display, progress.ProgressLog)
    with open(path, "wb") as f:
        f.write(b"....")
    with display:
        deadline = time.monotonic() + 10
        while "4/8 files" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        with open(path, "ab") as f:
            f.write(b"....")
    lines = stream.getvalue().splitlines(keepends=True)
    assert "\r" not in stream.getvalue() and all(line.endswith("\n") for line in lines)
    assert lines[0].startswith("kiln build: 4/8 files (50.0%)")
    assert lines[-1].startswith("kiln build: 8/8 files (100.0%)")  # the last line at the end

    quiet = io.StringIO()  # a build shorter than the interval prints nothing
    with progress.display(path, 8, enabled=True, every=60, stream=quiet):
        pass
    assert quiet.getvalue() == ""


def test_loop_progress_for_demo_data():
    stream = io.StringIO()
    ticks = iter([0.0, 1.0, 2.0, 3.0, 4.0, 5.0]).__next__
    shown = progress.LoopProgress(
        4, prefix="d: ", unit="images", every=2.0, stream=stream, clock=ticks
    )
    for done in range(1, 5):
        shown.update(done)  # t = 1, 2, 3, 4: a line at t=2 and t=4
    shown.close()  # t=5: the last line
    assert stream.getvalue() == (
        "d: 2/4 images (50.0%), 1.0 images/s, 0:02 left\n"
        "d: 4/4 images (100.0%), 1.0 images/s\n"
        "d: 4/4 images (100.0%), 1.0 images/s\n"
    )


def test_demo_data_prints_progress_off_a_terminal(tmp_path, capfd):
    code = cli.main(
        ["demo-data", str(tmp_path / "demo"), "--num-images", "30", "--progress-every", "0.001"]
    )
    assert code == 0
    out, err = capfd.readouterr()
    lines = err.splitlines()
    assert lines and all(line.startswith("kiln demo-data: ") for line in lines), err
    assert lines[-1].startswith("kiln demo-data: 30/30 images (100.0%)")
    assert out.startswith("wrote 30 images")


@pytest.mark.parametrize("targets", [[], ["--targets"]])
def test_demo_data_quiet_prints_nothing(tmp_path, capfd, targets):
    out = tmp_path / "demo"
    argv = ["demo-data", str(out), "--num-images", "30", "--progress-every", "0.001", "--quiet"]
    assert cli.main(argv + targets) == 0
    assert capfd.readouterr() == ("", "")
    assert any(out.rglob("*.png"))  # written all the same


def test_build_shows_every_file_counted(demo_corpus, tmp_path, capsys):
    config = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    result = build(config, show_progress=True, progress_every=0.01)
    err = capsys.readouterr().err  # not a terminal: plain lines
    total = NUM_DEMO_IMAGES + len(demo_corpus.broken)  # dropped files count as done too
    final = err.splitlines()[-1]
    assert final.startswith(f"kiln build: {total}/{total} files (100.0%)"), err
    assert err.endswith("\n") and "\r" not in err
    # The counting step changes no output: the same version as a build without it.
    quiet = build(make_config(demo_corpus.out_dir, output=str(tmp_path / "quiet")))
    assert quiet.version == result.version
    assert not any(name.startswith("progress") for name in os.listdir(result.dataset_dir))


def write_config(path, config) -> str:
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return str(path)


EMPTY_SPLITS = "split(s) with no example: "


def but_empty_splits(report: dict) -> list[str]:
    """The report's warnings but the one naming the splits its version has
    no example in (the 12 images of `small_corpus` at 70/15/15 may leave
    one empty), checked to name exactly those."""
    info = kiln.reader.info(report["dataset_dir"])
    empty = [name for name, split in info.splits.items() if not split.num_examples]
    named = [w for w in report["warnings"] if w.startswith(EMPTY_SPLITS)]
    if empty:
        (warning,) = named
        listed = warning[len(EMPTY_SPLITS) :].split(": ", 1)[0]
        assert sorted(name.split(" (")[0] for name in listed.split(", ")) == sorted(empty)
    else:
        assert named == []
    return [w for w in report["warnings"] if not w.startswith(EMPTY_SPLITS)]


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


def _cli_process(*args: str) -> subprocess.CompletedProcess:
    """`kiln ARGS` in a fresh process, as cron runs it (its stderr is what cron mails)."""
    source_root = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
    return subprocess.run(
        [sys.executable, "-m", "kiln.cli", *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=source_root),
        timeout=600,
    )


def png_chunk(kind: bytes, data: bytes, crc: int | None = None) -> bytes:
    if crc is None:
        crc = zlib.crc32(kind + data)
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def with_chunk_after_header(png: bytes, chunk: bytes) -> bytes:
    """`png` with `chunk` inserted after its IHDR chunk (8 + 25 bytes in)."""
    return png[:33] + chunk + png[33:]


def write_files_image_libraries_warn_about(root, source_png: bytes, source_jpeg: bytes) -> None:
    """Three images OpenCV decodes, while libpng and libjpeg print a warning
    about each on stderr: the most common such files in real photo sets."""
    (root / "circle" / "text_crc.png").write_bytes(
        with_chunk_after_header(source_png, png_chunk(b"tEXt", b"Comment\0hello", crc=0))
    )  # libpng warning: tEXt: CRC error
    (root / "square" / "short_profile.png").write_bytes(
        with_chunk_after_header(
            source_png, png_chunk(b"iCCP", b"ICC\0\0" + zlib.compress(b"\0" * 16))
        )
    )  # libpng warning: iCCP: too short
    # Junk before the end marker, past what the entropy decoder reads ahead:
    # Corrupt JPEG data: 14 extraneous bytes before marker 0xd9
    end = source_jpeg.rindex(b"\xff\xd9")
    (root / "star" / "extra_bytes.jpg").write_bytes(source_jpeg[:end] + b"\0" * 16 + b"\xff\xd9")


@pytest.mark.timeout(600)
def test_quiet_hides_what_image_libraries_print_about_files(demo_corpus, tmp_path):
    """libpng and libjpeg print warnings on stderr for images a build
    accepts; --quiet prints nothing at all when the build succeeds (the
    report says how many lines it hid), a failure is still its one line,
    and without --quiet the warnings show as they always did."""
    root = tmp_path / "images"
    small_corpus(demo_corpus, root)
    pixels = np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    write_files_image_libraries_warn_about(
        root, encode_image(pixels, format="png"), encode_image(pixels, format="jpeg")
    )
    config = make_config(root, output=str(tmp_path / "quiet"), errors={"max_fraction": 0.2})
    report_path = tmp_path / "report.json"

    quiet = run_kiln(
        "build",
        *("--config", write_config(tmp_path / "config.yaml", config)),
        *("--quiet", "--report", str(report_path)),
    )
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    report = json.loads(report_path.read_text())
    assert report["status"] == "built" and report["dropped_total"] == 0
    (hidden,) = but_empty_splits(report)
    # Three warnings, on fewer lines where image threads interleaved them.
    assert re.match(r"--quiet hid [123] line\(s\) that image libraries wrote to stderr", hidden)

    # A failure under --quiet: its one line, and only that.
    (root / "circle" / "notes.png").write_text("not a picture\n")
    strict = dict(config, output=str(tmp_path / "strict"), errors={"max_fraction": 0.0})
    failed = run_kiln(
        "build", "--config", write_config(tmp_path / "strict.yaml", strict), "--quiet"
    )
    assert failed.returncode == 1, failed.stderr
    assert failed.stdout == ""
    assert failed.stderr.startswith("kiln build: failed: dropped 1 of ")
    assert failed.stderr.count("\n") == 1, failed.stderr

    # Without --quiet, the libraries' lines show as they come. (libpng writes a
    # warning and its newline in two calls: image threads may interleave them,
    # so the messages are looked for in the text, not as whole lines.)
    loud_config = dict(strict, output=str(tmp_path / "loud"), errors={"max_fraction": 0.2})
    loud = run_kiln("build", "--config", write_config(tmp_path / "loud.yaml", loud_config))
    assert loud.returncode == 0, loud.stderr
    assert "libpng warning: tEXt: CRC error" in loud.stderr, loud.stderr
    assert "libpng warning: iCCP: too short" in loud.stderr, loud.stderr
    assert re.search(r"Corrupt JPEG data: \d+ extraneous bytes before marker 0xd9", loud.stderr), (
        loud.stderr
    )


def test_quiet_success_with_warnings_prints_nothing(demo_corpus, tmp_path):
    """Warnings of a build that succeeded (LATEST naming a version that is
    gone, a class whose only file is corrupt) go to the report's
    ``warnings``; under --quiet nothing is printed, and without it each is
    one line, never a traceback."""
    root = tmp_path / "images"
    small_corpus(demo_corpus, root)
    output = tmp_path / "out"
    config = make_config(root, output=str(output), errors={"max_fraction": 0.2})
    config_path = write_config(tmp_path / "config.yaml", config)
    build(config_path)
    (output / "shapes" / "LATEST").write_text("deadbeef0000\n")  # removed by hand
    (root / "hexagon").mkdir()
    (root / "hexagon" / "only.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)  # corrupt
    backdated(root / "hexagon")  # long before: the next build can then be up to date
    report_path = tmp_path / "report.json"

    quiet = _cli_process("build", "--config", config_path, "--quiet", "--report", str(report_path))
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    report = json.loads(report_path.read_text())
    assert report["status"] == "built" and report["previous_version"] == "deadbeef0000"
    (empty, compare) = but_empty_splits(report)
    assert compare.startswith("could not compare with the previous version deadbeef0000: ")
    assert "no such dataset folder" in compare and "Traceback" not in compare
    assert empty.startswith(
        "class(es) with no example (no file listed, or every one dropped): hexagon"
    )

    (output / "shapes" / "LATEST").write_text("deadbeef0000\n")
    loud = _cli_process("build", "--config", config_path, "--report", str(report_path))
    assert loud.returncode == 0, loud.stderr
    assert "Traceback" not in loud.stderr
    warned = [line for line in loud.stderr.splitlines() if line.startswith("WARNING")]
    assert warned == [
        f"WARNING kiln.pipeline.launcher: {compare}",
    ], loud.stderr  # up to date: the empty class was warned about when it was built
    assert json.loads(report_path.read_text())["warnings"] == [compare]
