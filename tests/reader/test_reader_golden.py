"""Golden test: the exact augmented stream of a seeded reader on a fixed dataset.

If this fails, the reader's seeded stream changed: record order, element
seeds or what an op does with its seed. If that is intended (it breaks the
reproducibility of users' runs, so say so in the change log), regenerate the
values by printing, for each batch of the stream below, the keys,
``float(images.astype(np.float64).sum())`` and ``images[:, 5, 7, 1]``.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln.reader

pytestmark = pytest.mark.usefixtures("no_global_seed")

# sha256 of the golden build's shards: they pin the input, so a failure here
# means the build (kiln.pipeline) wrote different records, not the reader.
GOLDEN_SHARDS = {
    "golden-train.tfrecord-00000-of-00002": (
        "11327065fdf75fc8663b41572817f2ab2a5e697ce42b9368af442552a50f39d8"
    ),
    "golden-train.tfrecord-00001-of-00002": (
        "85cfbab7142e51aeb69421f19b4680a9a97a280cdadabc05125f1c1b3e0310ca"
    ),
}

# load(seed=2024, batch_size=4, repeat=2), augment = builds.GOLDEN_AUGMENT
# (random_resized_crop 12, flip, color_jitter, random_erasing): per batch the
# keys, the sum of all pixels, and pixel (5, 7) of channel 1 of each image.
GOLDEN_STREAM = [
    (
        ["b/img_03.png", "b/img_05.png", "a/img_04.png", "a/img_02.png"],
        670.4151402390835,
        [0.0, 1.0, 0.459924, 0.356387],
    ),
    (
        ["b/img_01.png", "b/img_09.png", "a/img_08.png", "a/img_10.png"],
        802.2666931114727,
        [0.818934, 0.075205, 0.0, 0.0],
    ),
    (
        ["a/img_00.png", "b/img_11.png", "a/img_06.png", "b/img_07.png"],
        659.7408260031661,
        [0.0, 0.22589, 0.667145, 0.216423],
    ),
    (
        ["b/img_07.png", "b/img_11.png", "a/img_06.png", "b/img_09.png"],
        906.4141116596293,
        [0.0, 0.867345, 0.0, 0.869193],
    ),
    (
        ["a/img_08.png", "a/img_02.png", "b/img_05.png", "a/img_00.png"],
        954.0754715570947,
        [0.307762, 0.0, 0.0, 0.782959],
    ),
    (
        ["b/img_01.png", "a/img_04.png", "a/img_10.png", "b/img_03.png"],
        776.5046846452169,
        [0.785506, 0.0, 0.0, 0.88929],
    ),
]


def test_golden_input_is_the_expected_build(golden_dataset):
    shards = {s.filename: s.sha256 for s in golden_dataset.info.splits["train"].shards}
    assert shards == GOLDEN_SHARDS, "the golden build's records changed; see module docstring"


@pytest.mark.parametrize("augment_on", ["data", "model"])
def test_golden_stream(golden_dataset, augment_on):
    read = kiln.reader.load if augment_on == "data" else kiln.reader.load_for_model
    loaded = read(
        golden_dataset.dataset_dir, batch_size=4, seed=2024, repeat=2, as_supervised=False
    )
    if augment_on == "model":
        dataset, layer = loaded
        batches = [dict(b, image=layer(b, training=True)) for b in dataset]
    else:
        batches = list(loaded)
    assert len(batches) == len(GOLDEN_STREAM)
    for batch, (keys, total, pixels) in zip(batches, GOLDEN_STREAM, strict=True):
        images = batch["image"].numpy()
        assert [k.decode() for k in batch["key"].numpy()] == keys
        # Tolerances allow for float rounding on other CPUs, nothing more.
        assert float(images.astype(np.float64).sum()) == pytest.approx(total, rel=1e-6)
        np.testing.assert_allclose(images[:, 5, 7, 1], pixels, atol=2e-6)
