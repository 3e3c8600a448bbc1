"""The build job translates for Dataflow: a dry run with a fake project, no
credentials and no network.

What this proves: the job graph constructs for the DataflowRunner with
gs:// paths, every DoFn pickles into the job's pipeline proto (and the
image-processing DoFn taken back out of the proto still works), the steps
are there under their names, and the workers would run the given container.
What it cannot prove: anything that needs Google Cloud (staging, GCS I/O,
running on workers, that the container image exists and has kiln in it).
"""

import json

import pytest
import yaml
from apache_beam.internal import pickler
from apache_beam.portability.api import beam_runner_api_pb2

import object_store
from conftest import make_config
from kiln import cli
from kiln.pipeline import config, incremental, launcher, publish
from kiln.schemas import RECORD

pytest.importorskip(
    "apache_beam.runners.dataflow.dataflow_runner", reason="needs kiln[gcp] (apache-beam[gcp])"
)

CONTAINER = "europe-west1-docker.pkg.dev/fake-project/kiln/kiln:0.1.0"
DATAFLOW_ARGS = [
    "--runner=DataflowRunner",
    "--dry_run=True",
    "--project=fake-project",
    "--region=europe-west1",
    "--temp_location=gs://fake-bucket/tmp",
    f"--sdk_container_image={CONTAINER}",
    "--sdk_location=container",
]


def pardo_fn(proto, prefix):
    """The DoFn object pickled into the proto for the ParDo under `prefix`."""
    for transform in proto.components.transforms.values():
        if (
            transform.unique_name.startswith(prefix)
            and transform.spec.urn == "beam:transform:pardo:v1"
        ):
            payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
            return pickler.loads(payload.do_fn.payload)[0]
    raise AssertionError(f"no ParDo under {prefix}")


