"""The reader on a real detection + segmentation build: targets follow every augmentation.

The dataset is written by `kiln build` from a JSONL manifest of scenes
(`scenes.scene`: filled rectangles with exactly known boxes, class mask,
instance masks and keypoint markers), so these tests read what users get.
Every check recovers the objects from the augmented pixels alone; the
geometric ops resample with nearest-neighbour, so those pixels are exact
(see test_reader_targets_ops.py), and colour ops, which would change the
colours the checks read objects by, are tested apart.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import kiln.reader
import targets_data
from kiln.reader.targets import TargetError
from reader import scene_records, scenes

pytestmark = pytest.mark.usefixtures("no_global_seed")

NUM_SCENES = 8
TARGETS = {
    "boxes": {"min_visibility": 0.25},
    "mask": {"ignore_value": 255},
    "instance_masks": {},
    "keypoints": {"names": list(scenes.KEYPOINT_NAMES), "flip_pairs": [["left", "right"]]},
}
STORED_AUGMENT = [
    {"random_resized_crop": {"size": 48, "scale_range": [0.4, 1.0], "method": "nearest"}},
    "random_flip_left_right",
]
LISTS = {
    "stored": "default",
    "geometry": [
        {"random_resized_crop": {"size": 56, "scale_range": [0.5, 1.0], "method": "nearest"}},
        "random_flip_left_right",
        {"random_rotation": {"angle_range": [-25, 25], "interpolation": "nearest"}},
        "random_flip_up_down",
        {"random_zoom": {"factor_range": [0.8, 1.25], "interpolation": "nearest"}},
    ],
    "crop": [{"random_crop": {"size": 40}}, {"random_brightness": {"max_delta": 0.2}}],
}


@pytest.fixture(scope="session")
def scenes_dataset(tmp_path_factory):
    """The scenes built by `kiln build` from a JSONL manifest: PNG, 64x64, train
    only, 2 shards, STORED_AUGMENT stored."""
    root = str(tmp_path_factory.mktemp("scenes"))
    return scene_records.build_scenes(root, TARGETS, STORED_AUGMENT, count=NUM_SCENES)


def elements(dataset) -> list[tuple[np.ndarray, dict]]:
    """Unbatched ``(image, targets)`` pairs as NumPy."""
    return [
        (image.numpy(), {name: value.numpy() for name, value in targets.items()})
        for image, targets in dataset
    ]


def unbatch(images, targets) -> list[tuple[np.ndarray, dict]]:
    """Per element ``(image, targets)`` of a batch (ragged rows become dense arrays)."""
    out = []
    for index in range(int(images.shape[0])):
        one = {}
        for name, value in targets.items():
            row = value[index]
            one[name] = row.numpy() if hasattr(row, "numpy") else np.asarray(row)
        out.append((images[index].numpy(), one))
    return out


def test_stored_targets_are_the_scenes(scenes_dataset):
    stored = elements(
        kiln.reader.load(scenes_dataset.dataset_dir, batch_size=None, augment=None, shuffle=False)
    )
    assert len(stored) == NUM_SCENES
    for image, targets in stored:
        assert not scenes.check_element(image, targets)
        assert targets["boxes"].shape == (3, 4)
        assert targets["instance_masks"].shape == (3, 64, 64, 1)


@pytest.mark.parametrize("name", sorted(LISTS))
def test_targets_follow_the_pixels_for_many_seeds(scenes_dataset, name):
    dataset = kiln.reader.load(
        scenes_dataset.dataset_dir, batch_size=None, seed=11, repeat=4, augment=LISTS[name]
    )
    seen = 0
    for index, (image, targets) in enumerate(elements(dataset)):
        # "geometry" resamples more than once: see check_element.
        problems = scenes.check_element(image, targets, iou_side=40 if name == "geometry" else 0)
        assert not problems, f"{name}, element {index}: {problems}"
        seen += 1
    assert seen == 4 * NUM_SCENES


@pytest.fixture(scope="session")
def triangles_dataset(tmp_path_factory):
    """Four images of one right triangle each (right angle bottom-left, of
    class "blue"), with its instance mask, built by `kiln build`: a crop
    through a triangle leaves a piece whose box is smaller than the clipped
    box on a side the crop did not cut."""
    import json
    import os

    import cv2

    from kiln.pipeline import build

    root = str(tmp_path_factory.mktemp("triangles"))
    source = os.path.join(root, "source")
    os.makedirs(source)
    lines = []
    for index in range(4):
        shape = np.zeros((64, 64), np.uint8)
        left, top = 4 + index, 3 + index
        corners = np.array([[left, top], [left, 60], [left + 54, 60]], np.int32)
        cv2.fillPoly(shape, [corners], 1)
        image = np.zeros((64, 64, 3), np.uint8)
        image[shape == 1] = scenes.OBJECT_COLOURS[1]
        for name, array in ((f"t{index}.png", image), (f"t{index}_mask.png", shape)):
            cv2.imwrite(os.path.join(source, name), array[..., ::-1] if array.ndim == 3 else array)
        rows, cols = np.nonzero(shape)
        box = [int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1]
        objects = [{"bbox": box, "class": "blue", "mask": f"t{index}_mask.png"}]
        lines.append(json.dumps({"path": f"t{index}.png", "objects": objects}))
    with open(os.path.join(source, "manifest.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    config = {
        "name": "triangles",
        "source": {
            "type": "manifest",
            "path": os.path.join(source, "manifest.jsonl"),
            "classes": list(scenes.CLASSES),
        },
        "output": os.path.join(root, "datasets"),
        "encoding": {"format": "png"},
        "splits": {"fractions": {"train": 1.0}},
        "sharding": {"num_shards": 1},
        "targets": {"boxes": {"min_visibility": 0.0}, "instance_masks": {}},
    }
    return build(config, [])


@pytest.mark.parametrize(
    "augment",
    [
        [{"random_crop": {"size": 36}}, "random_flip_left_right"],
        [
            {"random_rotation": {"angle_range": [-10, 10], "interpolation": "nearest"}},
            {"random_crop": {"size": 40}},
        ],
        [{"random_resized_crop": {"size": 48, "scale_range": [0.2, 0.5], "method": "nearest"}}],
    ],
    ids=["leading_crop", "crop_after_rotation", "resized_crop"],
)
def test_a_box_the_crop_cuts_is_tightened_to_its_instance_mask(triangles_dataset, augment):
    """Every edge of a cut triangle's box lies on its pixels (and its moved
    instance mask's), on the data path and in the model layer alike (padded
    to static shapes there, as on a TPU)."""
    path = triangles_dataset.dataset_dir
    kwargs = {"batch_size": 4, "seed": 3, "repeat": 8, "augment": augment}
    checked = tightened = 0
    data = kiln.reader.load(path, **kwargs)
    model_dataset, layer = kiln.reader.load_for_model(path, max_objects=2, **kwargs)
    step = tf.function(lambda inputs, targets: layer(dict(inputs, targets=targets), training=True))
    for (images, targets), (inputs, raw) in zip(data, model_dataset, strict=True):
        _, layer_targets = step(inputs, raw)
        counts = layer_targets["num_objects"].numpy()
        np.testing.assert_array_equal(counts, targets["boxes"].row_lengths().numpy())
        padded = layer_targets["boxes"].numpy()
        np.testing.assert_allclose(
            np.concatenate([padded[i, :n] for i, n in enumerate(counts)]),
            targets["boxes"].flat_values.numpy(),
        )
        for image, moved in unbatch(images, targets):
            assert not scenes.check_element(image, moved), moved["boxes"]
            checked += len(moved["boxes"])
            for box in moved["boxes"]:
                # Cut through the slope: the top is below the crop's top edge.
                tightened += bool(box[0] > 0.05 and box[1] == 0.0)
    assert checked >= 24 and tightened >= 3, (checked, tightened)


def test_cutmix_tightens_a_pasted_box_the_rectangle_cuts(triangles_dataset):
    """A partner's triangle cut by the pasted rectangle: its box is its
    pasted mask's (an element's own objects keep their boxes: their extent
    did not change, only what shows of it)."""
    kwargs = {"batch_size": 4, "seed": 7, "repeat": 8, "augment": ["cutmix"]}
    pasted = 0
    for images, targets in kiln.reader.load(triangles_dataset.dataset_dir, **kwargs):
        for image, moved in unbatch(images, targets):
            height, width = image.shape[:2]
            scale = np.array([height, width, height, width])
            for row, (box, mask) in enumerate(
                zip(moved["boxes"], moved["instance_masks"], strict=True)
            ):
                reference = scenes.pixel_box(mask[..., 0] > 0)
                if reference is None:  # an own triangle the rectangle hides, not its box
                    continue
                if row == len(moved["boxes"]) - 1 and len(moved["boxes"]) == 2:  # the partner's
                    off = np.abs(box - reference) * scale
                    assert np.all(off <= scenes.EDGE_PX), (box, reference)
                    pasted += 1
                else:  # encloses what shows of it
                    assert np.all(box[:2] <= reference[:2] + 1e-6)
                    assert np.all(box[2:] >= reference[2:] - 1e-6)
    assert pasted >= 4, pasted


# None: ragged objects. 5: padded to static shapes (more than any scene has,
# so none is cut before the augmentation: see load_for_model).
@pytest.mark.parametrize("max_objects", [None, 5])
def test_model_layer_moves_targets_exactly_as_the_data_path(scenes_dataset, max_objects):
    augment = LISTS["geometry"]
    kwargs = {"batch_size": 4, "seed": 5, "augment": augment, "max_objects": max_objects}
    data = kiln.reader.load(scenes_dataset.dataset_dir, **kwargs)
    model_dataset, layer = kiln.reader.load_for_model(scenes_dataset.dataset_dir, **kwargs)
    step = tf.function(lambda inputs, targets: layer(dict(inputs, targets=targets), training=True))
    compared = counts_moved = 0
    for (images, targets), (inputs, raw) in zip(data, model_dataset, strict=True):
        layer_images, layer_targets = step(inputs, raw)
        np.testing.assert_allclose(layer_images.numpy(), images.numpy(), atol=1e-6)
        assert sorted(layer_targets) == sorted(targets)
        if max_objects is not None:
            counts_moved += int((targets["num_objects"].numpy() < raw["num_objects"].numpy()).any())
        scene_records.assert_same_targets(targets, layer_targets)
        for image, moved in unbatch(layer_images, layer_targets):
            assert not scenes.check_element(image, moved, iou_side=40)
        compared += 1
    assert compared == 2
    # Some objects left the crops (their count moved), so the layer was
    # compared on dropping objects too.
    assert max_objects is None or counts_moved >= 1


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("max_objects", [None, 5])
def test_model_layer_gives_targets_the_static_shapes_of_load(scenes_dataset, max_objects, training):
    """Inside a traced step the layer's targets have the shapes `load` gives:
    the inner dims of boxes and keypoints, and the output size of instance
    masks, are known, so code written against `load` (``tf.unstack(boxes,
    axis=-1)``) runs on the layer's output too."""
    kwargs = {
        "batch_size": 4,
        "seed": 5,
        "augment": LISTS["geometry"],
        "max_objects": max_objects,
        "drop_remainder": True,
    }
    data = kiln.reader.load(scenes_dataset.dataset_dir, **kwargs)
    model_dataset, layer = kiln.reader.load_for_model(scenes_dataset.dataset_dir, **kwargs)

    @tf.function
    def step(inputs, targets):
        images, moved = layer(dict(inputs, targets=targets), training=training)
        boxes = moved["boxes"]
        flat = boxes.flat_values if isinstance(boxes, tf.RaggedTensor) else boxes
        top, left, bottom, right = tf.unstack(flat, axis=-1)
        return images, moved, bottom - top

    images, moved, _ = step.get_concrete_function(*model_dataset.element_spec).structured_outputs
    image_spec, target_specs = data.element_spec
    assert images.shape.as_list() == image_spec.shape.as_list() == [4, 56, 56, 3]
    assert sorted(moved) == sorted(target_specs)
    shapes = {name: value.shape.as_list() for name, value in moved.items()}
    assert shapes == {name: spec.shape.as_list() for name, spec in target_specs.items()}
    objects = max_objects  # None: ragged
    assert shapes["boxes"] == [4, objects, 4]
    assert shapes["instance_masks"] == [4, objects, 56, 56, 1]
    assert shapes["keypoints"] == [4, objects, len(scenes.KEYPOINT_NAMES), 2]


