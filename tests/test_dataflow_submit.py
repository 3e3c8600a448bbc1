"""A Dataflow job that cannot be submitted is said so, in one line.

A real DataflowRunner, offline: the job's staging location is a bucket on a
Cloud Storage emulator on 127.0.0.1 (`gcs_emulator`), and its
``--dataflow_endpoint`` is a server on 127.0.0.1 that answers the job's
creation as Dataflow's API does for a project where it is not enabled
(HTTP 403). The source and the output are in the in-memory object store
(`object_store`). Nothing leaves the machine (`no_network_no_credentials`).

Marked slow: an emulator process starts, and the job is translated and
staged through HTTP.
"""

from __future__ import annotations

import http.server
import json
import logging

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
REFUSAL = "Dataflow API has not been used in project fake-project before or it is disabled."


class _RefusingDataflow(http.server.BaseHTTPRequestHandler):
    """Dataflow's API for a project where it is disabled: every request is
    refused with HTTP 403, in the API's error format."""

    requests: list[tuple[str, str]] = []

    def _refuse(self) -> None:
        self.requests.append((self.command, self.path))
        body = json.dumps(
            {"error": {"code": 403, "message": REFUSAL, "status": "PERMISSION_DENIED"}}
        ).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _refuse

    def log_message(self, format, *args) -> None:
        pass


@pytest.fixture
def dataflow_endpoint():
    """The refusing Dataflow API on 127.0.0.1: (its URL, the requests it got)."""
    _RefusingDataflow.requests = []
    with gcs_emulator.serving(_RefusingDataflow) as url:
        yield url, _RefusingDataflow.requests


@pytest.fixture
def staging_bucket(tmp_path, monkeypatch):
    """gs://`BUCKET` on a Cloud Storage emulator, Beam's client pointed at it."""
    with gcs_emulator.staging_bucket(tmp_path, monkeypatch, BUCKET) as bucket:
        yield bucket


def test_a_job_dataflow_refuses_is_not_submitted_in_one_line(
    corpus_on_memgs,
    no_network_no_credentials,
    staging_bucket,
    dataflow_endpoint,
    tmp_path,
    capfd,
    caplog,
):
    # It was "the Beam job failed writing under <staging folder>: ..." under
    # Beam's CRITICAL line quoting the same refusal: no job had started.
    endpoint, requests = dataflow_endpoint
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(make_config(f"{corpus_on_memgs}/images")))
    output = f"{corpus_on_memgs}/datasets"
    report = tmp_path / "report.json"
    argv = ["build", "--config", str(config_path), "--output", output, "--report", str(report)]
    argv += [
        "--runner=DataflowRunner",
        "--project=fake-project",
        "--region=europe-west1",
        f"--temp_location={staging_bucket}/staging",
        f"--dataflow_endpoint={endpoint}",
        "--sdk_container_image=europe-west1-docker.pkg.dev/fake-project/kiln/kiln:0.1.0",
        "--sdk_location=container",
    ]

    assert cli.main(argv) == 1
    # Beam's client logs the refusal at CRITICAL before it raises it: not
    # on the terminal, which has kiln's line (pytest's handler takes the
    # records here, so they are looked for in caplog).
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1, err
    # Beam's own last line: the service's answer to the job's creation.
    answer = f"403 POST {endpoint}/v1b3/projects/fake-project/locations/europe-west1/jobs"
    head = "kiln build: failed: the Beam job could not be submitted to DataflowRunner: "
    assert err.startswith(head + answer), err
    assert err.endswith(f"{REFUSAL[:-1]}; no worker ran, nothing was published\n"), err
    assert [method for method, _ in requests] == ["POST"]
    written = json.loads(report.read_text())
    assert written["status"] == "failed" and written["exit_code"] == 1
    assert written["error"] == err[len("kiln build: failed: ") :].strip()
    assert object_store.names(output) == []  # no staging folder left, no lock
