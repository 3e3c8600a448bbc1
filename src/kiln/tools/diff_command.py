"""`kiln diff`: what changed between two versions of a dataset; thresholds to stop on."""

from __future__ import annotations

import argparse
import json
import sys

from kiln import console, gate_flags
from kiln.errors import EXIT_FAILED, EXIT_OK, UsageError
from kiln.schemas import MetadataError, version_diff
from kiln.schemas.version_diff import Thresholds, VersionDiff, size_text

DESCRIPTION = """\
Compare two versions of a dataset written by `kiln build`: records added,
removed, changed (same key, other content) and moved (same key, other
split or class) per split and class; each class's share of the dataset
(of its examples: an image with boxes or a mask counts in every class it
shows) before and after; with boxes, each class's object count before and
after; per-channel mean/std drift per split; duplicate and dropped counts
(files, and objects dropped from stored images) before and after. Records
are compared by key and the sha256 of their source file: shards identical
in both versions are not read, the others' records come from the versions'
record index (index.jsonl), or from the shards themselves in datasets
without one.
With thresholds, crossing one exits 1, so a scheduled job can stop before
training on a broken dataset."""

EPILOG = """\
OLD and NEW are version folders (<output>/<name>/<version>), dataset
folders <output>/<name> (meaning the version LATEST names), or a bare
version id of the same dataset as the other argument.

examples:
  kiln diff build/datasets/shapes/3f2a9c1b0d4e build/datasets/shapes
  kiln diff 3f2a9c1b0d4e build/datasets/shapes --json
  kiln diff gs://bucket/datasets/photos/0a1b2c3d4e5f gs://bucket/datasets/photos \\
      --max-share-shift 2 --max-changed-percent 10 --fail-on-vanished-class
  kiln diff build/datasets/shapes-detection/<old> build/datasets/shapes-detection \\
      --max-object-change 5

exit codes:
  0  compared; no threshold crossed
  1  a threshold was crossed (each one is a line on stderr, and in --json's
     "violations")
  2  OLD or NEW is not a complete kiln dataset, or a bad flag
  73 --json, no threshold crossed: stdout could not be written (a full
     disk; not a reader that went away, as `| head` does)"""


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.add_argument("old", metavar="OLD", help="the earlier version")
    parser.add_argument("new", metavar="NEW", help="the later version")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document instead of the text"
    )
    gate_flags.add_arguments(parser, crossing="exit 1")


def run(args: argparse.Namespace, extra_argv: list[str]) -> int:
    try:
        thresholds = Thresholds(**gate_flags.values(args))
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        old = version_diff.open_version(args.old, relative_to=args.new)
        new = version_diff.open_version(args.new, relative_to=args.old)
        diff = version_diff.compare(old, new)
    except MetadataError as e:
        raise UsageError(str(e)) from None
    if old.info.name != new.info.name:
        console.write(
            f"kiln diff: note: OLD is dataset {old.info.name!r} and NEW is {new.info.name!r}: "
            f"records match by key across two datasets\n",
            sys.stderr,
        )
    # A reader that goes away (`kiln diff ... | head`) changes neither the
    # verdict (the exit code) nor the violations on stderr; nor does a text
    # diff that cannot be written. The JSON document that cannot be is exit 73
    # when no threshold was crossed (`console.Output`).
    out = console.Output(sys.stdout, "the JSON document")
    if args.json:
        out.write(json.dumps(diff.to_json(thresholds), indent=2, sort_keys=True) + "\n")
    else:
        console.write(render(diff) + "\n", sys.stdout)
    violations = diff.violations(thresholds)
    for violation in violations:
        console.write(f"kiln diff: threshold crossed: {violation}\n", sys.stderr)
    return out.finish(EXIT_FAILED if violations else EXIT_OK)


