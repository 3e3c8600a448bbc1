"""The `kiln` command line: one entry point, one module per command.

Each command lives in its own module, which provides::

    def configure_parser(parser: argparse.ArgumentParser) -> None: ...
    def run(args: argparse.Namespace, extra_argv: list[str]) -> int: ...

Modules are imported only for the command being run, so `kiln lint` does not
pay for importing Beam, and the reader-only install can still run the commands
that need nothing more; a command that needs an extra (`Command.extra`) says
which to install, in one line, exit 2, before it runs. `extra_argv` holds
the arguments the command's parser did not know (only commands with
``passes_extra_args`` accept them: `kiln build` hands them to Beam's
PipelineOptions).

Exit codes (`kiln.errors`): 0 success; 1 the command ran and found a problem
(failed build, lint findings, verification failure); 2 a usage or
configuration error; 3 another build of the dataset is running; 70 an
internal error; 73 the command succeeded but what it was asked to write
could not be written (a build's ``--report``, ``--json`` on stdout); 130
interrupted (Ctrl-C); 143 terminated (SIGTERM, handled as Ctrl-C). Output
for a person that cannot be written (a reader gone, a full disk) is dropped
and changes no exit code (`kiln.console`). Errors are
`kiln.errors.KilnError`s, mapped here once: one line, no traceback. Any
other exception is an internal error: one line too, naming it and the file
its traceback was saved to (``--verbose`` prints it).

Nothing heavy is imported before the command's own module asks for it:
``--help`` of any command, a config error and `kiln inspect` answer without
TensorFlow or Beam (tests/test_startup.py). TensorFlow's C++ logging is
configured here, before anything can import it.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import functools
import gc
import importlib
import importlib.util
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

from kiln import console, native_logs, worker_tracebacks
from kiln.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    KilnError,
    Terminated,
    UsageError,
    also_not_written,
    interruption,
    unexpected,
)

__all__ = ["COMMANDS", "Command", "UsageError", "main"]


@dataclasses.dataclass(frozen=True)
class Command:
    """A command: its module, its one-line help, whether it takes Beam's
    flags, and the extra of setup.py it needs (`EXTRA_MODULES`), if any."""

    module: str
    help: str
    passes_extra_args: bool = False
    extra: str | None = None


# The top-level modules each extra of setup.py installs that kiln's commands
# import (pipeline: Beam, OpenCV, PyYAML...). A command that needs an extra
# looks for them before it runs (`_missing_module`): on the reader-only
# install, `kiln build` says which extra to install, not, deep in a build,
# which module it missed. tests/test_cli_errors.py checks this against setup.py.
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "pipeline": (
        "apache_beam",
        "cv2",
        "imagesize",
        "PIL",
        "yaml",
        "google_crc32c",
        "ijson",
        "packaging",
        "zstandard",
    ),
}

COMMANDS: dict[str, Command] = {
    "build": Command(
        "kiln.pipeline.command", "build a dataset with the Beam job", True, extra="pipeline"
    ),
    "demo-data": Command(
        "kiln.pipeline.demo_data_command", "generate the small demo image folder", extra="pipeline"
    ),
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

exit codes: 0 ok, 1 the command found a problem, 2 usage or config error,
  3 another build of the dataset is running, 70 internal error (a bug: one line
  naming the file that holds the traceback), 73 succeeded but --report or
  --json's output could not be written, 130 interrupted, 143 terminated (SIGTERM)"""


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are one line (not the usage
    block first: a cron mail or CI log should say what was wrong at once),
    with a pointer to --help, and exit `EXIT_USAGE`. Each command's parser
    is one too (argparse makes subparsers of the parent's class).

    A command's module may define ``usage_error(argv, message) -> str``,
    called with the arguments after the command and the error (what the
    line says after ``error: ``) before the line is printed: `kiln build`
    writes its ``--report`` there, as its `run` does for the usage errors
    it finds; what it returns ends the line."""

    on_error: Callable[[str], str] | None = None

    def error(self, message: str) -> NoReturn:
        message = f"{message}; see {self.prog} --help"
        if self.on_error is not None:
            message += self.on_error(message)
        console.write(f"{self.prog}: error: {message}\n", sys.stderr)  # a full disk: still 2
        sys.exit(EXIT_USAGE)


def _top_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kiln",
        description="Prepare image datasets for TensorFlow training.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from kiln import __version__

    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    _add_verbose(parser, default=False)
    return parser


def _add_verbose(parser: argparse.ArgumentParser, default: object) -> None:
    # On the top parser and on each command's (`kiln inspect -v PATH`); a
    # command's own default must not reset a -v given before the command.
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=default, help="log at DEBUG level"
    )


# TensorFlow's C++ lines (oneDNN, CUDA, CPU features) bury the command's own
# output, and a cron job mails them. Unless the user asked for verbose
# output, TensorFlow's logging keeps only fatal errors (kiln reports errors
# itself, as Python exceptions), and the lines its libraries write while
# loading, before any log setting applies, are filtered out of stderr
# (`native_logs`). Set before TensorFlow is imported, which is the only time
# it reads them, and inherited by Beam's worker processes; a variable the
# user set wins.
_QUIET_TENSORFLOW = {
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "GRPC_VERBOSITY": "ERROR",
    native_logs.ENV: "1",
    # Not TensorFlow's, but passed on to Beam's workers the same way: the
    # traceback a failing worker prints before kiln's line (`worker_tracebacks`).
    worker_tracebacks.ENV: "1",
}


def _escape_unencodable(stream: object) -> None:
    """Makes `stream` write a character its encoding cannot hold as an
    escape (``\\xe9``), as Python's stderr does, instead of raising.

    With an ASCII or Latin-1 stdout (``PYTHONIOENCODING=ascii``, a
    non-UTF-8 locale), a summary naming a path or class such as ``café``
    raised UnicodeEncodeError: `kiln inspect` was exit 70, and `kiln build`
    exit 70 ("nothing was published") after it published, its report left
    ``running``. kiln's JSON documents are ASCII (escaped by `json`)."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None and getattr(stream, "errors", None) == "strict":
        with contextlib.suppress(ValueError, OSError):  # a closed or detached stream
            reconfigure(errors="backslashreplace")


def _quiet_tensorflow(argv: list[str]) -> None:
    if "-v" in argv or "--verbose" in argv:
        return
    for name, value in _QUIET_TENSORFLOW.items():
        os.environ.setdefault(name, value)
    if os.environ[native_logs.ENV] == "1":
        native_logs.install()


class _BeamOnRootFilter(logging.Filter):
    """Drops the records Beam's own modules log on the root logger
    (``logging.error(...)``, not their module's logger), below CRITICAL, as
    the ``apache_beam`` logger's are: its S3 filesystem logs a failed upload
    with its traceback ("Error in _start_upload while inserting file ...")
    before it raises the error kiln reports on one line. A filter of the
    root logger sees only the records logged on it, never those of kiln's
    loggers."""

    _BEAM = f"{os.sep}apache_beam{os.sep}"

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.CRITICAL or self._BEAM not in record.pathname


_BEAM_ON_ROOT = _BeamOnRootFilter()

# The logger of Beam's Dataflow API client (`main` quiets it).
_DATAFLOW_CLIENT = "apache_beam.runners.dataflow.internal.apiclient"


def _without_worker_tracebacks(verbose: bool) -> contextlib.AbstractContextManager[None]:
    """Where the command's Beam workers are threads of this process (the
    local runner's ``multi_threading``), keeps the traceback each prints
    off stderr (`worker_tracebacks`), as the variable `_quiet_tensorflow`
    set does in worker processes; not with --verbose."""
    if verbose or os.environ.get(worker_tracebacks.ENV) != "1":
        return contextlib.nullcontext()
    return worker_tracebacks.dropped()


def _missing_module(extra: str) -> str | None:
    """The first of `extra`'s modules (`EXTRA_MODULES`) that cannot be
    found, or None. Found, not imported: Beam's import takes seconds."""
    for name in EXTRA_MODULES[extra]:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):  # a finder that refuses it; a broken module
            return name
    return None


