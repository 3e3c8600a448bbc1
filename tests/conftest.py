"""Shared fixtures: a generated demo corpus and real builds of it.

Both are session-scoped: the corpus is generated once and each distinct
build runs once per test session (real Beam pipelines on the local runner,
a few seconds each), however many tests use them.

``demo_corpus`` -> `kiln.pipeline.demo_data.DemoSummary`
    60 demo shape images in 4 classes (``circle``, ``square``, ``star``,
    ``triangle``: label ids 0..3) plus the 3 deliberately broken files,
    written by ``demo_data.generate(seed=0)``. ``demo_corpus.out_dir`` is
    the folder, ``demo_corpus.broken`` maps each broken file's key
    (``class/name``) to its drop reason. Treat it as read-only.

``base_config`` -> dict
    A fresh copy of `BASE_CONFIG` pointing at the corpus, output not set.

``build_dataset(**overrides)`` -> `kiln.pipeline.BuildResult`
    Builds the corpus with `BASE_CONFIG`, each keyword replacing that
    top-level config key wholesale (a dict replaces the whole section), and
    returns the result. Identical calls return the cached result of the
    first, so tests can share builds freely; distinct calls build into
    their own output folders. Examples::

        result = build_dataset()                                  # PNG, 64x64... see BASE_CONFIG
        result = build_dataset(encoding={"format": "jpeg", "quality": 90})
        result = build_dataset(sharding={"num_shards": 1}, augment=["random_flip_left_right"])
        result = build_dataset(pipeline_args=["--direct_num_workers=2"])

    ``result.dataset_dir`` is the version folder (shards, kiln.json,
    errors.jsonl, duplicates.jsonl), ``result.dataset_root`` the
    ``<output>/<name>`` folder with LATEST, ``result.info`` the
    `kiln.schemas.DatasetInfo`.
    The shards are read-only for tests (copy them before corrupting one).

``no_network_no_credentials`` -> list of connections attempted
    Every connection off the machine is refused (and the test fails if one
    was attempted), and Google Cloud credentials and gcloud's config (its
    default region too) are out of reach.

``corpus_on_memgs`` -> ``"memgs://bucket"``
    The demo corpus under ``memgs://bucket/images`` in the in-memory object
    store (`object_store`): a source on an object store without a network.

``duplicates_build`` -> (`kiln.pipeline.BuildResult`, expected groups)
    The demo corpus plus three byte-for-byte copies, built with
    `BASE_CONFIG`: a circle copied once into its own class and once into
    ``star``, a square copied into ``triangle``. The groups are the sorted
    keys of each set of identical files, as duplicates.jsonl lists them.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

import kiln

# 60 images over 4 classes; with a 0.7/0.15/0.15 split each split holds
# several of every class. The 3 broken files are 4.8% of 63 inputs, so the
# base config allows 10% (the default 5% would be uncomfortably close).
NUM_DEMO_IMAGES = 60

BASE_CONFIG = {
    "name": "shapes",
    "source": {"type": "image_folder", "root": None},  # set to the corpus
    "transforms": [
        {"resize": {"shorter_side": 40}},
        {"center_crop": {"size": 32}},
    ],
    "encoding": {"format": "png"},
    "splits": {"fractions": {"train": 0.7, "validation": 0.15, "test": 0.15}},
    "sharding": {"num_shards": {"train": 3, "validation": 1, "test": 1}},
    "errors": {"max_fraction": 0.1},
}


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory):
    """The demo corpus, its files dated an hour back: written long before
    any build. (A file modified within `incremental.RACY_SECONDS` of a
    build's start is read by the next build's up-to-date check, and one it
    cannot verify, such as a broken file, makes that build run the job.)"""
    from kiln.pipeline import demo_data

    corpus = demo_data.generate(
        tmp_path_factory.mktemp("demo-corpus") / "images", num_images=NUM_DEMO_IMAGES, seed=0
    )
    backdated(corpus.out_dir)
    return corpus


AN_HOUR = 3600.0


def backdated(folder):
    """`folder` with every file's modification time an hour back: files
    written long before the build. (A file modified within
    `incremental.RACY_SECONDS` of a build's start is read by the next
    build: by its up-to-date check, whose stamps cannot vouch for it, and
    by its job, which does not trust the file's stamp either.)"""
    for directory, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(directory, name)
            earlier = os.stat(path).st_mtime - AN_HOUR
            os.utime(path, (earlier, earlier))
    return folder


def let_uploads_age() -> None:
    """Waits until objects just uploaded to a storage server, whose update
    times a test cannot set back, are older than `incremental.RACY_SECONDS`
    (plus a margin): written long before the build that follows, as
    `demo_corpus` dates its files, so that a rebuild is up to date (the
    up-to-date check cannot verify the broken files of a version built
    right after they were written: the build drops them, they have no record)."""
    import time

    from kiln.pipeline import incremental

    time.sleep(incremental.RACY_SECONDS + 0.1)


def run_kiln(*argv: str, pythonpath=(), preexec_fn=None, **env: str) -> subprocess.CompletedProcess:
    """`kiln ARGV` in a subprocess: this checkout's kiln, then the folders
    `pythonpath`, with the environment variables `env` set (and
    `preexec_fn` run in the child before it starts)."""
    source_root = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
    return subprocess.run(
        [sys.executable, "-m", "kiln.cli", *argv],
        capture_output=True,
        text=True,
        env=dict(
            os.environ, PYTHONPATH=os.pathsep.join([source_root, *map(str, pythonpath)]), **env
        ),
        timeout=600,
        preexec_fn=preexec_fn,
    )


def kiln_offline(credentials, *argv: str) -> subprocess.CompletedProcess:
    """`run_kiln` where kiln must find no Google Cloud credentials and reach
    no Google host: the credentials file `credentials` (missing, or fake),
    and the metadata server and any proxy on a closed port of localhost."""
    return run_kiln(
        *argv,
        GOOGLE_APPLICATION_CREDENTIALS=str(credentials),
        NO_GCE_CHECK="true",
        GCE_METADATA_HOST="127.0.0.1:9",
        GCE_METADATA_IP="127.0.0.1:9",
        HTTPS_PROXY="http://127.0.0.1:9",
        https_proxy="http://127.0.0.1:9",
        NO_PROXY="",
        no_proxy="",
    )


@pytest.fixture
def no_network_no_credentials(monkeypatch, tmp_path):
    """Refuses (and records) every connection that leaves the machine."""
    real_connect = socket.socket.connect
    attempts = []

    def local_only(sock, address):
        host = address[0] if isinstance(address, tuple) else address
        if (
            isinstance(host, str)
            and host not in ("localhost", "127.0.0.1", "::1")
            and not host.startswith("/")
        ):
            attempts.append(address)
            raise OSError(f"network disabled by the test: {address}")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", local_only)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.delenv("CLOUDSDK_COMPUTE_REGION", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud-config"))
    yield attempts
    # Checked after the test, in case library code swallowed the error.
    assert attempts == [], f"connections attempted: {attempts}"


