"""Beam's pipeline flags are checked before a build does anything: one line per
problem naming the flag (or the config's field), exit 2, nothing listed,
locked or written (`kiln.pipeline.pipeline_flags`).

Through the command line in this process, with the source and output on the
in-memory object store (`object_store`: reachable without a network, as a
Dataflow job's must be on Cloud Storage) and every connection off the machine
refused (`no_network_no_credentials`).
"""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml
from apache_beam.options import pipeline_options as beam_options

import object_store
from conftest import make_config
from kiln import cli
from kiln.pipeline import launcher

pytest.importorskip(
    "apache_beam.runners.dataflow.dataflow_runner", reason="needs kiln[gcp] (apache-beam[gcp])"
)

CONTAINER = "europe-west1-docker.pkg.dev/fake-project/kiln/kiln:0.1.0"
PROJECT = "--project=fake-project"
REGION = "--region=europe-west1"
TEMP = "--temp_location=gs://fake-bucket/tmp"
IMAGE = f"--sdk_container_image={CONTAINER}"
DATAFLOW = ["--runner=DataflowRunner", PROJECT, REGION, TEMP, IMAGE, "--sdk_location=container"]


def without(flags: list[str], *dropped: str) -> list[str]:
    return [flag for flag in flags if flag not in dropped]


@pytest.fixture
def on_store(corpus_on_memgs, tmp_path):
    """A config whose source and output are on the in-memory object store."""
    path = tmp_path / "config.yaml"
    config = make_config(f"{corpus_on_memgs}/images", output=f"{corpus_on_memgs}/datasets")
    path.write_text(yaml.safe_dump(config))
    object_store.EVENTS.clear()
    object_store.LIST_REQUESTS.clear()
    return str(path)


def run_cli(capfd, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capfd.readouterr()
    return code, out, err


def dataflow_dry_run(capfd, config, report, *flags: str) -> tuple[int, str, str]:
    """``kiln build`` of `config` as a Dataflow dry run from scratch (the docs'
    flags, no container image), its report written to `report`, with `flags`."""
    return run_cli(
        capfd,
        "build",
        "--config",
        config,
        *without(DATAFLOW, IMAGE, "--sdk_location=container"),
        *flags,
        "--dry_run=True",
        "--full",
        *("--report", str(report)),
    )


def workers_package(tmp_path) -> pathlib.Path:
    """A folder holding the setup.py of a small package, for --setup_file."""
    package = tmp_path / "package"
    package.mkdir()
    (package / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='workers', version='0.1', py_modules=[])\n"
    )
    (package / "README.md").write_text("workers\n")  # else sdist warns (written back)
    return package


def assert_nothing_done() -> None:
    """Nothing listed, locked or written on the store: the one listing
    request is the config check's look at the source (that it holds files);
    the build's listing would be a second."""
    assert object_store.LIST_REQUESTS == ["memgs://bucket/images/"]
    assert object_store.EVENTS == []
    assert object_store.names("memgs://bucket/datasets") == []


@pytest.mark.parametrize(
    "value, dry_run", [("True", True), ("true", True), ("1", True), ("False", False), ("0", False)]
)
def test_dry_run_takes_true_or_false(value, dry_run):
    # Beam's --dry_run is a string flag, and its Dataflow runner takes any
    # value as a dry run: "False" too. kiln reads it, and hands Beam a bool.
    options = launcher.pipeline_options(["--runner=DataflowRunner", f"--dry_run={value}"])
    assert launcher.is_dry_run(options) is dry_run
    assert options.view_as(beam_options.TestOptions).dry_run is dry_run


def test_a_dry_run_value_that_is_neither_is_refused(on_store, capfd, no_network_no_credentials):
    code, out, err = run_cli(capfd, "build", "--config", on_store, *DATAFLOW, "--dry_run=maybe")
    assert (code, out) == (2, "")
    assert err == (
        "kiln build: error: --dry_run=maybe: expected True (translate the job, run nothing) "
        "or False\n"
    )
    assert_nothing_done()


