"""Reader test fixtures: real datasets written by `kiln build`.

Every dataset here is built by the real Beam pipeline (`build_dataset` from
tests/conftest.py, or `kiln.pipeline.build` for the golden corpus), so the
reader is tested on exactly what users get. Builds are session-scoped and
cached; the demo builds hold 32x32 images, train in 3 shards.
"""

from __future__ import annotations

import pytest

from reader.builds import TRAIN_AUGMENT, golden_config, write_golden_corpus


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