@pytest.fixture
def corpus_on_memgs(demo_corpus):
    """The demo corpus in the in-memory object store (`object_store`), under
    ``memgs://bucket/images``: a source on an object store that this process
    reads without a network. Returns ``memgs://bucket``; the store is emptied
    after the test."""
    import object_store

    bucket = f"{object_store.SCHEME}://bucket"
    object_store.reset()
    put_folder(demo_corpus.out_dir, f"{bucket}/images")
    yield bucket
    object_store.reset()


def put_folder(folder, prefix: str) -> None:
    """Copies every file below the local `folder` into the in-memory object
    store (`object_store`) under `prefix`, keeping their relative paths,
    as objects put an hour ago (as `demo_corpus` dates its files)."""
    import object_store

    for directory, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                object_store.put(f"{prefix}/{os.path.relpath(path, folder)}", f.read(), ago=AN_HOUR)


def make_config(corpus_dir, **overrides) -> dict:
    """`BASE_CONFIG` for `corpus_dir`, top-level keys replaced by `overrides`."""
    config = copy.deepcopy(BASE_CONFIG)
    config["source"]["root"] = str(corpus_dir)
    config.update(copy.deepcopy(overrides))
    return config


@pytest.fixture
def base_config(demo_corpus):
    return make_config(demo_corpus.out_dir)


@pytest.fixture(scope="session")
def build_dataset(demo_corpus, tmp_path_factory):
    from kiln.pipeline import build

    cache = {}

    def build_with(pipeline_args=(), **overrides):
        cache_key = json.dumps([overrides, list(pipeline_args)], sort_keys=True)
        if cache_key not in cache:
            config = make_config(demo_corpus.out_dir, **overrides)
            config.setdefault("output", str(tmp_path_factory.mktemp("datasets")))
            cache[cache_key] = build(config, list(pipeline_args))
        return cache[cache_key]

    return build_with


@pytest.fixture(scope="session")
def duplicates_build(demo_corpus, tmp_path_factory):
    from kiln.pipeline import build

    root = tmp_path_factory.mktemp("duplicates-corpus") / "images"
    shutil.copytree(demo_corpus.out_dir, root)

    def first(class_name):
        return next(
            f"{class_name}/{name}"
            for name in sorted(os.listdir(root / class_name))
            if f"{class_name}/{name}" not in demo_corpus.broken
        )

    circle, square = first("circle"), first("square")
    copies = {circle: ["circle/zz_copy_a", "star/zz_copy_c"], square: ["triangle/zz_copy_b"]}
    groups = []
    for original, keys in copies.items():
        extension = os.path.splitext(original)[1]
        keys = [key + extension for key in keys]
        for key in keys:
            shutil.copyfile(root / original, root / key)
        groups.append(sorted([original, *keys]))
    config = make_config(root, output=str(tmp_path_factory.mktemp("duplicates-out")))
    return build(config), groups


def read_tree(root) -> dict[str, bytes]:
    """Relative path ('/'-separated) -> bytes of every file below `root`."""
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, root).replace(os.sep, "/")] = f.read()
    return files
