"""``# kiln: noqa`` comments: which lines of a source silence which codes."""

from __future__ import annotations

import ast
import io
import re
import tokenize

from kiln.tools.lint.rules import Finding

_NOQA = re.compile(r"#\s*kiln:\s*noqa\b(?:\s*\[\s*(?P<codes>[A-Za-z0-9,\s]*)\])?", re.IGNORECASE)


class NoqaComments:
    """The ``# kiln: noqa`` and ``# kiln: noqa[K101,K103]`` comments of one source.

    Only real comments count, not text in strings: the source is tokenized. A
    finding is silenced by a comment on its own line, or, given the parsed
    `tree`, by one on the first line of the statement it is in when that
    statement spreads over several lines (a call whose arguments are on the
    next lines, say): the documented place for the comment, whichever of the
    statement's lines the finding names. For a compound statement (`if`,
    `while`, `def`...) that covers its header, not its body.
    """

    def __init__(self, source: str, tree: ast.Module | None = None):
        # Line -> the codes silenced there; None: every code.
        self._silenced: dict[int, frozenset[str] | None] = {}
        try:
            for token in tokenize.generate_tokens(io.StringIO(source).readline):
                if token.type == tokenize.COMMENT:
                    self._read(token)
        except (tokenize.TokenError, SyntaxError):
            pass  # the source parsed, so this cannot happen short of a tokenizer bug
        if tree is not None and self._silenced:  # most files have no such comment
            self._extend_to_statements(tree)

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
            # `[K101,K103]`, and `[K101 K103]` as people also write it.
            named = frozenset(c.upper() for c in codes.replace(",", " ").split())
            self._silenced[line] = already | named

    def _extend_to_statements(self, tree: ast.Module) -> None:
        """Applies a comment on a statement's first line to the statement's other lines."""
        by_first_line = dict(self._silenced)
        for node in ast.walk(tree):
            if not isinstance(node, ast.stmt) or node.lineno not in by_first_line:
                continue
            codes = by_first_line[node.lineno]
            for line in range(node.lineno + 1, _header_end(node) + 1):
                already = self._silenced.get(line, frozenset())
                if already is None or codes is None:
                    self._silenced[line] = None
                else:
                    self._silenced[line] = already | codes

    def silences(self, finding: Finding) -> bool:
        if finding.line not in self._silenced:
            return False
        codes = self._silenced[finding.line]
        return codes is None or finding.code in codes


def _header_end(statement: ast.stmt) -> int:
    """The last line of a simple statement, or of a compound statement's header."""
    body = getattr(statement, "body", None)
    if isinstance(body, list) and body:
        first_inner = body[0].lineno
    elif isinstance(statement, ast.Match) and statement.cases:
        first_inner = statement.cases[0].pattern.lineno  # a match_case has no lineno
    else:
        return statement.end_lineno or statement.lineno
    return max(statement.lineno, first_inner - 1)