def test_model_layer_refuses_targets_beside_the_image(scenes_dataset):
    """The flat dict of ``as_supervised=False`` carries the targets beside the
    image: the layer, which would return only the image moved, refuses it and
    says how to pass them; passed that way they move as `load` moves them."""
    kwargs = {"batch_size": 4, "seed": 5, "augment": LISTS["geometry"], "as_supervised": False}
    model_dataset, layer = kiln.reader.load_for_model(scenes_dataset.dataset_dir, **kwargs)
    flat = next(iter(model_dataset))
    for training in (True, False):
        with pytest.raises(ValueError, match=r"carry the targets \['boxes', 'classes'") as error:
            layer(flat, training=training)
        assert "'targets': {name: d[name] for name in ['boxes'" in str(error.value)
        assert "as_supervised=True" in str(error.value)
    names = ["boxes", "classes", "keypoints", "keypoint_visibility", "mask", "instance_masks"]
    images, moved = layer(
        {
            "image": flat["image"],
            "augment_seed": flat["augment_seed"],
            "targets": {name: flat[name] for name in names},
        },
        training=True,
    )
    expected = next(iter(kiln.reader.load(scenes_dataset.dataset_dir, **kwargs)))
    np.testing.assert_allclose(images.numpy(), expected["image"].numpy(), atol=1e-6)
    for name in names:
        actual, wanted = moved[name], expected[name]
        if isinstance(wanted, tf.RaggedTensor):
            actual, wanted = actual.flat_values, wanted.flat_values
        np.testing.assert_allclose(actual.numpy(), wanted.numpy(), atol=1e-6, err_msg=name)


