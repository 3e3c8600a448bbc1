"""`kiln.reader.load` and `info` on real builds: paths, contents, shapes, sharding, options."""

from __future__ import annotations

import collections
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import kiln
import kiln.reader
from kiln.reader import AugmentConfigError
from kiln.schemas import LATEST_FILENAME, METADATA_FILENAME, MetadataError
from kiln.schemas.metadata import content_checksum
from reader.builds import TRAIN_AUGMENT, keys_of, split_keys, stored_images

PYTHON_CALLBACKS = {"PyFunc", "PyFuncStateless", "EagerPyFunc", "NumpyFunction"}


def copy_dataset(result, destination) -> str:
    target = os.path.join(destination, os.path.basename(result.dataset_dir))
    shutil.copytree(result.dataset_dir, target)
    return target


def edit_metadata(dataset_dir, change) -> None:
    """Edits kiln.json and records the new content's checksum, so the reader
    gets past that check to the one a test is about (an edit alone is refused:
    tests/test_verify.py)."""
    path = os.path.join(dataset_dir, METADATA_FILENAME)
    with open(path) as f:
        data = json.load(f)
    change(data)
    data["checksum"] = content_checksum(data)
    with open(path, "w") as f:
        json.dump(data, f)


# --- finding the dataset ---------------------------------------------------------------


def test_info_reads_the_metadata(png_dataset):
    info = kiln.reader.info(png_dataset.dataset_dir)
    assert info == png_dataset.info
    assert info.class_names == ["circle", "square", "star", "triangle"]
    assert info.splits["train"].num_examples == len(split_keys(png_dataset, "train"))
    assert info.augment == [a.to_json() for a in kiln.reader.validate(TRAIN_AUGMENT)]


def test_dataset_root_follows_latest(png_dataset):
    assert kiln.reader.locate(png_dataset.dataset_root) == png_dataset.dataset_dir
    assert kiln.reader.info(png_dataset.dataset_root).version == png_dataset.version
    dataset = kiln.reader.load(png_dataset.dataset_root, "test", batch_size=64, as_supervised=False)
    assert sorted(keys_of(dataset)) == sorted(split_keys(png_dataset, "test"))


def test_folder_without_metadata_is_named_in_the_error(tmp_path):
    with pytest.raises(
        MetadataError, match=f"{tmp_path} is not a kiln dataset: it has no kiln.json and no LATEST"
    ):
        kiln.reader.load(tmp_path, batch_size=4)
    with pytest.raises(MetadataError, match="no such dataset folder"):
        kiln.reader.info(tmp_path / "missing")


def test_a_file_passed_as_the_dataset_names_the_folder_to_pass(png_dataset, tmp_path):
    """kiln.json itself or a shard is a file: the message says so and names the folder
    holding kiln.json, instead of claiming the file "has no kiln.json"."""
    version_dir = png_dataset.dataset_dir
    metadata = os.path.join(version_dir, METADATA_FILENAME)
    shard = os.path.join(version_dir, png_dataset.info.splits["train"].shards[0].filename)
    for path in (metadata, shard):
        for read in (
            kiln.reader.locate,
            kiln.reader.info,
            lambda p: kiln.reader.load(p, batch_size=4),
        ):
            with pytest.raises(MetadataError) as raised:
                read(path)
            message = str(raised.value)
            assert message.startswith(f"{path} is ")
            assert "not a dataset folder" in message
            assert f"(here: {version_dir})" in message
            assert "<output>/<name> whose LATEST" in message
            assert "has no kiln.json" not in message
    with pytest.raises(MetadataError, match=r"is the dataset's kiln\.json file, not a dataset"):
        kiln.reader.locate(metadata)
    # LATEST is the file a dataset folder holds: that folder is the one to pass.
    latest = tmp_path / "shapes" / LATEST_FILENAME
    latest.parent.mkdir()
    latest.write_text(os.path.basename(version_dir))
    with pytest.raises(MetadataError) as raised:
        kiln.reader.load(latest, batch_size=4)
    assert str(raised.value) == (
        f"{latest} is the dataset's LATEST file, not a dataset folder. Pass the folder that "
        f"holds it ({latest.parent}), which follows it to the newest version, or a version "
        f"folder (the folder that holds kiln.json)."
    )
    stray = tmp_path / "notes.txt"
    stray.write_text("not a dataset")
    with pytest.raises(MetadataError) as raised:
        kiln.reader.info(stray)
    assert str(raised.value).startswith(f"{stray} is a file, not a dataset folder. Pass the")
    assert "(here:" not in str(raised.value)


