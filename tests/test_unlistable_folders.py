"""A folder of the source that cannot be listed stops the build: its files
are not left out of the dataset without a word.

An image folder's class folder that cannot be read tonight (its permissions
changed, an NFS hiccup) used to vanish from the listing: the build published
a version without that class, every later class's id shifted by one, and
nothing was counted or said. Each build runs `kiln build` in a subprocess;
as root (who reads any folder whatever its mode), the subprocess first drops
the capabilities that bypass permissions, so the mode bits hold for it.
"""

from __future__ import annotations

import ctypes
import os

import cv2
import numpy as np
import pytest
import yaml

from conftest import run_kiln
from kiln.pipeline import storage

_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2


def _respect_permissions() -> None:
    """In the child before exec: as root, drop the capabilities that read
    any file (from the bounding set, so exec does not give them back)."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            os._exit(99)  # the test sees exit 99, not a build that ignored the mode


@pytest.fixture
def folder_build(tmp_path):
    """An image folder of three classes, its config, and a first build."""
    rng = np.random.default_rng(0)
    root = tmp_path / "images"
    for name in ("cat", "dog", "fox"):
        (root / name).mkdir(parents=True)
        for i in range(4):
            cv2.imwrite(str(root / name / f"{i}.png"), rng.integers(0, 255, (24, 24, 3), np.uint8))
    config = tmp_path / "kiln.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "pets",
                "source": {"type": "image_folder", "root": str(root)},
                "output": str(tmp_path / "out"),
                "encoding": {"format": "png"},
            }
        )
    )
    first = build(config)
    assert first.returncode == 0, first.stderr
    yield root, config, tmp_path / "out" / "pets"
    for folder in root.iterdir():
        folder.chmod(0o755)
    root.chmod(0o755)


def build(config) -> object:
    return run_kiln("build", "--config", str(config), "--quiet", preexec_fn=_respect_permissions)


def test_a_class_folder_that_cannot_be_listed_stops_the_build(folder_build):
    root, config, dataset = folder_build
    published = (dataset / "LATEST").read_text()
    (root / "dog").chmod(0)

    night = build(config)

    assert night.returncode == 2, night.stderr
    lines = night.stderr.strip().splitlines()
    assert len(lines) == 1, night.stderr
    assert f"cannot list folder {root / 'dog'}: Permission denied" in lines[0]
    assert "source.root" in lines[0]
    assert (dataset / "LATEST").read_text() == published  # nothing published


def test_a_root_that_cannot_be_listed_is_not_called_empty(folder_build):
    root, config, _ = folder_build
    root.chmod(0)

    night = build(config)

    assert night.returncode == 2, night.stderr
    assert f"cannot list folder {root}: Permission denied" in night.stderr
    assert "not found or empty" not in night.stderr


def test_a_readable_folder_is_listed_again_the_next_night(folder_build):
    root, config, dataset = folder_build
    (root / "dog").chmod(0)
    assert build(config).returncode == 2
    (root / "dog").chmod(0o755)

    night = build(config)

    assert night.returncode == 0, night.stderr
    version = (dataset / "LATEST").read_text().strip()
    info = yaml.safe_load((dataset / version / "kiln.json").read_text())
    assert info["class_names"] == ["cat", "dog", "fox"]


def test_only_a_file_systems_own_lost_and_found_is_passed_over(tmp_path):
    assert storage.is_lost_and_found("/lost+found")  # "/" is a mount point
    assert not storage.is_lost_and_found(str(tmp_path / "lost+found"))
    assert not storage.is_lost_and_found("/lost+found/inner")
    assert not storage.is_lost_and_found(None)
