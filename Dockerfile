# The container the Dataflow workers run for `kiln build --runner=DataflowRunner`.
#
# Build and push it from the repository's top, then name it in the build:
#   docker build -t europe-west1-docker.pkg.dev/PROJECT/kiln/kiln:0.1.0 .
#   docker push europe-west1-docker.pkg.dev/PROJECT/kiln/kiln:0.1.0
#   kiln build --config configs/photos.yaml --runner=DataflowRunner ... \
#       --sdk_container_image=europe-west1-docker.pkg.dev/PROJECT/kiln/kiln:0.1.0 \
#       --sdk_location=container
# The launcher must run the same Python minor version (3.11) as this image.

# The Beam SDK image of exactly the version setup.py pins (BEAM_VERSION): the
# two must move together, because Dataflow refuses workers whose SDK differs
# from the launcher's. Its ENTRYPOINT (/opt/apache/beam/boot) is what the
# runner starts, so this file sets none. tests/test_dockerfile.py checks both.
FROM apache/beam_python3.11_sdk:2.77.0

WORKDIR /opt/kiln

# Only what installing kiln needs (setup.py reads README.md and the version
# from src/), so editing tests or docs does not invalidate the cached layers.
COPY setup.py README.md ./
COPY src ./src

# kiln with the extras the workers import: pipeline (OpenCV headless: no GUI
# libraries, PyYAML, google-crc32c, imagesize, Pillow, ijson) and coco (pycocotools,
# for COCO RLE segmentations: a worker that meets one without it fails the
# image), plus the base install's TensorFlow (kiln.schemas encodes records
# with it) and pydantic (the config and parameter models). Not gcp: the SDK
# image already has apache-beam[gcp]. Not dev: test tools.
# apache-beam==2.77.0 is already in the image, so pip keeps the SDK's copy.
# A regular (not editable) install: the workers import it from site-packages.
# No pip cache: it would only make the image larger.
RUN pip install --no-cache-dir ".[pipeline,coco]"

# Fail the image build if the installed packages conflict with each other
# (e.g. a dependency that wants another protobuf than the SDK's).
RUN pip check
