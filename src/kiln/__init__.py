"""kiln: prepare image datasets for TensorFlow training.

Deterministic work (decode, orient, resize, crop, colour, encode) runs once,
offline, in an Apache Beam job (`kiln.pipeline`, using the pure kernels in
`kiln.transforms`). Random augmentation runs every epoch, online, in a thin
tf.data reader (`kiln.reader`) made of TensorFlow ops with stateless seeds.
`kiln.schemas` is the one declaration of the record format both halves share.
"""

import os as _os

__version__ = "0.1.0"

# Bumped whenever the bytes a build writes for the same inputs and config
# change (record layout, sharding, metadata format). Part of every dataset
# fingerprint, so a format change forces a rebuild. Readers read every
# format up to their own (2: kiln.json's checksum and the reports' sha256,
# and duplicates.jsonl; see `kiln.schemas.DatasetInfo`).
FORMAT_VERSION = 2

# The kiln command line keeps TensorFlow's native start-up lines out of its
# output, in its own process and in Beam's worker processes, which inherit
# the variable and import kiln before TensorFlow (`kiln.native_logs`).
if _os.environ.get("KILN_QUIET_NATIVE_LOGS") == "1":
    from kiln import native_logs as _native_logs

    _native_logs.install()

# The kiln command line reports a failed job in one line of its own; Beam's
# worker processes, which inherit the variable, print the failing bundle's
# traceback on stderr first unless this drops it (`kiln.worker_tracebacks`).
if _os.environ.get("KILN_QUIET_WORKER_TRACEBACKS") == "1":
    from kiln import worker_tracebacks as _worker_tracebacks

    _worker_tracebacks.install()
