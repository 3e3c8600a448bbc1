"""Contact sheets of stored and augmented images: the library behind `kiln preview`.

`gather` reads the first elements of a split twice through `kiln.reader.load`
itself, never a re-implementation: once without augmentation (the stored
images, as the build wrote them), then once per epoch with augmentation.
Each new iteration of the reader's dataset is a new pass with new element
seeds, exactly as in training; reading the split unshuffled keeps the same
elements in the same columns, so each column shows one element's
augmentation epoch after epoch. (With shuffling, training applies the same
ops with other seeds: positions, and so seeds, change with the order.)

For datasets with targets every cell also shows them (`draw_targets`): the
class mask and each object's instance mask as a translucent overlay in its
class's colour (an instance mask over the class mask where both exist),
boxes with their class names, keypoints as ringed dots, as the reader yields them
for that element and epoch: a box or mask that does not follow its object is
visible at a glance.

`compose` lays the rows out on one uint8 sheet with NumPy; `write_image`
encodes it with TensorFlow (PNG or JPEG, as the file name says). Label
names and row titles are drawn with OpenCV's `putText` when OpenCV is
installed; the reader-only install has no OpenCV, and then the sheet has
no text (`kiln preview` prints the legend). OpenCV's Hershey fonts draw
ASCII only, so a class name that is not ASCII is drawn as its class id and
what of it is ASCII once accents are taken off (`drawn_class_names`:
``café`` is ``#0 cafe``, ``猫`` is ``#1``), which the legend maps back.

`unchanged_columns` is the check the sheet exists for: an element that comes
out identical in every epoch while augmentation is on means the randomness
does not reach it, the signature of randomness baked in at trace time.
"""

from __future__ import annotations

import dataclasses
import math
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

import kiln.reader
from kiln.lazy_import import LazyModule
from kiln.reader.targets import TargetSpec
from kiln.schemas import METADATA_FILENAME

if TYPE_CHECKING:
    import tensorflow as tf
else:  # imported when images are read: `kiln preview --help` and its checks need none
    tf = LazyModule("tensorflow")

# Images smaller than this (longest side, pixels) are enlarged by a whole
# factor, pixels kept square; larger than _LARGEST are shrunk.
_SMALLEST = 96
_LARGEST = 256
_GAP = 4
_BACKGROUND = 40
# The most pixels a sheet may have (about 300 MB of RGB): a larger --zoom is a
# mistake, not a picture anyone opens (zoom 1e6 asked numpy for 349 PiB).
MAX_SHEET_PIXELS = 100_000_000
_TEXT_COLOR = (235, 235, 235)
_CAPTION_HEIGHT = 16
_HEADER_WIDTH = 64
_FONT_SCALE = 0.4
# Columns per band of a sheet (`compose`'s default `wrap`): 16 cells of at
# most 256 px (`_LARGEST`) keep a sheet within about 4200 px wide.
WRAP = 16
# A box's class name sits on its image's pixels darkened to this fraction,
# this many pixels around the text.
_LABEL_SHADE = 0.25
_LABEL_PAD = 1


