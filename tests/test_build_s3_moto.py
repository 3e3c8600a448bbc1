"""The s3:// build cycle against moto's S3 server on 127.0.0.1.

`kiln build` (the CLI, then `kiln.pipeline.build`) lists an s3:// source,
takes the lock, runs the job, publishes and moves LATEST through Beam's
real S3 filesystem (`apache_beam.io.aws`, boto3, HTTP to
`moto.server.ThreadedMotoServer`), configured only by the pipeline flags a
user passes (``--s3_endpoint_url``, ``--s3_access_key_id``, ...): the same
flags configure the job's workers and the launcher. Then the up-to-date
rebuild, ``--keep``, and the lock's exclusive create (``If-None-Match: *``).

TensorFlow 2.21 has no s3:// filesystem, so the reader, ``kiln verify`` and
``kiln inspect`` cannot open the dataset on S3: they run on a copy of the
published version downloaded with boto3, which checks what S3 holds.

Marked slow: the builds go through HTTP, and moto's server is started here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections import Counter

import boto3
import pytest
import yaml
from moto import server as moto_server

import kiln
from conftest import let_uploads_age, make_config
from kiln import cli
from kiln.errors import Busy
from kiln.pipeline import build, command, storage
from kiln.pipeline.lock import DatasetLock, Holder
from kiln.pipeline.publish import (
    DROPPED_SHA256S_FILE,
    FILE_STAMPS_FOLDER,
    LISTED_FROM_FILE,
    PUBLISHED_FOLDER,
    STAMPS_FOLDER,
)

pytestmark = pytest.mark.slow

BUCKET = "kiln-test"
REGION = "us-east-1"
KEY_ID, SECRET = "testing-key", "testing-secret"


@pytest.fixture(scope="module")
def endpoint():
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3(endpoint, monkeypatch):
    """A boto3 client on moto, a fresh bucket, and no AWS settings of this
    machine's (files, profile, credentials) anywhere in reach."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
    )
    client.create_bucket(Bucket=BUCKET)
    yield client
    for name in _names(client, ""):
        client.delete_object(Bucket=BUCKET, Key=name)
    client.delete_bucket(Bucket=BUCKET)


def _flags(endpoint: str) -> list[str]:
    """What a user passes to reach an S3 endpoint: Beam's S3 options."""
    return [
        f"--s3_endpoint_url={endpoint}",
        f"--s3_region_name={REGION}",
        f"--s3_access_key_id={KEY_ID}",
        f"--s3_secret_access_key={SECRET}",
    ]


