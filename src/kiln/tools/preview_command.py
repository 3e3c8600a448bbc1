"""`kiln preview`: a PNG contact sheet of stored images and their augmentation, epoch by epoch."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import TYPE_CHECKING

from kiln import console
from kiln.errors import Failure, UsageError

if TYPE_CHECKING:
    from kiln.tools import contact_sheet

# The reader and the sheet are imported by `run` (TensorFlow on first use):
# `kiln preview --help` needs none of them.

DESCRIPTION = """\
Draw a contact sheet that answers "is my augmentation doing what I think,
and does it change every epoch?". Row 1: the first N elements of the split
as the build stored them (label names on top). Rows 2..: the same elements
as kiln.reader augments them in epochs 1, 2, ... (the reader's own code,
seeded, reading the split unshuffled so each column is one element).

On a detection or segmentation dataset every cell also shows its targets
as the reader yields them: boxes with class names, the class mask and
each object's instance mask as a translucent overlay in the class's colour
(an object's instance mask over the class mask where both exist),
keypoints as dots in a black ring (visible on any class colour). A box or
mask that does not follow its object is visible at a glance.

If augmentation is on and an element comes out identical in every epoch,
the command says so on stderr: that is what randomness baked in at trace
time looks like. Label names are drawn when OpenCV is installed (a name
that is not ASCII as its class id: the font is ASCII only); the legend is
printed either way, with the names as they are."""

EPILOG = """\
PATH is a version folder (<output>/<name>/<version>) or <output>/<name>.

examples:
  kiln preview build/datasets/shapes -o preview.png
  kiln preview build/datasets/shapes --split train --n 8 --epochs 3 -o preview.png
  kiln preview build/datasets/shapes --seed 7 --zoom 2 -o preview.png
  kiln preview build/datasets/shapes --n 48 --columns 12 -o many.png   # 4 bands of 12
  kiln preview build/datasets/shapes -o try.png \\
      --augment '[{"random_rotation": {"angle_range": [-30, 30]}}, "random_flip_up_down"]'
  kiln preview build/datasets/shapes -o mine.png --plugin my_project.augmentations

exit codes:
  0  sheet written (warnings, if any, on stderr)
  1  sheet written, but augmentation is on and no element changed between
     epochs (with --strict: any element); or a registered augmentation op
     ignores its seed (the reader refuses it); or nothing written: a shard
     cannot be read (damaged since the build) or the sheet cannot be
     written (a full disk)
  2  usage error: PATH is not a dataset, unknown split, bad --augment,
     batch ops (mixup, cutmix) with --n 1 or on images of varying sizes
     that no op of the list crops to one size (refused before reading),
     an -o whose folder is missing or cannot be written in"""


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.add_argument("path", metavar="PATH", help="dataset version folder, or <output>/<name>")
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE.png",
        help="where to write the sheet: FILE.png, or FILE.jpg for a JPEG (local path or gs://)",
    )
    parser.add_argument("--split", default="train", help="split to show (default: train)")
    parser.add_argument(
        "--n", type=int, default=8, metavar="N", help="elements, one per column (default: 8)"
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=3,
        metavar="K",
        help="augmented rows, one per epoch (default: 3)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the reader's seed; the same seed draws the same sheet (default: 0)",
    )
    parser.add_argument(
        "--augment",
        default="default",
        metavar="LIST",
        help="'default' (the list stored in the dataset), 'none', or a JSON "
        "list in the config's form; random for train, the deterministic "
        "inference form for other splits (as kiln.reader.load)",
    )
    parser.add_argument(
        "--training",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="--training draws the random ops on any split (e.g. to see validation "
        "augmented), --no-training shows the inference form on train too "
        "(default: random on train only, as kiln.reader.load)",
    )
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first, to register your own augmentation ops (repeatable)",
    )
    parser.add_argument(
        "--zoom",
        type=float,
        metavar="Z",
        help="scale images by Z (default: enlarge small images to about "
        "96 px, shrink large ones to 256 px)",
    )
    parser.add_argument(
        "--columns",
        type=int,
        default=None,
        metavar="C",
        help="columns per band: more elements wrap into further bands, one under the "
        "other, each with its stored and augmented rows (default: 16)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="print nothing when the sheet is written and nothing is wrong (no summary, "
        "no legend, no notes); problems (exit 1, exit 2) are still printed",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 if any element is identical in every epoch, not only when all are",
    )


def run(args: argparse.Namespace, extra_argv: list[str]) -> int:
    if args.n < 1:
        raise UsageError(f"--n must be at least 1, got {args.n}")
    if args.epochs < 1:
        raise UsageError(f"--epochs must be at least 1, got {args.epochs}")
    if args.zoom is not None and not 0 < args.zoom < math.inf:  # float() reads nan, inf
        raise UsageError(f"--zoom must be positive and finite, got {args.zoom}")
    if args.columns is not None and args.columns < 1:
        raise UsageError(f"--columns must be at least 1, got {args.columns}")
    from kiln.registry import import_plugin

    for module in args.plugin:
        problem = import_plugin(module)
        if problem:
            raise UsageError(f"--plugin: {problem}")
    augment = _augment_argument(args.augment)
    _check_output(args.output)
    from kiln.reader import AugmentConfigError, AugmentOpError
    from kiln.schemas import MetadataError
    from kiln.tools import contact_sheet

    try:
        preview = contact_sheet.gather(
            args.path,
            args.split,
            n=args.n,
            epochs=args.epochs,
            seed=args.seed,
            augment=augment,
            training=args.training,
        )
    except (MetadataError, AugmentConfigError) as e:
        raise UsageError(str(e)) from None
    except AugmentOpError as e:
        _warn(f"kiln preview: error: {e}")
        return 1
    except ValueError as e:  # e.g. mixup/cutmix on images of varying sizes, or on boxes
        raise UsageError(str(e)) from None
    except Exception as e:
        _raise_if_damaged(e, args.path, args.split)
        raise
    wrap = contact_sheet.WRAP if args.columns is None else args.columns
    try:
        sheet, layout = contact_sheet.compose(preview, zoom=args.zoom, wrap=wrap)
    except ValueError as e:  # a --zoom that makes a sheet too large to hold
        raise UsageError(f"--zoom: {e}") from None
    _write_sheet(args.output, sheet)
    if args.quiet:
        return _check_epochs(preview, strict=args.strict, training=args.training, quiet=True)

    if preview.random:
        rows = f"{len(preview.epochs)} epoch(s), seed {preview.seed}"
        applied = ", ".join(preview.applied)
        augmentation = f"augmentation random: {applied}"
    elif preview.augment:
        rows = "1 row as read"
        skipped = [_op_name(op) for op in preview.augment if _op_name(op) not in preview.applied]
        augmentation = "augmentation deterministic (inference form): applied: " + (
            ", ".join(preview.applied) or "none"
        )
        if skipped:
            augmentation += f"; not applied outside training: {', '.join(skipped)}"
    else:
        rows = "1 row as read"
        augmentation = "augmentation off"
    _say(
        f"kiln preview: wrote {args.output} ({layout.width}x{layout.height}): split "
        f"{preview.split!r}, {len(preview.keys)} elements x {rows}; {augmentation}"
    )
    names = preview.label_names
    if preview.stored_targets is not None:
        # Targets are drawn on the sheet; the legend says what each column stores.
        names = [
            " ".join(filter(None, [name, _targets_summary(targets)]))
            for name, targets in zip(names, preview.stored_targets, strict=True)
        ]
    width = max(console.width(name) for name in names)
    for column, (name, key) in enumerate(zip(names, preview.keys, strict=True)):
        _say(f"  column {column + 1}: {console.pad(name, width)}  {key}")
    drawn = contact_sheet.drawn_class_names(preview.class_names)
    renamed = [
        f"{name!r} as {shown!r}"
        for name, shown in zip(preview.class_names, drawn, strict=True)
        if shown != name
    ]
    if renamed and contact_sheet.draws_text():
        _say(f"  drawn (the sheet's font is ASCII only): {', '.join(renamed)}")
    return _check_epochs(preview, strict=args.strict, training=args.training)


def _raise_if_damaged(error: Exception, path: str, split: str) -> None:
    """A shard damaged or cut short since the build is the dataset's fault,
    not kiln's: a failure naming what is wrong (it was exit 70, "internal
    error", with TF's op text). TF's message names no file; ``kiln verify``
    names it and its checksum. Only looked at once TensorFlow is imported, so
    that a path that holds no dataset is still refused before it is."""
    tf = sys.modules.get("tensorflow")
    if tf is None or not isinstance(error, tf.errors.DataLossError):
        return
    from kiln.tools.verify import tf_message

    raise Failure(
        f"{path}: a shard of split {split!r} cannot be read: {tf_message(error)}; "
        f"nothing was written; kiln verify {path} names the file"
    ) from None


def _check_output(path: str) -> None:
    """Refuses an output that cannot be written before any work is done."""
    from kiln.schemas.location import is_remote
    from kiln.tools import contact_sheet

    if contact_sheet.image_format(path) is None:
        extensions = ", ".join(contact_sheet.IMAGE_FORMATS)
        raise UsageError(f"-o {path}: expected a file name ending in {extensions}")
    if is_remote(path):
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UsageError(f"-o {path}: {folder} is not a folder")
    if not os.path.isdir(folder):
        raise UsageError(f"-o {path}: the folder {folder} does not exist")
    if os.path.isdir(path):
        raise UsageError(f"-o {path}: is a folder; give a file name")
    # Found only when the sheet was written, after the dataset was read and
    # augmented, this was an internal error (exit 70).
    if not os.access(path if os.path.exists(path) else folder, os.W_OK):
        what = "write it" if os.path.exists(path) else f"create files in {folder}"
        raise UsageError(f"-o {path}: cannot {what}")


def _write_sheet(path: str, sheet) -> None:
    """Writes the sheet; a failure (a full disk, a file system that refuses
    it) is the command's one line, exit 1, not an internal error."""
    import tensorflow as tf

    from kiln.tools import contact_sheet

    try:
        contact_sheet.write_image(path, sheet)
    except (OSError, tf.errors.OpError) as e:
        reason = getattr(e, "message", None) or e.strerror or str(e)
        reason = reason.removeprefix(f"{path}; ")
        raise Failure(f"-o {path}: cannot write the sheet: {reason}") from None


def _targets_summary(targets: dict) -> str:
    parts = []
    if "boxes" in targets:
        parts.append(f"{len(targets['boxes'])} object(s)")
    if "mask" in targets:
        parts.append("mask")
    if "instance_masks" in targets:
        parts.append("instance masks")
    return "(" + ", ".join(parts) + ")" if parts else ""


def _augment_argument(text: str):
    if text == "default":
        return "default"
    if text == "none":
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(
            f"--augment: expected 'default', 'none' or a JSON list, got {text!r} ({e.msg})"
        ) from None
    if not isinstance(value, list):
        raise UsageError(f"--augment: expected a JSON list of ops, got {text!r}")
    return value


def _op_name(op) -> str:
    return op if isinstance(op, str) else next(iter(op))


def _check_epochs(
    preview: contact_sheet.Preview, *, strict: bool, training: bool | None, quiet: bool = False
) -> int:
    """Says, on stderr, when augmentation is on but elements do not change between epochs.

    With `quiet` only what makes the exit code 1 is said (no notes, and
    the warning about some columns only under `strict`)."""
    if not preview.random:
        if preview.augment and training is None and not quiet:
            _warn(
                f"kiln preview: note: split {preview.split!r} gets no random augmentation "
                f"by default (the reader applies the deterministic inference form of the "
                f"list); pass --training to draw the random ops on it",
            )
        return 0
    if len(preview.epochs) < 2:
        if quiet:
            return 0
        _warn(
            "kiln preview: note: one epoch cannot show whether augmentation changes "
            "between epochs; use --epochs 2 or more",
        )
        return 0
    from kiln.tools import contact_sheet

    unchanged = contact_sheet.unchanged_columns(preview.epochs)
    if not unchanged:
        return 0
    epochs = len(preview.epochs)
    listed = ", ".join(f"{column + 1} ({preview.keys[column]})" for column in unchanged)
    if len(unchanged) == len(preview.keys):
        _warn(
            f"kiln preview: error: augmentation is on, but every element came out identical "
            f"in all {epochs} epochs: the randomness does not reach the elements. This is "
            f"what augmentation baked in at trace time looks like (Python or NumPy random "
            f"values drawn once while tf.data traces the function), or ops whose "
            f"parameters make them deterministic (e.g. probability 0 or 1).",
        )
        return 1
    if quiet and not strict:
        return 0
    _warn(
        f"kiln preview: {'error' if strict else 'warning'}: column(s) {listed} came out "
        f"identical in all {epochs} "
        f"epochs. Ops that apply with a probability can do that by chance (a flip with "
        f"probability 0.5: 1 in {2 ** (epochs - 1)}); more --epochs tell chance from "
        f"a bug.",
    )
    return 1 if strict else 0


# The sheet is the product (written to -o); these lines are for a person. A
# line that cannot be written (a reader gone, a full disk) is dropped, and the
# command still returns its verdict (`kiln.console`).
def _say(line: str) -> None:
    console.write(line + "\n", sys.stdout)


def _warn(line: str) -> None:
    console.write(line + "\n", sys.stderr)
