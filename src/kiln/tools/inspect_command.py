"""`kiln inspect`: summarize a built dataset (readable text, or JSON for scripts)."""

from __future__ import annotations

import argparse
import sys

from kiln import console
from kiln.errors import UsageError

DESCRIPTION = """\
Summarize a dataset written by `kiln build`: version, splits with example
counts and shard sizes, class names with counts per split, pixel
statistics, how images are stored, the offline transforms and the default
augmentation, dropped files by reason (with examples from errors.jsonl),
duplicates (with the groups of identical files from duplicates.jsonl).
Reads only the metadata (no shard is opened); works in a
reader-only install and on gs:// paths."""

EPILOG = """\
PATH is a version folder (<output>/<name>/<version>) or the dataset folder
<output>/<name>, which follows its LATEST file.

examples:
  kiln inspect build/datasets/shapes
  kiln inspect build/datasets/shapes/3f2a9c1b0d4e
  kiln inspect gs://my-bucket/datasets/photos --json | jq '.splits.train.num_examples'

exit codes:
  0  summary printed
  2  PATH is not a complete kiln dataset (the message says why), or cannot be
     reached or read (s3://, which TensorFlow cannot read: copy the version
     folder to local disk or gs:// first)
  73 --json: stdout could not be written (a full disk; not a reader that
     went away, as `| head` does): what was written is incomplete"""


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.add_argument("path", metavar="PATH", help="dataset version folder, or <output>/<name>")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document (every shard, errors.jsonl row and "
        "duplicates.jsonl group) instead of the text summary",
    )


def run(args: argparse.Namespace, extra_argv: list[str]) -> int:
    # Here, not at the top: `kiln inspect --help` needs none of it.
    from kiln.schemas import MetadataError
    from kiln.tools import inspection

    try:
        # The report files' rows are read as they are written (`write_json`)
        # or summed up (`render`): memory does not grow with them.
        summary = inspection.inspect_dataset(args.path, stream=True)
        if args.json:
            out = console.Output(sys.stdout, "the JSON summary")
            inspection.write_json(summary, out)
            out.write("\n")
            return out.finish()
        # Text for a person: a reader that went away, or a full disk, drops it.
        console.write(inspection.render(summary) + "\n", sys.stdout)
    except MetadataError as e:
        raise UsageError(str(e)) from None
    return 0
