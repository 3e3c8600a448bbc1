"""The machine a benchmark ran on: CPU, cores, memory, load, library versions."""

from __future__ import annotations

import importlib
import os
import platform
import sys

_LIBRARIES = (
    ("kiln", "kiln"),
    ("tensorflow", "tensorflow"),
    ("keras", "keras"),
    ("apache_beam", "apache-beam"),
    ("cv2", "opencv"),
    ("numpy", "numpy"),
)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _vector_extensions() -> str | None:
    """The widest x86 vector instructions the CPU has (``AVX-512``, ``AVX2``,
    ``AVX``), or None (no /proc/cpuinfo, or none of them). OpenCV dispatches
    its kernels to the widest; TensorFlow's pip kernels use AVX at most
    (its start-up log names the rest), so the reader's ratios against
    OpenCV-based loaders move with it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
            else:
                return None
    except OSError:
        return None
    for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX")):
        if flag in flags:
            return name
    return None


def _memory_gb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def cpu_name(described: dict) -> str:
    """`describe`'s CPU model, with its vector extensions when known:
    ``AMD EPYC (AVX-512)``."""
    vector = described.get("vector_extensions")  # absent from older results
    return f"{described['cpu']} ({vector})" if vector else described["cpu"]


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def describe() -> dict:
    """CPU model and vector extensions, cores, memory, OS, and the versions
    of Python and of the libraries measured."""
    versions = {"python": platform.python_version()}
    for module, name in _LIBRARIES:
        try:
            versions[name] = importlib.import_module(module).__version__
        except ImportError:
            versions[name] = None
    memory = _memory_gb()
    return {
        "cpu": _cpu_model(),
        "vector_extensions": _vector_extensions(),
        "cores": usable_cores(),
        "memory_gb": round(memory, 1) if memory else None,
        "os": platform.platform(),
        "python_executable": sys.executable,
        "versions": versions,
    }


def busy_cpu_seconds() -> float | None:
    """CPU seconds all processes have used since boot (``/proc/stat``), or None.

    The difference over a measurement, minus the measured process's own CPU
    time, is what other processes used meanwhile: how loaded the shared
    machine was while that number was taken.
    """
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
