"""The Fn API path that Flink, Spark and Dataflow Runner v2 use, on this machine.

Beam's Python job service and an external SDK worker pool run as separate
processes on localhost; ``kiln build --runner PortableRunner`` (a separate
process too) submits the job to them. The workers are fresh interpreters:
every DoFn arrives pickled, setup/teardown run there, and the config's
``plugins:`` module is imported there from the worker's own path. The
shards, kiln.json and every other file of the version must be byte-identical
to the default runner's build of the same config.

Marked slow (about a minute: the worker starts a fresh interpreter that
imports TensorFlow, Beam and OpenCV); ``pytest -m "not slow"`` leaves it out
locally, CI runs it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import kiln
from conftest import make_config
from test_build import expected_pixels, read_split

pytestmark = pytest.mark.slow

PLUGIN_MODULE = "kiln_test_portable_plugin"
PLUGIN_SOURCE = """
    import numpy as np
    from kiln.transforms import register

    @register()
    def portable_invert(image: np.ndarray) -> np.ndarray:
        return 255 - image

    @register()
    def portable_slow(image: np.ndarray) -> np.ndarray:
        import time

        time.sleep(2.0)  # a job long enough to be interrupted while it runs
        return image
"""
START_SECONDS = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _child_env(*paths: Path) -> dict[str, str]:
    """The environment for the services and the launcher: this interpreter's
    folder first on PATH (the worker pool starts workers as ``python``), and
    this checkout's kiln plus `paths` first on PYTHONPATH."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    kiln_root = str(Path(kiln.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(
        [kiln_root, *map(str, paths), *[p for p in [env.get("PYTHONPATH")] if p]]
    )
    return env