@pytest.mark.parametrize(
    "flags, runner, publish",
    [
        ([], "FnApiRunner", " and publish the dataset"),
        (["--runner=DirectRunner"], "DirectRunner", " and publish the dataset"),
        # Beam's portable runner would submit the job to the job service.
        (["--runner=PortableRunner", "--job_endpoint=localhost:9"], "PortableRunner", ""),
    ],
)
def test_a_dry_run_on_another_runner_than_dataflow_is_refused(
    on_store, capfd, flags, runner, publish
):
    # Only Dataflow's runner translates a job without running it: the local
    # runner would build and publish, the portable one run the job.
    code, out, err = run_cli(capfd, "build", "--config", on_store, *flags, "--dry_run=True")
    assert (code, out) == (2, "")
    assert err == (
        f"kiln build: error: --dry_run=True: only DataflowRunner translates a job without "
        f"running it; {runner} would run the job{publish} (drop --dry_run, or check the job "
        f"with --runner=DataflowRunner --dry_run=True)\n"
    )
    assert_nothing_done()


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--max_num_workers=abc", "argument --max_num_workers: invalid int value: 'abc'"),
        ("--direct_num_workers=x", "argument --direct_num_workers: invalid int value: 'x'"),
        (
            "--dry_run",
            "argument --dry_run: expected one argument (a Beam pipeline option: "
            "--dry_run=True or --dry_run=False)",
        ),
        ("--runner", "argument --runner: expected one argument"),
    ],
)
def test_a_value_beam_cannot_parse_is_one_line(on_store, capfd, flag, message):
    # Beam's argparse would print its usage block (every option of every
    # runner, over a hundred lines) before the error.
    code, out, err = run_cli(capfd, "build", "--config", on_store, flag)
    assert (code, out) == (2, "")
    if "(a Beam" not in message:
        message += " (a Beam pipeline option)"
    assert err == f"kiln build: error: {message}\n"
    assert_nothing_done()


@pytest.mark.parametrize(
    "flags, line",
    [
        (without(DATAFLOW, PROJECT), "--project: Missing required option: project."),
        # No region from gcloud's config either (the fixture points it at an empty folder).
        (without(DATAFLOW, REGION), "--region: Missing required option: region."),
        (
            [*DATAFLOW, "--job_name=Bad_Name"],
            "--job_name: Invalid job_name (Bad_Name); the name must consist of only the "
            "characters [-a-z0-9], starting with a letter and ending with a letter or number",
        ),
        (
            [*without(DATAFLOW, PROJECT), "--project=123456"],
            "--project: Invalid Project ID (123456). Please make sure you specified the "
            "Project ID, not project number.",
        ),
        (
            [*DATAFLOW, "--max_num_workers=0"],
            "--max_num_workers: Invalid value (0) for option: max_num_workers. Value needs to "
            "be positive.",
        ),
    ],
)
def test_dataflow_options_are_checked_before_anything_is_done(
    on_store, capfd, no_network_no_credentials, flags, line
):
    # What Beam's validator says when the job starts, said first: before the
    # lock and the listing (not a dry run: a build that would take the lock).
    code, out, err = run_cli(capfd, "build", "--config", on_store, *flags)
    assert (code, out, err) == (2, "", f"kiln build: error: {line}\n")
    assert_nothing_done()


def test_every_problem_is_a_line_of_its_own(on_store, tmp_path, capfd, no_network_no_credentials):
    report = tmp_path / "report.json"
    flags = [*without(DATAFLOW, PROJECT), "--job_name=Bad_Name", "--setup_file=nowhere/setup.py"]
    code, out, err = run_cli(capfd, "build", "--config", on_store, *flags, "--report", str(report))
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert lines[0] == "kiln build: error: 3 problems with the pipeline flags for DataflowRunner:"
    assert [line.split(":", 1)[0] for line in lines[1:]] == [
        "  --setup_file",
        "  --job_name",
        "  --project",
    ]
    written = json.loads(report.read_text())
    assert written["status"] == "usage_error" and written["exit_code"] == 2
    assert_nothing_done()


@pytest.mark.parametrize(
    "flags, line",
    [
        (
            [*DATAFLOW, "--dry_run=True", "--setup_file=./nowhere/setup.py"],
            "--setup_file: no such file: ./nowhere/setup.py (in the current folder, {cwd})",
        ),
        (
            [*DATAFLOW, "--dry_run=True", "--requirements_file={tmp}/requirements.txt"],
            "--requirements_file: no such file: {tmp}/requirements.txt",
        ),
        # The local runner would not use it, but it names a file that is not there.
        (["--setup_file={tmp}/setup.py"], "--setup_file: no such file: {tmp}/setup.py"),
    ],
)
def test_files_the_flags_name_must_exist(
    on_store, tmp_path, capfd, monkeypatch, no_network_no_credentials, flags, line
):
    # Beam looks for them as it stages the job, after the listing, even for a
    # dry run, and that failed as a failed job (exit 1).
    monkeypatch.chdir(tmp_path)
    flags = [flag.format(tmp=tmp_path) for flag in flags]
    code, out, err = run_cli(capfd, "build", "--config", on_store, *flags)
    assert (code, out) == (2, "")
    assert err == f"kiln build: error: {line.format(tmp=tmp_path, cwd=tmp_path)}\n"
    assert_nothing_done()


