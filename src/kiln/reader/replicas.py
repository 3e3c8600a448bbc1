"""Per-replica input under a `tf.distribute` strategy whose position a checkpoint can save.

`strategy.distribute_datasets_from_function` yields a `DistributedIterator`,
which `tf.train.Checkpoint` refuses ("Checkpoint was expecting data to be a
trackable object"): a TensorFlow limit. `ReplicaIterator` gives each replica
its own input pipeline instead, each an ordinary `tf.data` iterator (which a
checkpoint saves), and hands their batches to `strategy.run` as per-replica
values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

from kiln.reader import dataset


class ReplicaIterator(tf.Module):
    """One input pipeline per replica, its position saved by `tf.train.Checkpoint`.

    `dataset_fn` is called once per replica of this machine with a
    `tf.distribute.InputContext` whose input pipelines are the strategy's
    replicas (pipeline i feeds replica i, its ``replica_id_in_sync_group``),
    as `distribute_datasets_from_function` with
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

    A dataset_fn whose `load` does not pass on the context it is given (no
    ``input_context``, or another replica's) is refused with ValueError:
    every replica would read the same records, silently. So is one whose
    `load` reads for tf.data service (``ReadOptions(dynamic_sharding=True)``):
    each replica's service job would hand it every file, and a service
    iterator cannot be checkpointed. (One that builds its dataset otherwise
    than with `load` cannot be told.)

    A checkpoint restores into as many replicas as it was written with:
    another count raises ValueError when it is restored.

    Serves strategies on one machine (`MirroredStrategy`, `OneDeviceStrategy`,
    the default strategy) and `MultiWorkerMirroredStrategy`: each worker
    makes its own, whose pipelines feed its own replicas, so the workers read
    disjoint shares of the same number of records. Each worker's checkpoint
    holds its own replicas' positions: restore every worker from the one it
    wrote (another worker's raises ValueError).
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
    ):
        super().__init__()
        _check_arguments(strategy, dataset_fn)
        replicas = strategy.num_replicas_in_sync
        self._strategy = strategy
        self._ended = False
        # This machine's replicas by their ids in the sync group: all of them on
        # one machine, on worker k of a multi-worker strategy its own (global) ids.
        self._local_ids = _local_replica_ids(strategy)
        # Before the iterators, so that it is restored first.
        self.replicas = _ReplicaCount(replicas, self._local_ids)
        self.iterators = [
            _replica_iterator(dataset_fn, replica, replicas) for replica in self._local_ids
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
        local = {replica: batch for replica, batch in zip(self._local_ids, batches, strict=True)}
        return self._strategy.experimental_distribute_values_from_function(
            lambda context: local[context.replica_id_in_sync_group]
        )


def _replica_iterator(dataset_fn, replica: int, replicas: int) -> tf.data.Iterator:
    """An iterator over `dataset_fn`'s dataset for `replica`, refusing one whose
    kiln reads did not take the context it was given (see `_check_reads`)."""
    context = tf.distribute.InputContext(
        num_input_pipelines=replicas, input_pipeline_id=replica, num_replicas_in_sync=replicas
    )
    with dataset.recorded_reads() as reads:
        data = dataset_fn(context)
    _check_reads(reads, replica, replicas)
    return iter(data)


def _check_reads(reads: Sequence[dataset.ReadShare], replica: int, replicas: int) -> None:
    """Refuses a dataset_fn whose `load` calls did not pass on the input
    context it was given: every replica would read the whole split (or
    another replica's share), the same records in every step's batches,
    silently. So, too, one that reads for tf.data service (dynamic
    sharding): each replica's `distribute` is its own job, which hands that
    replica every file (every replica trains on the whole pass);
    replicas sharing a `job_name` split the files unevenly, and the iterator
    stops at the first that runs out; and a service iterator cannot be
    checkpointed, which is what ReplicaIterator is for. A dataset_fn that
    reads otherwise than with `load` cannot be told."""
    if replicas == 1:
        return
    given = (replica, replicas)
    for read in reads:
        if read.dynamic_sharding:
            raise ValueError(
                f"ReplicaIterator: dataset_fn read split {read.split!r} of {read.dataset_dir} "
                f"with ReadOptions(dynamic_sharding=True), for tf.data service (pipeline "
                f"{replica} of {replicas}, for replica {replica}): ReplicaIterator gives every "
                f"replica its own input pipeline, so every replica's service job hands it every "
                f"file (the same records on every replica), or, with a job_name they share, the "
                f"replicas run out at different steps and the iterator stops at the first "
                f"(records left unread); and an iterator reading from tf.data service cannot be "
                f"checkpointed. Pass on the context it is given (kiln.reader.load(path, ..., "
                f"input_context=context)), or distribute the service's dataset with "
                f"strategy.distribute_datasets_from_function"
            )
        if read.pipeline == given:
            continue
        if read.pipeline is None:
            how = "without the tf.distribute.InputContext it was given"
            result = "every replica would read the whole split, the same records"
        else:
            how = (
                f"with an input_context for pipeline {read.pipeline[0]} of {read.pipeline[1]}, "
                f"not the one it was given"
            )
            result = "replicas would read the same share, the same records"
        raise ValueError(
            f"ReplicaIterator: dataset_fn read split {read.split!r} of {read.dataset_dir} "
            f"{how} (pipeline {replica} of {replicas}, for replica {replica}): {result} in "
            f"every step; pass on the context it is given: "
            f"kiln.reader.load(path, ..., input_context=context)"
        )


def _check_arguments(strategy, dataset_fn) -> None:
    """Refuses the mix-ups an AttributeError or "not callable" would report
    without naming the argument: the arguments swapped, or a dataset (what
    ``experimental_distribute_dataset`` takes) for the function."""
    if not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(
            f"ReplicaIterator(strategy, dataset_fn): strategy must be a tf.distribute.Strategy, "
            f"got {type(strategy).__name__}"
        )
    if isinstance(dataset_fn, tf.data.Dataset) or not callable(dataset_fn):
        raise TypeError(
            f"ReplicaIterator(strategy, dataset_fn): dataset_fn must be a function of a "
            f"tf.distribute.InputContext that returns that replica's dataset (as "
            f"distribute_datasets_from_function takes), got {type(dataset_fn).__name__}; pass "
            f"lambda context: kiln.reader.load(path, ..., input_context=context)"
        )


class _ReplicaCount(tf.train.experimental.PythonState):
    """The replica count (and, on a worker of several, its replicas' ids),
    saved beside the iterators and checked when restored.

    Each replica's position is in its share of the data, which the replica
    count and the replica's id decide. Restored into another count, TF
    restores the iterators it finds by index, silently: into fewer replicas
    they read a wrong stream (records repeated within a pass), into more the
    extra ones start afresh or fail obscurely. Under a multi-worker strategy
    every worker saves its own replicas' positions, and one worker's restored
    on another would read the other worker's share. (Checkpoints written
    before it existed restore unchecked.)

    Saved as ``"<count>"`` when this machine holds every replica (as before
    workers were served), ``"<count>:<id>,<id>..."`` otherwise.
    """

    def __init__(self, replicas: int, local_ids: Sequence[int]):
        self.replicas = replicas
        self.local_ids = tuple(local_ids)

    def serialize(self) -> str:
        if self.local_ids == tuple(range(self.replicas)):
            return str(self.replicas)
        return f"{self.replicas}:{','.join(map(str, self.local_ids))}"

    def deserialize(self, string_value) -> None:
        if isinstance(string_value, bytes):
            string_value = string_value.decode()
        count, _, ids = string_value.partition(":")
        saved = int(count)
        if saved != self.replicas:
            raise ValueError(
                f"ReplicaIterator: the checkpoint was written with {saved} replicas and this "
                f"strategy has {self.replicas}: each replica's input position is in its share "
                f"of the data, which the replica count decides; restore it with {saved} "
                f"replicas, or restore the model without `data` and start the input afresh"
            )
        saved_ids = tuple(map(int, ids.split(","))) if ids else tuple(range(saved))
        if saved_ids != self.local_ids:
            raise ValueError(
                f"ReplicaIterator: the checkpoint holds the input positions of replicas "
                f"{list(saved_ids)} and this worker holds replicas {list(self.local_ids)}: "
                f"each worker saves its own replicas' positions, in their shares of the data; "
                f"restore every worker from the checkpoint it wrote itself"
            )


def _local_replica_ids(strategy: tf.distribute.Strategy) -> tuple[int, ...]:
    """The ids in the sync group of the replicas this machine holds.

    Every replica on one machine; on a worker of `MultiWorkerMirroredStrategy`
    its own, numbered across the workers (``replica_id_in_sync_group``), which
    is how each worker's replicas find their shares of the data.
    """
    ids = strategy.experimental_distribute_values_from_function(
        lambda context: context.replica_id_in_sync_group
    )
    return tuple(int(replica) for replica in strategy.experimental_local_results(ids))