@dataclasses.dataclass(frozen=True)
class Preview:
    """The images of a contact sheet, as uint8 ``[height, width, channels]`` arrays.

    Attributes:
      split: The split read.
      seed: The reader's base seed for the augmented rows.
      keys: Record keys of the columns' elements (first elements of the
        split, unshuffled).
      labels: Their class ids.
      class_names: The dataset's class names.
      stored: One stored image per column, as the build wrote it.
      epochs: Per epoch, one augmented image per column.
      augment: The augmentation list, in YAML form (resolved).
      random: Whether the augmented rows are random (False: no augmentation,
        or the deterministic inference form the reader uses outside train;
        then there is one such row, as every epoch would be the same).
      applied: The names of the ops that change the rows: all of `augment`
        when random; in the inference form only the ops that have one (a
        crop's centre crop), the others leave the image as it is.
      stored_targets: For datasets with targets, per column the stored
        row's targets (NumPy, keyed as the reader yields them: boxes,
        classes, mask, keypoints...); None for classification.
      epoch_targets: Per epoch, per column, the augmented targets.
    """

    split: str
    seed: int
    keys: list[str]
    labels: list[int]
    class_names: list[str]
    stored: list[np.ndarray]
    epochs: list[list[np.ndarray]]
    augment: list[Any]
    random: bool
    applied: list[str] = dataclasses.field(default_factory=list)
    stored_targets: list[dict[str, np.ndarray]] | None = None
    epoch_targets: list[list[dict[str, np.ndarray]]] | None = None

    @property
    def label_names(self) -> list[str]:
        """Per column the stored element's classes: its label, then its
        multi-label ``labels`` joined by ``+`` (empty if it has neither)."""
        names = [self.class_names[label] for label in self.labels] or ["" for _ in self.keys]
        if self.stored_targets is None:
            return names
        return [
            " ".join(filter(None, [name, "+".join(self.class_names[int(c)] for c in ids)]))
            for name, ids in zip(
                names, (t.get("labels", ()) for t in self.stored_targets), strict=True
            )
        ]


def gather(
    path: str,
    split: str = "train",
    *,
    n: int = 8,
    epochs: int = 3,
    seed: int = 0,
    augment: str | Sequence[Any] | None = "default",
    training: bool | None = None,
) -> Preview:
    """Reads the first `n` elements of `split`, stored and as augmented in `epochs` epochs.

    Args:
      path: A dataset version folder or ``<output>/<name>`` (see
        `kiln.reader.locate`).
      split: Split name.
      n: Elements (columns); fewer if the split is smaller.
      epochs: Augmented rows.
      seed: The reader's seed; the same seed gives the same sheet.
      augment: As `kiln.reader.load` takes it: ``"default"`` (the list stored
        in the dataset) or a list in YAML form, random for ``"train"`` only
        (other splits show the inference form), or None.
      training: As `kiln.reader.load` takes it: True draws the random ops on
        any split, False shows the inference form on train too; None: train
        only.

    Raises:
      MetadataError: for a path that is not a dataset or a missing split.
      AugmentConfigError, AugmentOpError, ValueError: from the reader, for a
        bad list, a user op that ignores its seed, or sizes that cannot be
        batched for mixup/cutmix; ValueError, before anything is read, for
        random batch ops on fewer than 2 images or on images of varying
        sizes that no op of the list crops to one size.
    """
    if n < 1 or epochs < 1:
        raise ValueError(f"n and epochs must be at least 1, got n={n}, epochs={epochs}")
    dataset_dir = kiln.reader.locate(path)
    metadata = kiln.reader.info(dataset_dir)
    count = min(n, metadata.split(split).num_examples)
    ops, random = _augmentation(metadata, split, augment, dataset_dir, training)
    if not random:
        epochs = 1  # deterministic: every epoch would draw the same row
    _check_batch_ops(ops, random, count, n, split)
    _check_batchable(ops, random, metadata.image_size, split)

    stored_dataset = kiln.reader.load(
        dataset_dir, split, batch_size=None, shuffle=False, augment=None, as_supervised=False
    )
    stored = list(stored_dataset.take(count).as_numpy_iterator())
    keys = [element["key"].decode("utf-8") for element in stored]
    spec = TargetSpec.from_json(metadata.targets)
    names = [] if spec.classification_only else [n for n in spec.names if n not in spec.extras]

    # mixup/cutmix mix the elements of a batch: read the columns as one batch.
    batched = random and any(op.definition.kind == "batch" for op in ops)
    augmented_dataset = kiln.reader.load(
        dataset_dir,
        split,
        batch_size=count if batched else None,
        shuffle=False,
        seed=seed,
        augment=augment,
        training=random,
        as_supervised=False,
    )
    rows = []
    row_targets = []
    for _ in range(epochs):
        iterator = iter(augmented_dataset)  # a new iterator is a new pass: new seeds
        if batched:
            batch = next(iterator)
            row_keys = [key.decode("utf-8") for key in batch["key"].numpy()]
            images = [_to_uint8(image) for image in batch["image"].numpy()]
            targets = [
                {name: _numpy(batch[name][index]) for name in names} for index in range(count)
            ]
        else:
            elements = [next(iterator) for _ in range(count)]
            row_keys = [element["key"].numpy().decode("utf-8") for element in elements]
            images = [_to_uint8(element["image"].numpy()) for element in elements]
            targets = [{name: _numpy(element[name]) for name in names} for element in elements]
        row_targets.append(targets)
        if row_keys != keys:
            raise RuntimeError(
                f"the unshuffled passes over {split!r} disagree on the element "
                f"order: {keys} vs {row_keys}"
            )
        rows.append(images)
    return Preview(
        split=split,
        seed=seed,
        keys=keys,
        labels=[int(element["label"]) for element in stored if "label" in element],
        class_names=list(metadata.class_names),
        stored=[_to_uint8(element["image"]) for element in stored],
        epochs=rows,
        augment=[op.to_json() for op in ops],
        random=random,
        applied=[
            op.name
            for op in ops
            if random or (op.definition.kind == "element" and op.definition.inference is not None)
        ],
        stored_targets=(
            [{name: np.asarray(element[name]) for name in names} for element in stored]
            if names
            else None
        ),
        epoch_targets=row_targets if names else None,
    )