def _names(client, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


def _get(client, name: str) -> bytes:
    return client.get_object(Bucket=BUCKET, Key=name)["Body"].read()


def _upload_corpus(client, corpus_dir: str, prefix: str) -> None:
    for directory, _, files in os.walk(corpus_dir):
        for name in sorted(files):
            path = os.path.join(directory, name)
            key = os.path.relpath(path, corpus_dir).replace(os.sep, "/")
            client.upload_file(path, BUCKET, f"{prefix}/{key}")
    let_uploads_age()


def _download(client, prefix: str, folder) -> None:
    for name in _names(client, prefix):
        target = folder / name[len(prefix) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(_get(client, name))


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(list(argv))
    return code, out.getvalue()


def test_the_whole_cycle_on_moto(s3, endpoint, build_dataset, demo_corpus, tmp_path):
    _upload_corpus(s3, demo_corpus.out_dir, "images")
    root = f"s3://{BUCKET}/datasets/shapes"
    stale = "datasets/shapes/.staging-0123456789ab-dead/shapes-train.tfrecord-x"
    s3.put_object(Bucket=BUCKET, Key=stale, Body=b"left by a killed build")
    config = make_config(f"s3://{BUCKET}/images", output=f"s3://{BUCKET}/datasets")
    config_file = tmp_path / "s3.yaml"
    config_file.write_text(yaml.safe_dump(config))

    # The CLI, as a user runs it: the config check lists s3:// with the flags.
    code, out = _cli("build", "--config", str(config_file), "--quiet", *_flags(endpoint))
    assert code == 0 and out == ""
    version = _get(s3, "datasets/shapes/LATEST").decode().strip()

    local = build_dataset()
    assert version == local.version
    # Every file of the version is the local build's, byte for byte, except
    # where the source's location is written (errors.jsonl names each
    # dropped file, kiln.json the source and the checksums of both). The
    # report files with no rows (duplicates.jsonl) are empty objects.
    published = _names(s3, f"datasets/shapes/{version}/")
    assert [name.rsplit("/", 1)[1] for name in published] == sorted(os.listdir(local.dataset_dir))
    for name in os.listdir(local.dataset_dir):
        with open(os.path.join(local.dataset_dir, name), "rb") as f:
            expected = f.read()
        if name == "errors.jsonl":
            expected = expected.replace(
                demo_corpus.out_dir.encode(), f"s3://{BUCKET}/images".encode()
            )
        if name != "kiln.json":
            assert _get(s3, f"datasets/shapes/{version}/{name}") == expected, name
    assert _get(s3, f"datasets/shapes/{version}/duplicates.jsonl") == b""
    # No staging folder (the stale one included), no work files, no lock.
    stamps = _names(s3, f"datasets/shapes/{STAMPS_FOLDER}/")
    assert len(stamps) == 1 and _get(s3, stamps[0]).decode().strip() == version
    # The listing the version was built from, moved out of the staging folder.
    kept = f"datasets/shapes/{FILE_STAMPS_FOLDER}/{version}"
    file_stamps = [
        f"{kept}/listing.jsonl",
        f"{kept}/{LISTED_FROM_FILE}",
        f"{kept}/{DROPPED_SHA256S_FILE}",
    ]
    assert b'"mtime"' in _get(s3, file_stamps[0])
    everything = sorted(
        [
            "datasets/shapes/LATEST",
            f"datasets/shapes/{PUBLISHED_FOLDER}/.named",
            f"datasets/shapes/{PUBLISHED_FOLDER}/{version}",
            *stamps,
        ]
        + file_stamps
        + published
    )
    assert _names(s3, "datasets/") == everything

    again = build(config, _flags(endpoint))
    assert again.up_to_date and again.version == version
    assert again.dataset_dir == f"{root}/{version}"
    assert _names(s3, "datasets/") == everything

    # What S3 holds is a complete dataset: verify and inspect pass on a copy.
    copy = tmp_path / "copy"
    _download(s3, "datasets/shapes/", copy)
    code, out = _cli("verify", str(copy))
    assert code == 0 and f"kiln verify: OK: {copy / version}" in out, out
    code, out = _cli("inspect", str(copy), "--json")
    assert code == 0
    inspected = json.loads(out)
    assert inspected["splits"]["train"]["num_examples"] == local.info.splits["train"].num_examples

    # A second version with --keep 1: the first is pruned, LATEST moves on.
    changed = dict(
        config, transforms=[{"resize": {"shorter_side": 40}}, {"center_crop": {"size": 24}}]
    )
    second = build(changed, _flags(endpoint), keep=1)
    assert second.version != version and second.pruned == (version,)
    assert second.previous_version == version
    assert _get(s3, "datasets/shapes/LATEST").decode() == second.version + "\n"
    assert not _names(s3, f"datasets/shapes/{version}/")
    assert _names(s3, f"datasets/shapes/{second.version}/kiln.json")


def test_an_image_folder_listed_by_the_job_on_moto(s3, endpoint, demo_corpus):
    # source.listing: job: S3's delimiter listing (ListObjectsV2, Delimiter
    # '/') gives the class folders, the listing job lists each through Beam's
    # S3 filesystem; the same bytes as the launcher's listing.
    _upload_corpus(s3, demo_corpus.out_dir, "images")
    s3.put_object(Bucket=BUCKET, Key="images/stray.txt", Body=b"above the class folders")
    config = make_config(f"s3://{BUCKET}/images", output=f"s3://{BUCKET}/by-launcher")
    config["errors"] = {"max_fraction": 0.5}
    by_launcher = build(config, _flags(endpoint))
    # Its first version: the summary's next steps are the ones that work on s3://.
    (next_line,) = [line for line in command.summary(by_launcher).splitlines() if "next:" in line]
    assert next_line == (
        f"  next: TensorFlow has no s3:// filesystem: copy the version to local disk or gs:// "
        f"(aws s3 sync s3://{BUCKET}/by-launcher/shapes/{by_launcher.version} "
        f"{by_launcher.version}), then kiln inspect, kiln preview and kiln.reader.load read "
        f"the copy"
    )
    in_job = dict(
        config, output=f"s3://{BUCKET}/by-job", source=dict(config["source"], listing="job")
    )
    by_job = build(in_job, _flags(endpoint))

    assert by_job.version == by_launcher.version
    assert by_job.info.dropped == by_launcher.info.dropped
    launcher_files = _names(s3, f"by-launcher/shapes/{by_launcher.version}/")
    job_files = _names(s3, f"by-job/shapes/{by_job.version}/")
    assert [n.split("/", 1)[1] for n in job_files] == [n.split("/", 1)[1] for n in launcher_files]
    for ours, theirs in zip(job_files, launcher_files, strict=True):
        assert _get(s3, ours) == _get(s3, theirs), ours
    assert build(in_job, _flags(endpoint)).up_to_date
    assert not [name for name in _names(s3, "by-job/") if "/.listings/" in name]


def test_the_job_reads_each_image_with_one_get(s3, endpoint, demo_corpus, tmp_path, caplog):
    # Beam's S3 filesystem sends a HEAD before each GET, through a boto3
    # session and client it makes for every file (tenths of a second of CPU
    # each: most of the build's time). The job reads each image with one GET,
    # through one client, as moto's server (werkzeug's request log) saw it.
    _upload_corpus(s3, demo_corpus.out_dir, "images")
    config = make_config(f"s3://{BUCKET}/images", output=str(tmp_path / "out"))
    caplog.set_level(logging.INFO, logger="werkzeug")
    caplog.clear()  # the uploads
    result = build(config, _flags(endpoint))
    requests = Counter(
        match.groups()
        for record in caplog.records
        if record.name == "werkzeug"
        for match in [re.search(rf'"([A-Z]+) /{BUCKET}/images/([^ ?]+)', record.getMessage())]
        if match
    )
    keys = {
        os.path.relpath(os.path.join(folder, name), demo_corpus.out_dir)
        for folder, _, names in os.walk(demo_corpus.out_dir)
        for name in names
    }
    stored = sum(split.num_examples for split in result.info.splits.values())
    assert stored == len(keys) - len(demo_corpus.broken)
    assert requests == Counter({("GET", key): 1 for key in keys})


def test_the_lock_is_an_exclusive_create_on_s3(s3, endpoint):
    storage.use_pipeline_options(_flags(endpoint))
    store = storage.store_for(f"s3://{BUCKET}/x")
    root = f"s3://{BUCKET}/datasets/shapes"
    path = f"{root}/.lock"
    other = Holder(pid=4321, host="elsewhere", started="2026-01-01T00:00:00+00:00", token="other")
    other = dataclasses.replace(other, heartbeat=time.time())
    assert store.create_exclusive(path, other.to_bytes())
    # If-None-Match: * refuses a second create: the store keeps the first.
    assert not store.create_exclusive(path, b"second")
    assert store.read_bytes(path) == other.to_bytes()

    with pytest.raises(Busy, match="pid 4321 on elsewhere"):
        with DatasetLock(root):
            pass
    assert store.read_bytes(path) == other.to_bytes()


def test_the_lock_is_replaced_only_if_unchanged_on_s3(s3, endpoint):
    # Breaking a stale lock and the heartbeat replace the lock object only
    # if it is still what was read (If-Match of its ETag).
    storage.use_pipeline_options(_flags(endpoint))
    store = storage.store_for(f"s3://{BUCKET}/x")
    path = f"s3://{BUCKET}/datasets/shapes/.lock"
    assert not store.replace_if_unchanged(path, b"old", b"new")  # gone: nothing written
    assert store.read_bytes(path) is None
    assert store.create_exclusive(path, b"old")
    assert not store.replace_if_unchanged(path, b"other", b"new")
    assert store.replace_if_unchanged(path, b"old", b"new")
    assert store.read_bytes(path) == b"new"


def test_the_lock_of_a_build_killed_on_this_machine_is_broken_at_once(s3, endpoint, caplog):
    # It blocked every retry for 10 minutes (busy, exit 3), until its heartbeat went stale.
    root = f"s3://{BUCKET}/datasets/killed"
    kiln_root = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import json, sys, time\n"
            "from kiln.pipeline import lock, storage\n"
            "storage.use_pipeline_options(json.loads(sys.argv[2]))\n"
            "with lock.DatasetLock(sys.argv[1]):\n"
            "    print('held', flush=True); time.sleep(600)\n",
            root,
            json.dumps(_flags(endpoint)),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=kiln_root),
    )
    storage.use_pipeline_options(_flags(endpoint))
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(
            Busy, match=f"holds the lock .* \\(pid {holder.pid} on .*last heartbeat"
        ):
            DatasetLock(root).__enter__()
    finally:
        holder.kill()  # SIGKILL: it cannot delete its lock
        holder.wait()
    assert _names(s3, "datasets/killed/") == ["datasets/killed/.lock"]
    with caplog.at_level(logging.WARNING, logger="kiln.pipeline.lock"):
        with DatasetLock(root) as held:  # no --wait: at once
            assert held.holder().pid == os.getpid()
    assert f"its process {holder.pid} on this machine is not running" in caplog.text
    assert _names(s3, "datasets/killed/") == []  # released