def test_model_layer_refuses_targets_the_dataset_does_not_declare(scenes_dataset, png_dataset):
    """A target the layer does not know would come back as it went in, beside
    images it cropped and flipped: a mask for a classification dataset, a
    misspelt name on a detection one."""
    dataset, layer = kiln.reader.load_for_model(png_dataset.dataset_dir, batch_size=4, seed=1)
    inputs, labels = next(iter(dataset))
    mask = tf.zeros([4, 32, 32, 1], tf.uint8)
    with pytest.raises(
        ValueError,
        match=r"AugmentationLayer: the targets \['mask'\] are not among this dataset's "
        r"targets \['label'\] \(kiln.json targets\); the layer moves only those",
    ):
        layer({**inputs, "targets": {"label": labels, "mask": mask}}, training=True)
    images, passed = layer({**inputs, "targets": {"label": labels}}, training=True)
    np.testing.assert_array_equal(passed["label"].numpy(), labels.numpy())

    kwargs = {"batch_size": 4, "seed": 5, "augment": LISTS["geometry"]}
    dataset, layer = kiln.reader.load_for_model(scenes_dataset.dataset_dir, **kwargs)
    inputs, targets = next(iter(dataset))
    misspelt = dict(targets, masks=targets.pop("mask"))
    for training in (True, False):
        with pytest.raises(ValueError, match=r"the targets \['masks'\] are not among"):
            layer({**inputs, "targets": misspelt}, training=training)