def test_latest_naming_a_missing_version(tmp_path):
    (tmp_path / LATEST_FILENAME).write_text("v123\n")
    with pytest.raises(
        MetadataError,
        match=r"LATEST names version 'v123', but .*v123 has no "
        r"kiln.json",
    ):
        kiln.reader.info(tmp_path)


def test_metadata_problems_are_reported_with_the_file(png_dataset, tmp_path):
    newer = copy_dataset(png_dataset, tmp_path / "newer")
    edit_metadata(newer, lambda d: d.update(format_version=kiln.FORMAT_VERSION + 1))
    with pytest.raises(MetadataError, match=f"{newer}.*kiln.json: written with format version"):
        kiln.reader.info(newer)
    other_schema = copy_dataset(png_dataset, tmp_path / "schema")
    edit_metadata(other_schema, lambda d: d["schema"]["features"][0].update(key="img/bytes"))
    with pytest.raises(
        MetadataError, match=r"differs from this kiln's in feature\(s\) \['image'\]"
    ):
        kiln.reader.info(other_schema)
    missing_shard = copy_dataset(png_dataset, tmp_path / "missing")
    shard = png_dataset.info.splits["train"].shards[1].filename
    os.remove(os.path.join(missing_shard, shard))
    with pytest.raises(MetadataError, match=f"shard file.* missing: \\['{shard}'\\]"):
        kiln.reader.load(missing_shard, batch_size=4)
    with pytest.raises(MetadataError, match="has no split 'holdout'"):
        kiln.reader.load(png_dataset.dataset_dir, "holdout", batch_size=4)


# --- what comes out --------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["png_dataset", "jpeg_dataset", "raw_dataset"])
def test_one_pass_reads_every_record_once_with_its_label(fixture, request):
    result = request.getfixturevalue(fixture)
    dataset = kiln.reader.load(result.dataset_dir, batch_size=8, seed=5, as_supervised=False)
    keys, labels = [], []
    for batch in dataset:
        assert batch["image"].shape[1:] == (24, 24, 3) and batch["image"].dtype == tf.float32
        keys += batch["key"].numpy().tolist()
        labels += batch["label"].numpy().tolist()
    assert collections.Counter(keys) == collections.Counter(split_keys(result, "train"))
    names = result.info.class_names
    assert [names[label] for label in labels] == [k.decode().split("/")[0] for k in keys]
    assert set(batch) == {"image", "label", "key", "sha256", "height", "width", "channels"}


@pytest.mark.parametrize("fixture", ["png_dataset", "jpeg_dataset", "raw_dataset"])
def test_unaugmented_images_are_the_stored_pixels(fixture, request):
    result = request.getfixturevalue(fixture)
    stored = stored_images(result, "validation")
    dataset = kiln.reader.load(
        result.dataset_dir, "validation", batch_size=4, augment=None, as_supervised=False
    )
    seen = 0
    for batch in dataset:
        for key, image in zip(batch["key"].numpy(), batch["image"].numpy(), strict=True):
            np.testing.assert_allclose(image, stored[key] / 255.0, atol=1e-6)
            seen += 1
    assert seen == len(stored)


def test_default_augmentation_train_random_other_splits_inference_form(png_dataset):
    train = kiln.reader.load(png_dataset.dataset_dir, batch_size=4, seed=1)
    validation = kiln.reader.load(
        png_dataset.dataset_dir, "validation", batch_size=4, as_supervised=False
    )
    assert train.element_spec[0].shape[1:] == (24, 24, 3)
    assert validation.element_spec["image"].shape[1:] == (24, 24, 3)
    stored = stored_images(png_dataset, "validation")
    first, second = list(validation), list(validation)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a["image"], b["image"])  # no randomness
        for key, image in zip(a["key"].numpy(), a["image"].numpy(), strict=True):
            # The largest centred square of the 32x32 image is all of it: a resize.
            expected = tf.image.resize(stored[key], [24, 24]).numpy() / 255.0
            np.testing.assert_allclose(image, expected, atol=1e-5)
    # An explicit list follows the same rule (a flip's inference form does
    # nothing); training=True augments any split.
    for training, flip in ((None, slice(None)), (True, slice(None, None, -1))):
        flipped = kiln.reader.load(
            png_dataset.dataset_dir,
            "validation",
            batch_size=64,
            augment=[{"random_flip_left_right": {"probability": 1.0}}],
            training=training,
            as_supervised=False,
        )
        for batch in flipped:
            for key, image in zip(batch["key"].numpy(), batch["image"].numpy(), strict=True):
                np.testing.assert_allclose(image, stored[key][:, flip] / 255.0, atol=1e-6)


