"""The `kiln` command line: one entry point, one module per command.

Each command lives in its own module, which provides::

    def configure_parser(parser: argparse.ArgumentParser) -> None: ...
    def run(args: argparse.Namespace, extra_argv: list[str]) -> int: ...

Modules are imported only for the command being run, so `kiln lint` does not
pay for importing Beam, and the reader-only install can still run the commands
that need nothing more. `extra_argv` holds the arguments the command's parser
did not know (only commands with ``passes_extra_args`` accept them: `kiln
build` hands them to Beam's PipelineOptions).

Exit codes (`kiln.errors`): 0 success; 1 the command ran and found a problem
(failed build, lint findings, verification failure); 2 a usage or
configuration error; 3 another build of the dataset is running. Errors are
`kiln.errors.KilnError`s, mapped here once: one line, no traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import os
import sys

from kiln.errors import EXIT_USAGE, KilnError, UsageError

__all__ = ["COMMANDS", "Command", "UsageError", "main"]


@dataclasses.dataclass(frozen=True)
class Command:
    module: str
    help: str
    passes_extra_args: bool = False


COMMANDS: dict[str, Command] = {
    "build": Command("kiln.pipeline.command", "build a dataset with the Beam job", True),
    "demo-data": Command("kiln.pipeline.demo_data", "generate the small demo image folder"),
    "lint": Command("kiln.tools.lint.command", "check training code for tf.data tracing pitfalls"),
    "inspect": Command("kiln.tools.inspect_command", "summarize a built dataset"),
    "diff": Command("kiln.tools.diff_command", "compare two versions of a dataset, with limits"),
    "preview": Command(
        "kiln.tools.preview_command",
        "draw stored and augmented images of a dataset as a PNG contact sheet",
    ),
    "verify": Command(
        "kiln.tools.verify_command", "check every shard of a dataset against its kiln.json"
    ),
}

EPILOG = """examples:
  kiln demo-data build/demo-data
  kiln build --config configs/demo.yaml
  kiln build --config configs/demo.yaml --runner=DataflowRunner --project=P --region=R ...
  kiln inspect build/datasets/shapes
  kiln preview build/datasets/shapes -o preview.png
  kiln verify build/datasets/shapes
  kiln lint train.py

`kiln COMMAND --help` shows each command's options, examples and exit codes.

exit codes: 0 ok, 1 the command found a problem, 2 usage or config error"""


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kiln",
        description="Prepare image datasets for TensorFlow training.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from kiln import __version__

    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    return parser


def _quiet_tensorflow(argv: list[str]) -> None:
    # TensorFlow's C++ start-up lines (oneDNN, CUDA, CPU features) bury the
    # command's own output. Hide INFO and WARNING unless the user asked for
    # verbose output or set the variable themselves; errors still show.
    if "-v" not in argv and "--verbose" not in argv:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _quiet_tensorflow(argv)
    parser = _top_parser()
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Find the command without importing every command's module.
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, command in COMMANDS.items():
        sub = subparsers.add_parser(
            name,
            help=command.help,
            description=command.help,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if name == chosen:
            try:
                module = importlib.import_module(command.module)
            except ImportError as e:
                print(
                    f"kiln {name}: needs an extra that is not installed ({e}); "
                    f"try: pip install 'kiln[pipeline]'",
                    file=sys.stderr,
                )
                return EXIT_USAGE
            module.configure_parser(sub)
            sub.set_defaults(_module=module, _command=command)
    if chosen is None:
        parser.print_help()
        return EXIT_USAGE
    args, extra = parser.parse_known_args(argv)
    if extra and not args._command.passes_extra_args:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # Beam logs a failing worker's traceback at ERROR before re-raising it;
        # kiln reports the failure itself, on one line (--verbose shows both).
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
    try:
        return int(args._module.run(args, extra) or 0)
    except KilnError as e:
        print(f"kiln {args.command}: {e.label}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"kiln {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`kiln inspect --json | head`):
        # not an error of ours. Point stdout at devnull so the interpreter's
        # final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
