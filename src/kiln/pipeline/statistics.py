"""Per-channel pixel statistics of a split, merged exactly in any order.

Each image contributes its pixel count and per-channel integer sums of
values and of squared values (`PixelSums`); a `Summary` adds those up per
split: integer addition is exact and associative, so the totals are the
same whatever order Beam merges accumulators in (which depends on bundling
and the number of workers), and ``kiln.json`` stays byte-identical. Only
`channel_statistics` divides, once, in exact rational arithmetic::

    mean = sum / count
    M2   = squares - sum**2 / count        (= sum((x - mean)**2))
    std  = sqrt(M2 / count)

so the floats written out are the correctly rounded mean and the square
root of the exact variance. (Merging (count, mean, M2) accumulators with
Chan et al.'s update gives the same numbers in rationals, at a cost of
dozens of `Fraction` operations per image on the bundle's thread.)

The standard deviation is the population one (``sqrt(M2 / count)``), as
`np.std` computes, on the 0..255 scale of the stored uint8 pixels.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from typing import NamedTuple

import apache_beam as beam
import cv2
import numpy as np

from kiln.pipeline import versioning
from kiln.pipeline.box_convention import BoxEvidence
from kiln.schemas import ChannelStatistics, ClassObjects, ObjectStatistics
from kiln.schemas.metadata import OBJECT_SIZE_EDGES


class PixelSums(NamedTuple):
    """Exact sufficient statistics of one image's pixels, per channel."""

    pixels: int  # height * width (not `count`: that is tuple.count)
    sums: tuple[int, ...]  # sum of values, per channel
    squares: tuple[int, ...]  # sum of squared values, per channel


_VALUES = np.arange(256, dtype=np.int64)
_SQUARES = _VALUES * _VALUES
# cv2.calcHist counts in float32, exact up to 2**24 per bin.
_EXACT_HISTOGRAM_PIXELS = 1 << 24


def pixel_sums(image: np.ndarray) -> PixelSums:
    """`PixelSums` of a uint8 ``HxWxC`` image, exact.

    Computed from each channel's 256-bin histogram (sum = counts . values,
    squares = counts . values**2, in int64). OpenCV's histogram counts the
    uint8 values in one pass, where NumPy's axis reductions first widen the
    whole image to a larger dtype, and this runs once per image in the
    job's hot loop. (OpenCV's own `sumElems` is not exact, so it is not used.)
    """
    height, width, channels = image.shape
    if height * width < _EXACT_HISTOGRAM_PIXELS:
        image = np.ascontiguousarray(image)
        counts = [
            cv2.calcHist([image], [c], None, [256], [0, 256]).ravel().astype(np.int64)
            for c in range(channels)
        ]
    else:
        counts = [np.bincount(image[..., c].ravel(), minlength=256) for c in range(channels)]
    return PixelSums(
        pixels=int(height * width),
        sums=tuple(int(h @ _VALUES) for h in counts),
        squares=tuple(int(h @ _SQUARES) for h in counts),
    )


def merge(a: PixelSums, b: PixelSums) -> PixelSums:
    """The sums of two sets of pixels together (plain tuples too: coders
    may turn accumulators into tuples between bundles)."""
    count_a, sums_a, squares_a = a
    count_b, sums_b, squares_b = b
    if count_a == 0:
        return PixelSums(count_b, tuple(sums_b), tuple(squares_b))
    if count_b == 0:
        return PixelSums(count_a, tuple(sums_a), tuple(squares_a))
    if len(sums_a) != len(sums_b):
        raise ValueError(
            f"cannot merge statistics of {len(sums_a)}- and {len(sums_b)}-channel images"
        )
    return PixelSums(
        count_a + count_b,
        tuple(x + y for x, y in zip(sums_a, sums_b, strict=True)),
        tuple(x + y for x, y in zip(squares_a, squares_b, strict=True)),
    )


EMPTY = PixelSums(0, (), ())


