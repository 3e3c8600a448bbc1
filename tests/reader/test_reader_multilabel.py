"""The reader on a real multi-label build: stored ``labels`` read back, mixed by mixup and cutmix.

The dataset is written by `kiln build` from a CSV manifest whose ``labels``
column names several classes per image (``cat|dog``, or none). Each image is
one solid colour of its own, so after a batch op the pixels alone say whose
image each pixel came from and how much of it: the mixed labels are checked
against that.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import kiln.reader
from kiln.reader.augmenter import Augmenter
from kiln.reader.ops import validate
from kiln.reader.targets import TargetError, TargetSpec

pytestmark = pytest.mark.usefixtures("no_global_seed")

CLASSES = ["cat", "dog", "person", "tree"]
# The labels column of each image: none, one, several, all.
LABELS = [
    [],
    ["cat"],
    ["cat", "dog"],
    ["dog", "person", "tree"],
    ["tree"],
    ["cat", "dog", "person", "tree"],
    ["person"],
    ["cat", "tree"],
    ["dog"],
    [],
    ["person", "cat"],
    ["tree", "dog"],
]
SIZE = 16


# One colour per image, no three on a line: a blend of two of them is of
# those two only.
COLOURS = np.random.default_rng(12).integers(0, 256, (len(LABELS), 3)).astype(np.uint8)


def colour(index: int) -> np.ndarray:
    return COLOURS[index]


def key_of(index: int) -> str:
    return f"img_{index:02d}.png"


def expected_ids(index: int) -> list[int]:
    return sorted(CLASSES.index(name) for name in LABELS[index])


def multi_hot(index: int) -> np.ndarray:
    vector = np.zeros(len(CLASSES), np.float32)
    vector[expected_ids(index)] = 1.0
    return vector


@pytest.fixture(scope="module")
def tagged_dataset(tmp_path_factory):
    """12 solid-colour 16x16 PNGs and a CSV manifest of their labels, built by `kiln build`."""
    from kiln.pipeline import build

    root = tmp_path_factory.mktemp("multilabel")
    rows = ["path,labels"]
    for index, names in enumerate(LABELS):
        pixels = np.broadcast_to(colour(index), (SIZE, SIZE, 3)).copy()
        (root / key_of(index)).write_bytes(tf.io.encode_png(pixels).numpy())
        rows.append(f"{key_of(index)},{'|'.join(names)}")
    (root / "tags.csv").write_text("\n".join(rows) + "\n")
    return build(
        {
            "name": "tags",
            "source": {"type": "manifest", "path": str(root / "tags.csv"), "classes": CLASSES},
            "output": str(root / "datasets"),
            "encoding": {"format": "png"},
            "splits": {"fractions": {"train": 1.0}},
            "sharding": {"num_shards": 2},
            "targets": {"labels": {}},
        },
        [],
    )


def index_of_key(key: bytes) -> int:
    return int(os.path.basename(key.decode())[len("img_") : -len(".png")])


def test_stored_labels_round_trip_as_ascending_ids(tagged_dataset):
    assert kiln.reader.info(tagged_dataset.dataset_dir).class_names == CLASSES
    features = kiln.reader.load(
        tagged_dataset.dataset_dir, batch_size=None, augment=None, as_supervised=False
    )
    seen = {}
    for element in features:
        index = index_of_key(element["key"].numpy())
        seen[index] = element["labels"].numpy().tolist()
        assert element["labels"].dtype == tf.int64
    assert seen == {index: expected_ids(index) for index in range(len(LABELS))}


def test_as_supervised_yields_ragged_ids_batched_and_dense_ids_per_element(tagged_dataset):
    batched = kiln.reader.load(tagged_dataset.dataset_dir, batch_size=5, augment=None, seed=0)
    images_spec, targets_spec = batched.element_spec
    assert sorted(targets_spec) == ["labels"]
    assert isinstance(targets_spec["labels"], tf.RaggedTensorSpec)
    assert targets_spec["labels"].dtype == tf.int64
    palette = colours()
    rows = 0
    for images, targets in batched:
        for image, ids in zip(images.numpy(), targets["labels"].to_list(), strict=True):
            index = int(np.argmin(np.abs(image[0, 0] - palette).sum(-1)))
            assert ids == expected_ids(index)
            rows += 1
    assert rows == len(LABELS)
    one = kiln.reader.load(tagged_dataset.dataset_dir, batch_size=None, augment=None, seed=0)
    assert one.element_spec[1]["labels"].shape.as_list() == [None]


def colours() -> np.ndarray:
    return np.stack([colour(index) for index in range(len(LABELS))]).astype(np.float64) / 255.0


def mixed_batches(dataset_dir: str, augment: list, seed: int):
    """(own index, image, mixed labels) of every element of 3 passes."""
    dataset = kiln.reader.load(
        dataset_dir, batch_size=6, seed=seed, repeat=3, augment=augment, as_supervised=False
    )
    assert dataset.element_spec["labels"].shape.as_list() == [None, len(CLASSES)]
    assert dataset.element_spec["labels"].dtype == tf.float32
    for batch in dataset:
        for key, image, labels in zip(
            batch["key"].numpy(), batch["image"].numpy(), batch["labels"].numpy(), strict=True
        ):
            yield index_of_key(key), image, labels


def test_cutmix_mixes_multi_hot_labels_by_the_pasted_area(tagged_dataset):
    palette = colours()
    mixed = 0
    for own, image, labels in mixed_batches(tagged_dataset.dataset_dir, ["cutmix"], seed=3):
        # Whose image each pixel is: the nearest colour (they are exact here).
        source = np.argmin(np.abs(image[:, :, None, :] - palette).sum(-1), axis=-1)
        others = set(np.unique(source).tolist()) - {own}
        assert len(others) <= 1
        partner = others.pop() if others else own
        pasted = float((source == partner).mean()) if partner != own else 0.0
        expected = (1.0 - pasted) * multi_hot(own) + pasted * multi_hot(partner)
        np.testing.assert_allclose(labels, expected, atol=1e-6, err_msg=f"image {own}")
        # A class both images carry keeps its full weight.
        both = (multi_hot(own) > 0) & (multi_hot(partner) > 0)
        np.testing.assert_allclose(labels[both], 1.0, atol=1e-6)
        mixed += 0.0 < pasted < 1.0
    assert mixed >= 6


def test_mixup_mixes_multi_hot_labels_by_the_pixels_weight(tagged_dataset):
    palette = colours()
    mixed = 0
    augment = [{"mixup": {"alpha": 0.4}}]
    for own, image, labels in mixed_batches(tagged_dataset.dataset_dir, augment, seed=5):
        pixel = image[0, 0].astype(np.float64)
        assert np.allclose(image, pixel, atol=1e-6)  # a blend of two solid colours is solid
        # pixel = lam * own + (1 - lam) * partner: the partner and lam that fit.
        fits = []
        for partner in range(len(LABELS)):
            delta = palette[own] - palette[partner]
            if partner == own:
                continue
            lam = float(np.dot(pixel - palette[partner], delta) / np.dot(delta, delta))
            if np.allclose(lam * palette[own] + (1 - lam) * palette[partner], pixel, atol=1e-5):
                fits.append((partner, lam))
        if np.allclose(pixel, palette[own], atol=1e-6):
            expected = multi_hot(own)  # mixed with itself, or lam 1
        else:
            assert len(fits) == 1, (own, fits)
            partner, lam = fits[0]
            expected = lam * multi_hot(own) + (1 - lam) * multi_hot(partner)
            mixed += 1
        np.testing.assert_allclose(labels, expected, atol=1e-5, err_msg=f"image {own}")
    assert mixed >= 6


@pytest.mark.parametrize("augment", [["cutmix"], [{"mixup": {"alpha": 0.4}}]])
def test_one_hot_keeps_mixed_multi_hot_labels_and_smooths_them(tagged_dataset, augment):
    """Mixed labels are multi-hot already: one_hot=True must not encode them
    again (it took the mixed vectors for class ids), label_smoothing smooths them."""

    def labels(**kwargs):
        dataset = kiln.reader.load(
            tagged_dataset.dataset_dir, batch_size=6, seed=5, augment=augment, **kwargs
        )
        return np.concatenate([targets["labels"].numpy() for _, targets in dataset])

    mixed = labels()
    assert ((mixed > 0) & (mixed < 1)).any()  # some were mixed
    np.testing.assert_array_equal(labels(one_hot=True), mixed)
    smoothed = labels(one_hot=True, label_smoothing=0.2)
    np.testing.assert_allclose(smoothed, mixed * 0.8 + 0.1, atol=1e-6)


def test_batch_ops_take_multi_label_and_refuse_what_they_cannot_mix():
    labels_only = TargetSpec(kinds=("labels",))
    for augment in (["cutmix"], ["mixup"], ["mixup", "cutmix"]):
        Augmenter(tuple(validate(augment))).check_targets(labels_only)
    with pytest.raises(TargetError, match=r"'mixup' cannot mix this dataset's targets \['mask'\]"):
        Augmenter(tuple(validate(["mixup"]))).check_targets(TargetSpec(kinds=("labels", "mask")))


def test_positive_weights_are_each_class_negatives_over_positives(tagged_dataset):
    path = tagged_dataset.dataset_dir
    weights = kiln.reader.positive_weights(path)
    # Counted from the manifest's labels column, not from kiln.json.
    positives = [sum(name in names for names in LABELS) for name in CLASSES]
    expected = {c: (len(LABELS) - p) / p for c, p in enumerate(positives)}
    assert weights == pytest.approx(expected)
    # As a weighted cross-entropy's pos_weight on the reader's multi-hot labels:
    # with all-zero logits, each class's positives then weigh what its negatives do.
    _, targets = next(iter(kiln.reader.load(path, batch_size=len(LABELS), one_hot=True)))
    labels = targets["labels"]
    pos_weight = tf.constant([weights[c] for c in range(len(CLASSES))])
    loss = tf.nn.weighted_cross_entropy_with_logits(labels, tf.zeros_like(labels), pos_weight)
    positive_part = tf.reduce_sum(loss * labels, axis=0)
    negative_part = tf.reduce_sum(loss * (1 - labels), axis=0)
    np.testing.assert_allclose(positive_part.numpy(), negative_part.numpy(), rtol=1e-5)


def test_positive_weights_need_the_labels_counts_alone(multilabel_dataset):
    # label and labels both carry classes: kiln.json's counts are their union.
    with pytest.raises(TargetError, match=r"over labels and \['label'\]"):
        kiln.reader.positive_weights(multilabel_dataset.dataset_dir)


def test_positive_weights_need_labels(png_dataset):
    with pytest.raises(TargetError, match="has no labels"):
        kiln.reader.positive_weights(png_dataset.dataset_dir)


def test_class_weights_on_multi_label_point_to_positive_weights(tagged_dataset):
    """The README's way for multi-label data is positive_weights: both class
    weight entry points refuse the labels-only dataset and say so."""
    path = tagged_dataset.dataset_dir
    hint = r"multi-label labels weigh each class in the loss instead: .*positive_weights"
    with pytest.raises(TargetError, match=hint):
        kiln.reader.class_weights(path, "train")
    with pytest.raises(TargetError, match=hint):
        kiln.reader.load(path, "train", batch_size=4, seed=1, class_weight={0: 2.0})


def test_an_extra_column_named_like_the_element_seeds_is_refused_not_overwritten(
    tmp_path, monkeypatch
):
    """``augment_seed`` carries the element seeds to the model-side layer and to
    batch ops, and replaced a user's extra column of that name without a word:
    `kiln build` refuses the column, and `load` refuses to pass seeds over one
    in a dataset built before (plain reads still give the column)."""
    from kiln.pipeline import ConfigError, build
    from kiln.pipeline import config as config_module

    for index in range(2):
        pixels = np.broadcast_to(colour(index), (SIZE, SIZE, 3)).copy()
        (tmp_path / key_of(index)).write_bytes(tf.io.encode_png(pixels).numpy())
    (tmp_path / "rows.csv").write_text(
        f"path,labels,augment_seed\n{key_of(0)},cat,5\n{key_of(1)},dog,6\n"
    )
    config = {
        "name": "seeded",
        "source": {"type": "manifest", "path": str(tmp_path / "rows.csv"), "classes": CLASSES},
        "output": str(tmp_path / "datasets"),
        "splits": {"fractions": {"train": 1.0}},
        "targets": {"labels": {}, "extra": {"augment_seed": "int"}},
    }
    with pytest.raises(ConfigError, match=r"targets\.extra: 'augment_seed' is the name of"):
        build(config, [])

    # As a kiln from before the check built it.
    monkeypatch.setattr(config_module, "SEED_KEY", "not_a_column")
    folder = str(build(config, []).dataset_dir)
    plain = next(iter(kiln.reader.load(folder, batch_size=2, shuffle=False)))[1]
    assert sorted(plain["augment_seed"].numpy().tolist()) == [5, 6]
    with pytest.raises(TargetError, match=r"extra column named 'augment_seed'.*load_for_model"):
        kiln.reader.load_for_model(folder, batch_size=2)
    with pytest.raises(TargetError, match=r"extra column named 'augment_seed'.*batch ops"):
        kiln.reader.load(folder, batch_size=2, augment=["cutmix"])
