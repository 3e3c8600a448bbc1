"""Build throughput on the detection demo: the same scenes with and without targets.

`make bench` (`benchmarks.run`) measures three builds of the scenes of
``kiln demo-data --targets`` (`kiln.pipeline.demo_targets`, without its
broken scenes), each in its own process through `build_bench.measure`:

- ``classification``: the images alone, one class per image (the first
  object's): what the same pixels cost without targets.
- ``manifest``: configs/demo-detection.yaml's targets from the JSONL
  manifest: boxes, keypoints, a semantic mask PNG per image and an instance
  mask PNG per object, all moved by the transform and encoded.
- ``coco``: the same scenes from the COCO file: boxes, keypoints, ``iscrowd``
  and instance masks rasterized in the job from polygons and RLE.

Every build letterboxes to 128x128 and stores PNG. Nothing here is a test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from typing import Any

from benchmarks import build_bench

TRANSFORMS = [{"letterbox": {"size": 128}}]
KEYPOINTS = {"names": ["center", "left", "right"], "flip_pairs": [["left", "right"]]}
VARIANTS = (
    ("classification", "the same images, one class per image (no targets)"),
    ("manifest", "JSONL manifest: boxes, keypoints, semantic and instance mask PNGs"),
    ("coco", "COCO file: boxes, keypoints, iscrowd, instance masks from polygons and RLE"),
)


@dataclasses.dataclass(frozen=True)
class Settings:
    """Scenes built and rounds (every variant once per round); annotations of the
    generated COCO files whose reading is measured (once each)."""

    images: int
    repeats: int
    coco_sizes: tuple[int, ...]


FULL = Settings(images=600, repeats=3, coco_sizes=(100_000, 1_000_000))
QUICK = Settings(images=8, repeats=1, coco_sizes=(1_000, 4_000))


def prepare(folder: str, images: int) -> dict[str, str]:
    """Writes the scenes (again: a few seconds) and the classification manifest."""
    from kiln.pipeline import demo_targets

    data = os.path.join(folder, "data")
    demo_targets.generate(data, num_images=images, seed=0, include_broken=False)
    classification = os.path.join(folder, "classification.jsonl")
    with (
        open(os.path.join(data, demo_targets.MANIFEST)) as source,
        open(classification, "w") as out,
    ):
        for line in source:
            row = json.loads(line)
            label = row["objects"][0]["class"]
            out.write(json.dumps({"path": "data/" + row["path"], "label": label}) + "\n")
    return {
        "classification": classification,
        "manifest": os.path.join(data, demo_targets.MANIFEST),
        "coco": os.path.join(data, demo_targets.COCO),
        "images": os.path.join(data, "images"),
    }


def configs(paths: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The build config of each variant (`output` filled in by the child)."""
    common = {
        "image": {"channels": 3},
        "transforms": TRANSFORMS,
        "encoding": {"format": "png"},
        "splits": {"fractions": {"train": 1.0}},
        "sharding": {"target_shard_mb": 4},
    }
    return {
        "classification": {
            "name": "classification",
            "source": {"type": "manifest", "path": paths["classification"]},
            **common,
        },
        "manifest": {
            "name": "manifest",
            "source": {
                "type": "manifest",
                "path": paths["manifest"],
                "classes": ["background", "circle", "square", "star", "triangle"],
            },
            "targets": {
                "boxes": {},
                "mask": {},
                "instance_masks": {},
                "keypoints": KEYPOINTS,
            },
            **common,
        },
        "coco": {
            "name": "coco",
            "source": {"type": "coco", "annotations": paths["coco"], "images": paths["images"]},
            "targets": {
                "boxes": {"fields": {"iscrowd": "int"}},
                "instance_masks": {},
                "keypoints": KEYPOINTS,
            },
            **common,
        },
    }


def measure(settings: Settings, out_dir: str, log=None) -> dict[str, Any]:
    """Every variant, `settings.repeats` rounds, round-robin; medians per row."""
    folder = os.path.join(out_dir, "detection")
    scratch = os.path.join(out_dir, "scratch")
    os.makedirs(scratch, exist_ok=True)
    specs = configs(prepare(folder, settings.images))
    runs: dict[str, list[build_bench.BuildRun]] = {key: [] for key, _ in VARIANTS}
    for round_index in range(settings.repeats):
        for key, _ in VARIANTS:
            run = build_bench.measure({"kind": "kiln", "config": specs[key]}, scratch)
            runs[key].append(run)
            if log:
                log(
                    f"detection round {round_index + 1} {key}: {run.seconds:.2f} s, "
                    f"{run.images_per_second:.0f} images/s"
                )
    rows = {}
    for key, title in VARIANTS:
        seconds = statistics.median(r.seconds for r in runs[key])
        images = runs[key][0].images
        rows[key] = {
            "title": title,
            "images": images,
            "median_seconds": seconds,
            "images_per_second": images / seconds,
            "ms_per_image": 1000.0 * seconds / images,
            "peak_rss_mb": statistics.median(r.peak_rss_mb for r in runs[key]),
            "runs": [dataclasses.asdict(r) for r in runs[key]],
        }
    base = rows["classification"]["ms_per_image"]
    for row in rows.values():
        row["cost_vs_classification"] = row["ms_per_image"] / base
    coco_listing = measure_coco_listing(os.path.join(folder, "coco"), settings.coco_sizes)
    if log:
        for row in coco_listing:
            log(f"coco listing {row['annotations']}: {row['seconds']:.1f} s")
    return {
        "images": settings.images,
        "repeats": settings.repeats,
        "transforms": TRANSFORMS,
        "rows": rows,
        "coco_listing": coco_listing,
    }