def channel_statistics(sums: PixelSums) -> ChannelStatistics | None:
    """Count, mean and std per channel from exact sums (None for no pixels)."""
    count, totals, squares = sums
    if count == 0:
        return None
    mean = [Fraction(s, count) for s in totals]
    m2 = [Fraction(q) - Fraction(s * s, count) for s, q in zip(totals, squares, strict=True)]
    return ChannelStatistics(
        count=count,
        mean=[float(m) for m in mean],
        std=[math.sqrt(v / count) for v in m2],
    )


class TargetCounts(NamedTuple):
    """What the job counts about one stored image's targets.

    Attributes:
      image_classes: The distinct class ids the image carries (its label,
        labels, objects' classes and the classes its semantic mask shows),
        ascending: `Summary.class_counts` counts the image once for each.
      has_objects: The dataset has boxes (count `objects` and `dropped`).
      objects: ``(class id, size)`` per stored object; size = sqrt(box area)
        in stored pixels.
      dropped: ``(reason, count)``: objects removed while the image was kept.
      dropped_objects: Those objects, ``(index in the listed objects,
        reason, message)`` by index: what ``dropped_objects.jsonl`` reports.
    """

    image_classes: tuple[int, ...]
    has_objects: bool
    objects: tuple[tuple[int, float], ...]
    dropped: tuple[tuple[str, int], ...]
    dropped_objects: tuple[tuple[int, str, str], ...] = ()


class ObjectSums:
    """Exact, mergeable statistics of the objects of one split.

    Per class id: the object count, the smallest and largest size, the sum
    of sizes as an exact `Fraction` (every float is a dyadic rational, so
    the sum does not depend on the order of additions) and a histogram over
    `OBJECT_SIZE_EDGES`. A size is sqrt(box area) in stored pixels, rounded
    to a millionth of a pixel.
    """

    __slots__ = ("classes", "images_without_objects", "dropped", "most_objects")

    def __init__(self, classes=None, images_without_objects=0, dropped=None, most_objects=0):
        # class id -> [count, min, max, Fraction sum, [bucket counts]]
        self.classes: dict[int, list] = {
            int(c): [v[0], v[1], v[2], Fraction(v[3]), list(v[4])]
            for c, v in (classes or {}).items()
        }
        self.images_without_objects = int(images_without_objects)
        self.dropped: dict[str, int] = dict(dropped or {})
        # The most objects one stored image has.
        self.most_objects = int(most_objects)

    def __reduce__(self):
        return ObjectSums, (
            self.classes,
            self.images_without_objects,
            self.dropped,
            self.most_objects,
        )

    def __eq__(self, other):
        return isinstance(other, ObjectSums) and self.__reduce__() == other.__reduce__()

    def add(self, objects, dropped) -> None:
        """One stored image: ``objects`` ``[(class id, size), ...]``, ``dropped``
        ``[(reason, count), ...]`` (objects removed, the image kept)."""
        if not objects:
            self.images_without_objects += 1
        self.most_objects = max(self.most_objects, len(objects))
        for class_id, size in objects:
            # To a millionth of a pixel: a transform's float scale leaves a
            # 32-pixel box 31.999999999999996 wide, which would count in the
            # 16-32 bucket while its size shows as 32.0.
            size = round(float(size), 6)
            bucket = _size_bucket(size)
            entry = self.classes.get(class_id)
            if entry is None:
                histogram = [0] * len(OBJECT_SIZE_EDGES)
                histogram[bucket] = 1
                self.classes[class_id] = [1, size, size, Fraction(size), histogram]
                continue
            entry[0] += 1
            entry[1] = min(entry[1], size)
            entry[2] = max(entry[2], size)
            entry[3] += Fraction(size)
            entry[4][bucket] += 1
        for reason, count in dropped:
            self.dropped[reason] = self.dropped.get(reason, 0) + int(count)

    def merged(self, other: ObjectSums) -> ObjectSums:
        result = ObjectSums(
            self.classes, self.images_without_objects, self.dropped, self.most_objects
        )
        result.most_objects = max(result.most_objects, other.most_objects)
        for class_id, (count, low, high, total, histogram) in other.classes.items():
            entry = result.classes.get(class_id)
            if entry is None:
                result.classes[class_id] = [count, low, high, Fraction(total), list(histogram)]
                continue
            entry[0] += count
            entry[1] = min(entry[1], low)
            entry[2] = max(entry[2], high)
            entry[3] += total
            entry[4] = [a + b for a, b in zip(entry[4], histogram, strict=True)]
        result.images_without_objects += other.images_without_objects
        for reason, count in other.dropped.items():
            result.dropped[reason] = result.dropped.get(reason, 0) + count
        return result

    def statistics(self) -> ObjectStatistics:
        """The split's `ObjectStatistics`, classes keyed by their id as text
        (the launcher names them)."""
        return ObjectStatistics(
            classes={
                str(class_id): ClassObjects(
                    count=count,
                    size_min=low,
                    size_max=high,
                    size_mean=float(total / count),
                    size_histogram=list(histogram),
                )
                for class_id, (count, low, high, total, histogram) in sorted(self.classes.items())
            },
            images_without_objects=self.images_without_objects,
            dropped=dict(sorted(self.dropped.items())),
            most_objects=self.most_objects,
        )