def test_model_layer_refuses_padded_objects_without_num_objects(scenes_dataset):
    """``load_for_model(max_objects=M)`` pads each element's objects to M rows:
    without ``num_objects`` the layer cannot tell padding from objects (it
    moved the padding rows as objects of class -1)."""
    kwargs = {"batch_size": 4, "seed": 5, "augment": ["random_flip_left_right"]}
    dataset, layer = kiln.reader.load_for_model(scenes_dataset.dataset_dir, max_objects=5, **kwargs)
    inputs, targets = next(iter(dataset))
    assert int(tf.reduce_min(targets["num_objects"])) < 5  # padding rows present
    without_count = {name: value for name, value in targets.items() if name != "num_objects"}
    for training in (True, False):
        with pytest.raises(
            ValueError,
            match=r"AugmentationLayer: the targets \['boxes', 'classes', 'keypoints', "
            r"'keypoint_visibility', 'instance_masks'\] are padded .* but 'num_objects' is "
            r"missing",
        ):
            layer({**inputs, "targets": without_count}, training=training)
    # Ragged targets (no max_objects) need no count.
    dataset, layer = kiln.reader.load_for_model(scenes_dataset.dataset_dir, **kwargs)
    inputs, targets = next(iter(dataset))
    assert "num_objects" not in targets
    layer({**inputs, "targets": targets}, training=True)


def test_model_layer_refuses_some_of_the_columns_that_move_objects_together(scenes_dataset):
    """Which objects a move keeps is decided by their boxes and instance masks
    (to whose pixels the boxes are re-fitted); keypoints move with their
    visibility. Given part of them, the layer moved other boxes than `load`
    (or failed with a KeyError): it refuses, naming what the columns need;
    the others (classes, keypoints, the class mask) may be left out."""
    augment = [{"random_rotation": {"angle_range": [-40, 40]}}]
    kwargs = {"batch_size": 4, "seed": 1, "augment": augment}
    dataset, layer = kiln.reader.load_for_model(scenes_dataset.dataset_dir, **kwargs)
    inputs, targets = next(iter(dataset))
    refused = {
        ("boxes", "classes"): r"\['boxes', 'instance_masks'\] beside them, missing "
        r"\['instance_masks'\]: which objects a move keeps is decided by their boxes and "
        r"instance masks",
        ("instance_masks",): r"missing \['boxes'\]",
        ("boxes", "instance_masks", "keypoints"): r"need \['boxes', 'keypoints', "
        r"'keypoint_visibility', 'instance_masks'\] beside them, missing "
        r"\['keypoint_visibility'\]: .*keypoints move with their visibility",
    }
    for names, message in refused.items():
        for training in (True, False):
            with pytest.raises(ValueError, match=message):
                layer(
                    {**inputs, "targets": {name: targets[name] for name in names}},
                    training=training,
                )
    _, whole = layer({**inputs, "targets": targets}, training=True)
    names = ("boxes", "instance_masks")
    _, part = layer({**inputs, "targets": {name: targets[name] for name in names}}, training=True)
    assert sorted(part) == sorted(names)
    for name in names:
        assert part[name].to_list() == whole[name].to_list(), name


def test_model_layer_refuses_to_move_images_alone_in_training(scenes_dataset):
    """The README's classification model, ``network(layer(inputs))``, on a
    detection dataset: fit would train on flipped images and unflipped boxes.
    In training the layer refuses images without their targets; outside
    training (predict, serving) it takes images alone."""
    kwargs = {"batch_size": 4, "seed": 5, "augment": LISTS["geometry"]}
    dataset, layer = kiln.reader.load_for_model(scenes_dataset.dataset_dir, **kwargs)
    inputs, targets = next(iter(dataset))
    with pytest.raises(
        ValueError,
        match=r"AugmentationLayer\(training=True\) got images without this dataset's targets "
        r"\['boxes', 'mask', 'instance_masks', 'keypoints'\], and \['random_resized_crop', "
        r"'random_flip_left_right', 'random_rotation', 'random_flip_up_down', 'random_zoom'\] "
        r"move pixels",
    ):
        layer(inputs, training=True)
    assert layer(inputs["image"], training=False).shape == (4, 56, 56, 3)
    images, _ = layer({**inputs, "targets": targets}, training=True)
    assert images.shape == (4, 56, 56, 3)
    # Colour ops move no pixel: images alone are fine then.
    colour = {"batch_size": 4, "seed": 5, "augment": [{"random_brightness": {"max_delta": 0.2}}]}
    dataset, layer = kiln.reader.load_for_model(scenes_dataset.dataset_dir, **colour)
    inputs, _ = next(iter(dataset))
    assert layer(inputs, training=True).shape == (4, 64, 64, 3)


@pytest.fixture(scope="session")
def every_target_dataset(tmp_path_factory):
    """tests/targets_data.py's corpus built with every kind of target: label,
    multi-label ``labels`` (0 to 3 per image), boxes with a field, both masks,
    keypoints and extra columns."""
    from kiln.pipeline import build

    folder = tmp_path_factory.mktemp("every-target")
    manifest, _ = targets_data.corpus(folder, 12)
    config = {
        "name": "every-target",
        # The semantic mask's pixel values are ids into this list.
        "source": {"type": "manifest", "path": manifest, "classes": targets_data.CLASSES},
        "output": str(folder / "datasets"),
        "encoding": {"format": "png"},
        "splits": {"fractions": {"train": 1.0}},
        "targets": targets_data.TARGETS,
    }
    return build(config, [])