@pytest.mark.parametrize(
    "flags, why",
    [
        (without(DATAFLOW, TEMP), "neither is given"),
        (
            [*without(DATAFLOW, TEMP), "--temp_location=/tmp/dataflow"],
            "Invalid GCS path (/tmp/dataflow), given for the option: temp_location.",
        ),
        (
            [*without(DATAFLOW, TEMP), "--temp_location=gs://Not_A_Bucket/tmp"],
            "Invalid GCS bucket (gs://Not_A_Bucket/tmp), given for the option: temp_location. "
            "See https://developers.google.com/storage/docs/bucketnaming for more details.",
        ),
    ],
)
def test_dataflow_needs_a_staging_location_on_cloud_storage(
    on_store, capfd, no_network_no_credentials, flags, why
):
    # Beam would look for, or create, a default bucket (two minutes offline).
    code, out, err = run_cli(capfd, "build", "--config", on_store, *flags, "--dry_run=True")
    assert (code, out) == (2, "")
    assert err == (
        f"kiln build: error: --temp_location: Dataflow needs --temp_location (or "
        f"--staging_location) on gs://, e.g. --temp_location=gs://my-bucket/tmp: {why}\n"
    )
    assert_nothing_done()


def test_a_staging_location_alone_will_do(on_store, capfd, no_network_no_credentials):
    flags = [*without(DATAFLOW, TEMP), "--staging_location=gs://fake-bucket/staging"]
    code, out, err = run_cli(capfd, "build", "--config", on_store, *flags, "--dry_run=True")
    assert (code, err) == (0, "") and out.startswith("kiln build: dry run: ")


def replacing(*flags: str) -> list[str]:
    """`DATAFLOW` with `flags` instead of those of the same names (a container
    image instead of the other, which Beam refuses alongside)."""
    names = {flag.split("=", 1)[0] for flag in flags}
    if names & {"--sdk_container_image", "--worker_harness_container_image"}:
        names.add("--sdk_container_image")
    return [*(f for f in DATAFLOW if f.split("=", 1)[0] not in names), *flags]


IMAGE_FORM = (
    "[HOST[:PORT]/]PATH[:TAG][@sha256:DIGEST], PATH in lowercase letters, digits and . _ - "
    "between slashes, e.g. europe-west1-docker.pkg.dev/my-project/kiln/kiln:0.1.0"
)
REGION_FORM = "expected lowercase words and a number joined by hyphens, e.g. europe-west1"


@pytest.mark.parametrize(
    "flag, line",
    [
        (
            "--region=Europe_West1",
            f"--region: 'Europe_West1' is not a Google Cloud region: {REGION_FORM}",
        ),
        (
            "--region=europe-west1-b",
            f"--region: 'europe-west1-b' is not a Google Cloud region: {REGION_FORM} "
            f"(europe-west1-b is a zone, in region europe-west1)",
        ),
        (
            "--worker_region=US-CENTRAL1",
            f"--worker_region: 'US-CENTRAL1' is not a Google Cloud region: {REGION_FORM}",
        ),
        (
            "--worker_zone=europe-west1",
            "--worker_zone: 'europe-west1' is not a Google Cloud zone: expected a region and a "
            "letter, e.g. europe-west1-b",
        ),
        (
            "--sdk_container_image=kiln latest",
            f"--sdk_container_image: 'kiln latest' is not a container image reference: "
            f"expected {IMAGE_FORM}",
        ),
        (
            "--sdk_container_image=http://x/y:1",
            f"--sdk_container_image: 'http://x/y:1' is not a container image reference: "
            f"expected {IMAGE_FORM}",
        ),
        (
            "--sdk_container_image=gcr.io/my-project/Kiln:0.1.0",
            f"--sdk_container_image: 'gcr.io/my-project/Kiln:0.1.0' is not a container image "
            f"reference: expected {IMAGE_FORM}",
        ),
        (
            "--sdk_container_image=gcr.io/p/kiln@sha256:abc",
            f"--sdk_container_image: 'gcr.io/p/kiln@sha256:abc' is not a container image "
            f"reference: expected {IMAGE_FORM}",
        ),
        (
            "--worker_harness_container_image=gcr.io/p/kiln:",
            f"--worker_harness_container_image: 'gcr.io/p/kiln:' is not a container image "
            f"reference: expected {IMAGE_FORM}",
        ),
    ],
)
def test_a_dataflow_region_zone_or_image_of_the_wrong_form_is_refused(
    on_store, tmp_path, capfd, no_network_no_credentials, flag, line
):
    # A dry run took them, and a build found out as Dataflow refused the job
    # (or its workers could not pull the image), after the lock and the listing.
    code, out, err = run_cli(
        capfd, "build", "--config", on_store, *replacing(flag), "--dry_run=True", "--full"
    )
    assert (code, out, err) == (2, "", f"kiln build: error: {line}\n")
    assert_nothing_done()


