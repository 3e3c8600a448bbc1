"""A Dataflow job that was submitted, then failed, was cancelled, or was
interrupted from the launcher.

A real DataflowRunner, offline, as in `test_dataflow_submit`: its staging
location is a bucket on a Cloud Storage emulator on 127.0.0.1, and its
``--dataflow_endpoint`` is a server on 127.0.0.1 that plays Dataflow's API
for one job: it accepts the job's creation, then reports the state each
test gives it (with a worker's error message for a failed job), and takes
the launcher's request to cancel it. The source and the output are in the
in-memory object store (`object_store`); nothing leaves the machine.

Marked slow: an emulator process starts, the job is translated and staged
through HTTP, and Beam's client polls the job every few seconds.
"""

from __future__ import annotations

import atexit
import http.server
import json
import logging
import os
import signal
import socket
import threading

import pytest
import yaml

import gcs_emulator
import object_store
from conftest import make_config
from kiln import cli

pytest.importorskip(
    "apache_beam.runners.dataflow.dataflow_runner", reason="needs kiln[gcp] (apache-beam[gcp])"
)

pytestmark = pytest.mark.slow

BUCKET = "kiln-staging"
PROJECT, REGION, JOB_ID = "fake-project", "europe-west1", "2026-12-07_00_00_00-1234"
# Beam's client sends the requested state as the enum's number (Dataflow's
# API takes either form).
CANCELLED = ("JOB_STATE_CANCELLED", 5)
WORKER_ERROR = (
    "Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.11/site-packages/kiln/pipeline/images.py", line 1\n'
    "ModuleNotFoundError: No module named 'my_plugin'"
)


class _Dataflow(http.server.BaseHTTPRequestHandler):
    """Dataflow's API for one job: created on POST, then in `state`, with
    `messages` (the job's log, as Beam's client lists it); a PUT (cancel)
    moves it to JOB_STATE_CANCELLED."""

    state = "JOB_STATE_RUNNING"
    messages: list[dict] = []
    requests: list[tuple[str, str, dict]] = []
    polled = threading.Event()

    def _job(self, state: str | None = None) -> dict:
        return {
            "id": JOB_ID,
            "projectId": PROJECT,
            "location": REGION,
            "name": "kiln",
            "type": "JOB_TYPE_BATCH",
            "currentState": state or type(self).state,
        }

    def _answer(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}") if length else {}

    def do_POST(self) -> None:
        self.requests.append(("POST", self.path, {}))
        self._body()
        self._answer(self._job("JOB_STATE_QUEUED"))  # as Dataflow answers a new job

    def do_GET(self) -> None:
        self.requests.append(("GET", self.path, {}))
        if "/messages" in self.path:
            self._answer({"jobMessages": type(self).messages})
            return
        type(self).polled.set()
        self._answer(self._job())

    def do_PUT(self) -> None:
        body = self._body()
        self.requests.append(("PUT", self.path, body))
        if body.get("requestedState") in CANCELLED:
            type(self).state = "JOB_STATE_CANCELLED"
        self._answer(self._job())

    def log_message(self, format, *args) -> None:
        pass


@pytest.fixture(autouse=True)
def logging_as_it_was():
    """Beam's DataflowRunner reconfigures logging as it submits and polls a
    job (levels, handlers): put it back, or the builds of later test files
    lose the warnings their reports collect from the root logger."""
    manager = logging.root.manager
    loggers = [
        logging.root,
        *(v for v in manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]
    saved = [(lg, lg.level, lg.propagate, lg.disabled, list(lg.handlers)) for lg in loggers]
    disabled = manager.disable
    yield
    logging.disable(disabled)
    for lg, level, propagate, off, handlers in saved:
        lg.setLevel(level)
        lg.propagate, lg.disabled = propagate, off
        lg.handlers[:] = handlers
    for lg in list(manager.loggerDict.values()):
        if isinstance(lg, logging.Logger) and lg not in loggers:
            lg.setLevel(logging.NOTSET)
            lg.disabled = False


@pytest.fixture
def dataflow():
    """The fake Dataflow API on 127.0.0.1: its URL; the class holds the job."""
    _Dataflow.state, _Dataflow.messages, _Dataflow.requests = "JOB_STATE_RUNNING", [], []
    _Dataflow.polled = threading.Event()
    with gcs_emulator.serving(_Dataflow) as url:
        yield url


@pytest.fixture
def staging_bucket(tmp_path, monkeypatch):
    """gs://`BUCKET` on a Cloud Storage emulator, Beam's client pointed at it."""
    with gcs_emulator.staging_bucket(tmp_path, monkeypatch, BUCKET) as bucket:
        yield bucket


def _build(corpus, staging_bucket, endpoint, tmp_path) -> tuple[int, str, dict]:
    """Runs `kiln build` on Dataflow (the fake API): its exit code, the
    output root, and its --report."""
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(make_config(f"{corpus}/images")))
    output = f"{corpus}/datasets"
    report = tmp_path / "report.json"
    argv = ["build", "--config", str(config_path), "--output", output, "--report", str(report)]
    argv += [
        "--runner=DataflowRunner",
        f"--project={PROJECT}",
        f"--region={REGION}",
        f"--temp_location={staging_bucket}/staging",
        f"--dataflow_endpoint={endpoint}",
        f"--sdk_container_image={REGION}-docker.pkg.dev/{PROJECT}/kiln/kiln:0.1.0",
        "--sdk_location=container",
    ]
    code = cli.main(argv)
    return code, output, json.loads(report.read_text())