@pytest.mark.parametrize("max_objects", [None, 4])
def test_model_layer_passes_per_image_targets_through(every_target_dataset, max_objects):
    """Element ops leave label, labels and extras as read: the layer passes them
    through (a ragged row of labels per image) and moves the rest as `load` does."""
    augment = [{"random_crop": {"size": 40}}, "random_flip_left_right"]
    kwargs = {"batch_size": 4, "seed": 3, "augment": augment, "max_objects": max_objects}
    data = kiln.reader.load(every_target_dataset.dataset_dir, **kwargs)
    model_dataset, layer = kiln.reader.load_for_model(every_target_dataset.dataset_dir, **kwargs)
    compared = 0
    for (images, targets), (inputs, raw) in zip(data, model_dataset, strict=True):
        assert {"label", "labels", "weather"} <= set(raw)
        layer_images, layer_targets = layer(dict(inputs, targets=raw), training=True)
        np.testing.assert_allclose(layer_images.numpy(), images.numpy(), atol=1e-6)
        assert sorted(layer_targets) == sorted(targets)
        for name in sorted(targets):
            expected, actual = targets[name], layer_targets[name]
            if isinstance(expected, tf.RaggedTensor):
                assert actual.to_list() == expected.to_list(), name
            else:
                np.testing.assert_array_equal(actual.numpy(), expected.numpy(), err_msg=name)
        compared += 1
    assert compared == 3


@pytest.fixture(scope="session")
def empty_mask_dataset(tmp_path_factory):
    """64x64 images with a 20x20 square and a 2x2 object whose polygon covers
    no pixel's centre: the build keeps it, with an empty instance mask (as
    COCO's tiniest objects get)."""
    import json

    from kiln.pipeline import build

    folder = tmp_path_factory.mktemp("empty-mask")
    (folder / "images").mkdir()
    image = np.full((64, 64, 3), 40, np.uint8)
    image[30:50, 30:50] = (255, 0, 0)
    image[10:12, 10:12] = (0, 255, 0)
    rows = []
    for index in range(6):
        image[0, 0] = index  # distinct content: not duplicates
        (folder / "images" / f"{index}.png").write_bytes(tf.io.encode_png(image).numpy())
        square = [30, 30, 50, 30, 50, 50, 30, 50]
        speck = [10.1, 10.1, 10.4, 10.1, 10.1, 10.4]
        objects = [
            {"bbox": [30, 30, 50, 50], "class": "square", "segmentation": [square]},
            {"bbox": [10, 10, 12, 12], "class": "speck", "segmentation": [speck]},
        ]
        rows.append(json.dumps({"path": f"images/{index}.png", "objects": objects}) + "\n")
    (folder / "manifest.jsonl").write_text("".join(rows))
    config = {
        "name": "empty-mask",
        "source": {"type": "manifest", "path": str(folder / "manifest.jsonl")},
        "output": str(folder / "datasets"),
        "encoding": {"format": "png"},
        "splits": {"fractions": {"train": 1.0}},
        "targets": {"boxes": {"min_visibility": 0.25}, "instance_masks": {}},
    }
    return build(config, [])


@pytest.mark.parametrize(
    "augment",
    [
        {"random_rotation": {"angle_range": [-2, 2]}},
        {"random_zoom": {"factor_range": [1.0, 1.02]}},
        {"random_erasing": {"probability": 1.0, "erase_targets": True, "scale_range": [0.02, 0.1]}},
    ],
    ids=["rotation", "zoom", "erasing"],
)
def test_an_object_with_an_empty_stored_mask_is_kept_while_its_box_shows(
    empty_mask_dataset, augment
):
    path = empty_mask_dataset.dataset_dir
    stored = elements(kiln.reader.load(path, batch_size=None, augment=None, shuffle=False))
    assert [int(t["instance_masks"][1].sum()) for _, t in stored] == [0] * 6
    dataset = kiln.reader.load(path, batch_size=None, seed=4, repeat=4, augment=[augment])
    speck_shown = 0
    for image, targets in elements(dataset):
        # Not erased: erasing sets all channels to 0, which no other pixel is.
        if (image[9:13, 9:13].max(axis=-1) > 0).all():
            speck_shown += 1
            assert targets["classes"].tolist() == [1, 0], augment
            box = targets["boxes"][1] * 64
            assert np.abs(box - [10, 10, 12, 12]).max() < 1.5, box
    assert speck_shown >= 12


@pytest.fixture(scope="session")
def objects_dataset(tmp_path_factory):
    """The scenes with boxes, keypoints and the class mask, no instance masks:
    a batched read moves their boxes and keypoints once per batch."""
    root = str(tmp_path_factory.mktemp("objects"))
    targets = {name: value for name, value in TARGETS.items() if name != "instance_masks"}
    return scene_records.build_scenes(root, targets, STORED_AUGMENT, count=NUM_SCENES)


