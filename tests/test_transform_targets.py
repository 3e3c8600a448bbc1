"""Targets follow the image through every offline transform and EXIF orientation.

Scenes are drawn with known geometry: filled shapes (rectangles, ellipses,
triangles) each in its own colour on black, their boxes, semantic and
instance masks, and keypoints whose markers (small white squares) are drawn
on separate images. The image and its targets then go through a chain, and
the targets are checked against what the transformed image shows: boxes
enclose the shape's pixels tightly, masks agree with the shape's pixels,
keypoints sit on their markers.
"""

from __future__ import annotations

import dataclasses
import io
import math

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps
from pycocotools import mask as mask_api

from kiln import transforms
from kiln.transforms import (
    CoordinateMap,
    SegmentationError,
    Targets,
    TargetsError,
    TransformConfigError,
    TransformError,
)
from kiln.transforms import chain as chain_module

COLOURS = np.array([[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0]], np.uint8)
IGNORE = 255  # the semantic mask's fill for padding
# How far a keypoint's marker (5x5 pixels, scaled up to 2.5 times) reaches from it.
MARKER_REACH = 8.0


@dataclasses.dataclass
class Scene:
    image: np.ndarray  # the shapes, colour i for object i, on black
    markers: list[np.ndarray]  # per keypoint (flattened N*K), a white square on black
    targets: Targets
    rectangle: list[bool]  # per object: is the shape its whole box