def _one_line(capfd) -> str:
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1, err
    return err.strip()


def test_a_job_that_fails_on_the_workers_is_one_line_naming_the_workers_error(
    corpus_on_memgs, no_network_no_credentials, staging_bucket, dataflow, tmp_path, capfd
):
    _Dataflow.state = "JOB_STATE_FAILED"
    _Dataflow.messages = [
        {
            "id": "1",
            "time": "2026-12-07T00:01:00Z",
            "messageText": WORKER_ERROR,
            "messageImportance": "JOB_MESSAGE_ERROR",
        }
    ]
    code, output, report = _build(corpus_on_memgs, staging_bucket, dataflow, tmp_path)
    line = _one_line(capfd)
    assert code == 1, line
    assert line.startswith("kiln build: failed: the Beam job failed writing under "), line
    assert line.endswith(
        ": ModuleNotFoundError: No module named 'my_plugin'; nothing was published"
    ), line
    assert report["status"] == "failed" and report["exit_code"] == 1
    assert object_store.names(output) == []  # nothing published, no staging folder, no lock


def test_a_job_cancelled_on_dataflow_says_so(
    corpus_on_memgs, no_network_no_credentials, staging_bucket, dataflow, tmp_path, capfd
):
    _Dataflow.state = "JOB_STATE_CANCELLED"
    code, output, report = _build(corpus_on_memgs, staging_bucket, dataflow, tmp_path)
    line = _one_line(capfd)
    assert code == 1, line
    # It was "...: None; nothing was published": Beam's message for a job
    # that ended with no error in its log, whose last line is "None".
    assert line.startswith("kiln build: failed: the Beam job failed writing under "), line
    assert line.endswith(
        ": the job was cancelled on Dataflow, not by kiln (in the Cloud Console or with "
        "gcloud dataflow jobs cancel); nothing was published"
    ), line
    assert report["status"] == "failed" and report["exit_code"] == 1
    assert object_store.names(output) == []


def test_a_job_that_failed_with_nothing_in_its_log_names_its_end_state(
    corpus_on_memgs, no_network_no_credentials, staging_bucket, dataflow, tmp_path, capfd
):
    # Beam's client waits 50 seconds for an error message, then raises
    # "State: FAILED, Error: None" (the workers never logged one: e.g. their
    # container image could not be pulled).
    _Dataflow.state = "JOB_STATE_FAILED"
    code, output, report = _build(corpus_on_memgs, staging_bucket, dataflow, tmp_path)
    line = _one_line(capfd)
    assert code == 1, line
    assert line.endswith(
        ": the job ended in state FAILED on Dataflow with no error in its log (see its logs); "
        "nothing was published"
    ), line
    assert object_store.names(output) == []


@pytest.mark.parametrize(
    "signum, code, said",
    [
        (signal.SIGTERM, 143, "kiln build: terminated (SIGTERM)"),
        (signal.SIGINT, 130, "kiln build: interrupted"),
    ],
    ids=["SIGTERM", "SIGINT"],
)
def test_a_signal_cancels_the_dataflow_job(
    corpus_on_memgs,
    no_network_no_credentials,
    staging_bucket,
    dataflow,
    tmp_path,
    capfd,
    signum,
    code,
    said,
):
    # The job runs on Dataflow, apart from kiln: a scheduler's stop or a
    # Ctrl-C must cancel it, not leave it running (billing, racing the retry).
    def signal_once_polled() -> None:
        if _Dataflow.polled.wait(120):
            os.kill(os.getpid(), signum)

    threading.Thread(target=signal_once_polled, daemon=True).start()
    try:
        exit_code, output, report = _build(corpus_on_memgs, staging_bucket, dataflow, tmp_path)
    finally:
        # An interrupted `kiln build` ends its process with the exit code at
        # exit (`cli._end_interrupted_process`); here that process is pytest's,
        # which would end with 130 or 143 after every test passed.
        atexit.unregister(cli._end_interrupted_process)
    line = _one_line(capfd)
    assert exit_code == code, line
    assert line == said
    cancels = [body for method, _, body in _Dataflow.requests if method == "PUT"]
    assert len(cancels) == 1 and cancels[0].get("requestedState") in CANCELLED, cancels
    assert report["status"] == "interrupted" and report["exit_code"] == code
    assert object_store.names(output) == []


def test_a_runner_the_launcher_cannot_download_says_from_where(
    demo_corpus, no_network_no_credentials, tmp_path, monkeypatch, capfd
):
    # Prism's binary is downloaded from GitHub when the job starts; here
    # through a proxy on a closed port of 127.0.0.1 (nothing leaves the
    # machine), into an empty cache under this test's HOME. It was "could
    # not be submitted to PrismRunner: Connection refused", naming neither
    # the download nor its URL.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{port}")
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(make_config(demo_corpus.out_dir)))
    output = tmp_path / "datasets"
    argv = ["build", "--config", str(config_path), "--output", str(output)]
    assert cli.main([*argv, "--runner=PrismRunner"]) == 1
    line = _one_line(capfd)
    head = "kiln build: failed: the Beam job could not be submitted to PrismRunner: "
    assert line.startswith(head + "Unable to fetch remote prism binary at https://github.com/"), (
        line
    )
    # The proxy refuses the connection; where urllib goes around it (an
    # opener built earlier), the name does not resolve: either way Beam's line.
    assert "<urlopen error " in line, line
    assert line.endswith(">; no worker ran, nothing was published"), line
    # Nothing published, no staging folder: only the local lock's file stays.
    assert sorted(os.listdir(output / "shapes")) == [".lock"]
