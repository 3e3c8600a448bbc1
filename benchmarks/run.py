"""`make bench`: generate the corpus, measure builds, readers and listing, write the tables.

    python -m benchmarks.run             # full run: BENCHMARKS.md and build/bench/results.json
    python -m benchmarks.run --quick     # tiny corpus, one round: checks the harness (~2 min)
    python -m benchmarks.run --quick --out /tmp/bench --markdown /tmp/bench/BENCHMARKS.md

The full run generates (once; reused while the parameters hold) 4000
photo-like 800x600 JPEGs in ``build/bench/corpus``; the main measurements
use 2000 of them, the scaling builds 500 to 8000 (twice the corpus: see
`benchmarks.corpus`), the incremental builds 4000 and 8000 (a base build,
then 1% of the images changed, 1% added and 1% deleted: the incremental
rebuild next to a from-scratch build of the same inputs). Each measurement is taken
`repeats` times, round-robin (every variant once per round, so a burst of
load from elsewhere hits all variants alike), and the median is reported.
Builds run in their own processes (`benchmarks.build_bench`); the reader
variants run in this process, one fresh tf.data pipeline per measurement
(`benchmarks.reader_bench`). Then builds of the detection demo with and
without targets (`benchmarks.detection_bench`), the launcher's listing of
manifests of 100,000 and 1,000,000 rows (`benchmarks.listing_bench`, which
also runs alone), and last the start-up of every command (`benchmarks.startup_bench`:
`--help`, config errors, `kiln inspect`, next to importing TensorFlow).
Nothing here is a test: no timing is asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import resource
import statistics
import sys
import time
from typing import Any

from benchmarks import (
    build_bench,
    corpus,
    detection_bench,
    folder_listing_bench,
    listing_bench,
    machine,
    page,
    peers_bench,
    reader_bench,
    report,
    startup_bench,
)

logger = logging.getLogger("benchmarks.run")  # not __main__ under python -m

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Settings:
    """How big and how often.

    Attributes:
      corpus: The generated corpus.
      build_images: Images in the main build measurements and the reader datasets.
      scaling: Image counts of the scaling builds.
      build_repeats: Rounds of build measurements.
      reader_repeats: Rounds of reader measurements.
      target_pairs: Pairs of a targets variant and (b) per round: the
        targets rows' cost is a ratio of two short runs, the noisiest
        measure here, so it takes the median of more of them.
      batch_size: Reader batch size.
      reader_batches: Batches timed per reader measurement; None: each
        variant's own (`reader_bench.Variant.batches`).
      layer_batches: Batches timed for the model-side layer.
      listing: Manifest sizes and rounds of the listing measurements
        (`benchmarks.listing_bench`).
      startup: Rounds of the start-up measurements (`benchmarks.startup_bench`).
      incremental: Image counts of the incremental builds (1% changed, 1%
        added, 1% deleted after a base build).
      incremental_repeats: Rounds of incremental measurements.
      detection: Scenes and rounds of the detection demo builds
        (`benchmarks.detection_bench`).
    """

    corpus: corpus.CorpusSpec
    build_images: int
    scaling: tuple[int, ...]
    build_repeats: int
    reader_repeats: int
    target_pairs: int = 1
    batch_size: int = reader_bench.BATCH_SIZE
    reader_batches: int | None = None
    layer_batches: int = 20
    listing: listing_bench.Settings = listing_bench.FULL
    startup: startup_bench.Settings = startup_bench.FULL
    incremental: tuple[int, ...] = (4000, 8000)
    incremental_repeats: int = 3
    detection: detection_bench.Settings = detection_bench.FULL


FULL = Settings(
    corpus=corpus.CorpusSpec(parts=4, per_part=1000),
    build_images=2000,
    scaling=(500, 1000, 2000, 4000, 8000),
    build_repeats=5,
    reader_repeats=5,
    target_pairs=2,
)
QUICK = Settings(
    corpus=corpus.CorpusSpec(parts=2, per_part=8, width=160, height=120),
    build_images=16,
    scaling=(8, 16, 32),
    build_repeats=1,
    reader_repeats=1,
    batch_size=8,
    reader_batches=2,
    layer_batches=2,
    listing=listing_bench.QUICK,
    startup=startup_bench.QUICK,
    incremental=(16, 32),
    incremental_repeats=1,
    detection=detection_bench.QUICK,
)

# What an incremental measurement changes after its base build, each as a
# fraction of the images: changed content, added, deleted.
INCREMENTAL_CHANGES = 0.01

# The build variants: (key, title, spec without the manifest).
BUILD_VARIANTS = (
    (
        "baseline",
        "A: plain Python loop, 1 process, OpenCV on 1 thread",
        {"kind": "baseline", "opencv_threads": 1},
    ),
    ("kiln", "kiln build, local defaults", {"kind": "kiln", "args": []}),
    (
        "kiln_scaled_decode",
        "kiln build, local defaults, image.jpeg_scaled_decode",
        {"kind": "kiln", "args": [], "jpeg_scaled_decode": True},
    ),
    (
        "kiln_one_thread",
        "kiln build --image-threads 1 (OpenCV on 1 thread, as A)",
        {"kind": "kiln", "args": ["--image-threads", "1"], "opencv_threads": 1},
    ),
    (
        "baseline_opencv_threads",
        "A with OpenCV's default threads (one per core)",
        {"kind": "baseline", "opencv_threads": None},
    ),
    (
        "baseline_threads",
        "A's work on a thread pool, one thread per core (no pipeline)",
        {"kind": "baseline", "opencv_threads": 1, "threads": len(os.sched_getaffinity(0))},
    ),
)


def _median(values):
    return statistics.median(values) if values else None


def measure_builds(settings: Settings, source: corpus.Corpus, scratch: str) -> dict[str, Any]:
    """Every build variant and scaling size, `build_repeats` rounds, round-robin."""
    main = source.manifest(settings.build_images)
    jobs = [(key, dict(spec, manifest=main)) for key, _, spec in BUILD_VARIANTS]
    jobs += [
        (f"scaling_{n}", {"kind": "kiln", "args": [], "manifest": source.manifest(n)})
        for n in settings.scaling
        if n != settings.build_images
    ]
    runs: dict[str, list[build_bench.BuildRun]] = {key: [] for key, _ in jobs}
    for round_index in range(settings.build_repeats):
        for key, spec in jobs:
            run = build_bench.measure(spec, scratch)
            runs[key].append(run)
            logger.info(
                "build round %d %s: %.2f s, %.0f images/s, peak %.0f MB",
                round_index + 1,
                key,
                run.seconds,
                run.images_per_second,
                run.peak_rss_mb,
            )
    runs[f"scaling_{settings.build_images}"] = runs["kiln"]

    def summary(key: str) -> dict[str, Any]:
        key_runs = runs[key]
        seconds = _median([r.seconds for r in key_runs])
        images = key_runs[0].images
        return {
            "images": images,
            "median_seconds": seconds,
            "images_per_second": images / seconds,
            "ms_per_image": 1000.0 * seconds / images,
            # The median, as for the times: one run's peak moves by several MB
            # with the allocator's arenas, whatever the dataset.
            "peak_rss_mb": _median([r.peak_rss_mb for r in key_runs]),
            "peak_rss_range_mb": [
                min(r.peak_rss_mb for r in key_runs),
                max(r.peak_rss_mb for r in key_runs),
            ],
            "runs": [dataclasses.asdict(r) for r in key_runs],
        }

    rows = {key: dict(summary(key), title=title) for key, title, _ in BUILD_VARIANTS}
    background = [
        r.background_cores
        for key_runs in runs.values()
        for r in key_runs
        if r.background_cores is not None
    ]
    base = rows["baseline"]["images_per_second"]
    for row in rows.values():
        row["ratio_vs_baseline"] = row["images_per_second"] / base
    scaling = [summary(f"scaling_{n}") for n in settings.scaling]
    return {
        "images": settings.build_images,
        "repeats": settings.build_repeats,
        "transforms": build_bench.BUILD_TRANSFORMS,
        "jpeg_quality": build_bench.JPEG_QUALITY,
        "target_shard_mb": build_bench.TARGET_SHARD_MB,
        "background_cores": _median(background),
        "rows": rows,
        "scaling": scaling,
        "scaling_fit": _linear_fit([(s["images"], s["median_seconds"]) for s in scaling]),
    }


def measure_incremental(settings: Settings, source: corpus.Corpus, scratch: str) -> dict[str, Any]:
    """Incremental build time next to a from-scratch build of the same
    changed inputs, per size, `incremental_repeats` rounds round-robin
    (`build_bench._run_incremental`)."""
    smallest = settings.incremental[0]
    sizes = [(n, "") for n in settings.incremental]
    # The smallest size again with the added images of a new class that
    # shifts every class id: the records are relabelled, not decoded.
    sizes.append((smallest, "new_class"))
    # And a night where nothing changed but the name of a class folder of
    # a tenth of the images: the records are moved, not decoded.
    sizes.append((smallest, "renamed_class"))
    jobs = [
        (
            (n, scenario),
            {
                "kind": "incremental",
                "manifest": source.manifest(n),
                "changes": _changes(n, scenario),
                "new_class": scenario == "new_class",
                "renamed_class": scenario == "renamed_class",
            },
        )
        for n, scenario in sizes
    ]
    runs: dict[tuple[int, str], list[build_bench.BuildRun]] = {key: [] for key, _ in jobs}
    for round_index in range(settings.incremental_repeats):
        for (n, scenario), spec in jobs:
            run = build_bench.measure(spec, scratch)
            runs[n, scenario].append(run)
            logger.info(
                "incremental round %d, %d images%s: %.2f s incremental, %.2f s full",
                round_index + 1,
                n,
                f", {scenario.replace('_', ' ')}" if scenario else "",
                run.seconds,
                run.full_seconds,
            )
    rows = []
    for (n, scenario), key_runs in runs.items():
        incremental = _median([r.seconds for r in key_runs])
        full = _median([r.full_seconds for r in key_runs])
        rows.append(
            {
                "images": n,
                "new_class": scenario == "new_class",
                "renamed_class": scenario == "renamed_class",
                "changes": _changes(n, scenario),
                "incremental_seconds": incremental,
                "full_seconds": full,
                "ratio": incremental / full,
                "ratios": [r.seconds / r.full_seconds for r in key_runs],
                "runs": [dataclasses.asdict(r) for r in key_runs],
            }
        )
    return {
        "fraction": INCREMENTAL_CHANGES,
        "renamed_fraction": build_bench.RENAMED_FRACTION,
        "repeats": settings.incremental_repeats,
        "rows": rows,
    }


def _changes(images: int, scenario: str) -> int:
    """Images changed, added and deleted each; with ``renamed_class``, images
    whose class folder is renamed (`build_bench.renamed_rows`)."""
    if scenario == "renamed_class":
        return build_bench.renamed_count(images)
    return max(1, round(images * INCREMENTAL_CHANGES))


def _linear_fit(points):
    """``seconds = fixed + per_image * images`` by least squares."""
    if len(points) < 2:
        return None
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    return {
        "fixed_seconds": mean_y - slope * mean_x,
        "ms_per_image": 1000.0 * slope,
        "images_per_second": 1.0 / slope if slope > 0 else None,
    }


class _Background:
    """Appends the cores other processes kept busy during the block to `into`."""

    def __init__(self, into: list[float]):
        self._into = into

    def __enter__(self):
        self._busy, self._own = machine.busy_cpu_seconds(), _own_cpu_seconds()
        self._start = time.perf_counter()

    def __exit__(self, *exc):
        busy = machine.busy_cpu_seconds()
        if busy is not None and self._busy is not None:
            others = busy - self._busy - (_own_cpu_seconds() - self._own)
            self._into.append(max(0.0, others / (time.perf_counter() - self._start)))


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure_readers(
    settings: Settings, datasets: dict[str, str], target_dirs: dict[str, str] | None = None
) -> dict[str, Any]:
    """Every reader variant on both encodings, each targets variant on its dataset
    (`target_dirs`: variant key -> folder), and the layer, `reader_repeats` rounds."""
    target_dirs = target_dirs or {}
    target_variants = [v for v in reader_bench.TARGET_VARIANTS if v.key in target_dirs]
    target_runs: dict[str, list[float]] = {v.key: [] for v in target_variants}
    # (b) measured next to each targets variant, for its cost ratio.
    paired_b: dict[str, list[float]] = {v.key: [] for v in target_variants}
    plain_b = next(v for v in reader_bench.VARIANTS if v.key == "b")
    runs: dict[str, dict[str, list[float]]] = {
        encoding: {v.key: [] for v in reader_bench.VARIANTS} for encoding in datasets
    }
    layer_runs: list[float] = []
    background: list[float] = []
    for round_index in range(settings.reader_repeats):
        for index, variant in enumerate(target_variants * settings.target_pairs):
            # A pair: the targets variant and (b) on the same images without
            # targets, one right after the other, which first alternating,
            # so that a burst of load or the previous pipeline's wind-down
            # hits both alike.
            pair = [(variant, target_dirs[variant.key]), (plain_b, datasets["jpeg"])]
            if (round_index + index // len(target_variants)) % 2:
                pair.reverse()
            measured = {}
            for measured_variant, directory in pair:
                with _Background(background):
                    measured[measured_variant.key] = reader_bench.measure_variant(
                        measured_variant,
                        directory,
                        "jpeg",
                        batch_size=settings.batch_size,
                        batches=settings.reader_batches,
                    )
            target_runs[variant.key].append(measured[variant.key])
            paired_b[variant.key].append(measured["b"])
            logger.info(
                "reader round %d targets %s: %.0f images/s (next to it, (b): %.0f)",
                round_index + 1,
                variant.key,
                measured[variant.key],
                measured["b"],
            )
        for encoding, directory in datasets.items():
            for variant in reader_bench.VARIANTS:
                with _Background(background):
                    value = reader_bench.measure_variant(
                        variant,
                        directory,
                        encoding,
                        batch_size=settings.batch_size,
                        batches=settings.reader_batches,
                    )
                runs[encoding][variant.key].append(value)
                logger.info(
                    "reader round %d %s %s: %.0f images/s",
                    round_index + 1,
                    encoding,
                    variant.key,
                    value,
                )
        layer_runs.append(
            reader_bench.layer_throughput(
                datasets["jpeg"], settings.layer_batches, settings.batch_size
            )
        )
    rows = {}
    for encoding, by_variant in runs.items():
        medians = {key: _median(values) for key, values in by_variant.items()}
        rows[encoding] = {
            v.key: {
                "title": v.title,
                "images_per_second": medians[v.key],
                "ratio_vs_a": medians[v.key] / medians["a"],
                "runs": by_variant[v.key],
            }
            for v in reader_bench.VARIANTS
        }
        rows[encoding]["ratios"] = {
            "b_over_a": medians["b"] / medians["a"],
            "b_over_c": medians["b"] / medians["c"],
            "b_over_d": medians["b"] / medians["d"],
        }
    with_targets = None
    if target_variants:
        with_targets = {
            v.key: {
                "title": v.title,
                "images_per_second": _median(target_runs[v.key]),
                # Per-image cost relative to (b) on the same JPEG images without
                # targets: the median of the pairs' ratios.
                "cost_vs_b": _median(
                    [b / t for b, t in zip(paired_b[v.key], target_runs[v.key], strict=True)]
                ),
                "runs": target_runs[v.key],
                "paired_b_runs": paired_b[v.key],
            }
            for v in target_variants
        }
    return {
        "batch_size": settings.batch_size,
        "background_cores": _median(background),
        "targets": with_targets,
        "image_size": reader_bench.IMAGE_SIZE,
        "repeats": settings.reader_repeats,
        "target_pairs": settings.target_pairs,
        "augment": reader_bench.AUGMENT,
        "dataset_mb": {e: reader_bench.dataset_size_mb(d) for e, d in datasets.items()},
        "rows": rows,
        "layer": {
            "images_per_second": _median(layer_runs),
            "runs": layer_runs,
            "batch_size": settings.batch_size,
        },
    }


def reader_manifest(settings: Settings, out_dir: str) -> str:
    """The manifest of the reader measurements' images (the corpus reused when current)."""
    source = corpus.ensure(
        os.path.join(out_dir, "corpus"),
        settings.corpus,
        workers=machine.usable_cores() if settings is FULL else 1,
    )
    return source.manifest(settings.build_images)


