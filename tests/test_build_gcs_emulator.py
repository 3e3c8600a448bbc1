"""The whole gs:// cycle against a Cloud Storage emulator on 127.0.0.1.

Build, publish, LATEST, the up-to-date rebuild and ``--keep`` run in this
process through Beam's real GCS filesystem (`apache_beam.io.gcp.gcsio`,
google-cloud-storage, HTTP to the emulator); ``kiln verify``, ``kiln
inspect`` and `kiln.reader.load` run in a child process through
TensorFlow's own GCS filesystem, whose fixed ``https://*.googleapis.com``
URLs reach the same emulator through `gcs_emulator.GoogleApiTunnel`. The
lock's exclusive create (``ifGenerationMatch=0``) is tested on
fake-gcs-server, the emulator that implements preconditions (see
`gcs_emulator`). Every emulator and the tunnel are started here and stopped
when the module ends, pass or fail.

Marked slow: a child process imports TensorFlow, and the builds go through
HTTP.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

import gcs_emulator
import kiln
from conftest import let_uploads_age, make_config
from kiln.errors import Busy, DryRun
from kiln.pipeline import build, sources, storage
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

# Reads every split of each dataset given with TensorFlow's GCS filesystem
# and runs `kiln verify` and `kiln inspect --json` on it (mode "read"), or
# only `kiln verify` (mode "verify"), or `kiln verify`, `kiln inspect` and
# `kiln inspect --json` (mode "inspect"): one child process,
# so TensorFlow is imported once, with the tunnel's settings from the start.
TENSORFLOW_CHILD = """
    import contextlib, hashlib, io, json, sys
    import kiln.reader
    from kiln.cli import main

    def run(argv):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(argv)
        return {"code": code, "stdout": out.getvalue()}

    results = {}
    mode, *paths = sys.argv[1:]
    for path in paths:
        if mode == "verify":
            results[path] = {"verify": run(["verify", path])}
            continue
        if mode == "inspect":
            results[path] = {
                "verify": run(["verify", path]),
                "inspect": run(["inspect", path]),
                "json": run(["inspect", path, "--json"]),
            }
            continue
        info = kiln.reader.info(path)
        splits = {}
        for split in info.splits:
            dataset = kiln.reader.load(path, split, batch_size=None, shuffle=False, augment=None)
            splits[split] = [
                hashlib.sha256(image.numpy().tobytes()).hexdigest() + f":{int(label)}"
                for image, label in dataset
            ]
        results[path] = {
            "version": info.version,
            "splits": splits,
            "verify": run(["verify", path]),
            "inspect": run(["inspect", path, "--json"]),
        }
    print("RESULTS " + json.dumps(results))
