"""Reader test fixtures: real datasets written by `kiln build`.

Every dataset here is built by the real Beam pipeline (`build_dataset` from
tests/conftest.py, or `kiln.pipeline.build` for the golden corpus), so the
reader is tested on exactly what users get. Builds are session-scoped and
cached; the demo builds hold 32x32 images, train in 3 shards.
"""

from __future__ import annotations

import pytest

from reader.builds import DEMO_CLASSES, TRAIN_AUGMENT, golden_config, write_golden_corpus


@pytest.fixture(scope="session")
def png_dataset(build_dataset):
    """PNG, 32x32 RGB, train/validation/test in 3/1/1 shards, TRAIN_AUGMENT stored."""
    return build_dataset(augment=TRAIN_AUGMENT)


@pytest.fixture(scope="session")
def jpeg_dataset(build_dataset):
    """As `png_dataset`, stored as JPEG (4:2:0 chroma, so crops need upsampling context)."""
    return build_dataset(encoding={"format": "jpeg", "quality": 90}, augment=TRAIN_AUGMENT)


@pytest.fixture(scope="session")
def raw_dataset(build_dataset):
    """As `png_dataset`, stored as raw uint8 pixels."""
    return build_dataset(encoding={"format": "raw"}, augment=TRAIN_AUGMENT)


@pytest.fixture(scope="session")
def varying_dataset(build_dataset):
    """No offline transforms: images keep their source sizes (48..160 px), image_size null."""
    return build_dataset(transforms=[], sharding={"num_shards": 1})


@pytest.fixture(scope="session")
def golden_dataset(tmp_path_factory):
    """The fixed golden corpus as raw pixels: train only, 2 shards (see `builds`)."""
    from kiln.pipeline import build

    root = str(tmp_path_factory.mktemp("golden"))
    write_golden_corpus(root + "/images")
    return build(golden_config(root), [])


@pytest.fixture
def no_global_seed():
    """Clears a global seed another test may have set with `tf.random.set_seed`.

    TensorFlow mixes it into `Dataset.shuffle` and `Dataset.random`, so seeded
    streams are compared with it unset, as in a fresh process.
    """
    import tensorflow as tf

    tf.random.set_seed(None)


@pytest.fixture(scope="session")
def manifest_corpus(demo_corpus, tmp_path_factory):
    """A copy of the demo corpus with two JSONL manifests (`builds.label_manifests`)."""
    import shutil

    from reader.builds import label_manifests

    root = tmp_path_factory.mktemp("manifest-corpus") / "images"
    shutil.copytree(demo_corpus.out_dir, root)
    return label_manifests(str(root), demo_corpus.broken)


@pytest.fixture(scope="session")
def multilabel_dataset(build_dataset, manifest_corpus):
    """The demo images with targets ``label`` and multi-label ``labels`` (its class and,
    for every other image, the next class): PNG 32x32, 3/1/1 shards."""
    return build_dataset(
        source={"type": "manifest", "path": manifest_corpus["multilabel"]},
        targets={"label": {}, "labels": {}},
    )


@pytest.fixture(scope="session")
def empty_class_dataset(build_dataset, manifest_corpus):
    """The demo images as a classification manifest whose class list adds ``unicorn``,
    which no image has (class id 4, count 0 in every split)."""
    return build_dataset(
        source={
            "type": "manifest",
            "path": manifest_corpus["classification"],
            "classes": [*DEMO_CLASSES, "unicorn"],
        }
    )