def run(settings: Settings, out_dir: str, markdown: str | None, command: str) -> dict[str, Any]:
    """Generates or reuses the corpus, measures everything, writes JSON and Markdown."""
    started = time.time()
    load_start = machine.load_average()
    os.makedirs(out_dir, exist_ok=True)
    source = corpus.ensure(
        os.path.join(out_dir, "corpus"),
        settings.corpus,
        workers=machine.usable_cores() if settings is FULL else 1,
    )
    scratch = os.path.join(out_dir, "scratch")
    os.makedirs(scratch, exist_ok=True)
    builds = measure_builds(settings, source, scratch)
    builds["incremental"] = measure_incremental(settings, source, scratch)
    datasets = reader_bench.build_datasets(
        source.manifest(settings.build_images), os.path.join(out_dir, "datasets")
    )
    target_dirs = reader_bench.build_target_datasets(
        source.manifest(settings.build_images), os.path.join(out_dir, "datasets")
    )
    readers = measure_readers(settings, datasets, target_dirs)
    peers = peers_bench.measure(
        peers_bench.QUICK if settings is QUICK else peers_bench.FULL,
        peers_bench.build_datasets(
            source.manifest(settings.build_images), os.path.join(out_dir, "datasets")
        ),
        os.path.join(out_dir, "peers"),
        log=logger.info,
    )
    detection = detection_bench.measure(settings.detection, out_dir, log=logger.info)
    listing = listing_bench.measure(settings.listing, out_dir, log=logger.info)
    startup = startup_bench.measure(settings.startup, out_dir, log=logger.info)
    results = {
        "command": command,
        "mode": "full" if settings is FULL else "quick",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "duration_seconds": round(time.time() - started, 1),
        "machine": machine.describe(),
        "load_average": {"start": load_start, "end": machine.load_average()},
        "corpus": {
            "images": source.spec.num_images,
            "width": source.spec.width,
            "height": source.spec.height,
            "mean_file_kb": source.total_bytes(len(source.files)) / len(source.files) / 1024,
            "generated_seconds": round(source.generated_seconds, 1),
        },
        "build": builds,
        "reader": readers,
        "peers": peers,
        "listing": listing,
        "startup": startup,
        "detection": detection,
    }
    results["targets"] = report.targets(results)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    if markdown:
        new_page = report.markdown(results)
        new_page = page.replace_section(
            new_page,
            peers_bench.SECTION_TITLE,
            peers_bench.markdown(peers),
            after=peers_bench.AFTER,
        )
        # The image folder's listing is measured by `make bench-listing`
        # only (it starts an emulator): keep the section it last wrote.
        kept = None
        if os.path.exists(markdown):
            with open(markdown) as f:
                kept = page.find_section(f.read(), folder_listing_bench.SECTION_TITLE)
        if kept:
            title = folder_listing_bench.SECTION_TITLE
            new_page = page.replace_section(
                new_page, title, kept, after=listing_bench.SECTION_TITLE
            )
        with open(markdown, "w") as f:
            f.write(new_page)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny corpus and one round: checks that the harness works",
    )
    parser.add_argument(
        "--out",
        default=os.path.join(ROOT, "build", "bench"),
        help="scratch folder: corpus, datasets, results.json (default build/bench)",
    )
    parser.add_argument(
        "--markdown",
        default=None,
        help="where to write the table (default: BENCHMARKS.md at the "
        "repository's top for a full run, OUT/BENCHMARKS.md for --quick)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("benchmarks").setLevel(logging.INFO)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    settings = QUICK if args.quick else FULL
    markdown = args.markdown or (
        os.path.join(args.out, "BENCHMARKS.md")
        if args.quick
        else os.path.join(ROOT, "BENCHMARKS.md")
    )
    command = "python -m benchmarks.run" + (" --quick" if args.quick else "")
    results = run(settings, os.path.abspath(args.out), markdown, command)
    print(report.summary(results))
    print(f"wrote {markdown} and {os.path.join(args.out, 'results.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