"""


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    """The batch-capable emulator, a bucket on it, and the tunnel for TensorFlow."""
    folder = tmp_path_factory.mktemp("gcs-emulator")
    server = gcs_emulator.StorageEmulator(folder / "emulator.log")
    tunnel = None
    try:
        server.create_bucket(BUCKET)
        certificate, key = gcs_emulator.google_api_certificate(folder)
        tunnel = gcs_emulator.GoogleApiTunnel(server.port, certificate, key)
        credentials = gcs_emulator.authorized_user_credentials(folder / "adc.json")
        yield server, server.client_env(credentials), tunnel.env(certificate), tunnel
    finally:
        if tunnel is not None:
            tunnel.close()
        server.stop()


@pytest.fixture
def on_emulator(emulator, monkeypatch):
    """This process's clients on the emulator: Beam's, and TensorFlow's (the
    launcher compares a new version with the previous one through it)."""
    server, client_env, tensorflow_env, _ = emulator
    for name, value in {**client_env, **tensorflow_env}.items():
        monkeypatch.setenv(name, value)
    return server


def _client():
    from google.cloud import storage as gcs

    return gcs.Client()


def _names(prefix: str) -> list[str]:
    return sorted(blob.name for blob in _client().list_blobs(BUCKET, prefix=prefix))


def _get(name: str) -> bytes:
    return _client().bucket(BUCKET).blob(name).download_as_bytes()


def _without_location(info: dict) -> dict:
    return {k: v for k, v in info.items() if k not in ("provenance", "errors_sha256", "checksum")}


def _upload_corpus(corpus_dir: str, prefix: str) -> None:
    bucket = _client().bucket(BUCKET)
    for directory, _, files in os.walk(corpus_dir):
        for name in sorted(files):
            path = os.path.join(directory, name)
            key = os.path.relpath(path, corpus_dir).replace(os.sep, "/")
            bucket.blob(f"{prefix}/{key}").upload_from_filename(path)
    let_uploads_age()


def _read_with_tensorflow(emulator, mode: str, *paths: str) -> dict:
    _, client_env, tensorflow_env, _ = emulator
    kiln_root = str(Path(kiln.__file__).resolve().parent.parent)
    env = dict(os.environ, **client_env, **tensorflow_env, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(
        [kiln_root, *[p for p in [os.environ.get("PYTHONPATH")] if p]]
    )
    completed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(TENSORFLOW_CHILD), mode, *paths],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=600,
        check=False,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULTS ")]
    assert completed.returncode == 0 and lines, completed.stdout + completed.stderr[-5000:]
    return json.loads(lines[-1][len("RESULTS ") :])


def test_the_whole_cycle_on_the_emulator(emulator, on_emulator, build_dataset, demo_corpus):
    _upload_corpus(demo_corpus.out_dir, "images")
    root = f"gs://{BUCKET}/datasets/shapes"
    stale = "datasets/shapes/.staging-0123456789ab-dead/shapes-train.tfrecord-x"
    _client().bucket(BUCKET).blob(stale).upload_from_string(b"left by a killed build")
    config = make_config(f"gs://{BUCKET}/images", output=f"gs://{BUCKET}/datasets")

    first = build(config)  # the local runner, Beam's GCS filesystem

    local = build_dataset()
    assert first.version == local.version
    # The same dataset as the local build of the same files: every file of
    # the version byte for byte, except where the source's location is
    # written (errors.jsonl names each dropped file, kiln.json the source
    # and the checksums of both).
    assert _without_location(first.info.to_json()) == _without_location(local.info.to_json())
    published = _names(f"datasets/shapes/{first.version}/")
    assert [name.rsplit("/", 1)[1] for name in published] == sorted(os.listdir(local.dataset_dir))
    for name in os.listdir(local.dataset_dir):
        with open(os.path.join(local.dataset_dir, name), "rb") as f:
            expected = f.read()
        stored = _get(f"datasets/shapes/{first.version}/{name}")
        if name == "errors.jsonl":
            expected = expected.replace(
                demo_corpus.out_dir.encode(), f"gs://{BUCKET}/images".encode()
            )
        if name != "kiln.json":
            assert stored == expected, name
    assert _get("datasets/shapes/LATEST").decode() == first.version + "\n"
    # No staging folder (the stale one included), no work files, no lock:
    # beside the version only LATEST and the publisher's records.
    stamps = _names(f"datasets/shapes/{STAMPS_FOLDER}/")
    assert len(stamps) == 1 and _get(stamps[0]).decode().strip() == first.version
    # The listing the version was built from, moved out of the staging folder.
    kept = f"datasets/shapes/{FILE_STAMPS_FOLDER}/{first.version}"
    file_stamps = [
        f"{kept}/listing.jsonl",
        f"{kept}/{LISTED_FROM_FILE}",
        f"{kept}/{DROPPED_SHA256S_FILE}",
    ]
    assert b'"mtime"' in _get(file_stamps[0])
    everything = sorted(
        [
            "datasets/shapes/LATEST",
            f"datasets/shapes/{PUBLISHED_FOLDER}/.named",
            f"datasets/shapes/{PUBLISHED_FOLDER}/{first.version}",
            *stamps,
            *file_stamps,
            *published,
        ]
    )
    assert _names("datasets/") == everything

    again = build(config)
    assert again.up_to_date and again.version == first.version
    assert _names("datasets/") == everything

    # TensorFlow's GCS filesystem reads what Beam's wrote: the reader's
    # stream equals the local dataset's, and verify and inspect pass.
    read = _read_with_tensorflow(emulator, "read", root, local.dataset_root)
    on_gcs, on_disk = read[root], read[local.dataset_root]
    assert on_gcs["version"] == first.version
    assert on_gcs["splits"] == on_disk["splits"]
    for name, split in first.info.splits.items():
        assert len(on_gcs["splits"][name]) == split.num_examples > 0
    assert on_gcs["verify"]["code"] == 0, on_gcs["verify"]
    assert f"kiln verify: OK: {root}/{first.version}" in on_gcs["verify"]["stdout"]
    inspected = json.loads(on_gcs["inspect"]["stdout"])
    assert inspected["splits"]["train"]["num_examples"] == first.info.splits["train"].num_examples
    assert emulator[3].refused == []  # every request went to the emulator

    # A second version with --keep 1: the first is pruned, LATEST moves on.
    changed = dict(
        config, transforms=[{"resize": {"shorter_side": 40}}, {"center_crop": {"size": 24}}]
    )
    second = build(changed, keep=1)
    assert second.version != first.version and second.pruned == (first.version,)
    assert second.previous_version == first.version and second.changes is not None
    assert _get("datasets/shapes/LATEST").decode() == second.version + "\n"
    assert not _names(f"datasets/shapes/{first.version}/")
    assert _names(f"datasets/shapes/{second.version}/kiln.json")

    # kiln verify notices a shard changed on the store.
    shard = second.info.splits["train"].shards[0].filename
    blob = _client().bucket(BUCKET).blob(f"datasets/shapes/{second.version}/{shard}")
    data = bytearray(blob.download_as_bytes())
    data[-5] ^= 0xFF
    blob.upload_from_string(bytes(data))
    corrupted = _read_with_tensorflow(emulator, "verify", root)[root]["verify"]
    assert corrupted["code"] == 1 and shard in corrupted["stdout"], corrupted


def test_the_job_reads_each_image_with_one_request_on_shared_connections(
    on_emulator, demo_corpus, tmp_path, caplog
):
    # Beam's GCS filesystem makes a client, with its own HTTP session, for
    # every object it opens (on Cloud Storage a new TLS connection each) and
    # asks for the object's metadata before its bytes. The job reads each
    # image with one media GET on connections its threads share, as urllib3
    # (under google-cloud-storage's session) logs the requests it sends.
    _upload_corpus(demo_corpus.out_dir, "one-get")
    config = make_config(f"gs://{BUCKET}/one-get", output=str(tmp_path / "out"))
    caplog.set_level(logging.DEBUG, logger="urllib3.connectionpool")
    caplog.clear()  # the uploads
    result = build(config)
    messages = [r.getMessage() for r in caplog.records if r.name == "urllib3.connectionpool"]
    reads = Counter(
        (match.group(1), match.group(2).replace("%2F", "/"))
        for message in messages
        for match in [re.search(rf'"([A-Z]+) \S*/b/{BUCKET}/o/one-get(?:%2F|/)([^ ?]+)', message)]
        if match
    )
    keys = {
        os.path.relpath(os.path.join(folder, name), demo_corpus.out_dir)
        for folder, _, names in os.walk(demo_corpus.out_dir)
        for name in names
    }
    assert reads == Counter({("GET", key): 1 for key in keys})
    requests = [m for m in messages if f"/b/{BUCKET}/o/one-get" in m]
    assert all("alt=media" in m for m in requests), requests[:3]  # no metadata request
    connections = [m for m in messages if m.startswith("Starting new HTTP connection")]
    assert len(connections) < len(keys) / 4, len(connections)
    stored = sum(split.num_examples for split in result.info.splits.values())
    assert stored == len(keys) - len(demo_corpus.broken)


@pytest.mark.parametrize("per_row_max", [0, 1_000_000], ids=["listed", "asked_for"])
def test_a_manifest_on_the_emulator_lists_its_folders(
    on_emulator, demo_corpus, monkeypatch, per_row_max
):
    # The rows' folders are listed through Beam's GCS filesystem (google-cloud-storage's
    # paged listing), or their objects asked for one by one (few rows in a folder); what
    # either says of each object is what its metadata request says, so a row's stamp
    # does not depend on the way it was found.
    monkeypatch.setattr(sources, "_PER_ROW_MAX_OBJECTS", per_row_max)
    folder = f"manifest-images-{per_row_max}"  # one folder per case: no manifest left over
    _upload_corpus(demo_corpus.out_dir, folder)
    images = f"gs://{BUCKET}/{folder}"
    keys = [name[len(folder) + 1 :] for name in _names(folder + "/")]
    rows = [f"{key},{key.split('/')[0]}" for key in keys] + ["circle/missing.png,circle"]
    manifest = f"{folder}/manifest.csv"
    _client().bucket(BUCKET).blob(manifest).upload_from_string("path,label\n" + "\n".join(rows))

    source = sources.ManifestSource(type="manifest", path=f"gs://{BUCKET}/{manifest}")
    with source.list_files(splits_from_source=False) as listing:
        files = [(f.uri, f.size, f.mtime) for f in listing.files()]
        dropped = [(d.key, d.reason) for d in listing.dropped()]
    store = storage.store_for(images)
    assert files == sorted(
        (uri, *store.file_status(uri)[:2]) for uri in (f"{images}/{key}" for key in keys)
    )
    assert dropped == [("circle/missing.png", "missing")]


def test_an_image_folder_on_the_emulator_lists_its_class_folders_concurrently(on_emulator):
    # The first level by a delimiter listing, then each class folder on its own thread:
    # the same objects, sizes and times as Beam's one listing of the whole prefix.
    bucket = _client().bucket(BUCKET)
    names = ["top.png", "a/1.png", "a/deeper/2.png", "b/3.png", ".hidden/4.png", "b/.5.png"]
    for index, name in enumerate(names):
        bucket.blob(f"fan-out/{name}").upload_from_string(b"x" * index)
    root = f"gs://{BUCKET}/fan-out"
    store = storage.store_for(root)

    def listed(metadata_list):
        return sorted((m.path, m.size_in_bytes, m.last_updated_in_seconds) for m in metadata_list)

    from apache_beam.io.filesystems import FileSystems

    whole = listed(FileSystems.match([root + "/**"])[0].metadata_list)
    assert listed(store.walk_tree(root)) == whole
    assert [path for path, _, _ in listed(store.walk_tree(root, skip_hidden=True))] == [
        f"{root}/{name}" for name in ["a/1.png", "a/deeper/2.png", "b/3.png", "top.png"]
    ]


def test_an_image_folder_listed_by_the_job_on_the_emulator(on_emulator, demo_corpus):
    # source.listing: job through the real clients: Cloud Storage's delimiter
    # listing gives the class folders, the listing job lists each through
    # Beam's GCS filesystem in worker processes (the local runner's
    # multi-processing mode: the workers have the launcher's environment,
    # not its objects), and the build reads the job's listing files.
    _upload_corpus(demo_corpus.out_dir, "listed-in-job")
    config = make_config(f"gs://{BUCKET}/listed-in-job", output=f"gs://{BUCKET}/by-launcher")
    by_launcher = build(config)
    in_job = dict(
        config,
        output=f"gs://{BUCKET}/by-job",
        source=dict(config["source"], listing="job"),
    )
    workers = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    by_job = build(in_job, workers)

    assert by_job.version == by_launcher.version
    launcher_files = _names(f"by-launcher/shapes/{by_launcher.version}/")
    job_files = _names(f"by-job/shapes/{by_job.version}/")
    assert [n.split("/", 1)[1] for n in job_files] == [n.split("/", 1)[1] for n in launcher_files]
    for ours, theirs in zip(job_files, launcher_files, strict=True):
        assert _get(ours) == _get(theirs), ours
    again = build(in_job, workers)
    assert again.up_to_date and again.version == by_job.version
    assert not [name for name in _names("by-job/") if "/.listings/" in name]


@pytest.mark.parametrize("listing", ["launcher", "job"])
def test_folder_placeholders_are_folders_on_the_emulator(
    on_emulator, build_dataset, demo_corpus, listing
):
    # The Cloud Console's "Create folder" (and gcsfuse's mkdir) write an
    # empty object named like the folder, which stays when the folder's
    # files are deleted. They were read as files: each an `empty` drop (the
    # root's own `unexpected_location`), and a class made of each folder, so
    # a class emptied on the store stayed a class with no example. Now they
    # are folders, as on a disk: the version of the same files, where the
    # placeholders of the root, a class folder and an empty folder are.
    folder = f"placeholders-{listing}"
    _upload_corpus(demo_corpus.out_dir, f"{folder}/images")
    bucket = _client().bucket(BUCKET)
    for name in ("images/", "images/circle/", "images/zebra/"):
        bucket.blob(f"{folder}/{name}").upload_from_string(b"")
    let_uploads_age()
    config = make_config(f"gs://{BUCKET}/{folder}/images", output=f"gs://{BUCKET}/{folder}")
    config["source"]["listing"] = listing

    result = build(config)

    local = build_dataset()
    assert result.version == local.version
    assert result.info.class_names == local.info.class_names
    assert result.info.dropped == local.info.dropped


@pytest.mark.parametrize("per_row_max", [0, None], ids=["listed", "asked_for"])
def test_a_manifest_listed_by_the_job_on_the_emulator(
    on_emulator, demo_corpus, monkeypatch, per_row_max
):
    # source.listing: job for a manifest through the real clients: the job
    # reads the manifest through Beam's GCS filesystem and lists the rows'
    # folders (google-cloud-storage's paged listing) or, by the default rule
    # (a few rows a folder), asks for their objects one by one in 2 worker
    # processes (the local runner's multi-processing mode: the workers
    # unpickle the steps); the launcher's bytes, and up to date either way.
    workers: list[str] = []
    if per_row_max is None:
        workers = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    else:  # the rule patched in this process: the job runs in it
        monkeypatch.setattr(sources, "_PER_ROW_MAX_OBJECTS", per_row_max)
    folder = f"job-manifest-{per_row_max}"
    _upload_corpus(demo_corpus.out_dir, folder)
    keys = [name[len(folder) + 1 :] for name in _names(folder + "/")]
    rows = [f"{key},{key.split('/')[0]}" for key in keys] + ["circle/missing.png,circle"]
    manifest = f"{folder}/manifest.csv"
    _client().bucket(BUCKET).blob(manifest).upload_from_string("path,label\n" + "\n".join(rows))
    config = make_config(
        f"gs://{BUCKET}/{folder}",
        output=f"gs://{BUCKET}/{folder}-by-launcher",
        source={"type": "manifest", "path": f"gs://{BUCKET}/{manifest}"},
    )
    by_launcher = build(config)
    in_job = dict(
        config,
        output=f"gs://{BUCKET}/{folder}-by-job",
        source=dict(config["source"], listing="job"),
    )
    by_job = build(in_job, workers)

    assert by_job.version == by_launcher.version
    assert by_job.info.dropped == by_launcher.info.dropped
    assert by_job.info.dropped["missing"] == 1
    launcher_files = _names(f"{folder}-by-launcher/shapes/{by_launcher.version}/")
    job_files = _names(f"{folder}-by-job/shapes/{by_job.version}/")
    assert [n.split("/", 1)[1] for n in job_files] == [n.split("/", 1)[1] for n in launcher_files]
    for ours, theirs in zip(job_files, launcher_files, strict=True):
        assert _get(ours) == _get(theirs), ours
    again = build(dict(in_job, output=config["output"]), workers)
    assert again.up_to_date and again.version == by_launcher.version


@pytest.fixture
def fake_gcs_server(tmp_path, monkeypatch):
    server = gcs_emulator.FakeGcsServer(tmp_path / "fake-gcs-server.log")
    try:
        server.create_bucket(BUCKET)
        credentials = gcs_emulator.authorized_user_credentials(tmp_path / "adc.json")
        for name, value in server.client_env(credentials).items():
            monkeypatch.setenv(name, value)
        yield server
    finally:
        server.stop()


def test_the_lock_is_an_exclusive_create_on_gcs(fake_gcs_server):
    store = storage.store_for(f"gs://{BUCKET}/x")
    root = f"gs://{BUCKET}/datasets/shapes"
    path = f"{root}/.lock"
    other = Holder(pid=4321, host="elsewhere", started="2026-01-01T00:00:00+00:00", token="other")
    other = dataclasses.replace(other, heartbeat=time.time())
    assert store.create_exclusive(path, other.to_bytes())
    # ifGenerationMatch=0 refuses a second create: the store keeps the first.
    assert not store.create_exclusive(path, b"second")
    assert store.read_bytes(path) == other.to_bytes()

    with pytest.raises(Busy, match="pid 4321 on elsewhere"):
        with DatasetLock(root):
            pass
    assert store.read_bytes(path) == other.to_bytes()


def test_the_lock_is_replaced_only_if_unchanged_on_gcs(fake_gcs_server, monkeypatch):
    # Breaking a stale lock and the heartbeat replace the lock object only
    # if it is still what was read (ifGenerationMatch of that generation).
    from google.cloud import storage as gcs

    store = storage.store_for(f"gs://{BUCKET}/x")
    path = f"gs://{BUCKET}/datasets/shapes/.lock"
    assert not store.replace_if_unchanged(path, b"old", b"new")  # gone: nothing written
    assert not _client().bucket(BUCKET).blob("datasets/shapes/.lock").exists()
    assert store.create_exclusive(path, b"old")
    assert not store.replace_if_unchanged(path, b"other", b"new")
    assert store.replace_if_unchanged(path, b"old", b"new")
    assert store.read_bytes(path) == b"new"

    # Another writer in between the read and the write, with the same bytes
    # (a new generation): the replacement is refused, the other's kept.
    read = gcs.Blob.download_as_bytes

    def read_then_another_writes(blob, *args, **kwargs):
        data = read(blob, *args, **kwargs)
        _client().bucket(BUCKET).blob(blob.name).upload_from_string(data)
        return data

    with monkeypatch.context() as patched:
        patched.setattr(gcs.Blob, "download_as_bytes", read_then_another_writes)
        assert not store.replace_if_unchanged(path, b"new", b"mine")
    assert store.read_bytes(path) == b"new"


def test_a_dataflow_dry_run_reads_the_base_and_writes_nothing(
    on_emulator, demo_corpus, tmp_path_factory, caplog
):
    # A dry run translates the job that would reuse LATEST's records, so it
    # reads LATEST and that version's kiln.json; it takes no lock and
    # writes, renames and deletes nothing (a stale staging folder stays for
    # the next real build, which holds the lock, to delete). The source is
    # on the store too: Dataflow's workers could not read a local one.
    _upload_corpus(demo_corpus.out_dir, "dry-run-images")
    config = make_config(f"gs://{BUCKET}/dry-run-images", output=f"gs://{BUCKET}/dry-run")
    published = build(config)
    stale = "dry-run/shapes/.staging-0123456789ab-dead/x"
    _client().bucket(BUCKET).blob(stale).upload_from_string(b"left by a killed build")
    before = {name: _get(name) for name in _names("dry-run/")}
    temp = f"gs://{BUCKET}/dataflow-temp"
    dataflow = [
        *("--runner=DataflowRunner", "--dry_run=True", "--project=fake-project"),
        *("--region=europe-west1", f"--temp_location={temp}", "--sdk_location=container"),
        "--sdk_container_image=europe-west1-docker.pkg.dev/fake-project/kiln/kiln:0.1.0",
    ]
    changed = dict(config, transforms=[{"resize": {"shorter_side": 40}}])
    with caplog.at_level(logging.INFO, logger="kiln.pipeline.launcher"):
        with pytest.raises(DryRun, match="translated for DataflowRunner") as dry_run:
            build(config, dataflow)
        with pytest.raises(DryRun):
            build(changed, dataflow)
    chosen = [r.getMessage() for r in caplog.records if r.name == "kiln.pipeline.launcher"]
    assert f"reusing unchanged records of version {published.version}" in chosen
    assert any(m.startswith("building from scratch: its processing differs") for m in chosen)
    assert str(dry_run.value).endswith(
        f"(up to date: a build would run no job and point LATEST at version {published.version})"
    )
    assert {name: _get(name) for name in _names("dry-run/")} == before
    assert _names("dataflow-temp/") == []


# `kiln build` that SIGKILLs itself right after its first rename into a
# version folder (argv[1], a pattern): on Cloud Storage the version is
# copied file by file, kiln.json last, so it dies with the shards copied
# and no kiln.json, as a build killed by the OOM killer or a preempted VM.
KILLED_WHILE_COPYING = """
    import os, re, signal, sys
    from apache_beam.io.filesystems import FileSystems
    from kiln import cli

    rename = FileSystems.rename

    def rename_then_die(sources, destinations):
        rename(sources, destinations)
        if any(re.fullmatch(sys.argv[1], d) for d in destinations):
            os.kill(os.getpid(), signal.SIGKILL)

    FileSystems.rename = rename_then_die
    sys.exit(cli.main(["build", *sys.argv[2:]]))
