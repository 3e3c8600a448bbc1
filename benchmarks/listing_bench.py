"""Listing measurements: what a big manifest costs the launcher before the job starts.

    python -m benchmarks.listing_bench            # 100,000 and 1,000,000 rows; updates the
                                                  # listing section of BENCHMARKS.md
    python -m benchmarks.listing_bench --quick    # tiny manifests, one round

`make bench` (`benchmarks.run`) runs the same measurements and puts the
same section on its page; this module runs them alone, replacing only that
section. The launcher's share of a build, per manifest: list it
(`ManifestSource.list_files`: read, check and stat every row, spill the rows
to the listing's SQLite file), stamp it (`versioning.stamp` over
`Listing.stamp_entries`) and write the job's JSONL (`Listing.write`). Each
measurement runs in its own process (``python -m benchmarks.listing_bench
--child SPEC_JSON``); the child reports the seconds of each phase, the growth
of its peak resident memory over the imports (`resource.getrusage` before
and after; the imports alone take most of a process's memory, TensorFlow
included), and the size of the listing's temporary file (`Listing.disk_bytes`).

Two manifests (CSV, ten classes, rows in shuffled order, relative paths in
folders of 1000):

- ``real``: every row names an existing file: hard links of a few small files,
  made once and reused while their count holds (``build/bench/listing``;
  links cost no disk, and one ``os.stat`` per row is the same for a link as
  for any file).
- ``missing``: every row but two names a file that does not exist, the
  adversarial manifest of issue 13. Every row becomes a dropped row, which
  costs more than a file (its message is formatted, kept and written).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks import page

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ("real", "missing")
_CLASSES = 10
_PER_FOLDER = 1000
_LINKS_PER_FILE = 50_000  # ext4 allows 65,000 links to one file
_RESULT_PREFIX = "LISTING_RESULT "
SECTION_TITLE = "## Listing: manifests of"


@dataclasses.dataclass(frozen=True)
class Settings:
    """Manifest sizes (rows) and rounds; every size is measured for both kinds."""

    sizes: tuple[int, ...]
    repeats: int


FULL = Settings(sizes=(100_000, 1_000_000), repeats=3)
QUICK = Settings(sizes=(1000, 4000), repeats=1)


# --- the manifests ----------------------------------------------------------------


def ensure_manifests(folder: str, kind: str, sizes: tuple[int, ...]) -> dict[int, str]:
    """The `kind` manifest of each size in `folder/kind` (made once, reused)."""
    base = os.path.join(folder, kind)
    largest = max(sizes)
    if kind == "real":
        _ensure_links(base, largest)
    else:
        _ensure_links(base, 2)
    manifests = {}
    for rows in sizes:
        path = os.path.join(base, f"manifest-{rows}.csv")
        if not os.path.exists(path):
            order = list(range(rows))
            # A seeded order, not a secret.
            random.Random(rows).shuffle(order)  # noqa: S311
            temp = path + ".tmp"
            with open(temp, "w") as f:
                f.write("path,label\n")
                for i in order:
                    exists = kind == "real" or i < 2
                    f.write(f"{_relative_path(i, exists)},class{i % _CLASSES}\n")
            os.replace(temp, path)
        manifests[rows] = path
    return manifests


def _relative_path(index: int, exists: bool) -> str:
    return f"{'files' if exists else 'missing'}/{index // _PER_FOLDER:05d}/{index:08d}.png"


def _ensure_links(base: str, count: int) -> None:
    """`count` hard links under `base/files` (of a few 1 KB files); a marker records the count."""
    marker = os.path.join(base, "files", "COUNT")
    try:
        with open(marker) as f:
            if int(f.read()) >= count:
                return
    except (OSError, ValueError):
        pass
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(os.path.join(base, "originals"))
    for index in range(count):
        path = os.path.join(base, _relative_path(index, exists=True))
        if index % _PER_FOLDER == 0:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        if index % _LINKS_PER_FILE == 0:
            original = os.path.join(base, "originals", f"{index // _LINKS_PER_FILE}.png")
            with open(original, "wb") as f:
                f.write(bytes(range(256)) * 4)  # 1 KB; never decoded here
        os.link(original, path)
    with open(marker, "w") as f:
        f.write(str(count))


# --- the parent side --------------------------------------------------------------


def measure_one(manifest: str, scratch: str) -> dict[str, Any]:
    """Lists `manifest` in a fresh process, as the launcher does; its measurements."""
    temp = os.path.join(scratch, "listing-temp")  # the child's SQLite files, unlinked at birth
    os.makedirs(temp, exist_ok=True)
    spec = {"manifest": manifest, "output": os.path.join(scratch, "listing.jsonl")}
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.listing_bench", "--child", json.dumps(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", SQLITE_TMPDIR=temp),
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith(_RESULT_PREFIX)]
    if completed.returncode != 0 or not lines:
        raise RuntimeError(
            f"listing {manifest} failed (exit {completed.returncode}):\n{completed.stderr[-4000:]}"
        )
    os.remove(spec["output"])
    return json.loads(lines[-1][len(_RESULT_PREFIX) :])


def measure(settings: Settings, out_dir: str, log=None) -> dict[str, Any]:
    """Every kind and size, `settings.repeats` rounds, round-robin; medians per row."""
    folder = os.path.join(out_dir, "listing")
    scratch = os.path.join(out_dir, "scratch")
    os.makedirs(scratch, exist_ok=True)
    manifests = {kind: ensure_manifests(folder, kind, settings.sizes) for kind in KINDS}
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {
        (kind, rows): [] for kind in KINDS for rows in settings.sizes
    }
    loads = [os.getloadavg()[0]]
    for round_index in range(settings.repeats):
        for (kind, rows), kind_runs in runs.items():
            run = measure_one(manifests[kind][rows], scratch)
            kind_runs.append(run)
            loads.append(os.getloadavg()[0])
            if log:
                log(
                    f"listing round {round_index + 1} {kind} {rows}: "
                    f"{run['list_seconds'] + run['stamp_seconds'] + run['write_seconds']:.1f} s, "
                    f"+{run['growth_kb'] / 1024:.0f} MB"
                )
    rows_out = []
    for (kind, rows), kind_runs in runs.items():
        median = {
            name: statistics.median(run[name] for run in kind_runs)
            for name in (
                "list_seconds",
                "stamp_seconds",
                "write_seconds",
                "growth_kb",
                "temp_bytes",
                "peak_rss_kb",
            )
        }
        total = median["list_seconds"] + median["stamp_seconds"] + median["write_seconds"]
        rows_out.append(
            {
                "kind": kind,
                "rows": rows,
                **median,
                "seconds": total,
                "rows_per_second": rows / total,
                "list_rows_per_second": rows / median["list_seconds"],
                "temp_bytes_per_row": median["temp_bytes"] / rows,
                "files": kind_runs[0]["files"],
                "dropped": kind_runs[0]["dropped"],
                "runs": kind_runs,
            }
        )
    return {
        "repeats": settings.repeats,
        "load_average": [min(loads), max(loads)],
        "cores": os.cpu_count(),
        "sizes": list(settings.sizes),
        "rows": rows_out,
        "extrapolation": _extrapolate(rows_out, 10_000_000),
    }


def _extrapolate(rows: list[dict[str, Any]], target: int) -> dict[str, Any]:
    """Per kind, a straight line through the two largest sizes, out to `target` rows."""
    result = {}
    for kind in KINDS:
        measured = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["rows"])
        if len(measured) < 2:
            continue
        small, large = measured[-2], measured[-1]
        extra = large["rows"] - small["rows"]
        seconds_per_row = (large["seconds"] - small["seconds"]) / extra
        bytes_per_row = max(0.0, (large["growth_kb"] - small["growth_kb"]) * 1024 / extra)
        result[kind] = {
            "rows": target,
            "marginal_bytes_per_row": bytes_per_row,
            "seconds": large["seconds"] + seconds_per_row * (target - large["rows"]),
            "growth_mb": (large["growth_kb"] * 1024 + bytes_per_row * (target - large["rows"]))
            / 2**20,
            "temp_gb": large["temp_bytes_per_row"] * target / 1e9,
        }
    return result


def markdown(results: dict[str, Any]) -> str:
    """The listing section of BENCHMARKS.md."""
    sizes = " and ".join(f"{rows:,}" for rows in results["sizes"])
    lines = [
        f"{SECTION_TITLE} {sizes} rows",
        "",
        "The launcher's work before the job, per manifest (`benchmarks/listing_bench.py`; "
        "`python -m benchmarks.listing_bench` re-measures this section alone): list it (read, "
        "check and stat every row, spill the rows to the listing's SQLite file), stamp it "
        "and write the job's JSONL. `real`: every row names an existing file; `missing`: "
        "every row but two names a file that does not exist (issue 13's manifest; each row "
        "becomes a dropped row, which costs more than a file). Each run is its own process; "
        "memory is the growth of its peak resident set over the imports, Beam's included "
        "(which alone take the rest of the peak column), temp disk the listing's SQLite file "
        "at its largest. "
        f"Medians of {results['repeats']} runs{load_note(results)}.",
        "",
        "| Manifest | Rows | List s | Stamp s | Write s | Rows/s (all three) | "
        "Memory growth (MB) | Peak RSS (MB) | Temp disk (bytes/row) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results["rows"]:
        lines.append(
            f"| {row['kind']} | {row['rows']:,} | {row['list_seconds']:.1f} | "
            f"{row['stamp_seconds']:.1f} | {row['write_seconds']:.1f} | "
            f"{row['rows_per_second']:,.0f} | {row['growth_kb'] / 1024:.0f} | "
            f"{row['peak_rss_kb'] / 1024:.0f} | {row['temp_bytes_per_row']:.0f} |"
        )
    extrapolation = results["extrapolation"]
    if extrapolation:
        lines += [
            "",
            "Per row beyond the smaller size, and a straight line out to 10,000,000 rows:",
            "",
        ]
        for kind, line in extrapolation.items():
            lines.append(
                f"- `{kind}`: {line['marginal_bytes_per_row']:.1f} bytes of memory per extra "
                f"row; 10M rows would take about {line['seconds'] / 60:.0f} minutes, "
                f"{line['growth_mb']:.0f} MB of memory over the imports and "
                f"{line['temp_gb']:.1f} GB of temporary disk."
            )
        practical = all(
            line["seconds"] < 3600 and line["growth_mb"] < 1024 for line in extrapolation.values()
        )
        lines += [
            "",
            f"By the measure of under an hour and under 1 GB of the launcher's memory, "
            f"10M rows are {'practical' if practical else '**not** practical'}.",
        ]
    lines += [
        "",
        "What stays in memory is the class and split names, a few counters, the insert "
        "batches and SQLite's page cache (its sorts spill to temporary files beyond it): a "
        "constant, whatever the rows. Time is linear in the rows. Profiled (cProfile, 100,000 "
        "`real` rows), about a quarter of listing a local manifest is the confinement check "
        "(an `lstat` per row, and its folder's `os.path.realpath` once per folder; it was 40% "
        "with a `realpath` of every row, one `lstat` per path component), a tenth the row's "
        "`os.stat`, a fifth SQLite's inserts and sorted reads, the rest Python per row "
        "(parsing, resolving, building the rows). Before the listing went to disk (issue 13), "
        "1,000,000 missing files took 128 s and 2.3 GB in the launcher, about 1.4 KB per "
        "row (10M rows: some 14 GB more). Measured on a local disk; on an object store the "
        "rows' folders are listed instead of each row's `os.stat` (docs/dataflow.md, "
        '"Listing at scale").',
        "",
    ]
    return "\n".join(lines) + "\n"  # a blank line before the next section's heading


def load_note(results: dict[str, Any]) -> str:
    """The 1-minute load average seen during the runs, as text ("" if not recorded)."""
    if "load_average" not in results:
        return ""
    low, high = results["load_average"]
    return (
        f", on a machine shared with other work (1-minute load average {low:.1f} to "
        f"{high:.1f} on {results['cores']} cores)"
    )


# --- the child side ---------------------------------------------------------------


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    import resource

    import apache_beam.io.filesystems  # noqa: F401  (imported by the first file access: untimed)

    from kiln.pipeline import sources, versioning

    def peak_kb() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux

    before = peak_kb()
    source = sources.ManifestSource(type="manifest", path=spec["manifest"])
    start = time.perf_counter()
    with source.list_files(splits_from_source=False) as listing:
        listed = time.perf_counter()
        versioning.stamp("benchmark", listing.stamp_entries(), processing="benchmark")
        stamped = time.perf_counter()
        listing.write(spec["output"])
        written = time.perf_counter()
        temp_bytes = listing.disk_bytes
        counts = {"files": listing.num_files, "dropped": listing.num_dropped}
    return {
        "list_seconds": listed - start,
        "stamp_seconds": stamped - listed,
        "write_seconds": written - stamped,
        "growth_kb": peak_kb() - before,
        "peak_rss_kb": peak_kb(),
        "temp_bytes": temp_bytes,
        **counts,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.listing_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="tiny manifests, one round")
    parser.add_argument(
        "--out",
        default=os.path.join(ROOT, "build", "bench"),
        help="scratch folder: manifests, listing.json (default build/bench)",
    )
    parser.add_argument(
        "--markdown",
        default=None,
        help="the page whose listing section to replace (default: "
        "BENCHMARKS.md at the repository's top; OUT/BENCHMARKS.md "
        "for --quick)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(_RESULT_PREFIX + json.dumps(_child(json.loads(args.child))), flush=True)
        return 0
    out = os.path.abspath(args.out)
    results = measure(QUICK if args.quick else FULL, out, log=print)
    json_path = os.path.join(out, "listing.json")
    markdown_path = page.markdown_path(args.markdown, out, args.quick)
    page.write_section(results, json_path, markdown_path, SECTION_TITLE, markdown(results))
    print(f"wrote the listing section of {markdown_path} and {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