def test_shuffle_defaults(png_dataset):
    validation = kiln.reader.load(
        png_dataset.dataset_dir, "validation", batch_size=2, as_supervised=False
    )
    assert keys_of(validation) == keys_of(validation)
    train = kiln.reader.load(png_dataset.dataset_dir, batch_size=4, seed=3, as_supervised=False)
    first, second = keys_of(train), keys_of(train)
    assert first != second and sorted(first) == sorted(second)
    unshuffled = kiln.reader.load(
        png_dataset.dataset_dir, batch_size=4, shuffle=False, as_supervised=False
    )
    assert keys_of(unshuffled) == keys_of(unshuffled)


@pytest.mark.parametrize("augment_on", ["data", "model"])
@pytest.mark.parametrize("fixture", ["png_dataset", "jpeg_dataset", "raw_dataset"])
def test_drop_remainder_gives_fully_static_shapes(fixture, augment_on, request):
    result = request.getfixturevalue(fixture)
    for as_supervised in (True, False):
        read = kiln.reader.load if augment_on == "data" else kiln.reader.load_for_model
        loaded = read(
            result.dataset_dir,
            batch_size=8,
            drop_remainder=True,
            seed=0,
            as_supervised=as_supervised,
        )
        dataset = loaded if augment_on == "data" else loaded[0]
        specs = tf.nest.flatten(dataset.element_spec)
        assert all(spec.shape.is_fully_defined() for spec in specs), dataset.element_spec
        assert all(spec.shape[0] == 8 for spec in specs)
        batches = list(dataset)
        assert len(batches) == result.info.splits["train"].num_examples // 8
        assert dataset.cardinality() == len(batches)


def test_images_of_varying_size(varying_dataset):
    assert varying_dataset.info.image_size is None
    path = varying_dataset.dataset_dir
    with pytest.raises(
        ValueError,
        match=r"images in split 'train' vary in size \(kiln.json "
        r"image_size is null\) and no augmentation op sets",
    ):
        kiln.reader.load(path, batch_size=4, augment=["random_flip_left_right"])
    sizes = {
        tuple(image.shape)
        for image, _ in kiln.reader.load(path, batch_size=None, augment=["random_flip_left_right"])
    }
    assert len(sizes) > 1
    # A crop with a size makes batches, with static shapes.
    cropped = kiln.reader.load(
        path, batch_size=4, drop_remainder=True, augment=[{"random_resized_crop": {"size": 20}}]
    )
    assert cropped.element_spec[0].shape == (4, 20, 20, 3)
    assert next(iter(cropped))[0].shape == (4, 20, 20, 3)


def test_load_for_model_on_images_of_varying_size_says_the_crop_runs_in_the_model(
    varying_dataset,
):
    """load_for_model's dataset yields the stored images and its crops run in
    the layer: a crop in the list does not make the batches (as with load)."""
    path = varying_dataset.dataset_dir
    augment = [{"random_resized_crop": {"size": 20}}, "random_flip_left_right"]
    assert kiln.reader.load(path, batch_size=4, augment=augment).element_spec[0].shape[1:] == (
        20,
        20,
        3,
    )
    with pytest.raises(
        ValueError,
        match=r"vary in size \(kiln.json image_size is null\), and load_for_model's dataset "
        r"yields them as stored: its augmentation, crops included, runs in the model .* "
        r"build's transforms, pass batch_size=None",
    ):
        kiln.reader.load_for_model(path, batch_size=4, augment=augment)
    dataset, layer = kiln.reader.load_for_model(path, batch_size=None, augment=augment, seed=1)
    inputs, _ = next(iter(dataset))
    assert layer({k: v[None] for k, v in inputs.items()}, training=True).shape == (1, 20, 20, 3)


