"""Python control flow on tensors (flagged) versus on configuration (fine)."""

import tensorflow as tf

FLIP = True
TARGET_SIZE = 224


def make_augment(config):
    def augment(image, label, training=True):
        # Configuration: decided once, while the graph is built. All fine.
        if training and config["flip"]:
            image = tf.image.flip_left_right(image)
        if FLIP:
            image = tf.image.flip_up_down(image)
        if image.shape[0] != TARGET_SIZE:
            image = tf.image.resize(image, [TARGET_SIZE, TARGET_SIZE])
        if image.dtype == tf.uint8 and image.shape.rank == 3:
            image = tf.image.convert_image_dtype(image, tf.float32)
        if len(image.shape) == 3 and isinstance(label, tf.Tensor):
            pass
        if tf.executing_eagerly():
            pass

        # Values computed from the element: flagged.
        if label > 3:  # expect: K104
            label = label - 1
        brightness = tf.reduce_mean(image)
        if brightness < 0.2:  # expect: K104
            image = image + 0.1
        elif tf.shape(image)[0] > 10:  # expect: K104
            image = image[:10]
        image = image * 2 if brightness > 0.5 else image  # expect: K104
        bright_and_labelled = brightness > 0.5 and label > 0  # expect: K104
        steps = tf.constant(0)
        while steps < tf.cast(brightness * 10, tf.int32):  # expect: K105
            steps += 1
        assert label >= 0, "negative label"  # expect: K106
        assert TARGET_SIZE > 0  # configuration: fine
        positives = [value for value in tf.unstack(image) if value > 0]  # expect: K104
        # A random draw is a tensor too, even though it does not come from the element.
        if tf.random.uniform([]) > 0.5:  # expect: K104
            image = tf.image.flip_left_right(image)
        return image, label, bright_and_labelled, positives

    return augment


def with_features(features):
    image = features["image"]
    if "mask" in features:  # structure of the element: fine
        image = image * features["mask"]
    if features.get("weight") is not None:  # fine: identity test
        image = image * features["weight"]
    if features["label"] == 0:  # expect: K104
        image = tf.zeros_like(image)
    shape = image.shape
    height = shape[0]
    if height is not None and height > 100:  # static shape: fine
        image = image[:100]
    height = tf.shape(image)[0]
    if height > 100:  # expect: K104
        image = image[:100]
    return image


ds = tf.data.Dataset.from_tensor_slices(([0.0], [1])).map(make_augment({"flip": True}))
ds2 = tf.data.Dataset.from_tensor_slices({"image": [0.0], "label": [1]}).map(with_features)


def is_large(image):
    return image.shape[0] > 100


def is_bright(image):
    return tf.reduce_mean(image) > 0.5


def scale_of(image, factor):
    return factor * 2


def with_helpers(image):
    if is_large(image):  # the helper returns a static answer: fine
        image = image[:100]
    if tf.nest.is_nested(image):  # structure, not a value: fine
        image = image[0]
    if scale_of(image, 3) > 4:  # returns only configuration: fine
        image = image / 2
    if is_bright(image):  # expect: K104
        image = image / 2
    return image


ds3 = tf.data.Dataset.from_tensor_slices([[0.0]]).map(with_helpers)


def with_match(features, kind="rgb"):
    match kind:  # configuration: fine
        case "rgb":
            image = features["image"]
        case _:
            image = tf.image.rgb_to_grayscale(features["image"])
    match features["label"]:  # expect: K104
        case 0 | 1:
            image = -image
        case _:
            pass
    match features:
        case {"weight": weight} if weight > 0.5:  # expect: K104
            image = image * weight
        case {"mask": None}:  # structure, then identity: fine
            pass
    match image.shape.rank:  # a static property: fine
        case 3:
            image = image[None]
    return image


ds4 = tf.data.Dataset.from_tensor_slices({"image": [[0.0]], "label": [1]}).map(with_match)