@pytest.mark.parametrize(
    "flags",
    [
        ["--sdk_container_image=gcr.io/p/i"],
        [f"--sdk_container_image={CONTAINER}", "--region=northamerica-northeast2"],
        ["--sdk_container_image=localhost:5000/i@sha256:" + "0123456789abcdef" * 4],
        ["--sdk_container_image=apache/beam_python3.11_sdk:2.77.0", "--worker_zone=us-east1-b"],
        ["--sdk_container_image=[::1]:5000/team/kiln__worker.v2:v1.2_3-rc.1", "--zone=me-west1-a"],
        [
            "--worker_harness_container_image=Registry.Example.com:443/kiln",
            "--worker_region=us-central1",
        ],
    ],
)
def test_valid_dataflow_regions_zones_and_images_are_taken(
    on_store, capfd, no_network_no_credentials, flags
):
    code, out, err = run_cli(
        capfd, "build", "--config", on_store, *replacing(*flags), "--dry_run=True", "--full"
    )
    assert (code, err) == (0, "") and out.startswith("kiln build: dry run: "), err


@pytest.mark.parametrize("local", ["source", "output"])
def test_dataflow_refuses_a_local_source_or_output(
    corpus_on_memgs, demo_corpus, tmp_path, capfd, no_network_no_credentials, local
):
    # Dataflow's workers read the images and write the shards: a folder of
    # the launcher's machine is not theirs to reach.
    source = str(demo_corpus.out_dir) if local == "source" else f"{corpus_on_memgs}/images"
    output = str(tmp_path / "out") if local == "output" else f"{corpus_on_memgs}/datasets"
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(make_config(source, output=output)))
    code, out, err = run_cli(capfd, "build", "--config", str(config_path), *DATAFLOW)
    key, path, what = (
        ("source.root", source, "read the images")
        if local == "source"
        else ("output", output, "write the dataset")
    )
    assert (code, out) == (2, "")
    assert err == (
        f"kiln build: error: {key}: {path} is a local path: on Dataflow the workers {what} "
        f"there, so it must be on Cloud Storage (gs://...)\n"
    )
    assert not (tmp_path / "out").exists()


def test_dataflow_needs_a_way_to_install_kiln_on_the_workers(
    on_store, capfd, no_network_no_credentials
):
    flags = [*without(DATAFLOW, IMAGE, "--sdk_location=container"), "--dry_run=True"]
    code, out, err = run_cli(capfd, "build", "--config", on_store, *flags)
    assert (code, out) == (2, "")
    assert err == (
        "kiln build: error: --sdk_container_image: Dataflow's workers need kiln: give the "
        "image built from kiln's Dockerfile (--sdk_container_image=IMAGE "
        "--sdk_location=container), or --setup_file=./setup.py with --requirements_file, or "
        "--extra_package (docs/dataflow.md)\n"
    )
    assert_nothing_done()


