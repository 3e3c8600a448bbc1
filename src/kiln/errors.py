"""kiln's error base: every error a user can cause carries its exit code.

The command line maps them once (`kiln.cli.main`): the message is printed as
one line, ``kiln <command>: <label>: <message>``, without a traceback, and the
process exits with `KilnError.exit_code`. Library callers catch the classes.

Exit codes (the same for every command, documented in docs/cli.md):

====  ==========================================================================
0     success (built, up to date, verified, no findings)
1     the command ran and found a problem (`Failure`: a failed build, lint
      findings, a dataset that does not verify)
2     usage or configuration error (`UsageError`, `ConfigError`): nothing was done
3     another build of the same dataset holds its lock (`Busy`): nothing was done
130   interrupted (Ctrl-C): one line, no traceback; a build publishes nothing
====  ==========================================================================
"""

from __future__ import annotations

import reprlib
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_BUSY = 3
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT): 128 + the signal's number, as shells report it


# How much of a user's value an error message quotes. A config value can be
# huge (a YAML alias bomb expands a 600-byte file to gigabytes), and a
# message quoting it whole would be as large.
_QUOTE = reprlib.Repr()
_QUOTE.maxstring = 80
_QUOTE.maxother = 80
_QUOTE.maxlist = _QUOTE.maxtuple = _QUOTE.maxdict = _QUOTE.maxset = 6
_QUOTE.maxlevel = 3
MAX_MESSAGE_CHARS = 2000


def quote(value: Any) -> str:
    """`repr(value)` cut to a readable size: what error messages quote of user input."""
    return _QUOTE.repr(value)


def quote_text(text: str, limit: int = 500) -> str:
    """`text` cut to `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


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
    """


class Failure(KilnError):
    """The command ran and failed (a build, a verification): exit 1."""

    label = "failed"


class Busy(KilnError):
    """Another build of the same dataset is running: exit 3, nothing was done."""

    exit_code = EXIT_BUSY
    label = "busy"
