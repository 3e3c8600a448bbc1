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

A hash per record cannot balance small classes: each record lands in a split
by its own coin, so 80/10/10 of 300 can give 229/44/27, and a class of 20
anything from 0 to 6 test images. ``stratify: true`` assigns per class
instead, on the launcher, before the job (`stratify_class`, driven by
`listing.Listing.assign_splits`): a file that the previous version (LATEST)
already holds under the same key keeps its split; the class's other files,
in the order of their draws, each go to the split furthest below its share
``fraction * class size``. A fresh build so gives every class and split a
count within one file of its share; later builds keep every known file in
place and steer the new ones to the splits that are short. The trade-off:
the assignment depends on the previous version (it is part of the version:
the assigned split enters each file's version entry), files removed from a
class leave their splits short until new files refill them, and it needs
``split_by: key`` (contents are only hashed inside the job). The job then
takes each file's split from the listing, as with ``from_source``.

Datasets whose images carry sets of classes (``targets`` with ``labels`` or
``boxes`` and no ``label``) are stratified by those sets instead
(`stratify_class_sets`, driven by `listing.Listing.assign_splits_by_class_sets`):
iterative stratification, each image in the stratum of its rarest class.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol


class SplitsSettings(Protocol):
    """What a policy reads of the ``splits`` config (`kiln.pipeline.config.SplitsConfig`,
    not imported: the listing, which the config's sources use, stratifies with this module)."""

    @property
    def from_source(self) -> bool: ...
    @property
    def fractions(self) -> Mapping[str, float] | None: ...
    @property
    def split_by(self) -> str: ...
    @property
    def salt(self) -> str: ...
    @property
    def stratify(self) -> bool: ...


@dataclasses.dataclass(frozen=True)
class SplitPolicy:
    """How records get their split, from the resolved ``splits`` config.

    Attributes:
      fractions: ``((split, fraction), ...)`` sorted by split name, or None
        when splits come from the source.
      split_by: ``"content"`` or ``"key"``.
      salt: Mixed into the hash; change it to draw a different assignment.
      stratify: Splits are assigned per class on the launcher
        (`stratify_class`) and come with each listed file, like splits from
        the source.
    """

    fractions: tuple[tuple[str, float], ...] | None
    split_by: str = "content"
    salt: str = ""
    stratify: bool = False

    @classmethod
    def from_config(cls, splits: SplitsSettings) -> SplitPolicy:
        """The policy of a resolved ``splits`` config (`BuildSpec.config.splits`)."""
        fractions = None
        if not splits.from_source:
            if splits.fractions is None:
                raise ValueError("splits.fractions is unresolved (use BuildSpec.config)")
            fractions = tuple(sorted(splits.fractions.items()))
        return cls(fractions, splits.split_by, splits.salt, splits.stratify)

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
        if self.fractions is None or self.stratify:
            if source_split is None:
                how = "stratify" if self.stratify else "from_source"
                raise ValueError(f"{key}: splits.{how}, but the listing gives no split")
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


def stratify_class(
    fractions: Mapping[str, float],
    previous: Iterable[tuple[int, str | None]],
    kept: Mapping[str, int],
    size: int,
) -> Iterator[tuple[int, str]]:
    """The splits of one class's files, for ``splits.stratify``.

    Args:
      fractions: Split name -> fraction (summing to 1).
      previous: ``(position, previous split)`` of each of the class's files in
        the order of their draws (`SplitPolicy.draw`, then key), the previous
        split None for a file the previous version does not hold (or holds
        in a split that is no longer configured).
      kept: How many of the class's files keep each split (their previous
        split), as counted over `previous`.
      size: The class's number of files.

    Yields:
      ``(position, split)`` for every file: a known file keeps its split; a
      new one goes to the split with the largest shortfall ``fraction * size
      - files so far`` (ties: the first in name order), so a class without
      previous files ends within one file of every share.
    """
    names = sorted(fractions)
    counts = {name: kept.get(name, 0) for name in names}
    for position, split in previous:
        if split is None or split not in counts:
            # max() keeps the first of equal keys: ties go to the first name.
            split = max(names, key=lambda name: fractions[name] * size - counts[name])
            counts[split] += 1
        yield position, split


# The stratum of files that carry no class (`stratify_class_sets`).
NO_CLASS = -1


def class_set_order(sizes: Mapping[int, int]) -> dict[int, int]:
    """Class id -> its rank in `stratify_class_sets`' order: the rarest first
    (ties: the lower id), `NO_CLASS` last."""
    ranked = sorted((c for c in sizes if c != NO_CLASS), key=lambda c: (sizes[c], c))
    order = {class_id: rank for rank, class_id in enumerate(ranked)}
    if NO_CLASS in sizes:
        order[NO_CLASS] = len(ranked)
    return order


def key_class(classes: Iterable[int], order: Mapping[int, int]) -> int:
    """The class a file is stratified by: its rarest (`class_set_order`), or
    `NO_CLASS` for a file that carries none."""
    return min(classes, key=order.__getitem__, default=NO_CLASS)


def stratify_class_sets(
    fractions: Mapping[str, float],
    files: Iterable[tuple[int, tuple[int, ...], str | None]],
    sizes: Mapping[int, int],
    kept: Mapping[int, Mapping[str, int]],
    kept_files: Mapping[str, int],
    total: int,
) -> Iterator[tuple[int, str]]:
    """The splits of files that each carry a set of classes (multi-label
    ``labels``, or the classes of an image's objects), for ``splits.stratify``.

    Iterative stratification (Sechidis, Tsoumakas and Vlahavas, 2011) in one
    pass: each file is stratified by its rarest class, the rarest classes'
    files are assigned first, and a new file goes to the split furthest
    below its share ``fraction * class size`` of that class; ties go to the
    split furthest below its shares of all the file's classes, then of all
    files, then to the first in name order. So the rarest class ends within
    one file of every share in a fresh build, and the others close to
    theirs (a file counts for every class it carries, so they cannot all be
    exact).

    Args:
      fractions: Split name -> fraction (summing to 1).
      files: ``(position, classes, previous split)`` of every file, in the
        order: by `key_class` rank (`class_set_order`), then draw, then key;
        classes ``(NO_CLASS,)`` for a file without any; the previous split
        None for a file the previous version does not hold (or holds in a
        split that is no longer configured).
      sizes: Class id -> files carrying it (`NO_CLASS`: files without any).
      kept: Class id -> split -> files carrying it that keep that split.
      kept_files: Split -> files that keep it.
      total: The number of files.

    Yields:
      ``(position, split)`` for every file: a known file keeps its split.
    """
    names = sorted(fractions)
    counts = {c: {name: kept.get(c, {}).get(name, 0) for name in names} for c in sizes}
    totals = {name: kept_files.get(name, 0) for name in names}
    order = class_set_order(sizes)
    for position, classes, split in files:
        if split is None or split not in totals:
            stratum = key_class(classes, order)
            chosen, best = names[0], None
            for name in names:  # a strictly larger shortfall wins: ties go to the first name
                fraction = fractions[name]
                shortfall = (
                    fraction * sizes[stratum] - counts[stratum][name],
                    sum(fraction * sizes[c] - counts[c][name] for c in classes),
                    fraction * total - totals[name],
                )
                if best is None or shortfall > best:
                    chosen, best = name, shortfall
            split = chosen
            for c in classes:
                counts[c][split] += 1
            totals[split] += 1
        yield position, split
