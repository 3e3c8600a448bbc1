"""Per-channel pixel statistics of a split, merged exactly in any order.

Each image contributes its pixel count and per-channel integer sums of
values and of squared values (`PixelSums`, exact). `ChannelMomentsCombineFn`
turns those into (count, mean, M2) accumulators and merges them with Chan et
al.'s parallel update::

    delta = mean_b - mean_a
    mean  = mean_a + delta * n_b / n
    M2    = M2_a + M2_b + delta**2 * n_a * n_b / n

The accumulators hold `fractions.Fraction`, not floats. Beam merges
accumulators in an order that depends on bundling and the number of workers;
float merges would differ in the last bits from run to run and `kiln.json`
would not be byte-identical. Rational arithmetic makes every merge exact, so
the result is the same whatever the order, and the floats written out are
the correctly rounded mean and standard deviation. Denominators stay at most
the pixel count, so this is cheap (one merge per image per channel).

The standard deviation is the population one (``sqrt(M2 / count)``), as
`np.std` computes, on the 0..255 scale of the stored uint8 pixels.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Iterable, NamedTuple

import apache_beam as beam
import cv2
import numpy as np

from kiln.schemas import ChannelStatistics


class PixelSums(NamedTuple):
    """Exact sufficient statistics of one image's pixels, per channel."""

    count: int                 # pixels (height * width)
    sums: tuple[int, ...]      # sum of values, per channel
    squares: tuple[int, ...]   # sum of squared values, per channel


_VALUES = np.arange(256, dtype=np.int64)
_SQUARES = _VALUES * _VALUES
# cv2.calcHist counts in float32, exact up to 2**24 per bin.
_EXACT_HISTOGRAM_PIXELS = 1 << 24


def pixel_sums(image: np.ndarray) -> PixelSums:
    """`PixelSums` of a uint8 ``HxWxC`` image, exact.

    Computed from each channel's 256-bin histogram (sum = counts . values,
    squares = counts . values**2, in int64). OpenCV's histogram is about
    fifteen times faster than NumPy's axis reductions with a widened dtype,
    and this runs once per image in the job's hot loop. (OpenCV's own
    `sumElems` is not exact: it was measured off by one.)
    """
    height, width, channels = image.shape
    if height * width < _EXACT_HISTOGRAM_PIXELS:
        image = np.ascontiguousarray(image)
        counts = [cv2.calcHist([image], [c], None, [256], [0, 256]).ravel().astype(np.int64)
                  for c in range(channels)]
    else:
        counts = [np.bincount(image[..., c].ravel(), minlength=256) for c in range(channels)]
    return PixelSums(
        count=int(height * width),
        sums=tuple(int(h @ _VALUES) for h in counts),
        squares=tuple(int(h @ _SQUARES) for h in counts),
    )


class Moments(NamedTuple):
    """A (count, mean, M2) accumulator in exact rational arithmetic."""

    count: int
    mean: tuple[Fraction, ...]
    m2: tuple[Fraction, ...]


def moments_of(sums: PixelSums) -> Moments:
    n = sums.count
    mean = tuple(Fraction(s, n) for s in sums.sums)
    # M2 = sum((x - mean)^2) = sum(x^2) - sum(x)^2 / n, exact in rationals.
    m2 = tuple(Fraction(q) - Fraction(s * s, n) for s, q in zip(sums.sums, sums.squares))
    return Moments(n, mean, m2)


def merge(a: Moments, b: Moments) -> Moments:
    """Chan et al.'s parallel merge of two accumulators."""
    if a.count == 0:
        return b
    if b.count == 0:
        return a
    if len(a.mean) != len(b.mean):
        raise ValueError(
            f"cannot merge statistics of {len(a.mean)}- and {len(b.mean)}-channel images"
        )
    n = a.count + b.count
    mean, m2 = [], []
    for mean_a, mean_b, m2_a, m2_b in zip(a.mean, b.mean, a.m2, b.m2):
        delta = mean_b - mean_a
        mean.append(mean_a + delta * b.count / n)
        m2.append(m2_a + m2_b + delta * delta * a.count * b.count / n)
    return Moments(n, tuple(mean), tuple(m2))


EMPTY = Moments(0, (), ())


