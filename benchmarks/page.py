"""BENCHMARKS.md in sections: a benchmark that runs alone rewrites only its own section."""

from __future__ import annotations

import json
import os
import re
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _section(title: str) -> re.Pattern[str]:
    """A section: its heading line (starting with `title`) up to the next ``## `` heading."""
    return re.compile(rf"^{re.escape(title)}.*?(?=^## |\Z)", re.S | re.M)


def find_section(page: str, title: str) -> str | None:
    """The section of `page` whose heading starts with `title`, if any."""
    match = _section(title).search(page)
    return match.group(0) if match else None


def replace_section(page: str, title: str, section: str, after: str | None = None) -> str:
    """`page` with the section headed `title` replaced by `section`; where it
    has none, `section` goes right after the section headed `after` (if
    given and present), else at the end."""
    own = _section(title)
    if own.search(page):
        return own.sub(lambda _: section, page, count=1)
    match = _section(after).search(page) if after else None
    if match:
        rest = page[match.end() :]
        # One blank line between sections, however many the section found
        # elsewhere ends with (each regeneration used to add one).
        return (
            page[: match.end()].rstrip("\n")
            + "\n\n"
            + section.rstrip("\n")
            + ("\n\n" + rest if rest else "\n")
        )
    return page.rstrip("\n") + "\n\n" + section


def markdown_path(given: str | None, out: str, quick: bool) -> str:
    """Where a benchmark writes its section: `given`, else OUT/BENCHMARKS.md
    for a quick run (a harness check must not touch the committed page),
    else the repository's BENCHMARKS.md."""
    if given:
        return given
    return os.path.join(out, "BENCHMARKS.md") if quick else os.path.join(ROOT, "BENCHMARKS.md")


def write_section(
    results: Any,
    json_path: str,
    markdown: str,
    title: str,
    section: str,
    after: str | None = None,
) -> None:
    """Writes `results` to `json_path` and `section` into the page at `markdown`."""
    os.makedirs(os.path.dirname(json_path), exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(results, f, indent=2)
    page = ""
    if os.path.exists(markdown):
        with open(markdown) as f:
            page = f.read()
    with open(markdown, "w") as f:
        f.write(replace_section(page, title, section, after))