def render(diff: VersionDiff) -> str:
    """The text form of a diff."""
    data = diff.to_json()
    old, new = data["old"], data["new"]
    lines = [
        f"kiln diff: {old['name']} {old['version']} -> {new['name']} {new['version']}",
        f"  old: {old['dataset_dir']}  ({old['num_examples']} examples)",
        f"  new: {new['dataset_dir']}  ({new['num_examples']} examples)",
    ]
    if data["records_from"] == "identical":
        lines.append("  the same version: nothing changed")
        return "\n".join(lines)
    totals = data["totals"]
    lines.append(
        f"records: +{totals['added']} added, -{totals['removed']} removed, "
        f"{totals['changed']} changed, {totals['moved_in']} moved, "
        f"{totals['unchanged']} unchanged ({data['changed_percent']:.2f}% of "
        f"{totals['old']} changed; read from {data['records_from']})"
    )
    lines.extend(_changes_table(data))
    lines.extend(_shares_table(data))
    lines.extend(_objects_table(data))
    for key, title in (
        ("vanished_splits", "vanished splits (examples before, none now)"),
        ("vanished_classes", "vanished classes (examples before, none now)"),
        ("added_classes", "new classes"),
        ("removed_classes", "classes no longer listed"),
        ("label_ids_changed", "classes whose label id changed"),
        ("config_changes", "build config changed"),
    ):
        if data[key]:
            lines.append(f"{title}: {', '.join(data[key])}")
    size = data["image_size"]
    if size["old"] != size["new"]:
        lines.append(f"stored image size: {size_text(size['old'])} -> {size_text(size['new'])}")
    lines.extend(_statistics_lines(data["statistics"]))
    dropped, duplicates = data["dropped"], data["duplicates"]
    lines.append(
        f"dropped: {dropped['old_total']} -> {dropped['new_total']}"
        + _reasons(dropped["old"], dropped["new"])
    )
    objects = data["objects_dropped"]
    if objects is not None:
        lines.append(
            f"objects dropped from stored images: {objects['old_total']} -> "
            f"{objects['new_total']}" + _reasons(objects["old"], objects["new"])
        )
    lines.append(f"duplicates: {duplicates['old']} -> {duplicates['new']}")
    return "\n".join(lines)


_COLUMNS = ("old", "new", "added", "removed", "changed", "moved_in", "moved_out")


def _changes_table(data: dict) -> list[str]:
    rows = []
    for split, change in data["splits"].items():
        rows.append((split, change))
        for label, cell in change["classes"].items():
            if any(cell[column] for column in _COLUMNS):
                rows.append((f"  {label}", cell))
    width = max([len("split / class")] + [console.width(name) for name, _ in rows])
    header = "  ".join(f"{column:>9}" for column in _COLUMNS)
    lines = [f"  {'split / class':<{width}}  {header}"]
    for name, cell in rows:
        cells = "  ".join(f"{cell[column]:>9}" for column in _COLUMNS)
        lines.append(f"  {console.pad(name, width)}  {cells}")
    return lines


def _shares_table(data: dict) -> list[str]:
    classes = data["classes"]
    if not classes:
        return []
    width = max(console.width(name) for name in classes)
    lines = ["class shares of the dataset (percent of the examples; shift in points):"]
    for name, share in classes.items():
        lines.append(
            f"  {console.pad(name, width)}  {share['old']:>7} -> {share['new']:<7}  "
            f"{share['old_share']:6.2f}% -> {share['new_share']:6.2f}%  "
            f"{share['shift_points']:+6.2f}"
        )
    return lines


def _objects_table(data: dict) -> list[str]:
    objects = data["objects"]
    if not objects:
        return []
    width = max(console.width(name) for name in objects)
    lines = ["objects per class (all splits; change in percent of the old count):"]
    for name, count in objects.items():
        percent = count["change_percent"]
        lines.append(
            f"  {console.pad(name, width)}  {count['old']:>7} -> {count['new']:<7}  "
            + ("" if percent is None else f"{percent:+7.2f}%")
        )
    return lines


def _statistics_lines(statistics: dict) -> list[str]:
    if not statistics:
        return []
    lines = ["pixel statistics drift per channel (0..255; new - old):"]
    width = max(len(name) for name in statistics)
    for name, drift in statistics.items():
        mean = " ".join(f"{value:+6.2f}" for value in drift["mean_drift"])
        std = " ".join(f"{value:+6.2f}" for value in drift["std_drift"])
        lines.append(f"  {name:<{width}}  mean {mean}   std {std}")
    return lines


def _reasons(old: dict, new: dict) -> str:
    reasons = sorted(set(old) | set(new))
    if not reasons:
        return ""
    return " (" + ", ".join(f"{r}: {old.get(r, 0)} -> {new.get(r, 0)}" for r in reasons) + ")"