class ChannelMomentsCombineFn(beam.CombineFn):
    """PixelSums -> `ChannelStatistics` (count, mean and std per channel).

    Mergeable, exact and order-independent: see the module docstring.
    Returns None for no input.
    """

    def create_accumulator(self) -> Moments:
        return EMPTY

    def add_input(self, accumulator: Moments, element: PixelSums) -> Moments:
        return merge(accumulator, moments_of(PixelSums(*element)))

    def merge_accumulators(self, accumulators: Iterable[Moments]) -> Moments:
        result = EMPTY
        for accumulator in accumulators:
            result = merge(result, Moments(*accumulator))
        return result

    def extract_output(self, accumulator: Moments) -> ChannelStatistics | None:
        accumulator = Moments(*accumulator)
        if accumulator.count == 0:
            return None
        return ChannelStatistics(
            count=accumulator.count,
            mean=[float(m) for m in accumulator.mean],
            std=[math.sqrt(m2 / accumulator.count) for m2 in accumulator.m2],
        )


class CommonSizeCombineFn(beam.CombineFn):
    """(height, width) -> that size if every image has it, else None.

    Keeps at most two distinct sizes, so memory stays constant.
    """

    def create_accumulator(self) -> frozenset:
        return frozenset()

    def add_input(self, accumulator: frozenset, size) -> frozenset:
        if len(accumulator) > 1:
            return accumulator
        return accumulator | {tuple(size)}

    def merge_accumulators(self, accumulators) -> frozenset:
        result: frozenset = frozenset()
        for accumulator in accumulators:
            result = result | accumulator
            if len(result) > 1:
                return frozenset(sorted(result)[:2])
        return result

    def extract_output(self, accumulator: frozenset) -> list[int] | None:
        return list(next(iter(accumulator))) if len(accumulator) == 1 else None


class DuplicatesCombineFn(beam.CombineFn):
    """Splits of the records sharing one content hash -> (copies, splits).

    Used per sha256: ``copies`` is how many records have that content and
    ``splits`` the sorted splits they landed in.
    """

    def create_accumulator(self):
        return 0, frozenset()

    def add_input(self, accumulator, split):
        count, splits = accumulator
        return count + 1, splits | {split}

    def merge_accumulators(self, accumulators):
        count, splits = 0, frozenset()
        for c, s in accumulators:
            count, splits = count + c, splits | s
        return count, splits

    def extract_output(self, accumulator):
        count, splits = accumulator
        return count, sorted(splits)


def _duplicate_counts(copies_and_splits):
    copies, splits = copies_and_splits
    # Extra copies beyond the first; and whether they span splits (leakage).
    return copies - 1, (copies - 1) if len(splits) > 1 else 0


class ComputeStatistics(beam.PTransform):
    """What `kiln.json` says about the stored images, per split.

    Input: PCollection of records with ``split``, ``label``, ``sha256``,
    ``height``, ``width`` and ``pixel_sums`` fields (`images.ProcessedImage`
    after split assignment).

    Output: a dict of PCollections:
      ``channels``: (split, ChannelStatistics), one per non-empty split.
      ``class_counts``: ((split, label id), count).
      ``duplicates``: a single (extra copies, extra copies in another split)
        pair: records whose content equals an earlier record's.
      ``image_size``: a single [height, width] if every image has it, else None.
    """

    def expand(self, records):
        channels = (
            records
            | "PixelSumsBySplit" >> beam.Map(lambda r: (r.split, r.pixel_sums))
            # (split, PixelSums)
            | "CombineChannelMoments" >> beam.CombinePerKey(ChannelMomentsCombineFn())
            # (split, ChannelStatistics)
        )
        class_counts = (
            records
            | "SplitAndLabel" >> beam.Map(lambda r: ((r.split, r.label), 1))
            | "CountPerClass" >> beam.CombinePerKey(sum)
            # ((split, label), count)
        )
        duplicates = (
            records
            | "SplitByContent" >> beam.Map(lambda r: (r.sha256, r.split))
            # (sha256, split)
            | "GatherCopies" >> beam.CombinePerKey(DuplicatesCombineFn())
            # (sha256, (copies, [split]))
            | "ExtraCopies" >> beam.Map(lambda kv: _duplicate_counts(kv[1]))
            # (extra copies, extra copies across splits)
            | "SumDuplicates" >> beam.CombineGlobally(beam.combiners.TupleCombineFn(sum, sum))
            # (duplicates, duplicates across splits)
        )
        image_size = (
            records
            | "ImageSizes" >> beam.Map(lambda r: (r.height, r.width))
            | "CommonSize" >> beam.CombineGlobally(CommonSizeCombineFn())
            # [height, width] or None
        )
        return {
            "channels": channels,
            "class_counts": class_counts,
            "duplicates": duplicates,
            "image_size": image_size,
        }
