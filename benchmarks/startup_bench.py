"""Start-up measurements: what a user waits for before a command does anything.

    python -m benchmarks.startup_bench            # prints the rows (5 rounds)
    python -m benchmarks.startup_bench --quick    # one round

`make bench` (`benchmarks.run`) runs the same measurements and puts them on
its page. Each row is a whole command in a fresh process, as a user or a
scheduler runs it (``python -m kiln.cli ...``), wall-clock seconds from
start to exit, the median of the rounds; next to the reference row, a bare
``python -c "import tensorflow"``. The goal (issue 17): ``--help`` of every
command, a config error and `kiln inspect` under 1 s, without TensorFlow or
Beam (tests/test_startup.py checks the imports; timings are only measured
here). The last row is the time between a build's summary and its process's
exit (the build itself is not timed).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class Settings:
    repeats: int
    demo_images: int = 40


FULL = Settings(repeats=5)
QUICK = Settings(repeats=1)


def _kiln(*args: str) -> list[str]:
    return [sys.executable, "-m", "kiln.cli", *args]


def _environment() -> dict[str, str]:
    # The source tree first, as the tests run it; nothing else changed.
    path = os.path.join(ROOT, "src")
    existing = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=path + (os.pathsep + existing if existing else ""))


def _seconds(command: list[str], expect: int | None) -> float:
    start = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, env=_environment(), cwd=ROOT)
    seconds = time.perf_counter() - start
    if expect is not None and completed.returncode != expect:
        raise RuntimeError(
            f"{command} exited {completed.returncode}, expected {expect}: "
            f"{completed.stderr.decode(errors='replace')[-2000:]}"
        )
    return seconds


def _exit_after_summary(command: list[str]) -> float:
    """Seconds from the summary's first line on stdout to the process's exit."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_environment(), cwd=ROOT
    )
    if process.stdout is None:  # for the type checker: stdout=PIPE always gives one
        raise RuntimeError("no stdout")
    first_line = process.stdout.readline()
    printed = time.perf_counter()
    process.stdout.read()
    code = process.wait()
    exited = time.perf_counter()
    if code != 0 or not first_line.startswith(b"kiln build:"):
        raise RuntimeError(f"{command} exited {code} after {first_line!r}")
    return exited - printed


def _prepare(scratch: str, settings: Settings) -> dict[str, str]:
    """The demo images, a good config, two broken ones and a built dataset."""
    os.makedirs(scratch, exist_ok=True)
    images = os.path.join(scratch, "demo-data")
    subprocess.run(
        _kiln("demo-data", images, "--num-images", str(settings.demo_images), "--no-broken"),
        check=True,
        capture_output=True,
        env=_environment(),
    )
    config = {
        "name": "startup",
        "source": {"type": "image_folder", "root": images},
        "output": os.path.join(scratch, "datasets"),
        "transforms": [{"resize": {"shorter_side": 32}}, {"center_crop": {"size": 32}}],
    }
    paths = {}
    for name, data in {
        "good": config,
        "typo": dict(config, trasforms=config["transforms"]),
        "bad_augment": dict(config, augment=["random_flip_sideways"]),
    }.items():
        paths[name] = os.path.join(scratch, f"{name}.yaml")
        with open(paths[name], "w") as f:
            yaml.safe_dump(data, f)
    subprocess.run(
        _kiln("build", "--config", paths["good"], "--quiet"),
        check=True,
        capture_output=True,
        env=_environment(),
    )
    paths["dataset"] = os.path.join(config["output"], "startup")
    paths["rebuild"] = os.path.join(scratch, "rebuild.yaml")
    with open(paths["rebuild"], "w") as f:  # a new output each round: a real build, not up to date
        yaml.safe_dump(config, f)
    return paths


def measure(settings: Settings, out_dir: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every start-up row, `settings.repeats` rounds, round-robin."""
    paths = _prepare(os.path.join(out_dir, "startup"), settings)
    rows: list[tuple[str, str, list[str], int | None, bool]] = [
        (
            "tensorflow",
            'python -c "import tensorflow" (reference)',
            [sys.executable, "-c", "import tensorflow"],
            0,
            False,
        ),
        ("help", "kiln --help", _kiln("--help"), 0, True),
    ]
    from kiln import cli

    for command in sorted(cli.COMMANDS):
        rows.append(
            (f"help_{command}", f"kiln {command} --help", _kiln(command, "--help"), 0, True)
        )
    rows += [
        (
            "missing_config",
            "kiln build --config nope.yaml (missing file)",
            _kiln("build", "--config", os.path.join(out_dir, "nope.yaml")),
            2,
            True,
        ),
        (
            "typo_config",
            "kiln build, config with a typo (trasforms)",
            _kiln("build", "--config", paths["typo"]),
            2,
            True,
        ),
        (
            "bad_augment",
            "kiln build, unknown augmentation op",
            _kiln("build", "--config", paths["bad_augment"]),
            2,
            True,
        ),
        ("inspect", "kiln inspect DATASET", _kiln("inspect", paths["dataset"]), 0, True),
    ]
    runs: dict[str, list[float]] = {key: [] for key, *_ in rows}
    runs["exit_after_summary"] = []
    for round_index in range(settings.repeats):
        for key, _, command, expect, _ in rows:
            runs[key].append(_seconds(command, expect))
        output = os.path.join(out_dir, "startup", f"rebuild-{round_index}")
        runs["exit_after_summary"].append(
            _exit_after_summary(_kiln("build", "--config", paths["rebuild"], "--output", output))
        )
        log(
            f"startup round {round_index + 1}: "
            + ", ".join(f"{key} {values[-1]:.2f} s" for key, values in runs.items())
        )
    result_rows = [
        {
            "key": key,
            "title": title,
            "median_seconds": statistics.median(runs[key]),
            "runs": runs[key],
            "target_seconds": TARGET_SECONDS if judged else None,
        }
        for key, title, _, _, judged in rows
    ]
    result_rows.append(
        {
            "key": "exit_after_summary",
            "title": "kiln build: from the summary to the process's exit",
            "median_seconds": statistics.median(runs["exit_after_summary"]),
            "runs": runs["exit_after_summary"],
            "target_seconds": TARGET_SECONDS,
        }
    )
    return {"repeats": settings.repeats, "rows": result_rows}


def markdown(startup: dict[str, Any]) -> str:
    """The start-up section of BENCHMARKS.md."""
    lines = [
        "## Start-up: what a command costs before it does anything",
        "",
        "Each command in a fresh process, wall-clock seconds from start to exit (median of "
        f"{startup['repeats']} rounds), next to importing TensorFlow alone. Goal: under "
        f"{TARGET_SECONDS:.0f} s for every row that has one (`--help`, config errors and "
        "`kiln inspect` import neither TensorFlow nor Beam: tests/test_startup.py).",
        "",
        "| command | seconds | goal |",
        "|---|---:|---|",
    ]
    for row in startup["rows"]:
        goal = (
            "-"
            if row["target_seconds"] is None
            else ("met" if row["median_seconds"] < row["target_seconds"] else "NOT MET")
            + f" (< {row['target_seconds']:.0f} s)"
        )
        lines.append(f"| {row['title']} | {row['median_seconds']:.2f} | {goal} |")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.startup_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument(
        "--out", default=os.path.join(ROOT, "build", "bench"), help="scratch folder"
    )
    args = parser.parse_args(argv)
    startup = measure(QUICK if args.quick else FULL, os.path.abspath(args.out))
    print(markdown(startup))
    return 0


if __name__ == "__main__":
    sys.exit(main())