@pytest.mark.parametrize("name", ["stored", "crop", "geometry"])
def test_batches_move_objects_exactly_as_single_elements(objects_dataset, name):
    def read(batch_size):
        return kiln.reader.load(
            objects_dataset.dataset_dir,
            batch_size=batch_size,
            seed=13,
            repeat=3,
            augment=LISTS[name],
        )

    singles = elements(read(None))
    batched = [pair for images, targets in read(4) for pair in unbatch(images, targets)]
    assert len(batched) == len(singles) == 3 * NUM_SCENES
    dropped = 0
    for (image, targets), (single_image, single) in zip(batched, singles, strict=True):
        np.testing.assert_array_equal(image, single_image)
        assert sorted(targets) == sorted(single)
        for key, value in targets.items():
            np.testing.assert_array_equal(value, single[key], err_msg=f"{name}: {key}")
        if name != "geometry":  # rotated boxes are tight only with instance masks
            assert not scenes.check_element(image, targets), name
        dropped += 3 - len(targets["boxes"])
    if name == "stored":
        assert dropped > 0  # crops dropped objects: the batch filtered them too


def test_same_seed_same_targets_other_seed_other_targets(scenes_dataset):
    def boxes(seed):
        dataset = kiln.reader.load(scenes_dataset.dataset_dir, batch_size=4, seed=seed)
        return [targets["boxes"].to_list() for _, targets in dataset]

    assert boxes(3) == boxes(3)
    assert boxes(3) != boxes(4)


def test_batches_are_ragged_and_max_objects_makes_them_static(scenes_dataset):
    ragged = kiln.reader.load(scenes_dataset.dataset_dir, batch_size=4, seed=1)
    spec = ragged.element_spec[1]
    assert isinstance(spec["boxes"], tf.RaggedTensorSpec)
    assert spec["mask"].shape.as_list() == [None, 48, 48, 1]
    padded = kiln.reader.load(
        scenes_dataset.dataset_dir, batch_size=4, seed=1, max_objects=5, drop_remainder=True
    )
    images_spec, targets_spec = padded.element_spec
    assert images_spec.shape.as_list() == [4, 48, 48, 3]
    assert targets_spec["boxes"].shape.as_list() == [4, 5, 4]
    assert targets_spec["keypoints"].shape.as_list() == [4, 5, 2, 2]
    assert targets_spec["instance_masks"].shape.as_list() == [4, 5, 48, 48, 1]
    for (_, dense), (_, rows) in zip(padded, ragged, strict=True):
        counts = rows["boxes"].row_lengths().numpy()
        np.testing.assert_array_equal(dense["num_objects"].numpy(), counts)
        for index, count in enumerate(counts):
            np.testing.assert_array_equal(dense["boxes"][index, :count], rows["boxes"][index])
            assert np.all(dense["classes"][index, count:].numpy() == -1)


def test_kiln_json_counts_the_most_objects_and_load_warns_when_max_objects_cuts(
    scenes_dataset, caplog
):
    path = scenes_dataset.dataset_dir
    ragged = kiln.reader.load(path, batch_size=8, shuffle=False, augment=None)
    most = max(int(max(rows["boxes"].row_lengths().numpy(), default=0)) for _, rows in ragged)
    assert most > 1
    assert kiln.reader.info(path).objects["train"].most_objects == most

    with caplog.at_level("WARNING", logger="kiln.reader"):
        kiln.reader.load(path, batch_size=4, seed=0, max_objects=most)
    assert not caplog.records
    with caplog.at_level("WARNING", logger="kiln.reader"):
        kiln.reader.load(path, batch_size=4, seed=0, max_objects=most - 1)
    (record,) = caplog.records
    assert record.getMessage() == (
        f"max_objects={most - 1} cuts objects: images of split 'train' have up to {most} "
        f"(the first {most - 1} are kept); pass max_objects={most} to keep every object"
    )


def test_load_warns_when_max_objects_cuts_what_cutmix_pastes(scenes_dataset, caplog):
    """cutmix pastes a partner's objects into each element: up to twice the
    stored most, which `max_objects` must count (load pads after it)."""
    path = scenes_dataset.dataset_dir
    most = kiln.reader.info(path).objects["train"].most_objects
    kwargs = {"batch_size": 4, "seed": 0, "repeat": 2, "augment": ["cutmix"]}
    pasted = [n for _, t in kiln.reader.load(path, **kwargs) for n in t["boxes"].row_lengths()]
    assert most < max(pasted) <= 2 * most  # what the warning is about

    with caplog.at_level("WARNING", logger="kiln.reader"):
        kiln.reader.load(path, max_objects=most, **kwargs)
    (record,) = caplog.records
    assert record.name == "kiln.reader.dataset"
    assert record.getMessage() == (
        f"max_objects={most} cuts objects: images of split 'train' have up to {most}, and up "
        f"to {2 * most} after cutmix, which pastes objects of another image into each (the "
        f"first {most} are kept); pass max_objects={2 * most} to keep every object"
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="kiln.reader"):
        kiln.reader.load(path, max_objects=2 * most, **kwargs)
        # Without cutmix, or where it does not run (training=False), the stored most is all.
        kiln.reader.load(path, max_objects=most, **dict(kwargs, augment=LISTS["geometry"]))
        kiln.reader.load(path, max_objects=most, training=False, **kwargs)
    assert not caplog.records


