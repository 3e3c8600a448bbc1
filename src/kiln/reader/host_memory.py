"""Pooled host memory: float32 batches without fresh pages from the kernel every batch.

A float32 batch of 128 images of 224x224 is 77 MB. TensorFlow's default
CPU allocator takes such a block from glibc's malloc, which maps blocks
above 32 MB fresh from the kernel and unmaps them when freed: every batch
then costs a page fault and a zeroed page per 4 KB (on the benchmark
machine, a third of the CPU per image of kiln's float32 batches; see
BENCHMARKS.md). TensorFlow's pooling allocator (BFC, the one it uses on
GPUs) keeps the memory it frees for the next batch. It is a process-wide
choice, read from ``TF_CPU_ALLOCATOR_USE_BFC`` when TensorFlow creates
its host allocator, i.e. at its first op: `pool_host_memory` makes that
choice from Python, and `load` says when it came too late.

Where TensorFlow turns oneDNN on (``TF_ENABLE_ONEDNN_OPTS``: by default on
Linux on Intel CPUs with AVX512_VNNI, AVX512_BF16 or AMX), its host
allocator is oneDNN's, which pools large blocks already: there the default
is as cheap as `pool_host_memory`, and calling it changes nothing.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

# TensorFlow's switch for its CPU allocator (tensorflow/core/common_runtime/
# process_state.cc), read once, when the allocator is created.
ENVIRONMENT_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"

_requested = False
_checked = False


def pool_host_memory() -> None:
    """Has TensorFlow keep the host memory it frees, for the next batch.

    Process-wide: every CPU tensor of the process (the model's too) comes
    from TensorFlow's pooling allocator, which keeps what it has taken
    (the process's memory stays at its peak, as on a GPU) instead of
    handing large blocks back to the kernel and faulting them in again.
    Values do not change; float32 batches get cheaper (on the benchmark
    machine, kiln's float32 batches came 1.49x as fast for 224x224 images
    and 1.39x for 341x256; BENCHMARKS.md, "Reader against its peers").

    Call it before TensorFlow runs its first op (importing TensorFlow is
    fine): TensorFlow picks its allocator then, once. Called later, it has
    no effect, and the next `load` logs a warning saying so. Setting
    ``TF_CPU_ALLOCATOR_USE_BFC=true`` in the environment before Python
    starts does the same. Where TensorFlow runs oneDNN (see the module
    docstring) its host allocator pools already, and this changes nothing.

        import kiln.reader

        kiln.reader.pool_host_memory()
        train = kiln.reader.load(path, "train", batch_size=128, seed=1)
    """
    global _requested
    os.environ[ENVIRONMENT_VARIABLE] = "true"
    _requested = True


def pools() -> bool:
    """Whether TensorFlow's host allocator pools (creates it if not yet created).

    Only the pooling allocator keeps statistics for
    ``tf.config.experimental.get_memory_info("CPU:0")`` (unless TensorFlow's
    memory profiling switched them on for the default one).
    """
    import tensorflow as tf

    try:
        tf.config.experimental.get_memory_info("CPU:0")
    except ValueError:
        return False
    return True


def warn_if_too_late() -> None:
    """Logs a warning, once, when `pool_host_memory` was called after
    TensorFlow had created its host allocator (called by `load`)."""
    global _checked
    if not _requested or _checked:
        return
    _checked = True
    if not pools():
        logger.warning(
            "kiln.reader.pool_host_memory() had no effect: TensorFlow had already run an op "
            "and chosen its host allocator; call it before TensorFlow's first op, or set "
            "%s=true in the environment before Python starts",
            ENVIRONMENT_VARIABLE,
        )
