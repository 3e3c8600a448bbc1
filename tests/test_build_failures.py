"""Failures that still report: a full disk, a read-only or unwritable output.

Each gives exit 1, one line naming the path and the OS error (no Beam
traceback), the --report file, nothing published and no staging folder left.
The full and read-only disks are real tmpfs mounts (the tests run as root
here and in CI); where mounting is not allowed, the same OS error is injected
where the build writes, so the reporting path is still exercised."""

import contextlib
import errno
import json
import os
import subprocess

import pytest
import yaml

from conftest import make_config
from kiln import cli
from kiln.pipeline import storage


@contextlib.contextmanager
def tmpfs(path, *options):
    os.makedirs(path, exist_ok=True)
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)],
            capture_output=True,
        ).returncode
        == 0
    )
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", str(path)], check=True)


def build_into(tmp_path, demo_corpus, output, capsys):
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(make_config(demo_corpus.out_dir, output=str(output))))
    report = tmp_path / "report.json"
    code = cli.main(["build", "--config", str(config_path), "--quiet", "--report", str(report)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err, json.loads(report.read_text())


def assert_one_line_failure(code, out, err, report, *expected):
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("kiln build: failed: "), err
    assert "Traceback" not in err
    for text in expected:
        assert text in err, (text, err)
    assert report["status"] == "failed" and report["exit_code"] == 1
    assert report["error"] == err[len("kiln build: failed: ") :].strip()


def test_a_full_disk_fails_on_one_line_and_cleans_up(demo_corpus, tmp_path, capsys, monkeypatch):
    output = tmp_path / "full"
    with tmpfs(output, "size=200k") as mounted:
        if not mounted:

            def no_space(self, *args, **kwargs):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            from kiln.pipeline import sharding

            monkeypatch.setattr(sharding.RunWriter, "flush", no_space)
        code, out, err, report = build_into(tmp_path, demo_corpus, output, capsys)
        assert_one_line_failure(
            code,
            out,
            err,
            report,
            str(output / "shapes"),
            "No space left on device",
            "nothing was published",
        )
        assert sorted(os.listdir(output / "shapes")) == [".lock"]


def test_a_read_only_output_fails_on_one_line(demo_corpus, tmp_path, capsys, monkeypatch):
    output = tmp_path / "read-only"
    with tmpfs(output, "ro", "size=1m") as mounted:
        if not mounted:

            def read_only(*args, **kwargs):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(output / "shapes"))

            monkeypatch.setattr(os, "makedirs", read_only)
        code, out, err, report = build_into(tmp_path, demo_corpus, output, capsys)
        assert_one_line_failure(
            code, out, err, report, f"{output / 'shapes'}: Read-only file system"
        )
        assert os.listdir(output) == []


def test_an_output_under_a_file_fails_on_one_line(demo_corpus, tmp_path, capsys):
    (tmp_path / "a-file").write_text("not a folder")
    output = tmp_path / "a-file" / "datasets"
    code, out, err, report = build_into(tmp_path, demo_corpus, output, capsys)
    assert_one_line_failure(code, out, err, report, f"{output}: Not a directory")


def test_describe_os_error_names_the_path():
    error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/data/x")
    assert storage.describe_os_error(error) == "/data/x: No space left on device"
    with pytest.raises(OSError):
        raise error


def test_unreachable_reason_names_store_errors_only():
    from apache_beam.io.filesystem import BeamIOError
    from google.auth.exceptions import DefaultCredentialsError

    missing = DefaultCredentialsError("File /x.json was not found.")
    assert storage.unreachable_reason(missing) == "File /x.json was not found"
    wrapped = BeamIOError("Delete operation failed", {"gs://b/x": missing})
    assert storage.unreachable_reason(wrapped) == "File /x.json was not found"
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except OSError as e:
            raise RuntimeError("upload failed") from e
    except RuntimeError as e:
        assert storage.unreachable_reason(e) == "[Errno 111] Connection refused"
    # Anything else is not reported as an unreachable store (a bug stays a bug).
    assert storage.unreachable_reason(KeyError("version")) is None
    assert storage.unreachable_reason(OSError(errno.ENOSPC, "No space left on device")) is None
