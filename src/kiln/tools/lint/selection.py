"""Which codes a run reports: ``--select`` and ``--ignore`` by code prefix, flake8 style."""

from __future__ import annotations

from collections.abc import Iterable

from kiln.tools.lint.rules import RULES, SYNTAX_ERROR_CODE


class CodeFilter:
    """`select` / `ignore` by code prefix. K000 is never filtered.

    Raises:
      ValueError: from the constructor, if a prefix matches no rule's code, or
        `select` is given but names no code.
    """

    def __init__(self, select: Iterable[str] | None, ignore: Iterable[str] | None):
        self.select = self._validated(select, "select")
        self.ignore = self._validated(ignore, "ignore") or ()

    @staticmethod
    def _validated(codes: Iterable[str] | None, what: str) -> tuple[str, ...] | None:
        if codes is None:
            return None
        cleaned = tuple(c.strip().upper() for c in codes if c.strip())
        if what == "select" and not cleaned:
            # `--select "$CODES"` with an empty variable would report nothing and
            # pass in CI: an empty selection is a mistake, not "no codes".
            raise ValueError(
                f"{what}: no code given (known: {', '.join(sorted(RULES))}); "
                f"leave it out to report every code"
            )
        for prefix in cleaned:
            if not any(code.startswith(prefix) for code in RULES):
                raise ValueError(
                    f"{what}: unknown code {prefix!r} (known: {', '.join(sorted(RULES))})"
                )
        return cleaned

    def wants(self, code: str) -> bool:
        if code == SYNTAX_ERROR_CODE:
            return True
        if self.select is not None and not any(code.startswith(p) for p in self.select):
            return False
        return not any(code.startswith(p) for p in self.ignore)