def test_an_op_whose_output_has_no_static_size_is_named_on_fixed_size_images(png_dataset):
    """On a dataset of one stored size, unbatchable images come from an op
    whose output lost its static shape: the message names it and
    tf.ensure_shape, not a size that is not null."""
    from kiln.reader.ops import AUGMENTATIONS

    def crop(image, seed, *, size: int = 20):
        # The size is a tensor: the output's height and width are unknown when traced.
        size = tf.constant(size) + tf.random.stateless_uniform([], seed, 0, 1, tf.int32)
        return image[:size, :size]

    kiln.reader.register_augmentation(
        "random_dynamic_crop", inference=lambda image, size=20: image
    )(crop)
    try:
        path = png_dataset.dataset_dir
        with pytest.raises(
            ValueError,
            match=r"are stored 32x32 \(kiln.json image_size\), but the output of the op "
            r"'random_dynamic_crop' has no static size .* tf.ensure_shape\(image",
        ):
            kiln.reader.load(path, batch_size=4, augment=["random_dynamic_crop"], seed=1)

        def fixed(image, seed, *, size: int = 20):
            return tf.ensure_shape(crop(image, seed, size=size), [size, size, 3])

        AUGMENTATIONS.remove("random_dynamic_crop")
        kiln.reader.register_augmentation(
            "random_dynamic_crop", inference=lambda image, size=20: image[:size, :size]
        )(fixed)
        dataset = kiln.reader.load(path, batch_size=4, augment=["random_dynamic_crop"], seed=1)
        assert next(iter(dataset))[0].shape == (4, 20, 20, 3)
    finally:
        AUGMENTATIONS.remove("random_dynamic_crop")


def test_normalize_uses_the_stored_train_statistics(png_dataset):
    statistics = png_dataset.info.splits["train"].statistics
    mean, std = np.array(statistics.mean), np.array(statistics.std)
    for split in ("train", "validation"):
        plain = kiln.reader.load(png_dataset.dataset_dir, split, batch_size=8, seed=4)
        normalized = kiln.reader.load(
            png_dataset.dataset_dir, split, batch_size=8, seed=4, normalize=True
        )
        for (a, _), (b, _) in zip(plain, normalized, strict=True):
            np.testing.assert_allclose(b, (a.numpy() * 255.0 - mean) / std, rtol=1e-5, atol=1e-5)
    everything = np.concatenate(
        [
            b.numpy()
            for b, _ in kiln.reader.load(
                png_dataset.dataset_dir, batch_size=64, augment=None, normalize=True
            )
        ]
    )
    np.testing.assert_allclose(everything.mean(axis=(0, 1, 2)), 0.0, atol=1e-3)
    np.testing.assert_allclose(everything.std(axis=(0, 1, 2)), 1.0, atol=1e-3)


def test_normalize_without_statistics_fails_clearly(png_dataset, tmp_path):
    copy = copy_dataset(png_dataset, tmp_path)
    edit_metadata(copy, lambda d: [s.update(statistics=None) for s in d["splits"].values()])
    with pytest.raises(MetadataError, match="normalize=True needs pixel statistics"):
        kiln.reader.load(copy, batch_size=4, normalize=True)