def _batch_input(dataset) -> tuple[str, set[str]]:
    """The op that feeds the dataset's batch, and the ops of its function."""
    graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    nodes = {node.name: node for node in graph.node}
    functions = {function.signature.name: function for function in graph.library.function}
    # The output's batch: up the chain of first inputs from the result (the
    # seeds' datasets hold batches of their own).
    (batch,) = [node for node in graph.node if node.op == "_Retval"]
    while batch.op != "BatchDatasetV2":
        batch = nodes[batch.input[0]]
    source = nodes[batch.input[0]]
    function = functions.get(source.attr["f"].func.name) if "f" in source.attr else None
    return source.op, {node.op for node in function.node_def} if function else set()


@pytest.mark.parametrize("fixture", ["scenes_dataset", "objects_dataset"])
def test_the_batch_follows_the_element_map_so_tf_data_fuses_them(fixture, request):
    """tf.data fuses a batch with the map right before it (map_and_batch_fusion):
    the map's threads copy each element into the batch as they make it. The
    element map itself must feed the batch, not a map of ragged_batch's own."""
    dataset_dir = request.getfixturevalue(fixture).dataset_dir
    for kwargs in ({}, {"max_objects": 5, "drop_remainder": True}, {"as_supervised": False}):
        dataset = kiln.reader.load(dataset_dir, batch_size=4, seed=1, **kwargs)
        op, function_ops = _batch_input(dataset)
        assert op == "ParallelMapDatasetV2", kwargs
        assert "DecodePng" in function_ops, kwargs  # the element map: it decodes
        assert "RaggedTensorToVariant" in function_ops, kwargs  # objects vary in number


def test_static_batches_keep_ragged_objects_with_a_static_batch_size(scenes_dataset):
    dataset = kiln.reader.load(
        scenes_dataset.dataset_dir, batch_size=4, seed=1, drop_remainder=True
    )
    images_spec, targets_spec = dataset.element_spec
    assert images_spec.shape.as_list() == [4, 48, 48, 3]
    assert targets_spec["boxes"].shape.as_list() == [4, None, 4]
    assert targets_spec["instance_masks"].shape.as_list() == [4, None, 48, 48, 1]
    for _, targets in dataset:
        assert targets["boxes"].row_splits.shape == (5,)
        assert targets["boxes"].row_splits.dtype == tf.int64
        np.testing.assert_array_equal(
            targets["boxes"].row_lengths(), targets["classes"].row_lengths()
        )


def test_cutmix_mixes_targets_with_the_pixels_and_mixup_is_refused(scenes_dataset):
    dataset = kiln.reader.load(
        scenes_dataset.dataset_dir,
        batch_size=4,
        seed=2,
        augment=[{"random_crop": {"size": 64}}, "cutmix"],
    )
    for images, targets in dataset:
        for image, one in unbatch(images, targets):
            # Own boxes keep their extent while the paste hides part of the
            # object: check the class mask and the keypoints against the pixels.
            one = dict(one, boxes=np.zeros((0, 4)), classes=np.zeros((0,), np.int64))
            del one["instance_masks"]
            assert not scenes.check_element(image, one)
    with pytest.raises(TargetError, match=r"mixup.*'boxes'"):
        kiln.reader.load(scenes_dataset.dataset_dir, batch_size=4, augment=["mixup"])


def test_cutmix_leaves_a_batch_of_one_as_it_is(scenes_dataset):
    """One image has no other to mix with: it comes out as without cutmix, not
    pasted into itself (which doubled each object the rectangle cut)."""

    def read(augment):
        dataset = kiln.reader.load(
            scenes_dataset.dataset_dir,
            batch_size=1,
            seed=3,
            augment=augment,
            as_supervised=False,
        )
        return [{name: value[0] for name, value in batch.items()} for batch in dataset]

    plain = read([{"random_crop": {"size": 64}}])
    mixed = read([{"random_crop": {"size": 64}}, {"cutmix": {"alpha": 1.0}}])
    assert len(mixed) == len(plain) == NUM_SCENES
    for one, other in zip(mixed, plain, strict=True):
        assert one["key"] == other["key"]
        for name in ("image", "boxes", "classes", "instance_masks", "mask", "keypoints"):
            np.testing.assert_array_equal(one[name].numpy(), other[name].numpy(), err_msg=name)


def test_batch_ops_are_checked_against_the_targets_also_where_they_do_not_run(scenes_dataset):
    """Outside training (an evaluation script, a validation split) batch ops do
    not run, but a list that cannot train on the dataset is refused there too."""
    path = scenes_dataset.dataset_dir
    for read in (kiln.reader.load, kiln.reader.load_for_model):
        with pytest.raises(TargetError, match=r"mixup.*'boxes'"):
            read(path, batch_size=4, augment=["mixup"], training=False)
    kiln.reader.load(path, batch_size=4, augment=["cutmix"], training=False)


def test_erase_targets_on_a_dataset_without_targets_to_erase_is_refused(png_dataset):
    """erase_targets on a classification dataset did nothing, silently: a
    config that asks for what cannot happen is refused before any data."""
    erase = {"random_erasing": {"probability": 1.0, "erase_targets": True}}
    with pytest.raises(
        TargetError,
        match=r"^augment\[1\]\.random_erasing: erase_targets: true erases masks, keypoints and "
        r"objects under the rectangle, and this dataset has none \(its targets: \['label'\]\)",
    ):
        kiln.reader.load(
            png_dataset.dataset_dir, batch_size=4, augment=["random_flip_left_right", erase]
        )
    plain = {"random_erasing": {"probability": 1.0}}
    kiln.reader.load(
        png_dataset.dataset_dir, batch_size=4, augment=["random_flip_left_right", plain]
    )