def _stop(process: subprocess.Popen) -> None:
    """Ends `process` and everything it started (its own process group)."""
    if process.poll() is not None:
        return
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _wait_for_port(port: int, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited {process.returncode}:\n{log.read_text()}")
        with socket.socket() as s:
            if s.connect_ex(("localhost", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{process.args} did not listen on {port}:\n{log.read_text()}")


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("portable-plugin")
    (folder / f"{PLUGIN_MODULE}.py").write_text(textwrap.dedent(PLUGIN_SOURCE))
    sys.path.insert(0, str(folder))  # for the default runner's build, in this process
    yield folder
    sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def portable_services(request, tmp_path_factory, plugin_dir):
    """(job endpoint, worker pool address): Beam's job service and an
    external SDK worker pool, each in its own process group, stopped (with
    every worker they started) when the module's tests end, pass or fail."""
    logs = tmp_path_factory.mktemp("portable-logs")
    env = _child_env(plugin_dir)
    job_port, pool_port = _free_port(), _free_port()
    commands = {
        "job_service": [
            sys.executable,
            "-m",
            "apache_beam.runners.portability.local_job_service_main",
            f"--port={job_port}",
        ],
        "worker_pool": [
            sys.executable,
            "-m",
            "apache_beam.runners.worker.worker_pool_main",
            f"--service_port={pool_port}",
        ],
    }
    started = []
    for name, command in commands.items():
        with open(logs / f"{name}.log", "wb") as log:
            process = subprocess.Popen(
                command,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group, workers included
            )
        started.append(process)
        request.addfinalizer(lambda process=process: _stop(process))
    for port, process, name in zip((job_port, pool_port), started, commands, strict=True):
        _wait_for_port(port, process, logs / f"{name}.log")
    return f"localhost:{job_port}", f"localhost:{pool_port}", started, logs


def _portable_build(config_path: Path, output: Path, job_endpoint: str, pool: str) -> list[str]:
    """The command line of a build on the job service, its work on the worker pool."""
    return [
        sys.executable,
        "-m",
        "kiln.cli",
        "build",
        "--config",
        str(config_path),
        "--output",
        str(output),
        "--runner=PortableRunner",
        f"--job_endpoint={job_endpoint}",
        "--environment_type=EXTERNAL",
        f"--environment_config={pool}",
    ]


def _version_files(result) -> dict[str, bytes]:
    folder = Path(result.dataset_dir)
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_portable_runner_with_external_workers_writes_the_same_bytes(
    portable_services, plugin_dir, build_dataset, demo_corpus, tmp_path
):
    job_endpoint, pool, services, logs = portable_services
    overrides = {
        "transforms": [
            {"resize": {"shorter_side": 40}},
            {"center_crop": {"size": 32}},
            "portable_invert",
        ],
        "plugins": [PLUGIN_MODULE],
    }
    local = build_dataset(**overrides)  # the default runner, in this process

    config_path = tmp_path / "config.yaml"
    config_path.write_text(json.dumps(make_config(demo_corpus.out_dir, **overrides)))
    output = tmp_path / "portable-out"
    completed = subprocess.run(
        _portable_build(config_path, output, job_endpoint, pool),
        env=_child_env(plugin_dir),  # the launcher validates the config: it imports plugins too
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout
    assert f"built {local.info.name} version {local.info.version}" in completed.stdout

    # The work ran on the pool's SDK workers, fresh interpreters.
    pool_log = (logs / "worker_pool.log").read_text()
    assert "Starting worker" in pool_log, pool_log
    assert all(process.poll() is None for process in services)

    portable_dir = output / local.info.name / local.info.version
    portable = {p.name: p.read_bytes() for p in sorted(portable_dir.iterdir()) if p.is_file()}
    expected = _version_files(local)
    assert sorted(portable) == sorted(expected)
    assert [name for name in expected if ".tfrecord-" in name]
    assert "kiln.json" in expected
    for name, data in expected.items():
        assert portable[name] == data, name
    assert (output / local.info.name / "LATEST").read_text().strip() == local.info.version

    # The plugin transform ran (the images are inverted), so its module was
    # imported on the workers.
    for record in read_split(local, "train"):
        np.testing.assert_array_equal(
            record["image"], 255 - expected_pixels(demo_corpus, record["key"])
        )


def _job_states(job_endpoint: str) -> list[str]:
    """The state of every job the job service knows, by name (STOPPED, RUNNING, ...)."""
    import grpc
    from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

    with grpc.insecure_channel(job_endpoint) as channel:
        stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
        jobs = stub.GetJobs(beam_job_api_pb2.GetJobsRequest(), timeout=30).job_info
        return [beam_job_api_pb2.JobState.Enum.Name(job.state) for job in jobs]


def test_a_terminated_launcher_cancels_the_job_it_submitted(
    portable_services, plugin_dir, demo_corpus, tmp_path
):
    """An Airflow timeout (SIGTERM) during a job that runs apart from the
    launcher: kiln exits 143 with nothing published, and the job is
    cancelled, not left running (billing, racing the retry)."""
    job_endpoint, pool, _, _ = portable_services
    before = _job_states(job_endpoint)
    config_path = tmp_path / "config.yaml"
    config = make_config(demo_corpus.out_dir, transforms=["portable_slow"])
    config["plugins"] = [PLUGIN_MODULE]
    config_path.write_text(json.dumps(config))
    launcher = subprocess.Popen(
        [*_portable_build(config_path, tmp_path / "out", job_endpoint, pool), "--quiet"],
        env=_child_env(plugin_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + START_SECONDS
        while _job_states(job_endpoint)[len(before) :] != ["RUNNING"]:
            assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline, _job_states(job_endpoint)
            time.sleep(0.5)
        time.sleep(3.0)  # the workers are inside the images' transforms
        launcher.send_signal(signal.SIGTERM)
        out, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 143, (out, err)
    assert out == "" and err.startswith("kiln build: terminated"), (out, err)
    deadline = time.monotonic() + 60
    while _job_states(job_endpoint)[len(before) :] == ["CANCELLING"]:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert _job_states(job_endpoint)[len(before) :] == ["CANCELLED"]
    assert not (tmp_path / "out" / "shapes" / "LATEST").exists()
