"""Build measurements: kiln build against a plain single-core Python loop doing the same work.

Every measured build runs in its own subprocess (``python -m
benchmarks.build_bench SPEC_JSON``), so its peak resident memory is its own
(`os.wait4` returns the child's ``ru_maxrss``) and no state carries over
between runs. The child times only the work (the loop, or `kiln build`
from its command line, listing to publishing), not starting Python and
importing TensorFlow and Beam, which every variant pays once alike.

The work, for every variant: read the file, sha256 it, decode it with
OpenCV (`kiln.transforms.decode_image`), resize the shorter side to 256,
center crop 224, encode JPEG quality 95, serialize the record
(`kiln.schemas.RECORD.encode`) and write it to a TFRecord file. kiln also
splits, shards by hash, sorts, computes pixel statistics and writes its
metadata; the baseline does none of that.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks import machine

BUILD_TRANSFORMS = [{"resize": {"shorter_side": 256}}, {"center_crop": {"size": 224}}]
JPEG_QUALITY = 95
# Small shards, so the scaling builds write several (4000 records of ~17 KB
# are 5 shards) and "memory grows by less than one shard" means something.
TARGET_SHARD_MB = 16
_RESULT_PREFIX = "BENCH_RESULT "


def build_config(
    manifest: str,
    output: str,
    *,
    name: str = "bench",
    encoding: str = "jpeg",
    augment: Sequence[Any] = (),
    target_shard_mb: float = TARGET_SHARD_MB,
    compression: str = "none",
    jpeg_scaled_decode: bool = False,
) -> dict[str, Any]:
    """The benchmark's build config for a manifest of the corpus (`compression`:
    the shards', ``none`` or ``gzip``; `jpeg_scaled_decode`: the image option,
    written only when on)."""
    return {
        "name": name,
        "source": {"type": "manifest", "path": manifest},
        "output": output,
        "image": {"channels": 3, **({"jpeg_scaled_decode": True} if jpeg_scaled_decode else {})},
        "transforms": BUILD_TRANSFORMS,
        "encoding": {"format": encoding, "quality": JPEG_QUALITY},  # ignored unless jpeg
        "splits": {"fractions": {"train": 1.0}},
        "sharding": {
            "target_shard_mb": target_shard_mb,
            **({"compression": compression} if compression != "none" else {}),
        },
        "augment": list(augment),
    }


@dataclasses.dataclass(frozen=True)
class BuildRun:
    """One measured build.

    Attributes:
      seconds: Time of the work itself (see the module docstring).
      images: Images written.
      peak_rss_mb: Peak resident memory of the build's process, MB.
      cpu_seconds: CPU time (user + system) of the whole process, start-up included.
      work_cpu_seconds: CPU time of the work alone, all threads (the same
        span as `seconds`): less sensitive than wall time to what else the
        machine runs, though a busy host still inflates it somewhat.
      background_cores: Cores other processes kept busy on average meanwhile
        (None where /proc/stat is missing).
      full_seconds: For an incremental measurement, the from-scratch build
        of the same changed inputs (`seconds` is the incremental build's).
      incremental: For an incremental measurement, the build's report of
        its base (`IncrementalReport`: reused, relabelled, processed...).
    """

    seconds: float
    images: int
    peak_rss_mb: float
    cpu_seconds: float
    work_cpu_seconds: float | None = None
    kiln_module: str | None = None
    background_cores: float | None = None
    full_seconds: float | None = None
    incremental: dict[str, Any] | None = None

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds


# --- the parent side --------------------------------------------------------------


def measure(spec: dict[str, Any], scratch: str, *, kiln_src: str | None = None) -> BuildRun:
    """Runs one build described by `spec` in a fresh subprocess; deletes its output after.

    `kiln_src`: a folder to import `kiln` from instead of this checkout's
    (another revision's ``src``, for `benchmarks.revision_ab`); the harness
    stays this checkout's, so both sides do the same measured work.

    `spec` keys: ``kind`` (``"baseline"`` or ``"kiln"``), ``manifest`` (or, for
    kiln, ``config``: a whole build config whose ``output`` is filled in),
    ``opencv_threads`` (threads OpenCV may use inside one call; None leaves
    its default, one per core), for the baseline ``threads`` (images
    processed at once; default 1), and for kiln ``args`` (extra `kiln build`
    flags, e.g. ``["--image-threads", "1"]``) and ``jpeg_scaled_decode``
    (the config's ``image.jpeg_scaled_decode``; default off).
    """
    output = os.path.join(scratch, "build-output")
    shutil.rmtree(output, ignore_errors=True)
    os.makedirs(output)
    spec = dict(spec, output=output)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if kiln_src is not None:
        env["PYTHONPATH"] = os.pathsep.join([kiln_src, root])
    log_path = os.path.join(scratch, "build-child.log")
    busy_before, started = machine.busy_cpu_seconds(), time.perf_counter()
    with open(log_path, "w+b") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.build_bench", json.dumps(spec)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=root,
        )
        # wait4, not wait(): it returns this child's own resource usage.
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        busy_after = machine.busy_cpu_seconds()
        log.seek(0)
        output_text = log.read().decode(errors="replace")
    shutil.rmtree(output, ignore_errors=True)
    lines = [line for line in output_text.splitlines() if line.startswith(_RESULT_PREFIX)]
    if process.returncode != 0 or not lines:
        raise RuntimeError(
            f"benchmark build {spec} failed (exit {process.returncode}):\n{output_text[-4000:]}"
        )
    result = json.loads(lines[-1][len(_RESULT_PREFIX) :])
    cpu_seconds = usage.ru_utime + usage.ru_stime
    background = None
    if busy_before is not None and busy_after is not None:
        background = max(0.0, (busy_after - busy_before - cpu_seconds) / wall)
    return BuildRun(
        seconds=result["seconds"],
        images=result["images"],
        peak_rss_mb=usage.ru_maxrss / 1024.0,  # ru_maxrss is in KB on Linux
        cpu_seconds=cpu_seconds,
        work_cpu_seconds=result.get("cpu_seconds"),
        kiln_module=result.get("kiln_module"),
        background_cores=background,
        full_seconds=result.get("full_seconds"),
        incremental=result.get("incremental"),
    )


# --- the child side ---------------------------------------------------------------


def _run_baseline(spec: dict[str, Any]) -> dict[str, Any]:
    """The plain loop: one process, `opencv_threads` inside OpenCV; with
    ``threads`` > 1 the same per-image work on a thread pool (results
    written in order by the main thread): what the cores can do without a
    pipeline."""
    import concurrent.futures
    import csv

    import tensorflow as tf

    from kiln import transforms
    from kiln.schemas import RECORD

    _limit_opencv(spec)
    folder = os.path.dirname(spec["manifest"])
    with open(spec["manifest"], newline="") as f:
        rows = list(csv.DictReader(f))
    class_names = sorted({row["label"] for row in rows})
    labels = {name: index for index, name in enumerate(class_names)}
    chain = transforms.parse(BUILD_TRANSFORMS)
    out_path = os.path.join(spec["output"], "baseline.tfrecord")

    def record(row) -> bytes:
        with open(os.path.join(folder, row["path"]), "rb") as f:
            data = f.read()
        sha256 = hashlib.sha256(data).hexdigest()
        image = chain(transforms.decode_image(data, channels=3))
        height, width, channels = image.shape
        return RECORD.encode(
            {
                "image": transforms.encode_image(image, format="jpeg", quality=JPEG_QUALITY),
                "height": height,
                "width": width,
                "channels": channels,
                "label": labels[row["label"]],
                "key": row["path"],
                "sha256": sha256,
            }
        )

    threads = int(spec.get("threads") or 1)
    start, cpu_start = time.perf_counter(), time.process_time()
    with tf.io.TFRecordWriter(out_path) as writer:
        if threads == 1:
            for row in rows:
                writer.write(record(row))
        else:
            with concurrent.futures.ThreadPoolExecutor(threads) as pool:
                for serialized in pool.map(record, rows):
                    writer.write(serialized)
    return {
        "seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - cpu_start,
        "images": len(rows),
    }


def _limit_opencv(spec: dict[str, Any]) -> None:
    if spec.get("opencv_threads") is not None:
        import cv2

        cv2.setNumThreads(int(spec["opencv_threads"]))


def _run_kiln(spec: dict[str, Any]) -> dict[str, Any]:
    """`kiln build` as a user runs it (its command-line entry point, in this process)."""
    # What cli.main imports, not on the clock: the work is measured, and the
    # start-up has its own rows (`benchmarks.startup_bench`).
    import tensorflow  # noqa: F401
    import yaml

    import kiln
    import kiln.pipeline.command
    import kiln.pipeline.launcher
    from kiln import cli

    _limit_opencv(spec)
    config_path = os.path.join(spec["output"], "bench.yaml")
    datasets = os.path.join(spec["output"], "datasets")
    if "config" in spec:
        config = dict(spec["config"], output=datasets)
    else:
        config = build_config(
            spec["manifest"], datasets, jpeg_scaled_decode=spec.get("jpeg_scaled_decode", False)
        )
    with open(config_path, "w") as f:
        yaml.safe_dump(config, f)
    report = os.path.join(spec["output"], "report.json")
    start, cpu_start = time.perf_counter(), time.process_time()
    code = cli.main(
        ["build", "--config", config_path, "--quiet", "--report", report, *spec.get("args", [])]
    )
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    if code != 0:
        raise SystemExit(f"kiln build exited {code}")
    with open(report) as f:
        built = json.load(f)
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "images": sum(split["num_examples"] for split in built["splits"].values()),
        "kiln_module": kiln.__file__,
    }


def _kiln_build(
    manifest: str, output: str, args: Sequence[str] = (), compression: str = "none"
) -> tuple[float, float, dict]:
    """One `kiln build` of `manifest` into `output`/datasets: (seconds, CPU
    seconds of the process's threads meanwhile, its --report)."""
    import yaml

    from kiln import cli

    os.makedirs(output, exist_ok=True)
    config_path = os.path.join(output, "bench.yaml")
    with open(config_path, "w") as f:
        config = build_config(manifest, os.path.join(output, "datasets"), compression=compression)
        yaml.safe_dump(config, f)
    report = os.path.join(output, "report.json")
    start, cpu_start = time.perf_counter(), time.process_time()
    code = cli.main(["build", "--config", config_path, "--quiet", "--report", report, *args])
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    if code != 0:
        raise SystemExit(f"kiln build exited {code}")
    with open(report) as f:
        return seconds, cpu_seconds, json.load(f)


def _changed_copy(source: str, target: str, flip: int) -> None:
    """`source` flipped and re-encoded at `target`: new content, same kind of image."""
    import cv2

    image = cv2.imread(source, cv2.IMREAD_COLOR)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.lexists(target):
        os.remove(target)
    cv2.imwrite(target, cv2.flip(image, flip), [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])


# The class of the added images of a ``new_class`` incremental measurement:
# before every class of the corpus in sorted order.
NEW_CLASS = "0-added-class"

# A ``renamed_class`` incremental measurement: every tenth image of the
# corpus is in a class folder of its own, whose name changes after the base
# build. Both names sort between the corpus's classes star and triangle, so
# no other class id shifts: what is measured is moving records alone.
RENAMED_CLASS = ("tenth", "tenth-renamed")
RENAMED_FRACTION = 0.1


def renamed_count(images: int) -> int:
    """Images in the renamed class folder (`renamed_rows`)."""
    step = round(1 / RENAMED_FRACTION)
    return len(range(0, images, step))


def renamed_rows(rows: list[tuple[str, str]], name: str) -> list[tuple[str, str]]:
    """The manifest's ``(path, label)`` rows with every tenth image in the
    class folder `name` (`RENAMED_CLASS`), labelled so."""
    step = round(1 / RENAMED_FRACTION)
    return [
        (f"{name}/{path}", name) if index % step == 0 else (path, label)
        for index, (path, label) in enumerate(rows)
    ]


def _run_incremental(spec: dict[str, Any]) -> dict[str, Any]:
    """A base build of the manifest's images (not timed); then `changed`
    of the images get new content, as many new ones are added and as many
    are deleted; then the incremental build (timed) and a from-scratch
    build of the same inputs (timed), whose datasets must be identical.
    With ``new_class``, the added images are of a class that sorts before
    every other: each record's class id moves up one (`kiln.pipeline.relabel`).
    With ``renamed_class``, nothing changes but the name of a class folder
    of a tenth of the images (`renamed_rows`): their records are moved
    (`kiln.pipeline.moves`)."""
    import csv

    import kiln.pipeline.command  # noqa: F401  (cli.main imports it; not on the clock)

    _limit_opencv(spec)
    corpus_root = os.path.dirname(spec["manifest"])
    with open(spec["manifest"], newline="") as f:
        rows = [(row["path"], row["label"]) for row in csv.DictReader(f)]
    inputs = os.path.join(spec["output"], "inputs")
    original = rows
    sources = [path for path, _ in rows]
    if spec.get("renamed_class"):
        rows = renamed_rows(original, RENAMED_CLASS[0])
    for (path, _), source in zip(rows, sources, strict=True):
        # A private copy (hard links) the changes can edit.
        target = os.path.join(inputs, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            os.link(os.path.join(corpus_root, source), target)
        except OSError:
            shutil.copyfile(os.path.join(corpus_root, source), target)
    manifest = os.path.join(inputs, "manifest.csv")

    def write_manifest(listed):
        with open(manifest, "w") as f:
            f.write("path,label\n" + "".join(f"{p},{label}\n" for p, label in listed))

    write_manifest(rows)
    output = os.path.join(spec["output"], "incremental")
    _kiln_build(manifest, output, compression=spec.get("compression", "none"))

    if spec.get("renamed_class"):
        old, new = RENAMED_CLASS
        os.rename(os.path.join(inputs, old), os.path.join(inputs, new))
        write_manifest(renamed_rows(original, new))
        return _timed_incremental(spec, manifest, output)
    step = max(1, len(rows) // max(1, int(spec["changes"])))
    deleted = set(range(0, len(rows), step))
    changed = set(range(step // 3, len(rows), step)) - deleted
    added = []
    for index in range(2 * step // 3, len(rows), step):
        path, label = rows[index]
        new_path = f"added/{path}"
        _changed_copy(os.path.join(inputs, path), os.path.join(inputs, new_path), 0)
        added.append((new_path, NEW_CLASS if spec.get("new_class") else label))
    for index in changed:
        path = rows[index][0]
        _changed_copy(os.path.join(inputs, path), os.path.join(inputs, path), 1)
    write_manifest([row for i, row in enumerate(rows) if i not in deleted] + added)
    return _timed_incremental(spec, manifest, output)


def _timed_incremental(spec: dict[str, Any], manifest: str, output: str) -> dict[str, Any]:
    """The incremental build of `manifest` into `output` (which holds its
    base) and a from-scratch build, timed; their datasets must be identical.
    ``cpu_seconds`` is the incremental build's."""
    compression = spec.get("compression", "none")
    seconds, cpu_seconds, built = _kiln_build(manifest, output, compression=compression)
    full_seconds, _, full = _kiln_build(
        manifest, os.path.join(spec["output"], "full"), compression=compression
    )
    if built["version"] != full["version"] or not built["incremental"]["used"]:
        raise SystemExit(f"the incremental build differs from the full one: {built} {full}")
    with (
        open(os.path.join(built["dataset_dir"], "kiln.json"), "rb") as a,
        open(os.path.join(full["dataset_dir"], "kiln.json"), "rb") as b,
    ):
        if a.read() != b.read():
            raise SystemExit("the incremental build's kiln.json differs from the full one's")
    import kiln

    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "kiln_module": kiln.__file__,
        "full_seconds": full_seconds,
        "images": sum(split["num_examples"] for split in built["splits"].values()),
        "incremental": built["incremental"],
    }


def main(argv: Sequence[str]) -> int:
    spec = json.loads(argv[0])
    run = {"baseline": _run_baseline, "kiln": _run_kiln, "incremental": _run_incremental}[
        spec["kind"]
    ]
    print(_RESULT_PREFIX + json.dumps(run(spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