def test_random_erasing_of_zero_area_leaves_image_and_targets_alone(scenes_dataset):
    erase = {"probability": 1.0, "scale_range": [0.0, 0.0], "value": 0.5, "erase_targets": True}
    kwargs = {"batch_size": 4, "seed": 1, "as_supervised": False}
    plain = kiln.reader.load(scenes_dataset.dataset_dir, augment=None, **kwargs)
    erased = kiln.reader.load(
        scenes_dataset.dataset_dir, augment=[{"random_erasing": erase}], **kwargs
    )
    for expected, actual in zip(plain, erased, strict=True):
        for name in ("image", "mask", "instance_masks", "keypoint_visibility", "boxes"):
            wanted, got = expected[name], actual[name]
            if isinstance(wanted, tf.RaggedTensor):
                wanted, got = wanted.flat_values, got.flat_values
            np.testing.assert_array_equal(got.numpy(), wanted.numpy(), err_msg=name)


def test_training_smoke_segmentation_and_box_regression(scenes_dataset):
    train = kiln.reader.load(
        scenes_dataset.dataset_dir, batch_size=4, seed=0, max_objects=4, drop_remainder=True
    )
    segmentation = train.map(lambda image, targets: (image, targets["mask"]))
    inputs = tf.keras.Input([48, 48, 3])
    hidden = tf.keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inputs)
    model = tf.keras.Model(inputs, tf.keras.layers.Conv2D(len(scenes.CLASSES), 1)(hidden))
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(segmentation, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))

    boxes = train.map(lambda image, targets: (image, targets["boxes"][:, 0]))
    regressor = tf.keras.Sequential(
        [
            tf.keras.Input([48, 48, 3]),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(4),
        ]
    )
    regressor.compile("adam", "mse")
    history = regressor.fit(boxes, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))


# sha256 of the scenes' shards: they pin the input, so a failure there means
# the records changed, not the reader.
GOLDEN_SHARDS = {
    "scenes-train.tfrecord-00000-of-00002": (
        "8c9175a43390e743484f8a3d0ec33ada06aea717f28f3ff4193cf3b47cf53222"
    ),
    "scenes-train.tfrecord-00001-of-00002": (
        "bfb14269d1b5715a8ea4455aeb4dfd71e54be2b158b8c396bae3f09cff966ada"
    ),
}
# load(seed=2024, batch_size=4, repeat=2, augment=LISTS["geometry"]): per
# batch the keys, the sum of the boxes, the sum of the class masks, the sum
# of the keypoints and of their visibilities, and each image's classes (an
# object the crop cuts below min_visibility is dropped). If this fails the
# seeded stream of targets changed (see test_reader_golden.py); these values
# are of stream version 8 (which gave every pass a 64-bit identity: every
# seeded stream changed).
KEPT = [1, 2, 3]  # every object kept
GOLDEN_STREAM = [
    (["01", "03", "05", "00"], 23.732142884284258, 246806, 20.277561612427235, 36, [KEPT] * 4),
    (
        ["02", "04", "06", "07"],
        21.642857326194644,
        194077,
        16.719410877674818,
        36,
        [KEPT, KEPT, [1, 2], KEPT],
    ),
    (["05", "07", "01", "02"], 22.910714346915483, 475993, 17.786245971918106, 38, [KEPT] * 4),
    (["00", "06", "03", "04"], 22.607142996042967, 311203, 15.747628062963486, 32, [KEPT] * 4),
]


def test_golden_stream_with_targets(scenes_dataset):
    info = kiln.reader.info(scenes_dataset.dataset_dir)
    assert {s.filename: s.sha256 for s in info.splits["train"].shards} == GOLDEN_SHARDS
    dataset = kiln.reader.load(
        scenes_dataset.dataset_dir,
        batch_size=4,
        seed=2024,
        repeat=2,
        augment=LISTS["geometry"],
        as_supervised=False,
    )
    batches = list(dataset)
    assert len(batches) == len(GOLDEN_STREAM)
    for batch, (keys, boxes, mask, keypoints, visible, classes) in zip(
        batches, GOLDEN_STREAM, strict=True
    ):
        assert [k.decode() for k in batch["key"].numpy()] == [
            f"images/scene_{key}.png" for key in keys
        ]
        assert batch["classes"].to_list() == classes
        flat = batch["boxes"].flat_values.numpy().astype(np.float64)
        # Tolerances allow for float rounding on other CPUs, nothing more.
        assert float(flat.sum()) == pytest.approx(boxes, rel=1e-6)
        assert int(batch["mask"].numpy().astype(np.int64).sum()) == mask
        points = batch["keypoints"].flat_values.numpy().astype(np.float64)
        assert float(points.sum()) == pytest.approx(keypoints, rel=1e-6)
        assert int(batch["keypoint_visibility"].flat_values.numpy().sum()) == visible


def test_max_objects_takes_a_numpy_integer(objects_dataset):
    dataset = kiln.reader.load(
        objects_dataset.dataset_dir,
        batch_size=np.int64(4),
        seed=1,
        max_objects=np.int64(5),
        drop_remainder=True,
    )
    _, targets = dataset.element_spec
    assert targets["boxes"].shape.as_list() == [4, 5, 4]
