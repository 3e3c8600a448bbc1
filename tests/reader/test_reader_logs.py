"""What a training script that reads with `kiln.reader` sees of TensorFlow's logging."""

from __future__ import annotations

import subprocess
import sys

from kiln import native_logs
from kiln.schemas.location import LOCAL_READ_BUFFER_BYTES
from reader.fresh_process import fresh_environment

TWO_EPOCHS = """
import sys
import kiln.reader
dataset = kiln.reader.load(sys.argv[1], "train", batch_size=4, seed=0)
for epoch in range(2):
    print(epoch, sum(1 for _ in dataset), flush=True)
"""


def test_two_epochs_log_no_unspecified_buffer_size(png_dataset):
    # TF's INFO lines shown, as in a training script nobody configured (an
    # in-process `kiln` command of another test may have set these).
    completed = subprocess.run(
        [sys.executable, "-c", TWO_EPOCHS, png_dataset.dataset_dir],
        capture_output=True,
        text=True,
        env=fresh_environment({"TF_CPP_MIN_LOG_LEVEL": "0", native_logs.ENV: "0"}),
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert [line.split()[0] for line in completed.stdout.splitlines()] == ["0", "1"]
    assert "I0000" in completed.stderr or "cpu_feature_guard" in completed.stderr, (
        "TensorFlow's INFO lines are not shown: the test would see none either way"
    )
    record_lines = [
        line for line in completed.stderr.splitlines() if "tf_record_dataset_op.cc" in line
    ]
    assert not any("is unspecified" in line for line in record_lines), record_lines
    # TensorFlow logs one line for whatever buffer it is given, once per
    # process (not per epoch); kiln's is the one it names.
    assert len(record_lines) <= 1, record_lines
    assert all(
        line.endswith(f"`buffer_size` of {LOCAL_READ_BUFFER_BYTES}") for line in record_lines
    ), record_lines
