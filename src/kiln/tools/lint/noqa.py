"""``# kiln: noqa`` comments: which lines of a source silence which codes."""

from __future__ import annotations

import io
import re
import tokenize

from kiln.tools.lint.rules import Finding

_NOQA = re.compile(r"#\s*kiln:\s*noqa\b(?:\s*\[\s*(?P<codes>[A-Za-z0-9,\s]*)\])?", re.IGNORECASE)


class NoqaComments:
    """The ``# kiln: noqa`` and ``# kiln: noqa[K101,K103]`` comments of one source.

    Only real comments count, not text in strings: the source is tokenized. A
    finding is silenced by a comment on its own line (the first line of a
    statement spread over several).
    """

    def __init__(self, source: str):
        # Line -> the codes silenced there; None: every code.
        self._silenced: dict[int, frozenset[str] | None] = {}
        try:
            for token in tokenize.generate_tokens(io.StringIO(source).readline):
                if token.type == tokenize.COMMENT:
                    self._read(token)
        except (tokenize.TokenError, SyntaxError):
            pass  # the source parsed, so this cannot happen short of a tokenizer bug

    def _read(self, comment: tokenize.TokenInfo) -> None:
        match = _NOQA.search(comment.string)
        if not match:
            return
        codes = match.group("codes")
        line = comment.start[0]
        if codes is None:
            self._silenced[line] = None
            return
        already = self._silenced.get(line, frozenset())
        if already is not None:  # else a bare noqa on this line silences everything
            named = frozenset(c.strip().upper() for c in codes.split(",") if c.strip())
            self._silenced[line] = already | named

    def silences(self, finding: Finding) -> bool:
        if finding.line not in self._silenced:
            return False
        codes = self._silenced[finding.line]
        return codes is None or finding.code in codes
