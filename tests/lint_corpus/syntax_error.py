"""A file that does not parse: reported as K000 at the error, nothing else."""

import random


def augment(image)  # expect: K000
    print(random.random())
    return image
