"""Whether a dataset's boxes, taken together, are written in another convention than kiln's.

kiln reads a box as ``[x_min, y_min, x_max, y_max]`` in pixels of the image
file as stored (README, "Coordinates"). Boxes exported in one of three other
common conventions mostly pass the per-box checks (`kiln.pipeline.targets`)
and would make a "successful" build of wrong boxes:

- **normalized** to [0, 1]: every box is a valid sub-pixel box in the
  image's top-left pixel; none is reported.
- **[x, y, width, height]** (COCO's order): a box whose width is less than
  its x reads as ``x_max < x_min`` (a ``bad_box``); the others are silently
  wrong.
- **[y_min, x_min, y_max, x_max]** (TensorFlow's order): on square images
  every box is valid and wrong; on other images the boxes far enough from
  the origin spill out of the image's shorter side (``bad_box``), the others
  are silently wrong.

So the build job counts, per image and from the boxes as listed with the
image's stored size (`count`), the boxes that look like each convention
(`BoxEvidence`, merged exactly like the job's other statistics), and the
launcher asks `verdict` after the job, before anything is published. A
single box proves nothing (a tiny box can legitimately sit in the top-left
pixel, a box can be reversed by mistake), so a finding needs at least
`MIN_EVIDENCE` boxes that fit the other convention and no explanation as
kiln's (`Finding.certain`); fewer, and it is a warning.

Boxes drawn on another frame than the one kiln reads them in look like
the third convention: boxes drawn on a phone photo as viewers show it
(upright) spill out of its stored pixels as transposed boxes would, and
"swap x and y" would store them transposed, not turned. A COCO or VOC file
says which frame it was drawn on in the size it declares, so the job checks
that first (``size_mismatch``, `kiln.pipeline.targets`,
``targets.annotations_frame``): an image it drops is not counted here, and
boxes are counted in the frame the annotations are drawn on.

Two of the conventions show without any image's size: normalized boxes
(inside [0, 1] x [0, 1]) and ``[x, y, width, height]`` (reversed, with a
positive width and height). The launcher counts those as it lists the
source (`count_listed`), before the job reads an image, so a dataset in
either stops before it costs a build (and an unchanged one is not called
up to date); the job's count, with sizes, also finds the third.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

# A box may reach beyond the image by this fraction of the image's width
# (x) or height (y) and is clipped; farther out, it is a bad annotation
# (coordinates of another image, or another convention), not sloppiness.
FAR_OUTSIDE = 0.1
# Boxes that must look like another convention before the build stops.
MIN_EVIDENCE = 10
# Fewer than MIN_EVIDENCE, but at least this many: a warning.
MIN_WARNING = 3
# Boxes lie in [0, 1] x [0, 1] as evidence only on images at least this
# large on their shorter side (there, such a box covers part of one pixel).
MIN_SIDE = 16
# The share of the boxes that must look normalized, or like [x, y, w, h].
NORMALIZED_SHARE = 0.5
XYWH_SHARE = 0.25
# Of the boxes on non-square images that fit one order and not the other,
# the share that must fit [y_min, x_min, y_max, x_max] only: for boxes in
# kiln's order that share is about 0 (only bad boxes fit the transposed
# image alone), for boxes in TensorFlow's about 1.
TRANSPOSED_SHARE = 0.9


class BoxEvidence(NamedTuple):
    """How many of the listed boxes look like each convention (`count`); adds up exactly.

    Attributes:
      boxes: Boxes counted (finite ones).
      normalized: Boxes with a positive area inside [0, 1] x [0, 1], on
        images of at least `MIN_SIDE` pixels a side.
      xywh: Boxes with ``x_max < x_min`` or ``y_max < y_min`` that lie
        inside the image read as ``[x, y, width, height]``.
      transposed: Boxes on non-square images outside the image as read but
        inside it read as ``[y_min, x_min, y_max, x_max]``.
      not_transposed: Boxes on non-square images inside the image as read
        but outside it read as ``[y_min, x_min, y_max, x_max]``.
    """

    boxes: int = 0
    normalized: int = 0
    xywh: int = 0
    transposed: int = 0
    not_transposed: int = 0

    def merged(self, other: BoxEvidence) -> BoxEvidence:
        """Both counts added up (plain tuples too: coders may turn them into tuples)."""
        return BoxEvidence(*(a + b for a, b in zip(self, other, strict=True)))


def lies_inside(box: Sequence[float], height: int, width: int) -> bool:
    """Whether ``[x_min, y_min, x_max, y_max]`` is a box of a ``height x width``
    image: ordered, overlapping the image, and reaching at most `FAR_OUTSIDE`
    of its size beyond it (the part beyond is clipped)."""
    x_min, y_min, x_max, y_max = box
    slack_x, slack_y = FAR_OUTSIDE * width, FAR_OUTSIDE * height
    return (
        x_min <= x_max
        and y_min <= y_max
        and -slack_x <= x_min < width
        and -slack_y <= y_min < height
        and 0 < x_max <= width + slack_x
        and 0 < y_max <= height + slack_y
    )


def count(boxes: Iterable[Sequence[float]], height: int, width: int) -> BoxEvidence:
    """The evidence of one image's listed boxes (``[x_min, y_min, x_max, y_max]``
    as written), on its stored ``height x width`` pixels."""
    found = [0, 0, 0, 0, 0]
    square = height == width
    for box in boxes:
        a, b, c, d = (float(v) for v in box)
        if not all(math.isfinite(v) for v in (a, b, c, d)):
            continue
        found[0] += 1
        if min(height, width) >= MIN_SIDE and 0 <= a < c <= 1 and 0 <= b < d <= 1:
            found[1] += 1
        reversed_ = c < a or d < b
        if reversed_ and c > 0 and d > 0 and lies_inside((a, b, a + c, b + d), height, width):
            found[2] += 1
        if not square:
            as_read = lies_inside((a, b, c, d), height, width)
            transposed = lies_inside((b, a, d, c), height, width)
            found[3] += transposed and not as_read
            found[4] += as_read and not transposed
    return BoxEvidence(*found)


def count_listed(boxes: Iterable[Sequence[float]]) -> BoxEvidence:
    """The evidence of one row's boxes as listed, before its image's size is
    known: `count`'s normalized and ``[x, y, width, height]`` boxes, without
    the image's size to check them against (so a verdict on it needs no
    more evidence: see `verdict`'s `listed`). Run on every listed row, so
    kept to plain arithmetic."""
    total = normalized = xywh = 0
    for a, b, c, d in boxes:
        if not math.isfinite(a + b + c + d):  # NaN or infinite (or beyond 1e308)
            continue
        total += 1
        if 0 <= a < c <= 1 and 0 <= b < d <= 1:
            normalized += 1
        elif (c < a or d < b) and c > 0 and d > 0:
            xywh += 1
    return BoxEvidence(total, normalized, xywh)


@dataclasses.dataclass(frozen=True)
class Finding:
    """Boxes that look like another convention.

    Attributes:
      convention: ``normalized``, ``xywh`` or ``yxyx``.
      message: One line: what was seen and what to change.
      certain: Enough evidence (`MIN_EVIDENCE`) to stop the build.
    """

    convention: str
    message: str
    certain: bool


_EXPECTED = (
    "kiln reads boxes as [x_min, y_min, x_max, y_max] in pixels of the image file as stored "
    "(targets.boxes)"
)


def verdict(evidence: BoxEvidence, *, listed: bool = False) -> Finding | None:
    """What the boxes of a dataset look like, if not kiln's convention (None).

    Args:
      listed: `evidence` is `count_listed`'s, of boxes as listed (no image
        sizes): the messages say so.
    """
    total = evidence.boxes
    if evidence.normalized >= NORMALIZED_SHARE * total:
        where = "in the listed rows" if listed else f"on images of {MIN_SIDE} pixels or more a side"
        return _finding(
            "normalized",
            evidence.normalized,
            f"the boxes look normalized to [0, 1]: {evidence.normalized} of {total} boxes lie "
            f"within [0, 1] x [0, 1] {where}; {_EXPECTED}: "
            f"multiply x by the image's width and y by its height (normalized boxes from "
            f"TensorFlow are [y_min, x_min, y_max, x_max]: swap x and y too)",
        )
    if evidence.xywh >= XYWH_SHARE * total:
        fit = (
            "a positive third and fourth number (a width and a height)"
            if listed
            else "fit their image read as [x, y, width, height]"
        )
        return _finding(
            "xywh",
            evidence.xywh,
            f"the boxes look like [x, y, width, height] (COCO's order): {evidence.xywh} of "
            f"{total} boxes have x_max < x_min or y_max < y_min and {fit}; "
            f"{_EXPECTED}: write [x, y, x + width, y + height], or give "
            f"a COCO instances file as source.type: coco, which converts them",
        )
    decided = evidence.transposed + evidence.not_transposed
    if decided and evidence.transposed >= TRANSPOSED_SHARE * decided:
        return _finding(
            "yxyx",
            evidence.transposed,
            f"the boxes look like [y_min, x_min, y_max, x_max] (TensorFlow's order): "
            f"{evidence.transposed} of {total} boxes lie outside their non-square image but "
            f"inside it read in that order, and {evidence.not_transposed} the other way "
            f"around; {_EXPECTED}: swap x and y",
        )
    return None


def _finding(convention: str, seen: int, message: str) -> Finding | None:
    if seen >= MIN_EVIDENCE:
        return Finding(convention, message, certain=True)
    if seen >= MIN_WARNING:
        return Finding(
            convention, f"{message} (too few boxes to be sure: the build goes on)", certain=False
        )
    return None
