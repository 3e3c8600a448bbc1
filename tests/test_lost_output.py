"""Output that cannot be written changes no exit code and no ``--report``.

Real runs of the command line in subprocesses whose stdout or stderr is
``/dev/full`` (every write fails with ENOSPC, as on a full disk) or a pipe
whose reader has gone (EPIPE, as after ``| head``; closed before the command
starts, so every write meets it). What kiln prints for a person is dropped
and the command returns its own verdict; where stdout is the product
(``--json``, ``--format json``) a full disk is exit 73 with one line, a
reader that went away is not an error. See docs/cli.md, "Exit codes".
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import yaml

import kiln
from conftest import make_config

SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
LINT_CORPUS = pathlib.Path(__file__).parent / "lint_corpus"
NOT_WRITTEN = "output not written: stdout: cannot write the JSON {what}: No space left on device"


@contextlib.contextmanager
def _stream(kind: str):
    if kind == "full":
        with open("/dev/full", "w") as full:
            yield full
    elif kind == "closed":
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the first line
        try:
            yield write
        finally:
            os.close(write)
    else:
        assert kind == "captured", kind
        yield subprocess.PIPE


def kiln_into(stdout: str, stderr: str, *argv: str) -> tuple[int, str, str]:
    """`kiln ARGV` in a subprocess whose stdout and stderr are each
    ``"full"``, ``"closed"`` or ``"captured"``: its exit code and what was
    captured (``""`` for a stream that was not)."""
    with _stream(stdout) as out, _stream(stderr) as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "kiln.cli", *argv],
            stdout=out,
            stderr=err,
            text=True,
            env=dict(os.environ, PYTHONPATH=SOURCE_ROOT),
        )
        written, complaints = process.communicate(timeout=600)
    return process.returncode, written or "", complaints or ""


def test_a_build_whose_stdout_is_full_publishes_reports_and_exits_0(tmp_path, demo_corpus):
    """It used to publish, then exit 70 ("internal error: OSError: [Errno 28]
    No space left on device") with its --report left ``running``."""
    config = tmp_path / "config.yaml"
    output = tmp_path / "out"
    config.write_text(yaml.safe_dump(make_config(demo_corpus.out_dir, output=str(output))))
    report = tmp_path / "report.json"
    code, _, err = kiln_into(
        "full", "captured", "build", "--config", str(config), "--report", str(report)
    )
    assert code == 0, err
    assert "error" not in err, err
    written = json.loads(report.read_text())
    assert (written["status"], written["exit_code"]) == ("built", 0), written
    assert (output / "shapes" / "LATEST").read_text().strip() == written["version"]


def test_a_summary_its_stdout_cannot_encode_is_escaped_not_an_internal_error(tmp_path, demo_corpus):
    """With an ASCII stdout (``PYTHONIOENCODING=ascii``, a non-UTF-8 locale)
    a build into a folder named ``café`` published, then exited 70
    ("internal error: UnicodeEncodeError", which says nothing was published)
    with its report left ``running``; `kiln inspect` of it was exit 70. The
    character is printed escaped, as on stderr."""
    config = tmp_path / "config.yaml"
    output = tmp_path / "café"
    config.write_text(yaml.safe_dump(make_config(demo_corpus.out_dir, output=str(output))))
    report = tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=SOURCE_ROOT, PYTHONIOENCODING="ascii")

    def kiln_ascii(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "kiln.cli", *argv],
            capture_output=True,
            env=env,
            timeout=600,
        )

    built = kiln_ascii("build", "--config", str(config), "--report", str(report))
    assert (built.returncode, built.stderr) == (0, b""), built.stderr
    written = json.loads(report.read_text())
    assert (written["status"], written["exit_code"]) == ("built", 0), written
    escaped = f"{tmp_path}/caf\\xe9/shapes/{written['version']}".encode()
    assert escaped in built.stdout
    inspected = kiln_ascii("inspect", str(output / "shapes"))
    assert (inspected.returncode, inspected.stderr) == (0, b""), inspected.stderr
    assert escaped in inspected.stdout