def markdown(results: dict[str, Any]) -> str:
    """The detection build section of BENCHMARKS.md."""
    lines = [
        f"## Build: the detection demo, {results['images']} scenes",
        "",
        "The scenes of `kiln demo-data --targets` (96 to 192 pixels a side, one to four "
        "shapes each), letterboxed to 128x128 and stored as PNG, built three ways "
        "(`benchmarks/detection_bench.py`): the images alone, and with every target kind "
        "from the JSONL manifest and from the COCO file. Each build runs in its own process; "
        "the time is the work only, as in the build table above. Medians of "
        f"{results['repeats']} runs.",
        "",
        "| Variant | Seconds | Images/s | ms/image | vs no targets | Peak RSS (MB) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in results["rows"].values():
        lines.append(
            f"| {row['title']} | {row['median_seconds']:.2f} | "
            f"{row['images_per_second']:.0f} | {row['ms_per_image']:.1f} | "
            f"{row['cost_vs_classification']:.2f}x | {row['peak_rss_mb']:.0f} |"
        )
    lines += [
        "",
        "Listing a COCO file (`kiln.pipeline.coco.CocoFile.rows`, what the `coco` source "
        "reads before the job): generated files shaped like `instances_train2017.json` (7 "
        "annotations per image, a 12-point polygon each, 80 categories last), each read once "
        "in a fresh process. Memory is the growth of the peak resident set over the imports.",
        "",
        "| Annotations | File (MB) | Seconds | Annotations/s | Memory growth (MB) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in results["coco_listing"]:
        lines.append(
            f"| {row['annotations']:,} | {row['file_mb']:.0f} | {row['seconds']:.1f} | "
            f"{row['annotations'] / row['seconds']:,.0f} | {row['growth_kb'] / 1024:.0f} |"
        )
    return "\n".join(lines) + "\n"


# --- listing a large COCO file --------------------------------------------------------

_COCO_RESULT_PREFIX = "COCO_LISTING_RESULT "
_COCO_CHILD = """
import json, resource, sys, time
from kiln.pipeline.coco import CocoFile, CocoRow
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
rows = objects = problems = 0
for found in CocoFile(sys.argv[1]).rows():
    if isinstance(found, CocoRow):
        rows += 1
        objects += len(found.row["objects"])
    else:
        problems += 1
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(PREFIX + json.dumps({"seconds": seconds, "growth_kb": peak - before, "peak_kb": peak,
                           "rows": rows, "objects": objects, "problems": problems}))
"""


def write_coco(path: str, annotations: int) -> None:
    """A COCO file shaped like instances_train2017.json: 7 annotations per image
    with a 12-point polygon each, 80 categories last, annotations in no image order."""
    import random

    rng = random.Random(annotations)  # noqa: S311  (a seeded corpus, not a secret)
    images = max(1, annotations // 7)
    with open(path, "w") as f:
        f.write('{"info": {"description": "kiln benchmark"}, "images": [')
        for i in range(images):
            image = {"id": i + 1, "file_name": f"{i + 1:012d}.jpg", "width": 640, "height": 480}
            f.write(("," if i else "") + json.dumps(image))
        f.write('], "annotations": [')
        for a in range(annotations):
            x, y = round(rng.uniform(0, 500), 2), round(rng.uniform(0, 400), 2)
            polygon = [round(rng.uniform(0, 480), 2) for _ in range(24)]
            annotation = {
                "id": a + 1,
                "image_id": rng.randrange(1, images + 1),
                "category_id": rng.randrange(1, 81),
                "iscrowd": 0,
                "area": 600.5,
                "bbox": [x, y, 30.5, 20.25],
                "segmentation": [polygon],
            }
            f.write(("," if a else "") + json.dumps(annotation))
        categories = [
            {"id": c, "name": f"class{c:02d}", "supercategory": "thing"} for c in range(1, 81)
        ]
        f.write('], "categories": ' + json.dumps(categories) + "}")


def measure_coco_listing(folder: str, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    """Reads generated COCO files of `sizes` annotations, each in a fresh process."""
    import subprocess
    import sys

    os.makedirs(folder, exist_ok=True)
    results = []
    for size in sizes:
        path = os.path.join(folder, f"instances-{size}.json")
        if not os.path.exists(path):
            write_coco(path, size)
        completed = subprocess.run(
            [sys.executable, "-c", _COCO_CHILD.replace("PREFIX", repr(_COCO_RESULT_PREFIX)), path],
            capture_output=True,
            text=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        )
        lines = [
            line for line in completed.stdout.splitlines() if line.startswith(_COCO_RESULT_PREFIX)
        ]
        if completed.returncode != 0 or not lines:
            raise RuntimeError(f"reading {path} failed:\n{completed.stderr[-4000:]}")
        result = json.loads(lines[-1][len(_COCO_RESULT_PREFIX) :])
        result.update(annotations=size, file_mb=os.path.getsize(path) / 1e6)
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    """Measures this section alone and prints it (`make bench` puts it on its page)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.detection_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="12 scenes, small COCO files")
    parser.add_argument(
        "--out", default=os.path.join("build", "bench"), help="scratch folder (build/bench)"
    )
    args = parser.parse_args(argv)
    results = measure(QUICK if args.quick else FULL, os.path.abspath(args.out), log=print)
    with open(os.path.join(args.out, "detection.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