def test_dataflow_dry_run_translates_the_job(demo_corpus, no_network_no_credentials):
    options = launcher.pipeline_options(DATAFLOW_ARGS)
    resolved = config.load(make_config(demo_corpus.out_dir, output="gs://fake-bucket/datasets"))
    listing = resolved.list_source()  # the source is local; the job writes to gs://
    staging = publish.DatasetRoot(resolved.dataset_root).new_staging_dir("0" * 64)
    plan = launcher.make_plan(resolved, listing, staging, options)
    assert plan.image_threads == 1  # Dataflow runs a process per vCPU already
    assert plan.listing_uri.startswith("gs://fake-bucket/datasets/shapes/.staging-")

    result = launcher.construct_pipeline(plan, options).run()
    proto = result.job.proto_pipeline

    names = {t.unique_name for t in proto.components.transforms.values()}
    for step in [
        "ReadListing",
        "SpreadFiles",
        "ProcessImages/DecodeTransformEncode",
        "WriteShards/GroupShards",
        "WriteShards/WriteShardFiles",
        "Summarize",
        "FindDuplicates/GatherCopies",
        "WriteReports",
    ]:
        assert step in names, step
    images = set()
    for environment in proto.components.environments.values():
        assert environment.urn == "beam:env:docker:v1"
        images.add(
            beam_runner_api_pb2.DockerPayload.FromString(environment.payload).container_image
        )
    assert images == {CONTAINER}

    # The shard writer goes to the gs:// staging folder.
    writer = pardo_fn(proto, "WriteShards/WriteShardFiles")
    assert writer._folder == staging and writer._temp_folder.startswith(staging)

    # The image DoFn as a worker would get it: unpickled from the proto, its
    # image work runs, and its sorted runs go to the gs:// staging folder
    # (not written here: no network).
    process_fn = pardo_fn(proto, "ProcessImages/DecodeTransformEncode")
    assert process_fn._runs._folder.startswith(staging) and process_fn._counter is None
    key = next(f for f in listing.files() if f.key.startswith("star/"))
    process_fn.setup()
    try:
        outcome = process_fn._processor({**key.to_json()})
    finally:
        process_fn.teardown()
    assert outcome.dropped is None
    decoded = RECORD.decode(outcome.image.record)
    assert decoded["key"].decode() == key.key and (decoded["height"], decoded["width"]) == (32, 32)


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_dataflow_dry_run_translates_an_incremental_job(
    demo_corpus, no_network_no_credentials, compression
):
    # The base is read inside the job, through FileSystems on gs://: the
    # launcher hands the job only the base's file names and sha256. A gzip
    # base's records to relabel or move are read shard by shard.
    options = launcher.pipeline_options(DATAFLOW_ARGS)
    resolved = config.load(make_config(demo_corpus.out_dir, output="gs://fake-bucket/datasets"))
    listing = resolved.list_source()
    staging = publish.DatasetRoot(resolved.dataset_root).new_staging_dir("0" * 64)
    base = incremental.BaseFiles(
        version="0123456789ab",
        folder="gs://fake-bucket/datasets/shapes/0123456789ab",
        files=(("shapes-train.tfrecord-00000-of-00001", "a" * 64), ("index.jsonl", "b" * 64)),
        compression=compression,
    )
    plan = launcher.make_plan(resolved, listing, staging, options, base=base)

    proto = launcher.construct_pipeline(plan, options).run().job.proto_pipeline

    names = {t.unique_name for t in proto.components.transforms.values()}
    for step in [
        "VerifyBaseFiles/HashBaseFiles",
        "JoinBase/ReadBaseIndex",
        "JoinBase/GroupByBucket",
        "ProcessImages/DecodeTransformEncode",
        "PackOrphanDigests",
        "ProcessMovedImages/DecodeTransformEncode",
        "WriteShards/WriteShardFiles",
        "WriteReports",
    ]:
        assert step in names, step
    rewrite = {"RewriteFromBaseShards/GroupByBaseShard", "RewriteFromBaseShards/ReadBaseShards"}
    assert rewrite <= names if compression else not rewrite & names
    assert "SpreadFiles" not in names  # the join spreads the files
    # The reused records are copied by the shard writer, not by a step of their own.
    assert not any(name.startswith("ExtractReused") for name in names)
    images = pardo_fn(proto, "ProcessImages/DecodeTransformEncode")
    assert images._base.folder == base.folder and images._runs._folder.startswith(staging)


def _translated(construct, plan):
    """The Dataflow proto of a listing job that `construct` adds for `plan`."""
    import apache_beam as beam

    pipeline = beam.Pipeline(options=launcher.pipeline_options(DATAFLOW_ARGS))
    construct(pipeline, plan)
    return pipeline.run().job.proto_pipeline


def _assert_steps(proto, *steps: str) -> None:
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert [step for step in steps if step not in names] == []


def test_dataflow_dry_run_translates_the_listing_job(no_network_no_credentials):
    # source.listing: job: the listing job's graph for Dataflow (the folder
    # plan is given: making it would ask Cloud Storage for the folders).
    from kiln.pipeline import listing_job

    root = "gs://fake-bucket/images"
    plan = listing_job.ListingJobPlan(
        root=root,
        from_source=False,
        classes=None,
        prefixes=(f"{root}/circle/", f"{root}/star/"),
        strays=(f"{root}/stray.txt",),
        listing_dir="gs://fake-bucket/datasets/shapes/.listings/0123abcd",
    )
    proto = _translated(listing_job.construct, plan)
    _assert_steps(
        proto,
        "FolderPrefixes",
        "SpreadPrefixes",
        "ListPrefixes",
        "PlaceFiles",
        "DistinctClasses",
        "CheckFiles",
        "GroupFiles",
        "WriteListing/Write/WriteImpl/WriteBundles",
        "Summarize",
        "WriteSummary",
    )
    # The placement DoFn as a worker would get it: the launcher's rules.
    place = pardo_fn(proto, "PlaceFiles")
    assert list(place.process((f"{root}/star/1.png", 10, 5.0))) == [
        ("star/1.png", f"{root}/star/1.png", "star", None, 10, 5.0)
    ]
    (misplaced,) = place.process((f"{root}/stray.txt", 0, 0.0))
    assert misplaced.value[0].reason == "unexpected_location"  # (DroppedFile, entry)


