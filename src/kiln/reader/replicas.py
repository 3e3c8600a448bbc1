"""Per-replica input under a `tf.distribute` strategy whose position a checkpoint can save.

`strategy.distribute_datasets_from_function` yields a `DistributedIterator`,
which `tf.train.Checkpoint` refuses ("Checkpoint was expecting data to be a
trackable object"): a TensorFlow limit. `ReplicaIterator` gives each replica
its own input pipeline instead, each an ordinary `tf.data` iterator (which a
checkpoint saves), and hands their batches to `strategy.run` as per-replica
values.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf


class ReplicaIterator(tf.Module):
    """One input pipeline per replica, its position saved by `tf.train.Checkpoint`.

    `dataset_fn` is called once per replica with a `tf.distribute.InputContext`
    whose input pipelines are the replicas (pipeline i feeds replica i), as
    `distribute_datasets_from_function` with
    ``InputReplicationMode.PER_REPLICA`` calls it. Passed on to
    ``kiln.reader.load(input_context=...)``, every replica reads a disjoint
    share of the same number of records, so all replicas run out together
    and take the same number of steps.

        def dataset_fn(context):
            return kiln.reader.load(path, batch_size=context.get_per_replica_batch_size(64),
                                    seed=1, repeat=True, input_context=context)

        inputs = kiln.reader.ReplicaIterator(strategy, dataset_fn)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, data=inputs)
        checkpoint.restore(manager.latest_checkpoint)
        strategy.run(train_step, args=(next(inputs),))

    `next` returns per-replica values (what `strategy.run` distributes) and
    raises `StopIteration` when the replicas' datasets end. It is one
    iterator, not a dataset: a second ``for`` loop over it after that raises
    RuntimeError (rather than run an epoch of nothing), and a new one calls
    `dataset_fn` again, whose `load` starts again at pass 1. For epochs,
    load with ``repeat=True`` and take one pass's steps per epoch.

    A checkpoint restores into as many replicas as it was written with:
    another count raises ValueError when it is restored.

    For strategies on one machine (`MirroredStrategy`, `OneDeviceStrategy`,
    the default strategy); with several workers each would need its own
    share of the replicas, which this does not assign.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
    ):
        super().__init__()
        replicas = strategy.num_replicas_in_sync
        local = _local_replicas(strategy)
        if local != replicas:
            raise ValueError(
                f"ReplicaIterator: this machine holds {local} of the strategy's {replicas} "
                f"replicas; it serves strategies on one machine (MirroredStrategy)"
            )
        self._strategy = strategy
        self._ended = False
        # Before the iterators, so that it is restored first.
        self.replicas = _ReplicaCount(replicas)
        self.iterators = [
            iter(
                dataset_fn(
                    tf.distribute.InputContext(
                        num_input_pipelines=replicas,
                        input_pipeline_id=replica,
                        num_replicas_in_sync=replicas,
                    )
                )
            )
            for replica in range(replicas)
        ]

    def __iter__(self) -> ReplicaIterator:
        if self._ended:
            # A second `for` loop would otherwise run an epoch of nothing, silently.
            raise RuntimeError(
                "ReplicaIterator: iterated again after its datasets ended; it is one "
                "iterator over all the passes its datasets make, and a new one starts again "
                "at pass 1 (the same order and augmentation): for epochs, load with "
                "repeat=True and take a pass's steps per epoch"
            )
        return self

    def __next__(self):
        try:
            batches = [next(iterator) for iterator in self.iterators]
        except StopIteration:
            self._ended = True
            raise
        return self._strategy.experimental_distribute_values_from_function(
            lambda context: batches[context.replica_id_in_sync_group]
        )


class _ReplicaCount(tf.train.experimental.PythonState):
    """The replica count, saved beside the iterators and checked when restored.

    Each replica's position is in its share of the data, which the replica
    count decides. Restored into another count, TF restores the iterators it
    finds by index, silently: into fewer replicas they read a wrong stream
    (records repeated within a pass), into more the extra ones start afresh
    or fail obscurely. (Checkpoints written before it existed restore
    unchecked.)
    """

    def __init__(self, replicas: int):
        self.replicas = replicas

    def serialize(self) -> str:
        return str(self.replicas)

    def deserialize(self, string_value) -> None:
        saved = int(string_value)
        if saved != self.replicas:
            raise ValueError(
                f"ReplicaIterator: the checkpoint was written with {saved} replicas and this "
                f"strategy has {self.replicas}: each replica's input position is in its share "
                f"of the data, which the replica count decides; restore it with {saved} "
                f"replicas, or restore the model without `data` and start the input afresh"
            )


def _local_replicas(strategy: tf.distribute.Strategy) -> int:
    """How many of `strategy`'s replicas this machine holds.

    The default strategy (``tf.distribute.get_strategy()`` outside any
    scope) has one replica, here, but no `worker_devices`: it raises
    RuntimeError for them.
    """
    try:
        return len(strategy.extended.worker_devices)
    except RuntimeError:
        if strategy.num_replicas_in_sync == 1:
            return 1
        raise