"""


def test_a_version_half_copied_by_a_killed_build_is_deleted_by_the_next(
    on_emulator, emulator, demo_corpus, tmp_path, caplog
):
    folder = "half-copied"
    _upload_corpus(demo_corpus.out_dir, f"{folder}/images")
    root = f"gs://{BUCKET}/{folder}/shapes"
    config = make_config(f"gs://{BUCKET}/{folder}/images", output=f"gs://{BUCKET}/{folder}")
    first = build(config)
    changed = dict(config, transforms=[{"resize": {"shorter_side": 40}}])
    config_path = tmp_path / "config.yaml"
    config_path.write_text(json.dumps(changed))  # JSON is YAML
    kiln_root = str(Path(kiln.__file__).resolve().parent.parent)
    _, client_env, _, _ = emulator
    killed = subprocess.run(
        [
            *(sys.executable, "-c", textwrap.dedent(KILLED_WHILE_COPYING)),
            rf"{root}/[0-9a-f]{{12}}/[^/]+",
            *("--config", str(config_path), "--quiet"),
        ],
        env=dict(os.environ, **client_env, PYTHONPATH=kiln_root, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    versions = {n.split("/")[2] for n in _names(f"{folder}/shapes/") if n.count("/") == 3}
    (partial,) = versions - {first.version, "LATEST"} - {v for v in versions if v[0] == "."}
    left = _names(f"{folder}/shapes/{partial}/")
    assert left and f"{folder}/shapes/{partial}/kiln.json" not in left  # the ops finding
    assert _get(f"{folder}/shapes/LATEST").decode() == first.version + "\n"

    # Later builds make other versions (here: other transforms again); the
    # first of them deletes the half-copied folder, which no prune counts.
    other = dict(config, transforms=[{"resize": {"shorter_side": 36}}])
    kept = {name: _get(name) for name in _names(f"{folder}/shapes/{first.version}/")}
    with caplog.at_level(logging.WARNING):
        third = build(other, keep=2)
    assert third.version not in (first.version, partial)
    assert _names(f"{folder}/shapes/{partial}/") == []
    assert {name: _get(name) for name in _names(f"{folder}/shapes/{first.version}/")} == kept
    assert any(
        f"deleting the incomplete version folder {root}/{partial}" in r.getMessage()
        for r in caplog.records
    )
    assert not [n for n in _names(f"{folder}/shapes/") if "/.staging-" in n]


def test_a_report_in_a_missing_bucket_stops_the_build_before_it_starts(
    on_emulator, demo_corpus, tmp_path, capfd
):
    # It was found at the end: a published dataset and an internal error (exit 70).
    from kiln import cli

    config = tmp_path / "config.json"
    config.write_text(json.dumps(make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))))
    report = "gs://kiln-test-no-such-bucket/reports/r.json"
    code = cli.main(["build", "--config", str(config), "--quiet", "--report", report])
    out, err = capfd.readouterr()
    assert (code, out) == (2, ""), err
    assert err.startswith(
        f"kiln build: error: --report {report}: cannot write it: "
        f"cannot reach gs://kiln-test-no-such-bucket/reports: "
    )
    assert err.endswith("; nothing was done\n") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_a_source_in_a_missing_bucket_is_a_config_error(on_emulator, tmp_path, capfd):
    # It was an internal error (exit 70): BeamIOError, Match operation failed, NotFound.
    from kiln import cli

    source = "gs://kiln-test-no-such-bucket/images"
    config = tmp_path / "config.json"
    config.write_text(json.dumps(make_config(source, output=str(tmp_path / "out"))))
    code = cli.main(["build", "--config", str(config), "--quiet"])
    out, err = capfd.readouterr()
    assert (code, out) == (2, ""), err
    assert err.startswith(
        f"kiln build: error: config error in {config}: source.root: {source}: cannot reach it: 404 "
    )
    assert err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def _copy(source_prefix: str, target_prefix: str, skip: tuple[str, ...] = ()) -> None:
    """Copies every object under `source_prefix` to `target_prefix`, but
    those whose name ends with one of `skip`."""
    bucket = _client().bucket(BUCKET)
    for name in _names(source_prefix):
        if not name.endswith(skip):
            bucket.copy_blob(bucket.blob(name), bucket, target_prefix + name[len(source_prefix) :])


def test_inspect_and_verify_name_what_killed_builds_left_on_the_emulator(
    on_emulator, emulator, demo_corpus
):
    # What `kiln inspect gs://...` and `kiln verify gs://...` say, through
    # TensorFlow's GCS filesystem, of a dataset folder where builds were
    # killed: one while it copied its version (shards, no kiln.json), one
    # while its job ran (its staging folder). In "dead", the killed build's
    # lock is still there, without a heartbeat for an hour (stale); in
    # "live", a build holds the lock and beats.
    folder = "leftovers"
    _upload_corpus(demo_corpus.out_dir, f"{folder}/images")
    config = make_config(f"gs://{BUCKET}/{folder}/images", output=f"gs://{BUCKET}/{folder}")
    first = build(config)
    roots = {}
    bucket = _client().bucket(BUCKET)
    for state, heartbeat in (("dead", time.time() - 3600), ("live", time.time())):
        prefix = f"{folder}/{state}/shapes"
        _copy(f"{folder}/shapes/", f"{prefix}/")
        _copy(f"{folder}/shapes/{first.version}/", f"{prefix}/0123456789ab/", skip=("kiln.json",))
        staging = f"{prefix}/.staging-0123456789ab-dead"
        bucket.blob(f"{staging}/.work/listing.sqlite").upload_from_string(b"x" * 3000)
        bucket.blob(f"{staging}/shapes-train.tfrecord-x").upload_from_string(b"x" * 72)
        holder = Holder(
            pid=4321, host="elsewhere", started="2026-01-01T00:00:00+00:00", token=state
        )
        holder = dataclasses.replace(holder, heartbeat=heartbeat)
        bucket.blob(f"{prefix}/.lock").upload_from_string(holder.to_bytes())
        roots[state] = f"gs://{BUCKET}/{prefix}"

    results = _read_with_tensorflow(emulator, "inspect", *roots.values())
    assert emulator[3].refused == []  # every request went to the emulator
    for state, root in roots.items():
        result = results[root]
        incomplete = f"{root}/0123456789ab"
        staging = f"{root}/.staging-0123456789ab-dead"
        summary = json.loads(result["json"]["stdout"])
        assert summary["incomplete_versions"] == [incomplete]
        (found,) = summary["staging_folders"]
        assert (found["path"], found["num_files"], found["num_bytes"]) == (staging, 2, 3072)
        assert abs(found["modified"] - time.time()) < 600
        lock = summary["lock"]
        assert lock["held"] is (state == "live") and lock["holder"]["token"] == state

        seconds = "<N> s"  # a number of seconds: how long ago depends on the clock
        if state == "dead":
            lock_line = (
                "  the dataset's lock is stale (pid 4321 on elsewhere, started "
                f"2026-01-01T00:00:00+00:00; no heartbeat for {seconds}): its build is dead, "
                "and the next build breaks the lock: left by a build that was killed, or kept "
                "for its errors.jsonl by one that dropped too many files. The next kiln build "
                "of the dataset deletes them; to free the space now, while no build runs: "
                f"gcloud storage rm -r {staging}"
            )
        else:
            lock_line = (
                "  a build holds the dataset's lock (pid 4321 on elsewhere, started "
                f"2026-01-01T00:00:00+00:00, last heartbeat {seconds} ago): it may be running; "
                "leave them: it deletes those of earlier builds itself, its own when it ends"
            )
        expected = [
            "incomplete version folder(s), no kiln.json (left by an interrupted build or prune; "
            f"never read; the next kiln build deletes them): {incomplete}",
            "staging folder(s) of builds that did not finish (never read):",
            f"  {staging}  2 file(s), 3.0 KiB, last written {seconds} ago",
            lock_line,
        ]

        def matches(lines, patterns):
            return len(lines) == len(patterns) and all(
                re.fullmatch(re.escape(pattern).replace("<N>", r"\d+"), line)
                for line, pattern in zip(lines, patterns, strict=True)
            )

        printed = result["inspect"]["stdout"].splitlines()
        at = printed.index(expected[1])
        assert matches(printed[at - 1 :], expected), printed[at - 1 :]
        verified = result["verify"]
        assert verified["code"] == 0, verified
        first_line, *notes = verified["stdout"].splitlines()
        assert first_line.startswith(f"kiln verify: OK: {root}/{first.version}: ")
        noted = ["note: " + expected[0], "note: " + expected[1], *expected[2:]]
        assert matches(notes, noted), notes

    # What the lines promise: the next build breaks the dead build's lock
    # and deletes both (up to date: the stamp is there, no job runs).
    again = build(dict(config, output=f"gs://{BUCKET}/{folder}/dead"))
    assert again.up_to_date and again.version == first.version
    left = _names(f"{folder}/dead/shapes/")
    assert not [n for n in left if "/.staging-" in n or "/0123456789ab/" in n], left