def draw_scene(height: int, width: int, seed: int) -> Scene:
    """Four shapes of 36+ pixels in the quadrants of a ``height x width`` image (96+),
    apart from each other."""
    rng = np.random.default_rng(seed)
    image = np.zeros((height, width, 3), np.uint8)
    semantic = np.zeros((height, width), np.uint8)
    boxes, instance, keypoints, rectangle, markers = [], [], [], [], []
    half_h, half_w = height // 2, width // 2
    for index, (top, left) in enumerate([(0, 0), (0, half_w), (half_h, 0), (half_h, half_w)]):
        # A shape of 14+ px inside its quadrant, 3+ px from the quadrant's edges.
        h = int(rng.integers(36, half_h - 4))
        w = int(rng.integers(36, half_w - 4))
        y0 = top + 3 + int(rng.integers(0, half_h - 5 - h + 1))
        x0 = left + 3 + int(rng.integers(0, half_w - 5 - w + 1))
        shape = np.zeros((height, width), np.uint8)
        kind = index % 3
        if kind == 0:
            shape[y0 : y0 + h, x0 : x0 + w] = 1
        elif kind == 1:
            cv2.ellipse(shape, (x0 + w // 2, y0 + h // 2), (w // 2, h // 2), 0, 0, 360, 1, -1)
        else:  # a house: a roof over a wall, square corners below and a point on top
            wall = y0 + h // 2
            corners = [[x0, y0 + h - 1], [x0 + w - 1, y0 + h - 1], [x0 + w - 1, wall]]
            corners += [[x0 + w // 2, y0], [x0, wall]]
            cv2.fillPoly(shape, [np.array(corners, np.int32)], 1)
        ys, xs = np.nonzero(shape)
        boxes.append([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
        instance.append(shape)
        rectangle.append(kind == 0)
        image[shape == 1] = COLOURS[index]
        semantic[shape == 1] = index + 1
        # Two keypoints on shape pixels, markers drawn on their own images.
        points = []
        for _ in range(2):
            pick = int(rng.integers(len(xs)))
            px, py = int(xs[pick]), int(ys[pick])
            points.append([px + 0.5, py + 0.5, 2])
            marker = np.zeros((height, width, 3), np.uint8)
            marker[max(py - 2, 0) : py + 3, max(px - 2, 0) : px + 3] = 255
            markers.append(marker)
        keypoints.append(points)
    targets = Targets(
        boxes=np.array(boxes, np.float64),
        objects={"classes": np.arange(1, 5), "iscrowd": np.zeros(4, np.int64)},
        keypoints=np.array(keypoints, np.float64),
        mask=semantic,
        instance_masks=np.stack(instance),
    )
    return Scene(image, markers, targets, rectangle)


def pixels_of(image: np.ndarray, index: int) -> np.ndarray:
    """Where the transformed image shows object `index`: pixels nearest to its colour."""
    palette = np.concatenate([np.zeros((1, 3)), COLOURS]).astype(np.int32)
    distance = ((image[:, :, None, :].astype(np.int32) - palette[None, None]) ** 2).sum(-1)
    return distance.argmin(-1) == index + 1


def box_of(pixels: np.ndarray) -> np.ndarray | None:
    ys, xs = np.nonzero(pixels)
    if len(xs) == 0:
        return None
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float64)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    inter_w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    inter_h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = inter_w * inter_h
    area = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / area


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def resampling_error(specs: list, height: int, width: int) -> float:
    """How far (in output pixels) a mask's edge may be from the exact one after `specs`.

    Each resampling (resize, letterbox) puts an edge within about a pixel of
    where it belongs, and later resamplings scale the earlier errors; crops
    and pads are exact. The geometry of boxes and keypoints is exact: only
    masks, resampled nearest-neighbour step by step, carry this error.
    """
    error = 0.0
    for spec in specs:
        name = spec if isinstance(spec, str) else next(iter(spec))
        out = transforms.parse([spec])(np.zeros((height, width, 1), np.uint8))
        if name == "resize":
            error = error * max(out.shape[0] / height, out.shape[1] / width) + 1.0
        elif name == "letterbox":
            error = error * min(out.shape[0] / height, out.shape[1] / width) + 1.0
        height, width = out.shape[:2]
    return max(error, 1.0)


def check_follows(
    scene: Scene,
    image: np.ndarray,
    out: Targets,
    run,
    tolerance: float = 1.0,
    whole: Targets | None = None,
) -> None:
    """The transformed targets agree with the transformed image `image` (of `scene.image`).

    `run(image) -> image` transforms another image of the scene's size the
    same way (for the keypoint markers); `tolerance` is `resampling_error`;
    `whole` is the same transform's output with ``min_visibility=1``: the
    objects that were not cut.
    """
    height, width = image.shape[:2]
    assert out.mask is not None and out.mask.shape == (height, width)
    assert out.instance_masks is not None and out.instance_masks.shape[1:] == (height, width)
    assert out.keypoints is not None
    # Masks are resampled, never blended: only values that were there, or the fill.
    assert set(np.unique(out.mask)) <= {0, 1, 2, 3, 4, IGNORE}
    assert set(np.unique(out.instance_masks)) <= {0, 1}
    np.testing.assert_array_equal(out.boxes[:, [0, 2]].clip(0, width), out.boxes[:, [0, 2]])
    np.testing.assert_array_equal(out.boxes[:, [1, 3]].clip(0, height), out.boxes[:, [1, 3]])
    kept = [int(c) - 1 for c in out.objects["classes"]]
    for row, index in enumerate(kept):
        shown = pixels_of(image, index)
        box = out.boxes[row]
        mask_box = box_of(out.instance_masks[row])
        image_box = box_of(shown)
        assert mask_box is not None and image_box is not None, (index, box)
        # The box encloses the shape (within the masks' resampling error)...
        assert box[0] <= mask_box[0] + tolerance and box[1] <= mask_box[1] + tolerance
        assert box[2] >= mask_box[2] - tolerance and box[3] >= mask_box[3] - tolerance
        # ...tightly, also where a crop cut the shape: the box of what is left of
        # a cut ellipse or house is its mask's, not the clipped box.
        assert iou(box, mask_box) >= 0.9, (index, box, mask_box)
        assert iou(box, image_box) >= 0.9, (index, box, image_box)
        cut = whole is not None and index + 1 not in whole.objects["classes"]
        if cut:  # tightened to the moved mask's pixels: every side on them
            np.testing.assert_allclose(box, mask_box, atol=tolerance)
        # The masks agree with the image's pixels of the shape.
        assert mask_iou(out.instance_masks[row] == 1, shown) >= 0.9, index
        assert mask_iou(out.mask == index + 1, shown) >= 0.9, index
    # Keypoints sit on their markers; those whose marker left the image are invisible.
    # Where the scene's content is (not a pad's fill), and how far inside it each pixel is:
    # a crop's edge may be inside the image once a pad follows.
    content = run(np.full_like(scene.image, 255)).astype(np.int32).sum(-1) > 3 * 128
    depth = cv2.distanceTransform(np.pad(content.astype(np.uint8), 1), cv2.DIST_L2, 3)[1:-1, 1:-1]

    def inside_by(x: float, y: float) -> float:
        return float(depth[min(int(y), height - 1), min(int(x), width - 1)])

    for row, index in enumerate(kept):
        for k in range(2):
            marker = run(scene.markers[2 * index + k]).astype(np.float64).sum(-1)
            marker[marker <= 3 * 12] = 0  # the pad's fill (9), and ringing around nothing
            x, y, visibility = out.keypoints[row, k]
            mass = marker.sum()
            ys, xs = np.mgrid[0:height, 0:width]
            if visibility:
                assert mass > 0, (index, k)
                centre = ((xs + 0.5) * marker).sum() / mass, ((ys + 0.5) * marker).sum() / mass
                # A marker cut by the content's edge has its centre pulled inwards.
                if inside_by(x, y) <= MARKER_REACH:
                    continue
                assert abs(centre[0] - x) <= 1.5 and abs(centre[1] - y) <= 1.5, (
                    index,
                    k,
                    centre,
                    (x, y),
                )
            else:
                assert (x, y) == (0.0, 0.0)
                if mass > 0:  # only a sliver of the marker may be left, at the edge
                    cx = ((xs + 0.5) * marker).sum() / mass
                    cy = ((ys + 0.5) * marker).sum() / mass
                    assert inside_by(cx, cy) < MARKER_REACH, (index, k, cx, cy)


# --- every built-in geometric transform, many parameters ---------------------------------

INTERPOLATIONS = ["auto", "area", "linear", "cubic", "nearest", "lanczos"]


def scaled_range(length: int, low: float, high: float) -> tuple[int, int]:
    return math.ceil(length * low), math.floor(length * high)


@st.composite
def chains(draw):
    """A scene size and a list of 1-3 built-in geometric transforms.

    The content's scale stays within [0.7, 2.5] of the scene's, so shapes
    stay large enough (25+ pixels) that nearest-neighbour masks, resampled
    up to three times, lose under a pixel a side, and keypoint markers small
    enough to locate; crops cut up to half of each side.
    """
    height = draw(st.integers(96, 176))
    width = draw(st.integers(96, 176))
    specs = []
    h, w = height, width  # the current canvas
    sx = sy = 1.0  # the content's current scale

    def factors(scales):
        return max(0.75, 0.7 / min(scales)), min(2.0, 2.5 / max(scales))

    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["resize", "center_crop", "pad", "letterbox"]))
        interpolation = draw(st.sampled_from(INTERPOLATIONS))
        if kind == "resize":
            how = draw(st.sampled_from(["shorter_side", "longer_side", "size"]))
            if how == "size":
                size = [
                    draw(st.integers(*scaled_range(h, *factors([sy])))),
                    draw(st.integers(*scaled_range(w, *factors([sx])))),
                ]
                spec = {"resize": {"size": size, "interpolation": interpolation}}
            else:
                reference = min(h, w) if how == "shorter_side" else max(h, w)
                side = draw(st.integers(*scaled_range(reference, *factors([sx, sy]))))
                spec = {"resize": {how: side, "interpolation": interpolation}}
            new_h, new_w = transforms.parse([spec])(np.zeros((h, w, 1), np.uint8)).shape[:2]
            sy, sx = sy * new_h / h, sx * new_w / w
            h, w = new_h, new_w
        elif kind == "center_crop":
            spec = {
                "center_crop": {
                    "size": [draw(st.integers(h // 2, h)), draw(st.integers(w // 2, w))]
                }
            }
            h, w = spec["center_crop"]["size"]
        elif kind == "pad":
            if draw(st.booleans()):
                spec = {"pad": {"to_square": True}}
                h = w = max(h, w)
            else:
                spec = {
                    "pad": {
                        "size": [draw(st.integers(h, h + 40)), draw(st.integers(w, w + 40))],
                        "value": 9,
                    }
                }
                h, w = spec["pad"]["size"]
        else:
            low, high = factors([sx, sy])
            size = [
                draw(st.integers(*scaled_range(h, low, high))),
                draw(st.integers(*scaled_range(w, low, high))),
            ]
            spec = {"letterbox": {"size": size, "interpolation": interpolation}}
            fit = min(size[0] / h, size[1] / w)
            sx, sy = sx * fit, sy * fit
            h, w = size
        specs.append(spec)
    seed = draw(st.integers(0, 2**16))
    return height, width, specs, seed


# The same 80 examples every run (no flaky CI); shrinking a failure would take minutes,
# so the unshrunk example is reported.
@settings(
    derandomize=True,
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
@given(chains())
def test_targets_follow_every_builtin_transform(case):
    height, width, specs, seed = case
    scene = draw_scene(height, width, seed)
    chain = transforms.parse(specs)
    image, out = chain.apply(scene.image, scene.targets, min_visibility=0.3, mask_fill=IGNORE)
    # The image is exactly what the image-only chain makes.
    np.testing.assert_array_equal(image, chain(scene.image))
    _, whole = chain.apply(scene.image, scene.targets, min_visibility=1.0)
    check_follows(scene, image, out, chain, resampling_error(specs, height, width), whole)
    assert out.dropped_objects == 4 - out.num_objects


@pytest.mark.parametrize(
    "specs",
    [
        [{"resize": {"size": [72, 91], "interpolation": "area"}}],
        [{"resize": {"shorter_side": 211, "interpolation": "cubic"}}],
        [{"resize": {"longer_side": 96}}],
        [{"center_crop": {"size": [81, 64]}}],
        [{"pad": {"size": [150, 131], "value": [1, 2, 3]}}],
        [{"pad": {"to_square": True}}],
        [{"letterbox": {"size": 96}}],
        [{"letterbox": {"size": [200, 90], "interpolation": "nearest"}}],
        [
            {"resize": {"shorter_side": 100}},
            {"center_crop": {"size": 77}},
            {"pad": {"size": [99, 80]}},
        ],
    ],
)
def test_targets_follow_fixed_chains(specs):
    scene = draw_scene(96, 120, seed=7)
    chain = transforms.parse(specs)
    image, out = chain.apply(scene.image, scene.targets, min_visibility=0.3, mask_fill=IGNORE)
    _, whole = chain.apply(scene.image, scene.targets, min_visibility=1.0)
    check_follows(scene, image, out, chain, resampling_error(specs, 96, 120), whole)


@pytest.mark.parametrize("transform", ["resize", "letterbox"])
def test_nearest_resizes_copy_the_same_input_pixel_into_the_image_and_its_masks(transform):
    """With ``interpolation: nearest`` the image and its masks both copy
    input pixels: each output pixel must copy the same one into both. (The
    image was OpenCV's INTER_NEAREST_EXACT, whose fixed-point scale picked a
    neighbour of the masks' pixel at some rows and columns of one size pair
    in five: 48 -> 77 rows, row 38; 80 -> 131 columns, column 65.)"""
    rng = np.random.default_rng(5)
    sizes = [(48, 80, 77, 131), (48, 80, 29, 50), (60, 90, 31, 47)]
    sizes += [tuple(int(v) for v in rng.integers(2, 200, 4)) for _ in range(40)]
    for in_height, in_width, height, width in sizes:
        labels = rng.integers(1, 256, (in_height, in_width), np.uint8)
        image = np.repeat(labels[:, :, None], 3, axis=2)
        targets = transforms.Targets(boxes=np.zeros((0, 4)), mask=labels)
        size = [height, width]
        chain = transforms.parse([{transform: {"size": size, "interpolation": "nearest"}}])
        out_image, out = chain.apply(image, targets, min_visibility=0.0, mask_fill=0)
        assert out.mask is not None and out_image.shape[:2] == out.mask.shape
        # Letterbox bars: the fill, 0, in both.
        np.testing.assert_array_equal(
            out_image[..., 0], out.mask, err_msg=f"{transform} {in_height}x{in_width} -> {size}"
        )


def test_pad_and_letterbox_fill_the_semantic_mask_with_the_fill_value():
    scene = draw_scene(96, 96, seed=1)
    for specs in ([{"pad": {"size": [110, 100]}}], [{"letterbox": {"size": [96, 140]}}]):
        chain = transforms.parse(specs)
        image, out = chain.apply(scene.image, scene.targets, min_visibility=0.3, mask_fill=IGNORE)
        assert out.mask is not None
        bars = (image == 0).all(-1) & (out.mask == IGNORE)
        assert bars.any()
        assert (out.mask[:, :3] == IGNORE).all() or (out.mask[:3] == IGNORE).all()
        assert out.instance_masks is not None and out.instance_masks[:, bars].max() == 0


def test_resize_maps_continuous_edges_by_the_ratio_of_integer_sizes():
    """x_out = x_in * W_out / W_in for box edges, with the kernel's own rounded size."""
    image = np.zeros((30, 41, 3), np.uint8)
    targets = Targets(boxes=[[4.0, 3.0, 20.0, 10.0]], keypoints=[[[4.5, 3.5, 2]]])
    chain = transforms.parse([{"resize": {"shorter_side": 20}}])
    out_image, out = chain.apply(image, targets, min_visibility=0.0)
    # 41 * 20 / 30 = 27.33 -> 27 columns: the x scale is 27/41, not 20/30.
    assert out_image.shape[:2] == (20, 27)
    np.testing.assert_allclose(out.boxes, [[4 * 27 / 41, 2.0, 20 * 27 / 41, 20 / 3]])
    np.testing.assert_allclose(out.keypoints, [[[4.5 * 27 / 41, 3.5 * 2 / 3, 2]]])


def test_center_crop_shifts_by_the_kernels_integer_offsets():
    image = np.zeros((11, 10, 1), np.uint8)
    # Margins 11-4=7 (3 above, 4 below) and 10-5=5 (2 left, 3 right).
    targets = Targets(boxes=[[2.0, 3.0, 7.0, 7.0]])
    _, out = transforms.parse([{"center_crop": {"size": [4, 5]}}]).apply(
        image, targets, min_visibility=0.0
    )
    np.testing.assert_array_equal(out.boxes, [[0.0, 0.0, 5.0, 4.0]])


# --- EXIF orientation ----------------------------------------------------------------------


def pillow_png_with_orientation(image: np.ndarray, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "PNG", exif=exif.tobytes())
    return buffer.getvalue()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_targets_follow_exif_orientation(orientation):
    scene = draw_scene(96, 120, seed=orientation)
    data = pillow_png_with_orientation(scene.image, orientation)
    decoded = transforms.decode_with_orientation(data)
    assert decoded.orientation == orientation
    # Pillow's own reading of the tag, independent of kiln's.
    upright = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    np.testing.assert_array_equal(decoded.image, upright)
    out = transforms.orient_targets(scene.targets, orientation, 96, 120)
    assert out.dropped_objects == 0 and out.num_objects == 4

    def run(marker: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(transforms.orient(marker, orientation))

    check_follows(scene, decoded.image, out, run)
    # Flips and transposes move masks exactly.
    np.testing.assert_array_equal(
        out.mask, transforms.orient(scene.targets.mask[:, :, None], orientation)[:, :, 0]
    )
    for row in range(4):
        assert box_of(out.instance_masks[row]).tolist() == out.boxes[row].tolist()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_then_a_chain(orientation):
    scene = draw_scene(96, 128, seed=10 + orientation)
    chain = transforms.parse([{"resize": {"shorter_side": 80}}, {"center_crop": {"size": 72}}])
    upright = np.ascontiguousarray(transforms.orient(scene.image, orientation))
    oriented = transforms.orient_targets(scene.targets, orientation, 96, 128)
    image, out = chain.apply(upright, oriented, min_visibility=0.3, mask_fill=IGNORE)
    _, whole = chain.apply(upright, oriented, min_visibility=1.0)

    def run(marker: np.ndarray) -> np.ndarray:
        return chain(np.ascontiguousarray(transforms.orient(marker, orientation)))

    check_follows(scene, image, out, run, whole=whole)


def test_orientation_map_is_checked():
    with pytest.raises(ValueError, match=r"1\.\.8"):
        CoordinateMap.for_orientation(9, 4, 4)
    with pytest.raises(TargetsError, match="masks are 4x4"):
        transforms.orient_targets(
            Targets(boxes=np.zeros((0, 4)), mask=np.zeros((4, 4), np.uint8)), 6, 4, 5
        )


# --- colour transforms: no geometry -------------------------------------------------------


@pytest.mark.parametrize(
    "specs", [["equalize"], [{"to_grayscale": {"keep_channels": True}}], ["equalize", "equalize"]]
)
def test_colour_transforms_leave_targets_alone(specs):
    scene = draw_scene(96, 112, seed=3)
    image, out = transforms.parse(specs).apply(scene.image, scene.targets, min_visibility=0.5)
    assert image.shape == scene.image.shape
    for name in ("boxes", "keypoints", "mask", "instance_masks"):
        np.testing.assert_array_equal(getattr(out, name), getattr(scene.targets, name))
    assert out.dropped_objects == 0


# --- min_visibility --------------------------------------------------------------------


def crop_targets(min_visibility: float) -> Targets:
    """Object 0 keeps 4/9 of its box after center_crop 10 of a 10x20 image, object 1 all."""
    targets = Targets(
        boxes=[[0.0, 0.0, 9.0, 10.0], [8.0, 2.0, 12.0, 6.0]],
        objects={"classes": [3, 5], "iscrowd": [1, 0]},
        keypoints=[[[1.5, 1.5, 2], [9.5, 9.5, 1]], [[9.5, 3.5, 2], [0.0, 0.0, 0]]],
        instance_masks=np.stack(
            [np.pad(np.ones((10, 9), np.uint8), ((0, 0), (0, 11))), np.zeros((10, 20), np.uint8)]
        ),
    )
    _, out = transforms.parse([{"center_crop": {"size": 10}}]).apply(
        np.zeros((10, 20, 3), np.uint8), targets, min_visibility=min_visibility
    )
    return out


def test_min_visibility_drops_and_counts_with_everything_of_the_object():
    out = crop_targets(0.5)
    assert out.dropped_objects == 1
    np.testing.assert_array_equal(out.boxes, [[3.0, 2.0, 7.0, 6.0]])
    np.testing.assert_array_equal(out.objects["classes"], [5])
    np.testing.assert_array_equal(out.objects["iscrowd"], [0])
    np.testing.assert_array_equal(out.keypoints, [[[4.5, 3.5, 2], [0, 0, 0]]])
    assert out.instance_masks is not None and out.instance_masks.shape == (1, 10, 10)


def test_min_visibility_keeps_and_clips_what_is_visible_enough():
    out = crop_targets(0.4)
    assert out.dropped_objects == 0
    np.testing.assert_array_equal(out.boxes, [[0.0, 0.0, 4.0, 10.0], [3.0, 2.0, 7.0, 6.0]])
    # The first keypoint left the image: invisible, coordinates zeroed; the second stayed.
    np.testing.assert_array_equal(out.keypoints[0], [[0, 0, 0], [4.5, 9.5, 1]])
    assert out.instance_masks is not None
    assert box_of(out.instance_masks[0]).tolist() == [0, 0, 4, 10]


def test_a_cut_box_is_tightened_to_what_is_left_of_its_instance_mask():
    """A right triangle (right angle bottom-left) of a 20x20 image, center_crop
    to 20x10 (columns 5..14): what is left is a trapezoid whose top is lower
    than the clipped box's. An uncut box and a box whose mask has no pixel
    keep their boxes."""
    triangle = np.zeros((20, 20), np.uint8)
    cv2.fillPoly(triangle, [np.array([[0, 0], [0, 19], [19, 19]], np.int32)], 1)
    square = np.zeros((20, 20), np.uint8)
    square[8:12, 7:11] = 1
    targets = Targets(
        boxes=[[0.0, 0.0, 20.0, 20.0], [7.0, 8.0, 11.0, 12.0], [2.0, 2.0, 19.0, 4.0]],
        instance_masks=np.stack([triangle, square, np.zeros((20, 20), np.uint8)]),
    )
    _, out = transforms.parse([{"center_crop": {"size": [20, 10]}}]).apply(
        np.zeros((20, 20, 1), np.uint8), targets, min_visibility=0.0
    )
    assert out.instance_masks is not None
    expected = box_of(out.instance_masks[0])
    assert expected is not None and expected[1] == 5.0  # the row where column 5 starts
    np.testing.assert_array_equal(out.boxes[0], expected)
    np.testing.assert_array_equal(out.boxes[1], [2.0, 8.0, 6.0, 12.0])  # uncut: moved only
    np.testing.assert_array_equal(out.boxes[2], [0.0, 2.0, 10.0, 4.0])  # no pixel: clipped


def test_an_object_cut_out_entirely_is_dropped_even_with_min_visibility_zero():
    targets = Targets(boxes=[[0.0, 0.0, 4.0, 4.0], [16.0, 0.0, 20.0, 0.0]])
    _, out = transforms.parse([{"center_crop": {"size": 10}}]).apply(
        np.zeros((10, 20, 1), np.uint8), targets, min_visibility=0.0
    )
    assert out.num_objects == 0 and out.dropped_objects == 2


def test_min_visibility_is_per_step():
    """Two crops keeping 60% each: kept at 0.5 though 36% of the box is left."""
    targets = Targets(boxes=[[0.0, 0.0, 10.0, 10.0]])
    image = np.zeros((10, 10, 1), np.uint8)
    chain = transforms.parse(
        [{"center_crop": {"size": [10, 6]}}, {"center_crop": {"size": [6, 6]}}]
    )
    _, out = chain.apply(image, targets, min_visibility=0.5)
    assert out.num_objects == 1
    np.testing.assert_array_equal(out.boxes, [[0.0, 0.0, 6.0, 6.0]])


def test_boxes_given_partly_outside_the_image_are_clipped_first():
    targets = Targets(
        boxes=[[-5.0, 0.0, 5.0, 4.0], [-9.0, 0.0, 1.0, 4.0]], objects={"classes": [1, 2]}
    )
    _, out = transforms.Chain().apply(np.zeros((8, 8, 1), np.uint8), targets, min_visibility=0.25)
    np.testing.assert_array_equal(out.boxes, [[0.0, 0.0, 5.0, 4.0]])
    assert out.dropped_objects == 1


def test_zero_width_boxes_count_as_visible_inside_the_image():
    targets = Targets(boxes=[[3.0, 1.0, 3.0, 5.0], [3.0, 2.0, 3.0, 2.0]])
    _, out = transforms.parse([{"pad": {"size": 10}}]).apply(
        np.zeros((6, 6, 1), np.uint8), targets, min_visibility=0.9
    )
    np.testing.assert_array_equal(out.boxes, [[5.0, 3.0, 5.0, 7.0], [5.0, 4.0, 5.0, 4.0]])


def test_normalized_forms_for_the_records():
    targets = Targets(boxes=[[2.0, 1.0, 6.0, 4.0]], keypoints=[[[3.0, 2.0, 2], [9.0, 9.0, 0]]])
    np.testing.assert_allclose(targets.normalized_boxes(4, 8), [[0.25, 0.25, 1.0, 0.75]])
    points, visibility = targets.normalized_keypoints(4, 8)
    np.testing.assert_allclose(points, [[[0.5, 0.375], [0.0, 0.0]]])
    np.testing.assert_array_equal(visibility, [[2, 0]])
    assert points.dtype == np.float32 and visibility.dtype == np.int64


# --- Targets validation -------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"boxes": [[0, 0, 1]]}, r"shape \[N, 4\]"),
        ({"boxes": [[2, 0, 1, 1]]}, "x_min <= x_max"),
        ({"boxes": [[0, 0, np.nan, 1]]}, "finite"),
        ({"boxes": [[0, 0, 1, 1]], "objects": {"classes": [1, 2]}}, r"objects\['classes'\]"),
        ({"boxes": [[0, 0, 1, 1]], "keypoints": [[1, 1, 2]]}, r"\[N=1, K, 3\]"),
        ({"boxes": [[0, 0, 1, 1]], "keypoints": [[[1, 1, 3]]]}, "0, 1 or 2"),
        ({"boxes": np.zeros((0, 4)), "mask": np.zeros((2, 2, 1), np.uint8)}, r"\[H, W\]"),
        ({"boxes": np.zeros((0, 4)), "mask": np.full((2, 2), 300)}, "uint8"),
        ({"boxes": np.zeros((0, 4)), "mask": np.full((2, 2), 0.5)}, "uint8"),
        (
            {"boxes": [[0, 0, 1, 1]], "instance_masks": np.zeros((2, 4, 4), np.uint8)},
            r"\[N=1, H, W\]",
        ),
        (
            {
                "boxes": [[0, 0, 1, 1]],
                "mask": np.zeros((4, 4), np.uint8),
                "instance_masks": np.zeros((1, 4, 5), np.uint8),
            },
            "but the mask is 4x4",
        ),
        ({"boxes": np.zeros((0, 4)), "dropped_objects": -1}, "dropped_objects"),
    ],
)
def test_invalid_targets_are_refused(kwargs, message):
    with pytest.raises(TargetsError, match=message):
        Targets(**kwargs)


def test_targets_copy_their_arrays_and_zero_unlabelled_keypoints():
    boxes = np.array([[1.0, 1.0, 2.0, 2.0]])
    targets = Targets(boxes=boxes, keypoints=[[[5.0, 6.0, 0], [7.0, 8.0, 1]]])
    boxes[0, 0] = 0.5
    assert targets.boxes[0, 0] == 1.0
    np.testing.assert_array_equal(targets.keypoints, [[[0, 0, 0], [7, 8, 1]]])
    assert Targets(boxes=[]).boxes.shape == (0, 4)


def test_masks_of_another_size_than_the_image_are_refused():
    targets = Targets(boxes=np.zeros((0, 4)), mask=np.zeros((5, 5), np.uint8))
    with pytest.raises(TargetsError, match=r"masks are 5x5 \(HxW\) but the image is 5x6"):
        transforms.Chain().apply(np.zeros((5, 6, 3), np.uint8), targets, min_visibility=0.1)


def test_no_objects_and_no_masks_pass_through_every_transform():
    chain = transforms.parse([{"resize": {"size": 8}}, {"pad": {"size": 10}}])
    image, out = chain.apply(np.zeros((4, 6, 3), np.uint8), Targets(boxes=[]), min_visibility=0.3)
    assert image.shape == (10, 10, 3) and out.num_objects == 0 and out.dropped_objects == 0


# --- user transforms: declared, undeclared, lying -----------------------------------------


@pytest.fixture
def user_transforms():
    names = []

    def add(name, fn, **kwargs):
        transforms.register(name, **kwargs)(fn)
        names.append(name)

    yield add
    for name in names:
        chain_module.TRANSFORMS.remove(name)


def test_a_transform_without_geometry_is_refused_for_geometric_targets(user_transforms):
    user_transforms("test_sepia", lambda image: image)
    chain = transforms.parse(["equalize", "test_sepia"])
    assert chain.undeclared_geometry() == [(1, "test_sepia")]
    chain.check_geometry(["label", "labels"])  # classification: allowed
    for kind in ("boxes", "mask", "instance_masks", "keypoints"):
        with pytest.raises(
            TransformConfigError,
            match=rf"transforms\[1\]\.test_sepia: .*does not declare how it moves coordinates.*"
            rf"geometry=.*\(the dataset has {kind}\)",
        ):
            chain.check_geometry(["label", kind])
    with pytest.raises(TransformConfigError, match="test_sepia"):
        chain.apply(np.zeros((4, 4, 3), np.uint8), Targets(boxes=[]), min_visibility=0.5)


def test_geometry_none_that_changes_the_size_fails_the_image(user_transforms):
    user_transforms("test_liar", lambda image: image[:2], geometry="none")
    with pytest.raises(TransformError, match="declares geometry 'none' but changed"):
        transforms.parse(["test_liar"]).apply(
            np.zeros((4, 4, 3), np.uint8), Targets(boxes=[]), min_visibility=0.5
        )


def test_a_user_transform_that_returns_no_image_is_named_with_targets_too(user_transforms):
    """On a dataset with targets the chain reads the output's size to check the
    declared geometry: an output that is not an image (None, a list) was an
    AttributeError there, naming nothing."""

    def shift(image, *, step: int = 1):
        return CoordinateMap.scale_translate(height=image.shape[0], width=image.shape[1])

    def as_list(image, *, step: int = 1):
        return [image]

    user_transforms("test_none", lambda image: None, geometry="none")
    user_transforms("test_list", as_list, geometry=shift)
    scene = draw_scene(96, 96, seed=2)
    cases = {
        "test_none": r"transforms\[1\]\.test_none returned a NoneType; a transform returns",
        "test_list": r"transforms\[1\]\.test_list returned a list; a transform returns",
    }
    for name, message in cases.items():
        chain = transforms.parse(["equalize", name])
        with pytest.raises(TransformError, match=message):
            chain.apply(scene.image, scene.targets, min_visibility=0.3)
        with pytest.raises(TransformError, match=message):
            chain(scene.image)


def test_a_geometry_is_checked_when_registered_and_its_refusals_name_the_transform(
    user_transforms,
):
    def flat(image, *, strength: float = 1.0):
        return CoordinateMap.affine([[1, 0, 0], [0, 0, 0]], *image.shape[:2])  # not invertible

    def keep(image, *, strength: float = 1.0):
        return image

    user_transforms("test_flat", keep, geometry=flat)
    scene = draw_scene(96, 96, seed=2)
    with pytest.raises(TransformError, match="test_flat: its geometry: a coordinate map must be"):
        transforms.parse(["test_flat"]).apply(scene.image, scene.targets, min_visibility=0.3)

    def no_strength(image):
        return CoordinateMap.identity(*image.shape[:2])

    with pytest.raises(ValueError, match=r"test_sig: its geometry must take the transform's "):
        transforms.register("test_sig", geometry=no_strength)(keep)
    assert "test_sig" not in transforms.names()


def test_register_refuses_a_geometry_of_the_wrong_kind():
    with pytest.raises(ValueError, match="geometry must be None, 'none' or a function"):
        transforms.register("test_bad", geometry="affine")


def _rotation_matrix(image: np.ndarray, angle: float):
    height, width = image.shape[:2]
    return cv2.getRotationMatrix2D(((width - 1) / 2, (height - 1) / 2), angle, 1.0)


def rotate(image: np.ndarray, *, angle: float = 30.0) -> np.ndarray:
    """A user transform: rotation about the centre, same size (corners cut off)."""
    height, width = image.shape[:2]
    out = cv2.warpAffine(
        image, _rotation_matrix(image, angle), (width, height), flags=cv2.INTER_LINEAR
    )
    return out.reshape(image.shape)


def rotate_geometry(image: np.ndarray, *, angle: float = 30.0) -> CoordinateMap:
    height, width = image.shape[:2]
    return CoordinateMap.from_pixel_index_matrix(
        _rotation_matrix(image, angle).tolist(), height, width
    )


@pytest.mark.parametrize(
    "kind", ["mirror", "upside_down", "half_turn", "quarter_turn", "quarter_turn_back"]
)
def test_a_pixel_index_matrix_moves_targets_onto_the_pixels_opencv_moves(kind):
    """`CoordinateMap.from_pixel_index_matrix` of an OpenCV matrix that moves whole
    pixels: the mask comes out as `cv2.warpAffine` moves it, pixel for pixel, and
    a pixel's box and centre land on the pixel it moved to (docs/transforms.md's
    rotate example builds its geometry this way)."""
    height, width = (12, 12) if "quarter" in kind else (10, 17)
    centre = ((width - 1) / 2, (height - 1) / 2)
    matrix = {
        "mirror": np.array([[-1.0, 0, width - 1], [0, 1, 0]]),
        "upside_down": np.array([[1.0, 0, 0], [0, -1, height - 1]]),
        "half_turn": cv2.getRotationMatrix2D(centre, 180, 1.0),
        "quarter_turn": cv2.getRotationMatrix2D(centre, 90, 1.0),
        "quarter_turn_back": cv2.getRotationMatrix2D(centre, -90, 1.0),
    }[kind]
    mask = np.random.default_rng(3).integers(0, 5, (height, width), dtype=np.uint8)
    coordinate_map = CoordinateMap.from_pixel_index_matrix(matrix.tolist(), height, width)

    moved = cv2.warpAffine(mask, matrix, (width, height), flags=cv2.INTER_NEAREST)
    np.testing.assert_array_equal(coordinate_map.warp_mask(mask), moved)
    for row, col in [(0, 0), (2, 5), (height - 1, 3)]:
        marker = np.zeros_like(mask)
        marker[row, col] = 1
        (to_row,), (to_col,) = np.nonzero(
            cv2.warpAffine(marker, matrix, (width, height), flags=cv2.INTER_NEAREST)
        )
        np.testing.assert_allclose(
            coordinate_map.map_boxes(np.array([[col, row, col + 1, row + 1]])),
            [[to_col, to_row, to_col + 1, to_row + 1]],
            atol=1e-9,
        )
        np.testing.assert_allclose(
            coordinate_map.map_points(np.array([[col + 0.5, row + 0.5]])),
            [[to_col + 0.5, to_row + 0.5]],
            atol=1e-9,
        )


def test_a_map_that_mirrors_swaps_the_keypoints_of_each_flip_pair():
    keypoints = np.array([[[2.5, 3.5, 2], [7.5, 3.5, 1], [5.0, 8.0, 2]]])
    targets = Targets(boxes=[[1, 1, 9, 9]], keypoints=keypoints, mirror_order=(1, 0, 2))
    mirror = CoordinateMap.affine([[-1, 0, 10], [0, 1, 0]], 10, 10)
    turn = CoordinateMap.affine([[0, -1, 10], [1, 0, 0]], 10, 10)  # a quarter turn

    mirrored = targets.mapped(mirror, min_visibility=0.0).keypoints
    # Point 0 (left) takes point 1's place mirrored, and the other way round.
    np.testing.assert_array_equal(mirrored, [[[2.5, 3.5, 1], [7.5, 3.5, 2], [5.0, 8.0, 2]]])
    assert mirror.mirrors and not turn.mirrors
    turned = targets.mapped(turn, min_visibility=0.0).keypoints
    np.testing.assert_array_equal(turned[0, :, :2], turn.map_points(keypoints[0, :, :2]))
    # Twice mirrored is no mirror: the names are back.
    twice = targets.mapped(mirror, min_visibility=0.0).mapped(mirror, min_visibility=0.0)
    np.testing.assert_array_equal(twice.keypoints, keypoints)
    assert twice.mirror_order == (1, 0, 2)
    with pytest.raises(TargetsError, match="mirror_order must be an order of the 3 keypoints"):
        Targets(boxes=[[1, 1, 9, 9]], keypoints=keypoints, mirror_order=(0, 0, 2))


@pytest.mark.parametrize("angle", [90.0, 30.0, -45.0])
def test_a_user_transform_with_an_affine_geometry(user_transforms, angle):
    user_transforms("test_rotate", rotate, geometry=rotate_geometry)
    scene = draw_scene(100, 100, seed=5)
    chain = transforms.parse([{"test_rotate": {"angle": angle}}])
    chain.check_geometry(["boxes", "mask"])
    image, out = chain.apply(scene.image, scene.targets, min_visibility=0.3, mask_fill=IGNORE)
    assert out.mask is not None and out.instance_masks is not None
    assert set(np.unique(out.mask)) <= {0, 1, 2, 3, 4, IGNORE}
    for row, cls in enumerate(out.objects["classes"]):
        shown = pixels_of(image, int(cls) - 1)
        assert mask_iou(out.instance_masks[row] == 1, shown) >= 0.85
        mask_box = box_of(out.instance_masks[row])
        box = out.boxes[row]
        # A turned box is tightened to the rotated mask's pixels (the enclosing
        # box of the rotated corners of an ellipse or a house is not tight).
        np.testing.assert_allclose(box, mask_box, atol=1.0)
        assert iou(box, box_of(shown)) >= 0.9


def test_coordinate_map_composition_and_checks():
    scale = CoordinateMap.scale_translate(height=20, width=40, scale_x=2.0, scale_y=2.0)
    shift = CoordinateMap.scale_translate(height=25, width=40, shift_y=5.0)
    both = scale.then(shift)
    assert both.size == (25, 40)
    np.testing.assert_array_equal(both.map_points(np.array([[1.0, 1.0]])), [[2.0, 7.0]])
    with pytest.raises(ValueError, match="invertible"):
        CoordinateMap((0, 0, 0, 0, 1, 0), 4, 4)
    with pytest.raises(ValueError, match="positive int"):
        CoordinateMap.identity(0, 4)


def reference_warp(mask: np.ndarray, coordinate_map: CoordinateMap, fill: int) -> np.ndarray:
    """Nearest-neighbour resampling written out pixel by pixel: each output pixel's centre,
    mapped back by the inverse matrix, floored, read or filled."""
    xx, xy, x0, yx, yy, y0 = coordinate_map.matrix
    inverse = np.linalg.inv(np.array([[xx, xy], [yx, yy]]))
    out = np.full(coordinate_map.size, fill, np.uint8)
    for v in range(coordinate_map.height):
        for u in range(coordinate_map.width):
            x, y = inverse @ np.array([u + 0.5 - x0, v + 0.5 - y0])
            col, row = math.floor(x), math.floor(y)
            if 0 <= row < mask.shape[0] and 0 <= col < mask.shape[1]:
                out[v, u] = mask[row, col]
    return out


@pytest.mark.parametrize("seed", range(12))
def test_masks_are_resampled_at_output_pixel_centres(seed):
    rng = np.random.default_rng(seed)
    mask = rng.integers(0, 6, (int(rng.integers(3, 20)), int(rng.integers(3, 20))), np.uint8)
    height, width = int(rng.integers(2, 25)), int(rng.integers(2, 25))
    # Scales that are not exact binary fractions, signs for flips, shifts that are not
    # whole pixels, and a swap of the axes for transposes.
    scale_x, scale_y = rng.choice([-1, 1], 2) * rng.uniform(0.3, 3.0, 2)
    shift_x, shift_y = rng.uniform(-10, 30, 2)
    if seed % 2:
        matrix = (0.0, scale_x, shift_x, scale_y, 0.0, shift_y)
    else:
        matrix = (scale_x, 0.0, shift_x, 0.0, scale_y, shift_y)
    coordinate_map = CoordinateMap(matrix, height, width)
    expected = reference_warp(mask, coordinate_map, fill=250)
    np.testing.assert_array_equal(coordinate_map.warp_mask(mask, fill=250), expected)
    stacked = coordinate_map.warp_masks(np.stack([mask, mask[::-1, ::-1].copy()]), fill=250)
    np.testing.assert_array_equal(stacked[0], expected)
    np.testing.assert_array_equal(
        stacked[1], reference_warp(mask[::-1, ::-1], coordinate_map, fill=250)
    )


def test_rotated_masks_are_resampled_at_output_pixel_centres():
    rng = np.random.default_rng(0)
    mask = rng.integers(0, 6, (30, 40), np.uint8)
    angle = np.deg2rad(30)
    matrix = (np.cos(angle), -np.sin(angle), 15.0, np.sin(angle), np.cos(angle), -5.0)
    coordinate_map = CoordinateMap(matrix, 45, 50)
    ours = coordinate_map.warp_mask(mask, fill=250)
    # OpenCV rounds the mapped position to 1/1024 pixel: a few centres that fall
    # within that of a pixel edge may read the neighbour.
    assert (ours != reference_warp(mask, coordinate_map, fill=250)).mean() < 0.01
    assert set(np.unique(ours)) <= set(np.unique(mask)) | {250}


# --- COCO polygons and RLE ----------------------------------------------------------------


def random_polygon(rng: np.random.Generator, height: int, width: int) -> list[float]:
    """A star-shaped polygon around a random centre, some of it possibly outside the image."""
    count = int(rng.integers(3, 14))
    angles = np.sort(rng.uniform(0, 2 * np.pi, count))
    radii = rng.uniform(3, min(height, width) / 2, count)
    cx, cy = rng.uniform(0, width), rng.uniform(0, height)
    points = np.stack([cx + radii * np.cos(angles), cy + radii * np.sin(angles)], axis=1)
    return points.ravel().tolist()


def test_polygons_rasterize_like_pycocotools():
    rng = np.random.default_rng(0)
    ious, added, missing = [], [], []
    for _ in range(300):
        height, width = int(rng.integers(20, 200)), int(rng.integers(20, 200))
        polygons = [random_polygon(rng, height, width) for _ in range(int(rng.integers(1, 3)))]
        ours = transforms.polygons_to_mask(polygons, height, width)
        reference = mask_api.decode(mask_api.merge(mask_api.frPyObjects(polygons, height, width)))
        if reference.sum() < 50:
            continue
        ious.append(mask_iou(ours == 1, reference == 1))
        added.append(int((ours > reference).sum()))
        missing.append(int((ours < reference).sum()))
    # Measured on these 300: mean IoU 0.987, worst 0.88 (a thin sliver), about 9
    # boundary pixels of 1300 differ on average, as many added as missing.
    assert np.mean(ious) >= 0.98, np.mean(ious)
    assert min(ious) >= 0.85, min(ious)
    assert abs(np.mean(added) - np.mean(missing)) <= 1.0


def test_axis_aligned_polygons_rasterize_exactly_like_pycocotools():
    for polygon in (
        [1, 1, 5, 1, 5, 4, 1, 4],
        [0, 0, 8, 0, 8, 8, 0, 8],
        [2.2, 1.7, 6.6, 1.7, 6.6, 7.4, 2.2, 7.4],
    ):
        ours = transforms.polygons_to_mask([polygon], 8, 8)
        reference = mask_api.decode(mask_api.frPyObjects([polygon], 8, 8))[:, :, 0]
        np.testing.assert_array_equal(ours, reference)


@pytest.mark.parametrize(
    "polygons, message",
    [
        ([], "non-empty list"),
        ([[1, 1, 5, 1]], "2 point.*at least 3"),
        ([[1, 1, 5, 1, 5]], "odd number"),
        ([[1, 1, 5, 1, 5, float("nan")]], "NaN or infinite"),
        ([[1, 1, 5, 1, 5, "x"]], "only numbers"),
        ("1 2 3", "non-empty list"),
    ],
)
def test_bad_polygons_are_refused(polygons, message):
    with pytest.raises(SegmentationError, match=message):
        transforms.polygons_to_mask(polygons, 8, 8)


def test_polygon_far_outside_the_image_is_cut_off():
    mask = transforms.polygons_to_mask([[-1e12, -1e12, 4, -1e12, 4, 4, -1e12, 4]], 6, 6)
    expected = np.zeros((6, 6), np.uint8)
    expected[:4, :4] = 1
    np.testing.assert_array_equal(mask, expected)


def test_rle_decodes_compressed_and_uncompressed_like_pycocotools():
    rng = np.random.default_rng(1)
    for _ in range(20):
        height, width = int(rng.integers(1, 60)), int(rng.integers(1, 60))
        mask = (rng.random((height, width)) < rng.random()).astype(np.uint8)
        encoded = mask_api.encode(np.asfortranarray(mask))
        for counts in (encoded["counts"], encoded["counts"].decode("ascii")):
            decoded = transforms.rle_to_mask(
                {"size": [height, width], "counts": counts}, height, width
            )
            np.testing.assert_array_equal(decoded, mask)
        runs = np.diff(
            np.flatnonzero(np.diff(np.r_[-1, mask.ravel(order="F").astype(int), -1]) != 0)
        ).tolist()
        if mask.ravel(order="F")[0] == 1:
            runs = [0, *runs]
        decoded = transforms.segmentation_to_mask(
            {"size": [height, width], "counts": runs}, height, width
        )
        np.testing.assert_array_equal(decoded, mask)


@pytest.mark.parametrize(
    "rle, message",
    [
        ({"size": [4, 4]}, "RLE segmentation must be"),
        ({"size": [4, 5], "counts": [20]}, r"RLE size is 4x5 \(HxW\) but the image is 4x4"),
        ({"size": [4, 4], "counts": [10, 10]}, "add up to 20, not height \\* width = 16"),
        ({"size": [4, 4], "counts": [10, -1, 7]}, "integers >= 0"),
        ({"size": [4, 4], "counts": "0"}, "add up to 0"),
        ({"size": [4, 4], "counts": "`"}, "truncated"),  # continuation bit on the last character
        ({"size": [4, 4], "counts": "~"}, "outside COCO's alphabet"),
        ({"size": [4, 4], "counts": "ooooooo0"}, "too long"),
        ({"size": [4, 4], "counts": "@"}, "negative"),
        ({"size": [4, 4], "counts": 16}, "string or a list"),
    ],
)
def test_bad_rle_is_refused_before_pycocotools_sees_it(rle, message):
    with pytest.raises(SegmentationError, match=message):
        transforms.rle_to_mask(rle, 4, 4)
