"""Split assignment: from the source, or from fractions by a salted hash.

With fractions, each record draws ``u = hash(salt, value)`` uniformly in
[0, 1) and takes the split whose cumulative range holds it, the splits taken
in sorted name order (YAML mapping order is not part of the config's
fingerprint, so it must not change the result). The hashed value is the
content sha256 (``split_by: content``, the default: identical files always
land in the same split, so duplicates cannot leak from train into test) or
the record's key (``split_by: key``). The assignment depends on nothing but
the record, so it is the same on every runner and worker, and adding files
does not move the others.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiln.pipeline.config import SplitsConfig


@dataclasses.dataclass(frozen=True)
class SplitPolicy:
    """How records get their split, from the resolved ``splits`` config.

    Attributes:
      fractions: ``((split, fraction), ...)`` sorted by split name, or None
        when splits come from the source.
      split_by: ``"content"`` or ``"key"``.
      salt: Mixed into the hash; change it to draw a different assignment.
    """

    fractions: tuple[tuple[str, float], ...] | None
    split_by: str = "content"
    salt: str = ""

    @classmethod
    def from_config(cls, splits: SplitsConfig) -> SplitPolicy:
        """The policy of a resolved ``splits`` config (`BuildSpec.config.splits`)."""
        fractions = None
        if not splits.from_source:
            if splits.fractions is None:
                raise ValueError("splits.fractions is unresolved (use BuildSpec.config)")
            fractions = tuple(sorted(splits.fractions.items()))
        return cls(fractions, splits.split_by, splits.salt)

    @property
    def split_names(self) -> list[str] | None:
        return [name for name, _ in self.fractions] if self.fractions is not None else None

    def draw(self, key: str, sha256: str) -> float:
        """The record's uniform draw in [0, 1)."""
        value = sha256 if self.split_by == "content" else key
        digest = hashlib.sha256(f"{self.salt}\x00{value}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2.0**64

    def assign(self, key: str, sha256: str, source_split: str | None) -> str:
        """The split of one record.

        Raises:
          ValueError: splits come from the source and the record has none
            (the listing drops such files before the job), or no fraction is
            above 0 (the config refuses that: they sum to 1).
        """
        if self.fractions is None:
            if source_split is None:
                raise ValueError(f"{key}: splits.from_source, but the source gives no split")
            return source_split
        u = self.draw(key, sha256)
        upper = 0.0
        chosen = None
        for name, fraction in self.fractions:
            upper += fraction
            if fraction > 0:
                chosen = name
                if u < upper:
                    return name
        # Rounding can leave the top of [0, 1) above the last bound: it
        # belongs to the last split with a non-zero fraction.
        if chosen is None:
            raise ValueError(f"{key}: no split has a fraction above 0")
        return chosen