def _check_batch_ops(ops, random: bool, count: int, n: int, split: str) -> None:
    """Refuses random batch ops on one column: they mix each image with
    another of its batch, and a batch of one has no other (the reader leaves
    it alone), so the sheet would show them doing nothing (and every epoch
    alike)."""
    names = [op.name for op in ops if op.definition.kind == "batch"]
    if not random or not names or count >= 2:
        return
    fix = (
        "preview 2 or more (kiln preview --n 2)"
        if n < 2
        else f"split {split!r} holds only {count}; preview the list without them"
    )
    raise ValueError(
        f"batch ops need at least 2 images in a preview, got {count}: {', '.join(names)} "
        f"{'mixes' if len(names) == 1 else 'mix'} each image with another of its batch, "
        f"and one image can only pair with "
        f"itself, which shows no change; {fix}"
    )


def _check_batchable(ops, random: bool, image_size, split: str) -> None:
    """Refuses, before anything is read, random batch ops on images of varying size.

    The preview reads its columns as one batch for them, and images of
    varying sizes (kiln.json ``image_size`` null) batch only once an op of
    the list gives them one size (a crop with a ``size``). The reader
    would refuse the batch too, but only once it is read, and in its own
    terms (its ``batch_size``, which a preview does not take). An op of
    your own after the last sized one may give a size: the reader decides.
    """
    names = [op.name for op in ops if op.definition.kind == "batch"]
    if not random or not names or image_size is not None:
        return
    sized = False
    for op in ops:
        definition = op.definition
        if definition.kind != "element":
            continue
        if definition.output_size is not None:
            sized = True
        elif not definition.builtin:
            return
    if sized:
        return
    raise ValueError(
        f"batch ops mix the images of a batch, and the preview reads its columns as "
        f"one batch for {', '.join(names)}; but split {split!r} stores images of varying "
        f"sizes (kiln.json image_size is null) and no op of the list gives them one size. "
        f"Put random_resized_crop or random_crop with a size before "
        f"{'it' if len(names) == 1 else 'them'} in the list, e.g. --augment "
        f'\'[{{"random_crop": {{"size": 32}}}}, "{names[0]}"]\''
    )