def _needs_extra(command: str, extra: str, detail: str) -> int:
    """Says, in one line, which extra `command` needs (`detail`: which
    module is missing), and returns `EXIT_USAGE`."""
    console.write(
        f"kiln {command}: error: needs kiln's {extra} extra, which is not installed "
        f"({detail}): pip install 'kiln[{extra}]'\n",
        sys.stderr,
    )
    return EXIT_USAGE


def _exit_without_collecting() -> None:
    # At exit the interpreter runs a last garbage collection over every
    # object alive, millions after TensorFlow and Beam were imported: seconds
    # between a build's summary and the process's end. Frozen objects are
    # left out of it; nothing kiln needs happens in that collection (files
    # are closed and output flushed by then).
    gc.freeze()


def _interrupt_quietly(signum, frame) -> None:
    # Ctrl-C: the job's other threads fail as it is torn down under them;
    # their logs and tracebacks would bury the one line that says what
    # happened ("interrupted"). --verbose keeps them.
    _quiet_teardown()
    raise KeyboardInterrupt


def _quiet_teardown() -> None:
    logging.disable(logging.CRITICAL)
    threading.excepthook = lambda args: None


def _terminate(verbose: bool):
    """The SIGTERM handler: a scheduler's stop, handled as Ctrl-C (`Terminated`)."""

    def terminate(signum, frame) -> None:
        if not verbose:
            _quiet_teardown()
        raise Terminated

    return terminate