def test_a_config_error_that_cannot_be_printed_is_still_exit_2(tmp_path):
    """It was exit 1 on a full stderr: the failure line's write raised."""
    config = tmp_path / "config.yaml"
    config.write_text("name: [unclosed\n")
    assert kiln_into("captured", "full", "build", "--config", str(config))[0] == 2
    # A flag's value argparse refuses, and one no one knows: the same.
    assert kiln_into("captured", "full", "build", "--config", str(config), "--keep", "two")[0] == 2
    assert kiln_into("captured", "full", "inspect", "--depth", "x")[0] == 2


@pytest.mark.parametrize("stdout", ["full", "closed"])
def test_inspect_returns_its_verdict_whatever_happens_to_its_text(build_dataset, stdout):
    """`kiln inspect DS | head -1` exited 1 ("found a problem"); `> /dev/full` 70."""
    assert kiln_into(stdout, "captured", "inspect", build_dataset().dataset_root) == (0, "", "")


def test_inspect_json_into_a_closed_pipe_is_not_an_error(build_dataset):
    root = build_dataset().dataset_root
    assert kiln_into("closed", "captured", "inspect", "--json", root) == (0, "", "")


def test_inspect_json_that_cannot_be_written_is_exit_73_in_one_line(build_dataset):
    """A script reading the file must not take half a document for the answer."""
    code, _, err = kiln_into("full", "captured", "inspect", "--json", build_dataset().dataset_root)
    assert code == 73, err
    assert err.startswith("kiln inspect: " + NOT_WRITTEN.format(what="summary")), err
    assert err.count("\n") == 1, err


@pytest.fixture
def damaged(build_dataset, tmp_path):
    """A copy of the base build's version folder with a shard cut short."""
    result = build_dataset()
    copy = tmp_path / result.version
    shutil.copytree(result.dataset_dir, copy)
    shard = copy / result.info.splits["train"].shards[0].filename
    shard.write_bytes(shard.read_bytes()[:-10])
    return str(copy)


@pytest.mark.parametrize(
    "stdout, flags", [("full", ()), ("closed", ()), ("full", ("--quiet",))], ids=str
)
def test_verify_returns_its_verdict_whatever_happens_to_its_lines(
    build_dataset, damaged, stdout, flags
):
    """`kiln verify DS > /dev/full` exited 70 (or 120, when the lines failed
    at the interpreter's last flush); `| head` made an intact dataset exit 1."""
    intact = build_dataset().dataset_dir
    assert kiln_into(stdout, "captured", "verify", *flags, intact) == (0, "", "")
    assert kiln_into(stdout, "captured", "verify", *flags, damaged) == (1, "", "")


def test_lint_text_that_cannot_be_written_keeps_the_verdict():
    clean, findings = LINT_CORPUS / "clean_stateless.py", LINT_CORPUS / "methods.py"
    assert kiln_into("full", "full", "lint", str(clean))[0] == 0
    assert kiln_into("closed", "closed", "lint", str(findings))[0] == 1
    assert kiln_into("full", "full", "lint", str(findings))[0] == 1


def test_lint_json_that_cannot_be_written_is_exit_73_unless_there_are_findings():
    """With findings the verdict (1) stands and the lost output is logged, as
    a --report that cannot be written after a failed build is."""
    clean, findings = LINT_CORPUS / "clean_stateless.py", LINT_CORPUS / "methods.py"
    assert kiln_into("closed", "captured", "lint", "--format", "json", str(clean)) == (0, "", "")
    code, _, err = kiln_into("full", "captured", "lint", "--format", "json", str(clean))
    assert code == 73
    assert err.startswith("kiln lint: " + NOT_WRITTEN.format(what="document")), err
    assert err.count("\n") == 1, err
    code, _, err = kiln_into("full", "captured", "lint", "--format", "json", str(findings))
    assert code == 1
    assert err.startswith("ERROR kiln.console: stdout: cannot write the JSON document"), err


def test_demo_data_and_preview_whose_stdout_is_full_do_their_work_and_exit_0(
    build_dataset, tmp_path
):
    folder = tmp_path / "demo"
    code, _, err = kiln_into("full", "captured", "demo-data", str(folder), "--num-images", "4")
    assert code == 0, err
    assert sorted(path.name for path in folder.iterdir() if path.is_dir())
    sheet = tmp_path / "sheet.png"
    root = build_dataset().dataset_root
    code, _, err = kiln_into("full", "captured", "preview", root, "--n", "2", "-o", str(sheet))
    assert code == 0, err
    assert sheet.stat().st_size > 0