def _size_bucket(size: float) -> int:
    bucket = 0
    for index, edge in enumerate(OBJECT_SIZE_EDGES):
        if size >= edge:
            bucket = index
    return bucket


class Summary:
    """Everything the job counts about the files it read, mergeable in any order.

    One `ProcessImagesFn` bundle fills one (`add`, per file, on the bundle's
    thread), emits it when the bundle finishes, and `SummaryCombineFn`
    merges the few partial summaries: per image this costs a few dict
    updates, not a pass through several Beam steps per statistic. Every
    field merges exactly (integer sums, counts, a set), so the result does
    not depend on bundling or the number of workers.

    Attributes:
      pixels: ``{split: PixelSums}`` of the stored images.
      class_counts: ``{(split, label id): count}``.
      sizes: The distinct stored ``(height, width)``; at most two are kept
        (enough to tell whether every image has one size).
      smallest: ``(least height, least width)`` of the stored images (of
        two images, maybe), or None before any: what a fixed crop must fit
        in when the sizes vary.
      inputs_hash: The multiset hash of every file's version entry, stored
        or dropped (`versioning.combine_hashes`).
      files: How many files were read, stored or dropped: with the rows
        dropped while listing, this must add up to the listing.
      objects: ``{split: ObjectSums}`` of datasets with boxes.
      images: ``{split: stored images}``.
      unclassed: ``{split: stored images that carry no class}`` (with
        targets and no ``label``: no labels, objects or mask classes).
      boxes: What the boxes of the files decoded say about their
        convention (`kiln.pipeline.box_convention`), datasets with boxes.
    """

    __slots__ = (
        "pixels",
        "class_counts",
        "sizes",
        "smallest",
        "inputs_hash",
        "files",
        "objects",
        "images",
        "boxes",
        "unclassed",
    )

    def __init__(
        self,
        pixels=None,
        class_counts=None,
        sizes=frozenset(),
        inputs_hash=0,
        files=0,
        objects=None,
        images=None,
        boxes=(),
        unclassed=None,
        smallest=None,
    ):
        self.pixels: dict[str, PixelSums] = dict(pixels or {})
        self.class_counts: dict[tuple[str, int], int] = dict(class_counts or {})
        self.sizes: frozenset = frozenset(sizes)
        self.inputs_hash: int = int(inputs_hash)
        self.files: int = int(files)
        self.objects: dict[str, ObjectSums] = dict(objects or {})
        self.images: dict[str, int] = dict(images or {})
        self.boxes = BoxEvidence(*boxes)
        self.unclassed: dict[str, int] = dict(unclassed or {})
        self.smallest: tuple[int, int] | None = None if smallest is None else tuple(smallest)

    def __reduce__(self):  # plain data when Beam pickles accumulators
        return Summary, (
            self.pixels,
            self.class_counts,
            self.sizes,
            self.inputs_hash,
            self.files,
            self.objects,
            self.images,
            tuple(self.boxes),
            self.unclassed,
            self.smallest,
        )

    def __eq__(self, other):
        return isinstance(other, Summary) and self.__reduce__() == other.__reduce__()

    def add(self, entry_hash: int, image=None, boxes: BoxEvidence | None = None) -> None:
        """Counts one file read: its version entry, and the stored image if any.

        Args:
          entry_hash: `versioning.entry_hash` of the file's entry.
          image: An `images.ProcessedImage` with its split set, or None
            (the file was dropped).
          boxes: What its listed boxes say about their convention, if it
            was decoded (stored or dropped after decoding).
        """
        self.inputs_hash = versioning.combine_hashes((self.inputs_hash, entry_hash))
        self.files += 1
        if boxes is not None:
            self.boxes = self.boxes.merged(boxes)
        if image is None:
            return
        split = image.split
        self.images[split] = self.images.get(split, 0) + 1
        self.pixels[split] = merge(self.pixels.get(split, EMPTY), image.pixel_sums)
        # A classification image counts for its label; an image with targets
        # for each class it carries (label, labels, objects).
        counted = (image.label,) if image.targets is None else image.targets.image_classes
        for label in counted:
            key = (split, label)
            self.class_counts[key] = self.class_counts.get(key, 0) + 1
        if not counted:
            self.unclassed[split] = self.unclassed.get(split, 0) + 1
        if image.targets is not None and image.targets.has_objects:
            sums = self.objects.setdefault(split, ObjectSums())
            sums.add(image.targets.objects, image.targets.dropped)
        size = (image.height, image.width)
        if size not in self.sizes:
            self.sizes = _two_smallest(self.sizes | {size})
        self.smallest = _least(self.smallest, size)

    def merged(self, other: Summary) -> Summary:
        pixels = dict(self.pixels)
        for split, sums in other.pixels.items():
            pixels[split] = merge(pixels.get(split, EMPTY), sums)
        class_counts = dict(self.class_counts)
        for key, count in other.class_counts.items():
            class_counts[key] = class_counts.get(key, 0) + count
        objects = dict(self.objects)
        for split, found in other.objects.items():
            objects[split] = (objects[split] if split in objects else ObjectSums()).merged(found)
        images = dict(self.images)
        for split, count in other.images.items():
            images[split] = images.get(split, 0) + count
        unclassed = dict(self.unclassed)
        for split, count in other.unclassed.items():
            unclassed[split] = unclassed.get(split, 0) + count
        return Summary(
            pixels,
            class_counts,
            _two_smallest(self.sizes | other.sizes),
            versioning.combine_hashes((self.inputs_hash, other.inputs_hash)),
            self.files + other.files,
            objects,
            images,
            self.boxes.merged(other.boxes),
            unclassed,
            _least(self.smallest, other.smallest),
        )

    def channel_statistics(self) -> dict[str, ChannelStatistics | None]:
        """``{split: ChannelStatistics}`` (count, mean and std per channel)."""
        return {split: channel_statistics(sums) for split, sums in self.pixels.items()}

    @property
    def image_size(self) -> list[int] | None:
        """[height, width] if every stored image has it, else None."""
        return list(next(iter(self.sizes))) if len(self.sizes) == 1 else None

    @property
    def smallest_size(self) -> list[int] | None:
        """[least height, least width] of the stored images, or None without any."""
        return None if self.smallest is None else list(self.smallest)


def _least(one: tuple[int, int] | None, other: tuple[int, int] | None) -> tuple[int, int] | None:
    """Height and width, each the least of the two (None: no image yet)."""
    if one is None or other is None:
        return one if other is None else other
    return (min(one[0], other[0]), min(one[1], other[1]))


def _two_smallest(sizes: frozenset) -> frozenset:
    # Any two sizes say "more than one"; keeping the smallest two makes the
    # accumulator the same whatever order images and merges come in.
    return frozenset(sorted(sizes)[:2]) if len(sizes) > 2 else sizes


class SummaryCombineFn(beam.CombineFn):
    """Partial `Summary` objects -> their merged `Summary` (empty for no input)."""

    def create_accumulator(self) -> Summary:
        return Summary()

    def add_input(self, accumulator: Summary, element: Summary) -> Summary:
        return accumulator.merged(element)

    def merge_accumulators(self, accumulators: Iterable[Summary]) -> Summary:
        result = Summary()
        for accumulator in accumulators:
            result = result.merged(accumulator)
        return result

    def extract_output(self, accumulator: Summary) -> Summary:
        return accumulator