def _end_interrupted_process(code: int = EXIT_INTERRUPTED) -> None:
    # After Ctrl-C, Beam's and TensorFlow's threads may still be inside
    # native code; finalizing the interpreter under them aborts the process
    # ("terminate called without an active exception", exit -6) after the
    # one line was printed. Everything kiln cleans up (the staging folder,
    # the lock) was cleaned while the interrupt unwound; end here.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _internal_error(command: str, error: Exception, verbose: bool) -> int:
    """Reports an exception that is not a `KilnError` as cron and CI logs
    want it, one line on stderr, and saves its traceback to a file that line
    names (`save_traceback`); ``--verbose`` prints the traceback first."""
    if verbose:
        traceback.print_exception(error, file=sys.stderr)
    saved = save_traceback(command, error)
    where = f"the traceback is in {saved}" if saved else "the traceback could not be saved"
    console.write(
        f"kiln {command}: internal error: {unexpected(error)} "
        f"(unexpected; {where}; --verbose prints it){also_not_written(error)}\n",
        sys.stderr,
    )
    return EXIT_INTERNAL


def save_traceback(command: str, error: BaseException) -> str | None:
    """Writes `error`'s traceback to a new file in the temp folder
    (``$TMPDIR/kiln-<command>-<UTC time>-<random>.traceback.txt``, readable
    by its owner only), with kiln's and Python's versions; its path, or None
    if it cannot be written. Not the command line's arguments: pipeline
    flags may hold credentials (s3's)."""
    from kiln import __version__

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    header = (
        f"kiln {__version__} ({command}), Python {sys.version.split()[0]}, "
        f"pid {os.getpid()}, {stamp}\n"
    )
    try:
        fd, path = tempfile.mkstemp(prefix=f"kiln-{command}-{stamp}-", suffix=".traceback.txt")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(header + "".join(traceback.format_exception(error)))
    except OSError:
        return None
    return path


_EXIT_HOOK: list[bool] = []


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _escape_unencodable(sys.stdout)
    _quiet_tensorflow(argv)
    if not _EXIT_HOOK:
        atexit.register(_exit_without_collecting)
        _EXIT_HOOK.append(True)
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
        _add_verbose(sub, default=argparse.SUPPRESS)
        if name == chosen:
            try:
                module = importlib.import_module(command.module)
            except ImportError as e:
                return _needs_extra(name, command.extra or "pipeline", str(e))
            module.configure_parser(sub)
            if hasattr(module, "usage_error"):
                sub.on_error = functools.partial(  # type: ignore[attr-defined]
                    module.usage_error, argv[argv.index(name) + 1 :]
                )
            sub.set_defaults(_module=module, _command=command, _parser=sub)
    if chosen is None:
        parser.parse_args(argv)  # --help and --version exit 0 here; anything else is an error
        parser.print_help(sys.stderr)  # `kiln` or `kiln -v` alone: which command?
        return EXIT_USAGE
    args, extra = parser.parse_known_args(argv)
    if extra and not args._command.passes_extra_args:
        args._parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args._command.extra:  # after parsing: --help works without the extra
        missing = _missing_module(args._command.extra)
        if missing:
            return _needs_extra(args.command, args._command.extra, f"no module named {missing!r}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # Beam logs a failing worker's traceback at ERROR before re-raising it;
        # kiln reports the failure itself, on one line (--verbose shows both).
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
        logging.getLogger().addFilter(_BEAM_ON_ROOT)
        # Dataflow's client logs the service's refusal of a job at CRITICAL
        # before raising it: kiln's one line quotes it (JobNotSubmitted).
        logging.getLogger(_DATAFLOW_CLIENT).setLevel(logging.CRITICAL + 1)
    else:
        logging.getLogger().removeFilter(_BEAM_ON_ROOT)
        logging.getLogger(_DATAFLOW_CLIENT).setLevel(logging.NOTSET)
    previous_handlers = {}
    if threading.current_thread() is threading.main_thread():
        previous_handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, _terminate(args.verbose))
        if not args.verbose:
            previous_handlers[signal.SIGINT] = signal.signal(signal.SIGINT, _interrupt_quietly)
    try:
        with _without_worker_tracebacks(args.verbose):
            return int(args._module.run(args, extra) or 0)
    except KilnError as e:
        console.write(f"kiln {args.command}: {e.label}: {e}{also_not_written(e)}\n", sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:
        what, code = interruption(e)
        console.write(f"kiln {args.command}: {what}{also_not_written(e)}\n", sys.stderr)
        atexit.register(_end_interrupted_process, code)
        return code
    except Exception as e:  # not a KilnError: unexpected (a bug, here or in a plugin or library)
        # Commands write through `console`, so output that cannot be written
        # (`| head`, a full disk) never ends up here: a write that failed
        # here bypassed it (a plugin's print()). What it left in stdout's
        # buffer would fail again at the interpreter's last flush.
        console.write("", sys.stdout)
        return _internal_error(args.command, e, verbose=args.verbose)
    finally:
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
