"""The Dataflow worker image, checked as far as this machine allows (no docker
engine here, so the image itself is not built).

What matters for a custom Beam container (Beam's "custom containers" guide):
the base is the Beam SDK image of exactly the pinned version and of the
launcher's Python; the image keeps the SDK's entrypoint (/opt/apache/beam/boot,
which the runner starts); kiln is installed with the pipeline extra; the build
fails on conflicting packages (pip check). And the files the Dockerfile copies
must be enough to install kiln: that part is tested for real, by building
kiln's wheel from a folder holding only those files."""

import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

from dockerfile_parse import DockerfileParser

TOP = pathlib.Path(__file__).resolve().parent.parent


def dockerfile():
    return DockerfileParser(str(TOP / "Dockerfile"))


def instructions():
    return [
        (entry["instruction"], entry["value"])
        for entry in dockerfile().structure
        if entry["instruction"] != "COMMENT"
    ]


def test_base_image_is_the_pinned_beam_sdk_for_this_python():
    beam_version = re.search(
        r'^BEAM_VERSION = "([^"]+)"', (TOP / "setup.py").read_text(), re.M
    ).group(1)
    match = re.fullmatch(r"apache/beam_python(\d+)\.(\d+)_sdk:(\S+)", dockerfile().baseimage)
    assert match, dockerfile().baseimage
    assert match.group(3) == beam_version
    # The launcher's Python must match the container's: the tests run on it.
    assert (int(match.group(1)), int(match.group(2))) == sys.version_info[:2]


# The extras whose modules worker code imports (pycocotools: RLE masks in
# kiln.transforms.masks). gcp is in the SDK image; dev holds test tools.
WORKER_EXTRAS = {"pipeline", "coco"}


def test_keeps_the_sdk_entrypoint_installs_the_worker_extras_and_ends_with_pip_check():
    kinds = [kind for kind, _ in instructions()]
    assert "ENTRYPOINT" not in kinds and "CMD" not in kinds  # the runner starts the SDK's boot
    runs = [value for kind, value in instructions() if kind == "RUN"]
    installs = [re.fullmatch(r'pip install --no-cache-dir "\.\[([a-z,]+)\]"', run) for run in runs]
    (extras,) = [set(match.group(1).split(",")) for match in installs if match]
    assert extras == WORKER_EXTRAS
    assert instructions()[-1] == ("RUN", "pip check")


def test_worker_extras_exist_and_cover_the_optional_imports_of_worker_code():
    source = (TOP / "setup.py").read_text()
    for extra in WORKER_EXTRAS:
        assert re.search(rf'^\s+"{extra}": \[', source, re.M), extra
    # Every optional import in the offline code is in a worker extra's requirements.
    masks = (TOP / "src" / "kiln" / "transforms" / "masks.py").read_text()
    assert "from pycocotools import" in masks
    coco = re.search(r'^\s+"coco": \[([^\]]*)\]', source, re.M)
    assert coco and "pycocotools" in coco.group(1)


def test_the_copied_files_are_enough_to_build_kiln(tmp_path):
    context = tmp_path / "context"
    workdir = context
    for kind, value in instructions():
        if kind == "WORKDIR":
            workdir = context / value.lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif kind == "COPY":
            *sources, destination = value.split()
            target = workdir / destination
            for source in sources:
                path = TOP / source
                if path.is_dir():
                    shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy(path, target / path.name)
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path / "wheels"),
            str(workdir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    (wheel,) = (tmp_path / "wheels").glob("kiln-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    # The workers import the job's modules and its transforms from the wheel.
    for module in (
        "kiln/pipeline/job.py",
        "kiln/pipeline/images.py",
        "kiln/transforms/chain.py",
        "kiln/schemas/features.py",
        "kiln/registry.py",
        "kiln/errors.py",
    ):
        assert module in names, module
    # PEP 561's marker: type checkers read kiln's annotations in code that
    # imports the installed package (kiln is checked with mypy --strict).
    assert "kiln/py.typed" in names
