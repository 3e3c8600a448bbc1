"""`kiln verify`: check every shard of a built dataset against its kiln.json."""

from __future__ import annotations

import argparse
import sys

from kiln import console
from kiln.errors import UsageError

DESCRIPTION = """\
Check a dataset written by `kiln build` before trusting it: check kiln.json
against the checksum it records of its own content, read every shard, check
every record's TFRecord CRCs, the record counts, sizes and sha256 of the
shards against kiln.json, parse and decode every record with the schema, and
check the splits' example, class and statistics counts, errors.jsonl and
duplicates.jsonl (against their sha256 in kiln.json, its counts and the
records) and the TFDS metadata. Works in a reader-only install and on gs://
paths."""

EPILOG = """\
PATH is a version folder (<output>/<name>/<version>) or the dataset folder
<output>/<name>, which follows its LATEST file.

examples:
  kiln verify build/datasets/shapes
  kiln verify gs://my-bucket/datasets/photos/3f2a9c1b0d4e
  kiln build --config configs/demo.yaml --quiet && kiln verify --quiet build/datasets/shapes

exit codes:
  0  every shard and count matches kiln.json
  1  something does not: the first line names the first bad file (kiln.json when
     it was edited, else a shard or report) and what is wrong, one line per
     further problem follows (under --quiet, that one line only, with their number)
  2  PATH is not a kiln dataset (no kiln.json, no LATEST naming a version), or
     cannot be reached or read (s3://, which TensorFlow cannot read: copy the
     version folder to local disk or gs:// first)"""


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.add_argument("path", metavar="PATH", help="dataset version folder, or <output>/<name>")
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="print nothing when the dataset is intact (for cron, which mails any output); "
        "a damaged one prints one line: the first problem and how many more there are",
    )


def run(args: argparse.Namespace, extra_argv: list[str]) -> int:
    # Here, not at the top: `kiln verify --help` needs none of it (TensorFlow, NumPy).
    from kiln.schemas import MetadataError
    from kiln.schemas.location import locate

    # The path first, with plain Python: a path that holds no dataset is a
    # usage error in a fraction of a second, not after TensorFlow's import.
    try:
        dataset_dir = locate(args.path)
    except MetadataError as e:
        raise UsageError(str(e)) from None

    from kiln.schemas.leftovers import Leftovers, leftovers
    from kiln.schemas.location import incomplete_versions
    from kiln.tools import verify
    from kiln.tools.inspection import incomplete_versions_line, staging_lines

    try:
        result = verify.verify(dataset_dir)
        # Not problems of the version checked (readers never use them), so
        # not under --quiet: the next build deletes them.
        incomplete = [] if args.quiet else incomplete_versions(args.path)
        left = Leftovers() if args.quiet else leftovers(args.path)
    except MetadataError as e:
        raise UsageError(str(e)) from None
    if result.ok:
        if args.quiet:
            return 0
        _say(
            f"kiln verify: OK: {result.dataset_dir}: {result.num_shards} shards, "
            f"{result.num_records} records match kiln.json"
        )
    else:
        first, *others = result.problems
        line = f"kiln verify: FAILED: {result.dataset_dir}: {first}"
        if args.quiet and others:  # cron mails the output: one line, as a failed build's
            line += f" (and {len(others)} more problem(s): `kiln verify {args.path}` lists them)"
        _say(line)
        if others and not args.quiet:
            _say(f"{len(others)} more problem(s):")
            for problem in others:
                _say(f"  {problem}")
    if incomplete:
        _say(f"note: {incomplete_versions_line(incomplete)}")
    found = left.to_json()
    for line in staging_lines(found["staging_folders"], found["lock"]):
        _say(f"note: {line}" if not line.startswith(" ") else line)
    return 0 if result.ok else 1


def _say(line: str) -> None:
    # The verdict is the exit code: a line that cannot be written (a reader
    # gone, a full disk) is dropped, and the check still reports its verdict.
    console.write(line + "\n", sys.stdout)