def test_dataflow_dry_run_translates_a_manifests_listing_job(no_network_no_credentials):
    # source.listing: job for a manifest: the graph for Dataflow, and the
    # row checks as a worker would get them (unpickled from the proto).
    from kiln.pipeline import listing_job
    from kiln.pipeline.listing import Candidate

    plan = listing_job.manifest_plan(
        "gs://fake-bucket/images/manifest.csv",
        False,
        ["circle", "star"],
        [],
        "gs://fake-bucket/datasets/shapes/.listings/0123abcd",
    )
    proto = _translated(listing_job.construct_manifest, plan)
    _assert_steps(
        proto,
        "ReadRows",
        "CountFolders",
        "Lookups",
        "GroupRows",
        "CheckRows",
        "ListFolders",
        "AskObjects",
        "JoinRows",
        "LookUpRows",
        "WriteListing/Write/WriteImpl/WriteBundles",
        "Summarize",
        "WriteSummary",
    )
    check = pardo_fn(proto, "CheckRows")
    uri = "gs://fake-bucket/images/star/1.png"
    row = Candidate("star/1.png", 2, uri, "star", None)
    assert list(check.process(("star/1.png", [row]), ["circle", "star"])) == [
        (uri, ("star/1.png", "star", 1, None))
    ]
    outside = Candidate("x.png", 3, "gs://elsewhere/x.png", "star", None)
    (dropped,) = check.process(("x.png", [outside]), ["circle", "star"])
    assert dropped.value[0].reason == "outside_source"


@pytest.mark.parametrize(
    "quiet, output",
    [
        (False, "memgs://bucket/datasets"),
        (True, "memgs://bucket/datasets"),
        # No credentials and no network: with --full a dry run reads
        # nothing of the output, and writes nothing (no lock either).
        (False, "gs://fake-bucket/datasets"),
    ],
)
def test_kiln_build_dry_run(
    corpus_on_memgs, tmp_path, capfd, no_network_no_credentials, quiet, output
):
    # Through the command line, as a user checks a Dataflow job: translated,
    # not submitted; exit 0, one line (none with --quiet), nothing published,
    # nothing written into the output at all (no lock, no staging folder),
    # the report says so. The source is on an object store, as on Dataflow
    # (the in-memory one: no network).
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(make_config(f"{corpus_on_memgs}/images")))
    report = tmp_path / "report.json"
    argv = ["build", "--config", str(config_path), "--output", output]
    argv += [*DATAFLOW_ARGS, "--report", str(report), *(["--quiet"] if quiet else [])]
    argv += ["--full"] if output.startswith("gs://") else []
    object_store.EVENTS.clear()

    assert cli.main(argv) == 0
    out, err = capfd.readouterr()
    outlook = (
        "a build would process all 63 listed files from scratch, unless the dataset is up "
        "to date: with --full the dry run reads nothing of the output"
        if output.startswith("gs://")
        else "a build would process all 63 listed files, from scratch: no published version "
        "to reuse"
    )
    message = (
        f"the job was translated for DataflowRunner and not submitted; nothing was published "
        f"({outlook})"
    )
    assert (out, err) == ("" if quiet else f"kiln build: dry run: {message}\n", "")
    assert object_store.EVENTS == [] and object_store.names(output) == []
    written = json.loads(report.read_text())
    assert written["status"] == "dry_run" and written["exit_code"] == 0
    assert written["message"] == message


