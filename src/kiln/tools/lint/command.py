"""`kiln lint`: report tf.data / tf.function tracing pitfalls in training code."""

from __future__ import annotations

import argparse
import json
import sys

from kiln import console
from kiln.errors import UsageError
from kiln.tools import lint

DESCRIPTION = """\
Statically check your own training code for the tf.data tracing pitfalls.

Dataset.map (filter, flat_map, interleave) and tf.function trace a Python
function once into a graph, so plain Python in it runs once, at trace time.
This command reads the source (Python's ast; it imports neither your code nor
TensorFlow) and reports, inside every traced function and the functions it
calls (in its module, or in the other files checked in the same run: lint the
helper modules with the script): Python/NumPy randomness, .numpy(), print(), Python
if/while/assert on tensors, tf.py_function, NumPy/OpenCV on tensors, and
Python state (globals, module-level lists and dicts, self.*) changed."""


def _epilog() -> str:
    codes = "\n".join(f"  {rule.code}  {rule.title}" for rule in lint.RULES.values())
    return f"""\
codes:
{codes}

output: one line per finding, sorted by file and line:
  FILE:LINE:COL: CODE message (fix: ...)
silence one line with a trailing comment:  # kiln: noqa   or   # kiln: noqa[K101,K103]

examples:
  kiln lint train.py
  kiln lint src/ scripts/train.py
  kiln lint --ignore K103 src/
  kiln lint --select K101,K104 train.py
  kiln lint --format json src/ > lint.json
  kiln lint --quiet src/          # a pre-commit hook or cron: silent when clean

exit codes:
  0  no findings
  1  findings (a file that cannot be parsed is reported as K000 and counts
     as a finding; the other files are still checked)
  2  usage error: a path does not exist, an unknown code in --select/--ignore,
     a --select naming no code, no Python file found, or no file could be parsed
  73 --format json, no findings: stdout could not be written (a full disk;
     not a reader that went away, as `| head` does)"""


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.epilog = _epilog()
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="FILE_OR_DIR",
        help="Python files, or directories searched for *.py files",
    )
    parser.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text (default): one line per finding; json: one JSON document",
    )
    parser.add_argument(
        "--select",
        type=_codes,
        metavar="CODES",
        help="comma-separated codes or prefixes to report (e.g. K101,K104 or K10)",
    )
    parser.add_argument(
        "--ignore",
        type=_codes,
        metavar="CODES",
        help="comma-separated codes or prefixes not to report",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="print the findings only, without the summary line on stderr: nothing when "
        "clean (for cron, which mails any output, and pre-commit hooks)",
    )


def _codes(text: str) -> list[str]:
    return [code.strip() for code in text.split(",") if code.strip()]


def run(args: argparse.Namespace, extra_argv: list[str]) -> int:
    try:
        files = lint.python_files(args.paths)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    if not files:
        raise UsageError(f"no Python files found in: {' '.join(args.paths)}")
    try:
        # Together: a function one file imports from another is checked in its own file.
        findings = lint.lint_files(files, select=args.select, ignore=args.ignore)
    except ValueError as e:  # an unknown code in --select/--ignore, an empty --select
        raise UsageError(str(e)) from None
    unparsable = len({f.path for f in findings if f.code == lint.SYNTAX_ERROR_CODE})
    checked = len(files) - unparsable

    verdict = 2 if checked == 0 else 1 if findings else 0
    if args.format == "json":
        out = console.Output(sys.stdout, "the JSON document")
        json.dump(
            {
                "files_checked": checked,
                "files_unparsable": unparsable,
                "findings": [f.to_dict() for f in findings],
            },
            out,
            indent=2,
        )
        out.write("\n")
        return out.finish(verdict)
    # Text for a person: a reader that went away, or a full disk, drops it.
    console.write("".join(finding.format() + "\n" for finding in findings), sys.stdout)
    problems = len(findings) - unparsable
    summary = (
        f"kiln lint: {problems} finding{'s' * (problems != 1)} in {checked} "
        f"checked file{'s' * (checked != 1)}"
    )
    if unparsable:
        summary += f"; {unparsable} file{'s' * (unparsable != 1)} could not be parsed (K000)"
    if not args.quiet:
        console.write(summary + "\n", sys.stderr)
    return verdict
