"""The reader's cost of targets with the class mask stored as PNG and raw, side by side.

    python -m benchmarks.mask_encoding_ab                  # 1000 images, 6 rounds
    python -m benchmarks.mask_encoding_ab --rounds 9
    python -m benchmarks.mask_encoding_ab --quick          # checks the harness (tiny corpus)

make bench's targets rows (`reader_bench`): (b), the default augmentation,
on the JPEG dataset without targets; ``b_targets``, the same images with
boxes and a class mask stored as PNG; ``b_targets_raw``, the same with
``mask: {encoding: raw}``. One process measures the three in fresh
pipelines (as `reader_ab.measure_pair_member`), round after round, the
order rotating each round, so the three see the same machine. It reports
the medians over rounds of images per second, CPU microseconds per image
(all the process's threads, which a busy shared machine disturbs much less
than wall time) and of each round's cost ratios against (b), with the load
average before and after. The datasets and the corpus are `reader_ab`'s
(the same scratch folder reuses them). Nothing here is a test; make bench
keeps the absolute numbers (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from benchmarks import corpus, machine, reader_ab, reader_bench

NAMES = ("plain", *reader_bench.TARGET_MASK_ENCODINGS)


def datasets(scratch: str, images: int, quick: bool) -> dict[str, str]:
    """``{"plain": (b)'s JPEG dataset, variant key: its targets dataset}``."""
    source = corpus.ensure(
        os.path.join(scratch, "corpus"),
        reader_ab.QUICK_CORPUS if quick else reader_ab.FULL_CORPUS,
        workers=1 if quick else machine.usable_cores(),
    )
    manifest = source.manifest(images)
    output = os.path.join(scratch, "datasets")
    plain = reader_bench.build_datasets(manifest, output, encodings=("jpeg",))["jpeg"]
    return {"plain": plain, **reader_bench.build_target_datasets(manifest, output)}


def measure(
    folders: dict[str, str], rounds: int, batch_size: int, batches: int, log=print
) -> dict[str, list[tuple[float, float]]]:
    """Per name, one ``(images per second, CPU us per image)`` per round."""
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in NAMES}
    for index in range(rounds):
        order = NAMES[index % len(NAMES) :] + NAMES[: index % len(NAMES)]
        for name in order:
            out[name].append(reader_ab.measure_pair_member(folders[name], batch_size, batches))
        log(
            f"round {index + 1}: "
            + ", ".join(f"{n} {out[n][-1][0]:.0f} img/s {out[n][-1][1]:.0f} us" for n in NAMES)
            + f"; load average {machine.load_average()}"
        )
    return out


def summary(runs: dict[str, list[tuple[float, float]]]) -> dict[str, dict[str, float]]:
    """Medians per name: images/s, CPU us per image, and cost vs (b) in wall and CPU."""
    plain = runs["plain"]
    out = {}
    for name, values in runs.items():
        out[name] = {
            "images_per_second": statistics.median(v[0] for v in values),
            "cpu_us": statistics.median(v[1] for v in values),
            "wall_cost": statistics.median(p[0] / v[0] for p, v in zip(plain, values, strict=True)),
            "cpu_cost": statistics.median(v[1] / p[1] for p, v in zip(plain, values, strict=True)),
        }
    return out


def report(medians: dict[str, dict[str, float]]) -> str:
    lines = [f"{'':14} {'img/s':>7} {'wall cost':>10} {'cpu us':>8} {'cpu cost':>9}"]
    for name in NAMES:
        m = medians[name]
        lines.append(
            f"{name:14} {m['images_per_second']:7.0f} {m['wall_cost']:9.3f}x "
            f"{m['cpu_us']:8.0f} {m['cpu_cost']:8.3f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.mask_encoding_ab", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--images", type=int, default=None, help="images per dataset (1000)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (6)")
    parser.add_argument("--quick", action="store_true", help="16 tiny images, batches of 8")
    parser.add_argument(
        "--out", default=os.path.join(reader_ab.ROOT, "build", "bench-reader-ab"), help="scratch"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    images = args.images or (16 if args.quick else 1000)
    batch_size = 8 if args.quick else reader_bench.BATCH_SIZE
    batches = 2 if args.quick else reader_bench.TARGET_VARIANTS[0].batches
    folders = datasets(os.path.abspath(args.out), images, args.quick)
    load_before = machine.load_average()
    runs = measure(folders, args.rounds or (1 if args.quick else 6), batch_size, batches)
    print(
        f"{images} images, batches of {batch_size}, medians of {len(runs['plain'])} rounds; "
        f"load average {load_before} before, {machine.load_average()} after"
    )
    print(report(summary(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