def _numpy(value) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def _augmentation(metadata, split: str, augment, dataset_dir: str, training: bool | None):
    """The validated ops and whether they run randomly, by `kiln.reader.load`'s rules.

    ``"default"`` (the stored list) or a list: random where `training` says,
    by default for ``"train"`` only; other splits get the deterministic
    inference form (`load`'s ``training`` default).
    """
    random = split == "train" if training is None else training
    if augment is None:
        return [], False
    if isinstance(augment, str):
        if augment != "default":
            raise kiln.reader.AugmentConfigError(
                f"augment must be 'default', a list of ops, or None; got {augment!r}"
            )
        try:
            ops = kiln.reader.validate(
                metadata.augment,
                field=tf.io.gfile.join(dataset_dir, METADATA_FILENAME) + ": augment",
            )
        except kiln.reader.AugmentConfigError as e:
            plugins = metadata.config.get("plugins") or []
            if plugins and "unknown augmentation op" in str(e):
                # As kiln.reader.load says it, in the preview's own terms: its
                # did-you-means name built-in ops, not the plugin's.
                flags = " ".join(f"--plugin {module}" for module in plugins)
                raise kiln.reader.AugmentConfigError(
                    f"{e}. The dataset was built with plugins: {plugins}; a dataset's files "
                    f"import nothing: pass the one that registers the op ({flags})"
                ) from None
            raise
        return ops, random and bool(ops)
    ops = kiln.reader.validate(augment)
    return ops, random and bool(ops)


def _to_uint8(image: np.ndarray) -> np.ndarray:
    """The reader's float [0, 1] pixels back on the 0..255 scale (exact for stored pixels)."""
    image = np.asarray(image)
    if image.dtype != np.uint8:
        image = np.clip(np.round(image.astype(np.float32) * 255.0), 0, 255).astype(np.uint8)
    return image


def unchanged_columns(epoch_rows: Sequence[Sequence[np.ndarray]]) -> list[int]:
    """Columns whose image is identical (same shape, same pixels) in every epoch row.

    Raises:
      ValueError: with fewer than two rows, which cannot show a change.
    """
    if len(epoch_rows) < 2:
        raise ValueError(f"needs at least two epochs to compare, got {len(epoch_rows)}")
    first = epoch_rows[0]
    return [
        column
        for column in range(len(first))
        if all(np.array_equal(first[column], row[column]) for row in epoch_rows[1:])
    ]