def test_a_quiet_dry_run_with_a_setup_file_prints_nothing(
    on_store, tmp_path, capfd, no_network_no_credentials
):
    # Beam's stager builds the --setup_file package with `python -m build`,
    # and without the build module (Python says so on stderr) with
    # `setup.py sdist`: --quiet keeps that line off the console, the
    # report says it was hidden.
    package = workers_package(tmp_path)
    report = tmp_path / "report.json"
    code, out, err = dataflow_dry_run(
        capfd, on_store, report, f"--setup_file={package / 'setup.py'}", "--quiet"
    )
    assert (code, out, err) == (0, "", "")
    written = json.loads(report.read_text())
    assert written["status"] == "dry_run"
    try:
        import build  # noqa: F401
    except ImportError:
        (warning,) = [w for w in written["warnings"] if "python -m build" in w]
        assert "No module named build" in warning


def test_a_quiet_dry_run_with_a_build_folder_beside_the_setup_file_prints_nothing(
    on_store, tmp_path, capfd, no_network_no_credentials
):
    # A `build/` folder beside setup.py (kiln's own checkout after `make
    # demo`): Beam's stager runs `python -m build` in that folder, where the
    # folder hides the build package, installed or not, and Python says so
    # in another form. --quiet keeps that line off the console too.
    package = workers_package(tmp_path)
    (package / "build" / "demo-data").mkdir(parents=True)
    report = tmp_path / "report.json"
    code, out, err = dataflow_dry_run(
        capfd, on_store, report, f"--setup_file={package / 'setup.py'}", "--quiet"
    )
    assert (code, out, err) == (0, "", "")
    written = json.loads(report.read_text())
    assert written["status"] == "dry_run"
    (warning,) = [w for w in written["warnings"] if "python -m build" in w]
    assert (
        "No module named build.__main__; 'build' is a package and cannot be directly executed"
        in warning
    )


def test_a_dry_run_with_a_requirements_file_downloads_nothing(
    on_store, tmp_path, capfd, no_network_no_credentials, monkeypatch
):
    # Beam's stager would `pip download` every requirement into its cache
    # before the dry run translates the job; pip (a subprocess) is pointed
    # at a closed port on this machine, so a download fails at once (the
    # requirement is one no cache of an earlier run can hold either).
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "1")
    requirements = tmp_path / "worker-requirements.txt"
    requirements.write_text(f"kiln-test-unpublished-{tmp_path.name}==0.0.1\n")
    package = workers_package(tmp_path)
    report = tmp_path / "report.json"
    code, out, err = dataflow_dry_run(
        capfd,
        on_store,
        report,
        f"--setup_file={package / 'setup.py'}",
        f"--requirements_file={requirements}",
        "--quiet",
    )
    assert (code, out, err) == (0, "", "")
    # The docs' recipe: worker requirements (no kiln) beside the --setup_file
    # that installs kiln are not warned of.
    warnings = json.loads(report.read_text())["warnings"]
    assert not [w for w in warnings if "names no kiln package" in w]


@pytest.mark.parametrize(
    "lines, warned",
    [
        (["opencv-python-headless>=5.0,<6", "numpy"], True),
        (
            ["--extra-index-url https://example.invalid/simple", "# kiln is not here", "pyyaml"],
            True,
        ),
        (["kiln[pipeline] @ file:///opt/kiln-0.1.0.tar.gz"], False),
        (["./dist/kiln-0.1.0-py3-none-any.whl"], False),
        (["git+https://example.invalid/team/kiln.git#egg=kiln"], False),
        (["-r base-requirements.txt"], False),  # which names kiln==0.1.0
        (["-e ./kiln-checkout"], False),  # kiln cannot tell: not warned
    ],
)
def test_a_requirements_file_alone_that_names_no_kiln_is_warned_of(
    on_store, tmp_path, capfd, no_network_no_credentials, monkeypatch, lines, warned
):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # a dry run downloads nothing
    (tmp_path / "base-requirements.txt").write_text("kiln==0.1.0\n")
    requirements = tmp_path / "worker-requirements.txt"
    requirements.write_text("\n".join(lines) + "\n")
    report = tmp_path / "report.json"
    code, out, err = dataflow_dry_run(
        capfd, on_store, report, f"--requirements_file={requirements}"
    )
    assert code == 0 and out.startswith("kiln build: dry run:")
    warning = (
        f"--requirements_file: {requirements} names no kiln package, and no --setup_file, "
        f"--extra_package or --sdk_container_image installs kiln: unless one of its packages "
        f"depends on kiln, every image step will fail on the workers (No module named 'kiln'; "
        f"docs/dataflow.md)"
    )
    assert (warning in json.loads(report.read_text())["warnings"]) == warned