@pytest.mark.parametrize("pipelines", [3, 2, 5])
def test_input_context_shares_are_disjoint_and_equal(png_dataset, pipelines):
    counts = [s.num_records for s in png_dataset.info.splits["train"].shards]
    assert len(counts) == 3 and len(set(counts)) > 1  # uneven shards: equal shares need care
    shares = []
    for index in range(pipelines):
        context = tf.distribute.InputContext(
            num_input_pipelines=pipelines, input_pipeline_id=index, num_replicas_in_sync=pipelines
        )
        dataset = kiln.reader.load(
            png_dataset.dataset_dir,
            batch_size=4,
            seed=8,
            input_context=context,
            as_supervised=False,
        )
        keys = keys_of(dataset)
        assert dataset.cardinality() == -(-len(keys) // 4)
        shares.append(keys)
    # Every pipeline takes the same number of steps.
    assert len({len(share) for share in shares}) == 1
    everything = [key for share in shares for key in share]
    assert len(set(everything)) == len(everything)
    assert set(everything) <= set(split_keys(png_dataset, "train"))
    # Contiguous ranges of records: all but fewer than `pipelines` are read,
    # however uneven the shards (dealt whole, 3 pipelines read only as many
    # as the smallest shard each).
    assert len(shares[0]) == sum(counts) // pipelines
    assert len(everything) > sum(counts) - pipelines


def test_input_context_of_another_type_is_refused_naming_it(png_dataset):
    with pytest.raises(
        TypeError, match=r"input_context must be a tf\.distribute\.InputContext .* got int 2"
    ):
        kiln.reader.load(png_dataset.dataset_dir, batch_size=8, seed=1, input_context=2)


@pytest.mark.parametrize(
    "pipelines, index, message",
    [
        (2, 2, r"input_context.input_pipeline_id must be 0 to 1 .*, got 2"),
        (2, 5, r"input_context.input_pipeline_id must be 0 to 1 .*, got 5"),
        (2, -1, r"input_context.input_pipeline_id must be 0 to 1 .*, got -1"),
        (0, 0, r"input_context.num_input_pipelines must be a positive int .*, got 0"),
    ],
)
def test_an_input_pipeline_id_outside_the_pipelines_is_refused(
    png_dataset, pipelines, index, message
):
    """`tf.distribute.InputContext` takes any numbers; an id past the count
    read another pipeline's share again (host 2 of 2 read host 0's
    records), and a count of 0 divided by zero."""
    context = tf.distribute.InputContext(
        num_input_pipelines=pipelines, input_pipeline_id=index, num_replicas_in_sync=2
    )
    with pytest.raises(ValueError, match=message):
        kiln.reader.load(png_dataset.dataset_dir, batch_size=4, seed=1, input_context=context)


def test_numpy_integers_are_taken_for_sizes_and_passes(png_dataset):
    """``global_batch // np.int64(hosts)`` is a NumPy integer: taken as the seed is."""
    path = png_dataset.dataset_dir
    expected = keys_of(kiln.reader.load(path, batch_size=8, seed=1, repeat=2, as_supervised=False))
    dataset = kiln.reader.load(
        path, batch_size=np.int64(8), seed=1, repeat=np.int32(2), as_supervised=False
    )
    assert keys_of(dataset) == expected
    assert dataset.element_spec["image"].shape[0] is None
    for value in (np.bool_(True), 8.0):
        with pytest.raises(ValueError, match="batch_size must be a positive int or None"):
            kiln.reader.load(path, batch_size=value)


def test_more_input_pipelines_than_records_is_refused(png_dataset):
    """Every pipeline reads records // pipelines records per pass: with more
    pipelines than records that is none, an empty dataset Keras would train
    on silently."""
    records = png_dataset.info.splits["validation"].num_examples
    context = tf.distribute.InputContext(
        num_input_pipelines=records + 1, input_pipeline_id=0, num_replicas_in_sync=records + 1
    )
    with pytest.raises(
        ValueError,
        match=rf"split 'validation' has {records} records for {records + 1} input pipelines "
        r"\(input_context\): .* would read nothing",
    ):
        kiln.reader.load(png_dataset.dataset_dir, "validation", batch_size=1, input_context=context)


def test_drop_remainder_with_a_batch_larger_than_the_read_is_refused(png_dataset):
    records = png_dataset.info.splits["validation"].num_examples
    with pytest.raises(
        ValueError,
        match=rf"batch_size={records + 1} with drop_remainder=True yields no batch from "
        rf"{records} records per pass;",
    ):
        kiln.reader.load(
            png_dataset.dataset_dir, "validation", batch_size=records + 1, drop_remainder=True
        )
    # Two passes hold one such batch.
    twice = kiln.reader.load(
        png_dataset.dataset_dir,
        "validation",
        batch_size=records + 1,
        drop_remainder=True,
        repeat=2,
    )
    assert len(list(twice)) == 1


def test_repeat(png_dataset):
    total = png_dataset.info.splits["train"].num_examples
    twice = kiln.reader.load(
        png_dataset.dataset_dir, batch_size=5, seed=2, repeat=2, as_supervised=False
    )
    keys = keys_of(twice)
    assert len(keys) == 2 * total and keys[:total] != keys[total:]
    assert sorted(keys[:total]) == sorted(keys[total:])
    assert twice.cardinality() == -(-2 * total // 5)
    endless = kiln.reader.load(png_dataset.dataset_dir, batch_size=5, repeat=True)
    assert endless.cardinality() == tf.data.INFINITE_CARDINALITY
    assert len(list(endless.take(3 * total // 5))) == 3 * total // 5


def test_gzip_compressed_shards(build_dataset):
    result = build_dataset(sharding={"num_shards": 2, "compression": "gzip"}, augment=TRAIN_AUGMENT)
    assert result.info.compression == "gzip"
    dataset = kiln.reader.load(result.dataset_dir, batch_size=8, as_supervised=False)
    assert len(keys_of(dataset)) == result.info.splits["train"].num_examples


def test_mixup_makes_one_hot_labels(png_dataset):
    dataset = kiln.reader.load(
        png_dataset.dataset_dir, batch_size=8, seed=1, augment=TRAIN_AUGMENT + ["mixup"]
    )
    assert dataset.element_spec[1].shape.as_list() == [None, 4]
    for images, labels in dataset:
        np.testing.assert_allclose(tf.reduce_sum(labels, axis=1), 1.0, atol=1e-6)
        assert images.shape[1:] == (24, 24, 3)
    with pytest.raises(ValueError, match="mix labels, which a layer inside the model cannot"):
        kiln.reader.load_for_model(png_dataset.dataset_dir, batch_size=8, augment=["mixup"])


@pytest.mark.parametrize("fixture", ["png_dataset", "jpeg_dataset", "raw_dataset"])
def test_serialized_graph_has_no_python_callbacks(fixture, request):
    result = request.getfixturevalue(fixture)
    for kwargs in (
        {},
        {"for_model": True},
        {"augment": TRAIN_AUGMENT + ["cutmix"]},
        {"augment": None, "normalize": True},
    ):
        if kwargs.get("for_model"):
            dataset, _ = kiln.reader.load_for_model(result.dataset_dir, batch_size=8, seed=1)
        else:
            dataset = kiln.reader.load(result.dataset_dir, batch_size=8, seed=1, **kwargs)
        graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
        ops = {node.op for node in graph.node}
        ops |= {node.op for function in graph.library.function for node in function.node_def}
        assert "ParseExampleV2" in ops or "ParseSingleExample" in ops  # the graph is all there
        assert not ops & PYTHON_CALLBACKS, kwargs


@pytest.mark.parametrize("for_model", [False, True])
def test_stages_run_one_call_per_core_without_autotuning_which_a_trainer_can_restore(
    png_dataset, for_model
):
    def load():
        if for_model:
            return kiln.reader.load_for_model(png_dataset.dataset_dir, batch_size=4, seed=3)[0]
        return kiln.reader.load(png_dataset.dataset_dir, batch_size=4, seed=3)

    dataset = load()
    options = dataset.options()
    # tf.data's autotuning times every op of every map call (about 5% of the
    # CPU per image here); without it an AUTOTUNE stage runs at
    # min(initial_parallelism, cores): every core of any host.
    assert options.autotune.enabled is False
    assert options.autotune.initial_parallelism >= 1024
    # The documented way back: a later with_options takes precedence, and the
    # seeded stream is the same either way (each a first pass).
    autotuned = tf.data.Options()
    autotuned.autotune.enabled = True
    again = load().with_options(autotuned)
    assert again.options().autotune.enabled is True
    batches = 0
    for (image, label), (other_image, other_label) in zip(dataset, again, strict=True):
        image = image["image"] if for_model else image
        other_image = other_image["image"] if for_model else other_image
        np.testing.assert_array_equal(image.numpy(), other_image.numpy())
        np.testing.assert_array_equal(label.numpy(), other_label.numpy())
        batches += 1
    assert batches == -(-png_dataset.info.splits["train"].num_examples // 4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 0}, "batch_size must be a positive int or None"),
        ({"batch_size": 4, "repeat": 0}, "repeat must be False, True or a number of passes"),
        ({"batch_size": 4, "augment_on": "gpu"}, "augment_on must be one of"),
        ({"batch_size": None, "drop_remainder": True}, "drop_remainder=True needs a batch_size"),
        ({"batch_size": None, "augment": ["cutmix"]}, r"\['cutmix'\] mix images of a batch"),
    ],
)
def test_argument_errors(png_dataset, kwargs, message):
    with pytest.raises(ValueError, match=message):
        kiln.reader.load(png_dataset.dataset_dir, **kwargs)


def test_bad_augment_argument(png_dataset):
    with pytest.raises(AugmentConfigError, match="augment must be 'default', a list"):
        kiln.reader.load(png_dataset.dataset_dir, batch_size=4, augment="strong")
    with pytest.raises(AugmentConfigError, match=r"augment\[0\].random_crop.size"):
        kiln.reader.load(png_dataset.dataset_dir, batch_size=4, augment=["random_crop"])


def test_default_shuffle_buffer_is_bounded_by_memory_and_share():
    from kiln.reader.dataset import _Share

    def buffer(record_bytes, records):
        return _Share(["f"], records, record_bytes).default_shuffle_buffer

    assert buffer(100_000, 50_000) == (256 << 20) // 100_000  # 256 MB of 100 KB records
    assert buffer(1_000, 50_000) == 10_000  # at most 10000
    assert buffer(10_000_000, 50_000) == 1_000  # at least 1000
    assert buffer(1_000, 47) == 47  # a small share: all of it