# --- layout and drawing ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where everything sits on a sheet (pixels).

    Row 0 holds the stored images, rows 1..epochs the augmented ones. Every
    image is zoomed by `zoom` and centred in a cell of the largest zoomed size.
    More columns than `wrap` are wrapped: the sheet holds bands of `wrap`
    columns one under the other, each with its own captions, stored row and
    augmented rows (column `wrap` starts the second band), so that a long
    preview stays a sheet rather than one very wide strip.
    """

    rows: int
    columns: int
    cell_height: int
    cell_width: int
    zoom: float
    header_width: int  # row titles at the left (0 without text)
    caption_height: int  # label names above the stored row (0 without text)
    gap: int = _GAP
    wrap: int = 0  # columns per band; 0: one band of every column

    @property
    def band_columns(self) -> int:
        """Columns in a (full) band."""
        return min(self.columns, self.wrap) if self.wrap > 0 else self.columns

    @property
    def bands(self) -> int:
        return -(-self.columns // max(self.band_columns, 1))

    @property
    def band_height(self) -> int:
        return self.caption_height + self.rows * (self.cell_height + self.gap)

    @property
    def height(self) -> int:
        return self.bands * self.band_height + self.gap

    @property
    def width(self) -> int:
        return self.header_width + self.band_columns * (self.cell_width + self.gap) + self.gap

    def cell_origin(self, row: int, column: int) -> tuple[int, int]:
        """``(y, x)`` of the top-left corner of a cell."""
        band, column = divmod(column, max(self.band_columns, 1))
        return (
            band * self.band_height
            + self.caption_height
            + self.gap
            + row * (self.cell_height + self.gap),
            self.header_width + self.gap + column * (self.cell_width + self.gap),
        )

    def zoomed_size(self, height: int, width: int) -> tuple[int, int]:
        return (max(1, round(height * self.zoom)), max(1, round(width * self.zoom)))

    def image_box(self, row: int, column: int, height: int, width: int) -> tuple[slice, slice]:
        """The sheet slices holding an image of stored size ``height x width`` in a cell."""
        zoomed_height, zoomed_width = self.zoomed_size(height, width)
        y, x = self.cell_origin(row, column)
        y += (self.cell_height - zoomed_height) // 2
        x += (self.cell_width - zoomed_width) // 2
        return slice(y, y + zoomed_height), slice(x, x + zoomed_width)


def auto_zoom(longest_side: int) -> float:
    """Whole-number enlargement for small images, shrinking for large ones, else 1."""
    if longest_side < _SMALLEST:
        return float(math.ceil(_SMALLEST / longest_side))
    if longest_side > _LARGEST:
        return _LARGEST / longest_side
    return 1.0


def compose(
    preview: Preview, *, zoom: float | None = None, text: bool = True, wrap: int = WRAP
) -> tuple[np.ndarray, Layout]:
    """Draws the sheet: a uint8 ``[height, width, 3]`` array and its `Layout`.

    Args:
      preview: From `gather`.
      zoom: Scale of every image; None: `auto_zoom` of the largest image.
      text: Draw label names and row titles (needs OpenCV; without it the
        sheet simply has none).
      wrap: Columns per band: more elements wrap into further bands, one
        under the other (see `Layout`).
    """
    if wrap < 1:
        raise ValueError(f"wrap must be at least 1, got {wrap}")
    rows = [preview.stored] + list(preview.epochs)
    images = [image for row in rows for image in row]
    if zoom is None:
        zoom = auto_zoom(max(max(image.shape[:2]) for image in images))
    if not 0 < zoom < math.inf:  # NaN too
        raise ValueError(f"zoom must be positive and finite, got {zoom}")
    put_text = _text_renderer() if text else None
    if put_text:  # what the ASCII-only font can draw of each class name
        preview = dataclasses.replace(preview, class_names=drawn_class_names(preview.class_names))
    probe = Layout(len(rows), len(preview.stored), 0, 0, zoom, 0, 0)
    sizes = [probe.zoomed_size(*image.shape[:2]) for image in images]
    layout = Layout(
        rows=len(rows),
        columns=len(preview.stored),
        cell_height=max(size[0] for size in sizes),
        cell_width=max(size[1] for size in sizes),
        zoom=zoom,
        header_width=_HEADER_WIDTH if put_text else 0,
        caption_height=_CAPTION_HEIGHT if put_text else 0,
        wrap=wrap,
    )
    if layout.height * layout.width > MAX_SHEET_PIXELS:
        raise ValueError(
            f"zoom {zoom:g} makes a sheet of {layout.width}x{layout.height} pixels, more than "
            f"the {MAX_SHEET_PIXELS // 1_000_000} million a sheet may have: zoom less"
        )
    sheet = np.full((layout.height, layout.width, 3), _BACKGROUND, np.uint8)
    target_rows = (
        [preview.stored_targets, *preview.epoch_targets]
        if preview.stored_targets is not None and preview.epoch_targets is not None
        else None
    )
    for row_index, row in enumerate(rows):
        for column, image in enumerate(row):
            box = layout.image_box(row_index, column, *image.shape[:2])
            cell = _zoomed(_as_rgb(image), layout.zoomed_size(*image.shape[:2]))
            if target_rows is not None:
                cell = draw_targets(
                    cell, target_rows[row_index][column], preview.class_names, put_text
                )
            sheet[box] = cell
    if put_text:
        if preview.random:
            titles = ["stored"] + [f"epoch {epoch}" for epoch in range(1, len(rows))]
        else:
            titles = ["stored", "as read"]
        for band in range(layout.bands):
            for row_index, title in enumerate(titles):
                y, _ = layout.cell_origin(row_index, band * layout.band_columns)
                put_text(
                    sheet,
                    title,
                    (layout.gap, y + layout.cell_height // 2 + 4),
                    layout.header_width - layout.gap,
                )
        for column, name in enumerate(preview.label_names):
            y, x = layout.cell_origin(0, column)
            put_text(sheet, name, (x, y - layout.gap), layout.cell_width)
    return sheet, layout


# Overlay colours by class id (cycled), and for keypoints by index.
_PALETTE = np.array(
    [
        (230, 25, 75),
        (60, 180, 75),
        (255, 225, 25),
        (0, 130, 200),
        (245, 130, 48),
        (145, 30, 180),
        (70, 240, 240),
        (240, 50, 230),
        (210, 245, 60),
        (250, 190, 212),
    ],
    np.uint8,
)
_MASK_ALPHA = 0.45
_KEYPOINT_RING = np.array((0, 0, 0), np.uint8)


def draw_targets(
    image: np.ndarray,
    targets: dict,
    class_names: Sequence[str],
    put_text: _TextRenderer | None = None,
):
    """Draws one element's targets onto its (zoomed) uint8 RGB image; returns a new array.

    The class mask and each object's instance mask are a translucent
    overlay in the class's colour (class 0, the background, and the ignore
    value are left clear; an instance mask over the class mask where both
    exist: `_overlay`), each box a one-pixel frame in its class's
    colour with the class name on a dark backing above it, or inside it when
    there is no room above, moved left to fit in the image
    (`label_origin`; when text can be drawn), each
    labelled keypoint a 3x3 dot in its keypoint's colour (visible: filled;
    hidden: hollow) in a one-pixel black ring, which keeps it visible on a
    box or mask of any colour, its own included.
    """
    out = image.copy()
    height, width = out.shape[:2]
    overlay = _overlay(targets, len(class_names), height, width)
    if overlay is not None:
        labelled, colours = overlay
        blended = (1 - _MASK_ALPHA) * out + _MASK_ALPHA * colours
        out = np.where(labelled[..., None], np.round(blended), out).astype(np.uint8)
    if "boxes" in targets:
        classes, count = _object_classes(targets, len(targets["boxes"]))
        labels = []
        for box, class_id in zip(
            np.asarray(targets["boxes"])[:count], classes[:count], strict=True
        ):
            colour = _PALETTE[int(class_id) % len(_PALETTE)]
            top, left = int(box[0] * height), int(box[1] * width)
            bottom = min(height - 1, max(top, int(np.ceil(box[2] * height)) - 1))
            right = min(width - 1, max(left, int(np.ceil(box[3] * width)) - 1))
            top, left = min(max(top, 0), height - 1), min(max(left, 0), width - 1)
            out[top, left : right + 1] = colour
            out[bottom, left : right + 1] = colour
            out[top : bottom + 1, left] = colour
            out[top : bottom + 1, right] = colour
            if put_text is not None and 0 <= class_id < len(class_names):
                labels.append((class_names[int(class_id)], top, left))
        if put_text is not None:  # over every frame, so that no frame cuts a name
            for name, top, left in labels:
                put_text.label(out, name, top, left)
    if "keypoints" in targets:
        points = np.asarray(targets["keypoints"])
        visibility = np.asarray(targets.get("keypoint_visibility", np.full(points.shape[:2], 2)))
        count = int(targets.get("num_objects", len(points)))
        for object_points, object_visibility in zip(
            points[:count], visibility[:count], strict=True
        ):
            for index, ((y, x), visible) in enumerate(
                zip(object_points, object_visibility, strict=True)
            ):
                if visible <= 0:
                    continue
                row, col = int(y * height), int(x * width)
                if not (0 <= row < height and 0 <= col < width):
                    continue
                # A black ring around the dot: the dot's colour is also a
                # class's, and without the ring a keypoint on a frame or mask
                # of that colour would vanish into it.
                out[max(row - 2, 0) : row + 3, max(col - 2, 0) : col + 3] = _KEYPOINT_RING
                dot = out[max(row - 1, 0) : row + 2, max(col - 1, 0) : col + 2]
                dot[...] = _PALETTE[(index + 3) % len(_PALETTE)]
                if visible == 1 and dot.shape[0] == 3 and dot.shape[1] == 3:
                    dot[1, 1] = image[row, col]  # hidden: hollow
    return out


def _object_classes(targets: dict, objects: int) -> tuple[np.ndarray, int]:
    """The objects' class ids (0 without ``classes``) and how many objects are real
    (``num_objects`` where the reader pads them)."""
    classes = np.asarray(targets.get("classes", np.zeros(objects, np.int64)))
    return classes, int(targets.get("num_objects", objects))


def _overlay(targets: dict, num_classes: int, height: int, width: int):
    """Which pixels of a ``height x width`` cell the masks colour, and in which colours.

    Returns ``(labelled [height, width] bool, colours [height, width, 3] uint8)``,
    or None without masks. The class mask colours its labelled pixels (not
    class 0, the background, nor the ignore value); each object's instance
    mask then colours its pixels in its class's colour, over the class mask's
    (a later object over an earlier one). Where the two agree, as they do
    when both move with the image, the overlay is the same as either alone;
    a mask that did not follow its object shows as colour off the object.
    """
    if "mask" not in targets and "instance_masks" not in targets:
        return None
    labelled = np.zeros((height, width), bool)
    colours = np.zeros((height, width, 3), np.uint8)
    if "mask" in targets:
        mask = _nearest(np.asarray(targets["mask"])[..., 0], height, width).astype(np.int64)
        labelled = (mask > 0) & (mask < num_classes if num_classes else mask > 0)
        colours = _PALETTE[mask % len(_PALETTE)]
    if "instance_masks" in targets:
        masks = np.asarray(targets["instance_masks"])
        classes, count = _object_classes(targets, len(masks))
        for instance, class_id in zip(masks[:count], classes[:count], strict=True):
            covered = _nearest(instance[..., 0], height, width) > 0
            labelled = labelled | covered
            colours = np.where(covered[..., None], _PALETTE[int(class_id) % len(_PALETTE)], colours)
    return labelled, colours


def _nearest(mask: np.ndarray, height: int, width: int) -> np.ndarray:
    rows = (np.arange(height) * mask.shape[0]) // height
    cols = (np.arange(width) * mask.shape[1]) // width
    return mask[rows][:, cols]


def _as_rgb(image: np.ndarray) -> np.ndarray:
    return np.repeat(image, 3, axis=-1) if image.shape[-1] == 1 else image


def _zoomed(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    if size == image.shape[:2]:
        return image
    height, width = image.shape[:2]
    if size[0] % height == 0 and size[1] % width == 0:
        # Whole-number enlargement: repeat pixels, so they stay exact squares.
        return np.repeat(np.repeat(image, size[0] // height, axis=0), size[1] // width, axis=1)
    resized = tf.image.resize(image, size, method="area" if size[0] < height else "bilinear")
    return np.clip(np.round(resized.numpy()), 0, 255).astype(np.uint8)


def drawn_class_names(class_names: Sequence[str]) -> list[str]:
    """Each class name as the sheet draws it: an ASCII name as it is; any
    other as ``#<class id>`` followed by its ASCII letters once accents are
    taken off (NFKD without combining marks: ``café`` is ``#0 cafe``, ``猫``
    is ``#1``). OpenCV's fonts draw ASCII only (anything else comes out as
    ``?``); the id comes first so that a name cut to the cell's width keeps
    it, and `kiln preview` prints which name each id is."""
    drawn = []
    for class_id, name in enumerate(class_names):
        if name.isascii():
            drawn.append(name)
            continue
        decomposed = unicodedata.normalize("NFKD", name)
        plain = "".join(c for c in decomposed if not unicodedata.combining(c))
        ascii_part = " ".join(plain.encode("ascii", "ignore").decode("ascii").split())
        has_letters = any(c.isalnum() for c in ascii_part)
        drawn.append(f"#{class_id} {ascii_part}" if has_letters else f"#{class_id}")
    return drawn


def draws_text() -> bool:
    """Whether `compose` can draw text here (OpenCV is installed)."""
    return _text_renderer() is not None


def label_origin(
    text_size: tuple[int, int, int], top: int, left: int, height: int, width: int
) -> tuple[int, int]:
    """Where a box's class name goes in a ``height x width`` cell: ``(x, baseline_y)``.

    Above the box's top-left corner when it fits there, else just inside
    the box, below its top edge; moved left as far as needed for the whole
    name (and its backing, `_LABEL_PAD` pixels around it) to stay inside
    the cell, so a box at the right edge keeps its full name rather than a
    cut one. A name wider than the cell starts at its left edge.

    Args:
      text_size: ``(text_width, text_height, descent)`` in pixels, as OpenCV
        measures the text (height above the baseline, descent below it).
      top, left: The box's top-left pixel in the cell.
      height, width: The cell's size.
    """
    text_width, text_height, descent = text_size
    x = max(min(left + _LABEL_PAD, width - text_width - _LABEL_PAD), _LABEL_PAD)
    above = top - _LABEL_PAD - descent
    if above - text_height - _LABEL_PAD < 0:  # no room above: inside, under the top edge
        above = min(top + 1, height - 1) + _LABEL_PAD + text_height
    return x, above


class _TextRenderer:
    """Draws ASCII text with OpenCV's Hershey font: plain (`__call__`, on the
    sheet's dark margins) or as a box's label (`label`, on any image)."""

    def __init__(self, cv2) -> None:
        self._cv2 = cv2

    def size(self, text: str) -> tuple[int, int, int]:
        """``(width, height above the baseline, descent)`` of `text`, in pixels."""
        (text_width, text_height), descent = self._cv2.getTextSize(
            text, self._cv2.FONT_HERSHEY_SIMPLEX, _FONT_SCALE, 1
        )
        return text_width, text_height, descent

    def fitted(self, text: str, max_width: int) -> str:
        """`text` in ASCII (the font's), cut to at most `max_width` pixels."""
        text = text.encode("ascii", "replace").decode("ascii")  # Hershey fonts are ASCII
        while text and self.size(text)[0] > max_width:
            text = text[:-1]
        return text

    def __call__(
        self, sheet: np.ndarray, text: str, origin: tuple[int, int], max_width: int
    ) -> None:
        """Draws `text` (cut to `max_width`) with its baseline starting at ``origin (x, y)``."""
        self._cv2.putText(
            sheet,
            self.fitted(text, max_width),
            origin,
            self._cv2.FONT_HERSHEY_SIMPLEX,
            _FONT_SCALE,
            _TEXT_COLOR,
            1,
            self._cv2.LINE_AA,
        )

    def label(self, image: np.ndarray, text: str, top: int, left: int) -> None:
        """Draws a box's class name where `label_origin` puts it, on a dark backing.

        The backing (the pixels under the name, `_LABEL_PAD` around it,
        darkened to `_LABEL_SHADE`) keeps the light text readable on light
        images as on dark ones, and still shows what is under it.
        """
        height, width = image.shape[:2]
        text = self.fitted(text, width - 2 * _LABEL_PAD)
        if not text:
            return
        text_size = self.size(text)
        x, y = label_origin(text_size, top, left, height, width)
        text_width, text_height, descent = text_size
        rows = slice(max(y - text_height - _LABEL_PAD, 0), min(y + descent + _LABEL_PAD, height))
        columns = slice(max(x - _LABEL_PAD, 0), min(x + text_width + _LABEL_PAD, width))
        image[rows, columns] = np.round(image[rows, columns] * _LABEL_SHADE).astype(np.uint8)
        self(image, text, (x, y), width)


def _text_renderer() -> _TextRenderer | None:
    """The text renderer with OpenCV, or None without it."""
    try:
        import cv2  # optional: the reader-only install has no OpenCV
    except ImportError:
        return None
    return _TextRenderer(cv2)


# What `write_image` writes, by the file name's extension.
IMAGE_FORMATS = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg"}


def image_format(path: str) -> str | None:
    """``"png"`` or ``"jpeg"`` as the file name of `path` says, or None."""
    name = path.rstrip("/").rsplit("/", 1)[-1].lower()
    return next((fmt for ext, fmt in IMAGE_FORMATS.items() if name.endswith(ext)), None)


def write_image(path: str, sheet: np.ndarray) -> None:
    """Writes the sheet as a PNG or a JPEG, as `path`'s extension says (local path or gs://).

    Raises:
      ValueError: for another extension.
    """
    fmt = image_format(path)
    if fmt is None:
        raise ValueError(f"{path}: expected a file name ending in {', '.join(IMAGE_FORMATS)}")
    if fmt == "png":
        data = tf.io.encode_png(sheet).numpy()
    else:
        data = tf.io.encode_jpeg(sheet, quality=95).numpy()
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(data)
