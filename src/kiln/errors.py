"""kiln's error base: every error a user can cause carries its exit code.

The command line maps them once (`kiln.cli.main`): the message is printed as
one line, ``kiln <command>: <label>: <message>``, without a traceback, and the
process exits with `KilnError.exit_code`. A config with several problems is
the exception: they are all reported at once, one line each under a first
line that counts them (`ConfigError.of`). Library callers catch the
classes.

Exit codes (the same for every command, documented in docs/cli.md):

====  ==========================================================================
0     success (built, up to date, verified, no findings)
1     the command ran and found a problem (`Failure`: a failed build, lint
      findings, a dataset that does not verify)
2     usage or configuration error (`UsageError`, `ConfigError`): nothing was done
3     another build of the same dataset holds its lock (`Busy`): nothing was done
70    internal error: an exception that is not a `KilnError` (a bug in kiln, or
      in a plugin it ran): one line naming it and where its traceback was
      saved (`unexpected`); sysexits.h's EX_SOFTWARE
73    the command succeeded but what it was asked to write could not be
      written: `kiln build`'s ``--report`` file after the dataset was
      published or found up to date (`ReportNotWritten`), or a command's
      product on stdout (``--json``, ``--format json``) for a reason other
      than a reader that went away (`OutputNotWritten`, `kiln.console`);
      sysexits.h's EX_CANTCREAT. After a failed build the build's own code
      stands, its line saying the report was not written (`also_not_written`)
130   interrupted (Ctrl-C): one line, no traceback; a build publishes nothing
143   terminated (SIGTERM): handled as Ctrl-C, one line (`Terminated`)
====  ==========================================================================
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable, Sequence
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_BUSY = 3
# An exception kiln did not expect (not a KilnError): sysexits.h's EX_SOFTWARE,
# apart from 1 so that a scheduler can tell a bug from a failed build.
EXIT_INTERNAL = 70
# The build succeeded but its --report file could not be written, or a command
# succeeded but its product on stdout could not be: sysexits.h's EX_CANTCREAT,
# apart from 1 and 70, which mean that nothing was published.
EXIT_NOT_REPORTED = 73
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT): 128 + the signal's number, as shells report it
EXIT_TERMINATED = 143  # SIGTERM (a scheduler, Kubernetes, `timeout`): 128 + 15


# How much of a user's value an error message quotes. A config value can be
# huge (a YAML alias bomb expands a 600-byte file to gigabytes), and a
# message quoting it whole would be as large.
_QUOTE = reprlib.Repr()
_QUOTE.maxstring = 80
_QUOTE.maxother = 80
_QUOTE.maxlist = _QUOTE.maxtuple = _QUOTE.maxdict = _QUOTE.maxset = 6
_QUOTE.maxlevel = 3
MAX_MESSAGE_CHARS = 2000
# How many problems of one config a message lists (then "... and N more").
MAX_PROBLEMS_SHOWN = 10


def quote(value: Any) -> str:
    """`repr(value)` cut to a readable size: what error messages quote of user input."""
    return _QUOTE.repr(value)


def quote_text(text: str, limit: int = 500) -> str:
    """`text` cut to `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


# How many names a did-you-mean offers at most, and how far below the closest
# one (difflib's similarity ratio, 0..1) a name may be and still be offered.
MAX_SUGGESTIONS = 3
SUGGESTION_MARGIN = 0.1


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``"; did you mean 'transforms'?"`` for the known names closest to a
    misspelled `word`, or ``""`` when none is close.

    Every name about as close as the closest is offered (up to
    `MAX_SUGGESTIONS`, closest first): ``"; did you mean
    'random_flip_left_right' or 'random_flip_up_down'?"`` for
    ``random_flip``. A `word` of 3 or more characters that begins up to
    `MAX_SUGGESTIONS` names (an abbreviation: prob -> probability) offers
    those names; one that begins more offers none (the caller lists all).
    """
    matches = close_names(word, known)
    if not matches:
        return ""
    names = [repr(name) for name in matches]
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    return f"; did you mean {listed}?"


def unknown_names(unknown: Sequence[str], known: Iterable[str], one: str, many: str) -> str:
    """What a message says of `unknown` names, each with its did-you-mean
    among `known`: ``"'centre' is a keypoint of no category; did you mean
    'center'?"`` for one (``one`` is what follows the name), ``"'a' ('did you
    mean ...'), 'b' are keypoints of no category"`` for more (``many``)."""
    known = list(known)
    if len(unknown) == 1:
        return f"{quote(unknown[0])} {one}{did_you_mean(unknown[0], known)}"
    named = [
        quote(name) + (f" ({hint[2:]})" if (hint := did_you_mean(name, known)) else "")
        for name in unknown
    ]
    return f"{', '.join(named)} {many}"


def close_names(word: str, known: Iterable[str]) -> list[str]:
    """The known names `did_you_mean` offers for `word`, closest first (maybe
    none). A name that differs from `word` in case only (``PNG`` for ``png``)
    is the closest, whatever difflib's ratio says (it compares characters)."""
    known = sorted(set(known))
    same = [name for name in known if name.casefold() == word.casefold()]
    if same:
        return same[:MAX_SUGGESTIONS]
    matches = [name for name in known if name.startswith(word)] if len(word) >= 3 else []
    if not matches and len(word) >= 4:
        # A prefix with a slip in its last character (``random_flipp``):
        # the names it begins, rather than difflib's ratio, which favours
        # the shortest (``random_flip_up_down`` over ``..._left_right``).
        matches = [name for name in known if name.startswith(word[:-1])]
    if len(matches) > MAX_SUGGESTIONS:
        return []
    if not matches:
        matcher = difflib.SequenceMatcher()
        matcher.set_seq2(word)
        scored = []
        for name in known:
            matcher.set_seq1(name)
            scored.append((matcher.ratio(), name))
        scored.sort(key=lambda pair: -pair[0])  # stable: ties stay in name order
        best = scored[0][0] if scored else 0.0
        matches = [
            name
            for ratio, name in scored[:MAX_SUGGESTIONS]
            if ratio >= 0.6 and ratio >= best - SUGGESTION_MARGIN
        ]
    return matches


class Terminated(KeyboardInterrupt):
    """SIGTERM (sent by Airflow, Kubernetes, `timeout`), handled as Ctrl-C:
    the command line raises it in the main thread, so everything that cleans
    up after a Ctrl-C (a build's staging folder, its lock) does after it too,
    and exits `EXIT_TERMINATED` after one line."""


def interruption(error: KeyboardInterrupt) -> tuple[str, int]:
    """What the command line says of an interrupt, and its exit code:
    ``("interrupted", 130)`` for Ctrl-C, ``("terminated (SIGTERM)", 143)``
    for `Terminated`. Not the exception's text: a runner may have appended
    the step it interrupted."""
    if isinstance(error, Terminated):
        return "terminated (SIGTERM)", EXIT_TERMINATED
    return "interrupted", EXIT_INTERRUPTED


def unexpected(error: BaseException) -> str:
    """What the command line says of an exception that is not a `KilnError`,
    on one line: its type (with its module, unless built in) and its message
    with every run of whitespace made one space, cut to `quote_text`'s
    length: ``ValueError: bad value``, ``yaml.scanner.ScannerError: ...``."""
    kind = type(error)
    name = kind.__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    message = " ".join(str(error).split())
    return quote_text(f"{name}: {message}" if message else name)


def first_line(error: BaseException, limit: int = 200) -> str:
    """The first line of `error`'s message (its type's name when it has
    none), cut to `limit` characters: a library's error (an OSError, an HTTP
    client's, a JSON parser's) quoted inside one of kiln's own lines."""
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:limit]


# The attribute a failure carries when a file the command promised could not
# be written either (`kiln build --report` after a failed build): said at the
# end of the failure's one line (`also_not_written`), the exit code unchanged.
REPORT_PROBLEM = "kiln_report_problem"


def also_not_written(error: BaseException) -> str:
    """``; <why the report could not be written>`` for the end of `error`'s
    one line (`REPORT_PROBLEM`), or ''."""
    problem = getattr(error, REPORT_PROBLEM, None)
    return f"; {problem}" if problem else ""


class KilnError(Exception):
    """Base of kiln's user-facing errors.

    The message is cut to `MAX_MESSAGE_CHARS`: a last guard for messages
    that quote user input (quote it with `quote` in the first place).

    Attributes:
      exit_code: What the command line exits with.
      label: The word the command line prints before the message.
    """

    exit_code = EXIT_FAILED
    label = "error"

    def __str__(self) -> str:
        return quote_text(super().__str__(), MAX_MESSAGE_CHARS)


class UsageError(KilnError):
    """A bad flag or argument: one line, exit 2, nothing was done."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError, ValueError):
    """A build config (or augmentation or transform list) is invalid.

    The message names the file and the field. Also a `ValueError`, so code
    that only knows Python's conventions can catch it.

    Attributes:
      problems: Every problem found, one line each (``field: what is
        wrong``); the message is the single problem, or all of them, one per
        line, under a line that counts them.
    """

    def __init__(self, message: str, problems: Sequence[str] = ()):
        super().__init__(message)
        self.problems = tuple(problems) or (message,)

    @classmethod
    def of(cls, where: str, problems: Sequence[str]) -> ConfigError:
        """One error for all of `problems` in `where` (a file name): ``config
        error in <where>: <problem>`` on one line for one problem, else that
        first line counting them and one indented line per problem (at most
        `MAX_PROBLEMS_SHOWN`)."""
        if len(problems) == 1:
            return cls(f"config error in {where}: {problems[0]}", problems)
        shown = [f"  {problem}" for problem in problems[:MAX_PROBLEMS_SHOWN]]
        if len(problems) > MAX_PROBLEMS_SHOWN:
            shown.append(f"  ... and {len(problems) - MAX_PROBLEMS_SHOWN} more")
        return cls(
            "\n".join([f"config error in {where}: {len(problems)} problems:", *shown]), problems
        )


class Failure(KilnError):
    """The command ran and failed (a build, a verification): exit 1."""

    label = "failed"


class DryRun(KilnError):
    """Not an error: the pipeline options asked for a dry run (Beam's
    ``--dry_run=True``), so the job was translated for its runner and not
    submitted, and nothing was published: exit 0.

    `kiln build` prints its one line (none under ``--quiet``) and reports
    the status ``dry_run``.
    """

    exit_code = EXIT_OK
    label = "dry run"


class Busy(KilnError):
    """Another build of the same dataset holds its lock: exit 3, nothing was done."""

    exit_code = EXIT_BUSY
    label = "busy"


class ReportNotWritten(KilnError):
    """`kiln build` published its dataset (or found it up to date), but the
    file ``--report`` names could not be written: exit 73, one line saying
    both. Not 1 or 70, which mean that nothing was published; not 0, since
    a scheduler that reads the report would read an old one, or none."""

    exit_code = EXIT_NOT_REPORTED
    label = "report not written"


class OutputNotWritten(KilnError):
    """A command succeeded, but its product on stdout (``kiln inspect
    --json``, ``kiln diff --json``, ``kiln lint --format json``) could not
    be written for a reason other than a reader that went away (a full
    disk, an I/O error): exit 73, one line. Not 0, since a script would
    read an incomplete document as the answer (`kiln.console.Output`)."""

    exit_code = EXIT_NOT_REPORTED
    label = "output not written"