def test_a_dry_run_says_what_a_build_would_do(corpus_on_memgs, tmp_path, capfd):
    # Up to date, reusing a version's records, or from scratch (and why):
    # the dry run's one line says which, as a real build would find it.
    output = f"{corpus_on_memgs}/datasets"
    first = make_config(f"{corpus_on_memgs}/images", output=output)
    published = launcher.build(first)  # on the local runner
    resharded = dict(first, sharding={"num_shards": {"train": 2, "validation": 1, "test": 1}})
    resized = dict(first, transforms=[{"resize": {"shorter_side": 36}}])
    lines = []
    for number, variant in enumerate([first, resharded, resized]):
        config_path = tmp_path / f"config{number}.yaml"
        config_path.write_text(yaml.safe_dump(variant))
        assert cli.main(["build", "--config", str(config_path), *DATAFLOW_ARGS]) == 0
        lines.append(capfd.readouterr().out.split(" (", 1)[1])
    assert lines == [
        f"up to date: a build would run no job and point LATEST at version {published.version})\n",
        f"a build would run the job over 63 listed files, reusing the unchanged records of "
        f"version {published.version})\n",
        "a build would process all 63 listed files, from scratch: its processing differs "
        "(image, transforms, encoding, targets, plugins or OpenCV version))\n",
    ]


def test_a_dry_run_that_must_read_the_output_says_so(
    corpus_on_memgs, tmp_path, capfd, no_network_no_credentials, monkeypatch
):
    # Without --full, a dry run reads LATEST (the job reuses its records):
    # with no credentials, one line at once naming the output and --full.
    # Credentials pointed at a missing file; no network.
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(make_config(f"{corpus_on_memgs}/images")))
    credentials = tmp_path / "no-such-credentials.json"
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(credentials))
    argv = ["build", "--config", str(config_path), "--output", "gs://fake-bucket/datasets"]

    assert cli.main([*argv, *DATAFLOW_ARGS]) == 2
    assert capfd.readouterr().err == (
        f"kiln build: error: gs://fake-bucket/datasets/shapes: cannot reach it: File "
        f"{credentials} was not found; a dry run reads LATEST and that version's kiln.json to "
        f"translate the job that reuses its records (--full translates a build from scratch "
        f"without reading the output); nothing was done\n"
    )


def test_a_dry_run_verifies_recent_objects_as_a_build_does(
    demo_corpus, corpus_on_memgs, tmp_path, capfd
):
    # An object updated as the published version's build started is read by
    # the up-to-date check, in a dry run as in a build: up to date while its
    # bytes are its record's (unlike a build, it keeps no time it verified
    # it at: `up_to_date.check`'s refresh); once rewritten unseen (its size and update
    # time as listed), a build would run the job, and one does.
    output = f"{corpus_on_memgs}/datasets"
    first = make_config(f"{corpus_on_memgs}/images", output=output)
    recent = next(
        name
        for name in sorted(object_store.OBJECTS)
        if name.split("/images/", 1)[1] not in demo_corpus.broken
    )
    object_store.put(recent, object_store.get(recent))  # updated now
    published = launcher.build(first)  # on the local runner
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(first))
    dataset = publish.DatasetRoot(published.dataset_root)
    started = dataset.build_started(published.version)
    lines = []
    for rewrite in (False, True):
        if rewrite:
            data, updated = object_store.OBJECTS[recent]
            object_store.OBJECTS[recent] = (b"\x00" * len(data), updated)
        assert cli.main(["build", "--config", str(config_path), *DATAFLOW_ARGS]) == 0
        lines.append(capfd.readouterr().out.split(" (", 1)[1])
        # A dry run writes nothing: not the time it verified the object at.
        assert dataset.build_started(published.version) == started
    assert lines == [
        f"up to date: a build would run no job and point LATEST at version {published.version})\n",
        f"a build would run the job over 63 listed files, reusing the unchanged records of "
        f"version {published.version})\n",
    ]
    assert not launcher.build(first).up_to_date