def _kiln_without_aws_settings(*argv: str) -> subprocess.CompletedProcess:
    """`python -m kiln ARGV` in a fresh process, as a user runs it, with
    none of this machine's AWS settings: no AWS_* variables, no files, no
    instance role (the metadata service is not asked)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    env.update(
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
        PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__))),
    )
    # Beam's S3 filesystem retried these requests for about nine minutes;
    # the timeout only stops a test that hangs.
    return subprocess.run(
        [sys.executable, "-m", "kiln", *argv], capture_output=True, text=True, env=env, timeout=240
    )


def test_an_s3_source_without_credentials_is_one_line(endpoint, tmp_path):
    config = make_config(f"s3://{BUCKET}/images", output=str(tmp_path / "out"))
    config_file = tmp_path / "s3.yaml"
    config_file.write_text(yaml.safe_dump(config))

    completed = _kiln_without_aws_settings(
        "build", "--config", str(config_file), f"--s3_endpoint_url={endpoint}"
    )
    err = completed.stderr
    assert completed.returncode == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(
        f"kiln build: error: config error in {config_file}: source.root: s3://{BUCKET}/images: "
        "cannot reach it: no AWS credentials found: pass --s3_access_key_id and "
        "--s3_secret_access_key"
    ), err
    assert "AWS_ACCESS_KEY_ID" in err
    assert not (tmp_path / "out").exists()


def test_an_s3_endpoint_that_is_down_is_one_line(tmp_path):
    # Port 1 on this machine: nothing listens, the connection is refused.
    config = make_config(f"s3://{BUCKET}/images", output=str(tmp_path / "out"))
    config_file = tmp_path / "s3.yaml"
    config_file.write_text(yaml.safe_dump(config))
    down = _flags("http://127.0.0.1:1")

    completed = _kiln_without_aws_settings("build", "--config", str(config_file), *down)
    err = completed.stderr
    assert completed.returncode == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(
        f"kiln build: error: config error in {config_file}: source.root: s3://{BUCKET}/images: "
        'cannot reach it: Could not connect to the endpoint URL: "http://127.0.0.1:1/'
    ), err


def test_an_output_on_s3_without_credentials_is_one_line(endpoint, demo_corpus, tmp_path):
    # A local source: the first access to S3 is the lock's create, through boto3.
    config = make_config(demo_corpus.out_dir, output=f"s3://{BUCKET}/datasets")
    config_file = tmp_path / "s3.yaml"
    config_file.write_text(yaml.safe_dump(config))

    completed = _kiln_without_aws_settings(
        "build", "--config", str(config_file), f"--s3_endpoint_url={endpoint}"
    )
    err = completed.stderr
    assert completed.returncode == 2, err
    assert err.count("\n") == 1 and err.endswith("; nothing was done\n"), err
    assert err.startswith(
        f"kiln build: error: s3://{BUCKET}/datasets/shapes: cannot reach it: no AWS credentials "
        "found: pass --s3_access_key_id and --s3_secret_access_key"
    ), err


def test_beams_s3_errors_say_the_store_cannot_be_reached():
    # What Beam's S3 filesystem raises once its retries are spent: its own
    # S3ClientError (whose str is the tuple of its arguments) in a
    # BeamIOError, the boto3 error it wrapped no longer its context.
    from apache_beam.io.aws.clients.s3.messages import S3ClientError
    from apache_beam.io.filesystem import BeamIOError

    refused = S3ClientError('Could not connect to the endpoint URL: "http://127.0.0.1:1/b"', None)
    error = BeamIOError("List operation failed", {"s3://b/images": refused})
    assert storage.unreachable_reason(error) == (
        'Could not connect to the endpoint URL: "http://127.0.0.1:1/b"'
    )
    assert storage.unreachable_reason(BeamIOError("x", {"s3://b/i": ValueError("bug")})) is None


def test_a_report_into_a_missing_s3_bucket_is_one_line(s3, endpoint, demo_corpus, tmp_path):
    # Beam's S3 filesystem logs the failed upload, with its traceback, on
    # the root logger ("ERROR root: Error in _start_upload ...") before it
    # raises the error kiln reports: in a fresh process, as a user runs it.
    config = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    config_file = tmp_path / "s3.yaml"
    config_file.write_text(yaml.safe_dump(config))
    report = "s3://no-such-bucket/r.json"

    completed = _kiln_without_aws_settings(
        "build", "--config", str(config_file), *_flags(endpoint), "--report", report
    )
    err = completed.stderr
    assert completed.returncode == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"kiln build: error: --report {report}: cannot write it: "), err
    assert "NoSuchBucket" in err and err.endswith("; nothing was done\n"), err
    assert not (tmp_path / "out").exists()
