"""``source.listing: job`` for a manifest on an object store: its rows read
and their objects looked up by a Beam job (`listing_job.construct_manifest`),
through the in-memory ``memgs://`` store and the local runner: the same
bytes, dropped rows, stamp and version as the launcher's listing."""

import json

import pytest

import object_store
from conftest import make_config, put_folder
from kiln.errors import ConfigError
from kiln.pipeline import BuildError, build, job, sources, text_lines
from test_build_listing_job import _no_listing_on_the_launcher, _published

BUCKET = f"{object_store.SCHEME}://bucket"
ROOT = f"{BUCKET}/images"


@pytest.fixture
def store(demo_corpus):
    object_store.reset()
    put_folder(demo_corpus.out_dir, ROOT)
    yield
    object_store.reset()


def _images() -> dict[str, list[str]]:
    """The corpus's image keys (``<class>/<name>``) by class."""
    by_class: dict[str, list[str]] = {}
    for name in object_store.names(ROOT + "/"):
        key = name[len(ROOT) + 1 :]
        by_class.setdefault(key.split("/")[0], []).append(key)
    return by_class


def _jsonl_manifest(monkeypatch) -> tuple[str, str]:
    """A JSONL manifest beside the images: every image of the first class,
    two of each other class (with the rule at 2, the first class's folder is
    listed and the others' objects asked for one by one), and rows the
    listing drops. Returns the manifest and the listed folder."""
    monkeypatch.setattr(sources, "_PER_ROW_MAX_OBJECTS", 2)
    by_class = _images()
    first, *others = sorted(by_class)
    keys = by_class[first] + [key for name in others for key in sorted(by_class[name])[:2]]
    rows = [json.dumps({"path": key, "label": key.split("/")[0]}) for key in keys]
    rows += [
        json.dumps({"path": f"{first}/gone.png", "label": first}),  # missing
        "{not json",  # bad_row
        json.dumps({"path": f"{object_store.SCHEME}://elsewhere/x.png", "label": first}),
        # The same key twice with two labels: duplicate_key; twice the same: kept once.
        json.dumps({"path": keys[1], "label": others[0]}),
        json.dumps({"path": keys[2], "label": first}),
    ]
    manifest = f"{ROOT}/manifest.jsonl"
    object_store.put(manifest, ("\n".join(rows) + "\n").encode())
    return manifest, f"{ROOT}/{first}/"


def _config(manifest: str, output: str, listed_by: str, **overrides) -> dict:
    config = make_config(ROOT, output=f"{BUCKET}/{output}", errors={"max_fraction": 0.5})
    config["source"] = {"type": "manifest", "path": manifest, "listing": listed_by}
    config.update(overrides)
    return config


def test_the_job_reads_the_manifest_into_the_same_bytes(store, monkeypatch):
    manifest, listed_folder = _jsonl_manifest(monkeypatch)
    by_launcher = build(_config(manifest, "launcher", "launcher"))
    object_store.LIST_REQUESTS.clear()
    object_store.OBJECT_REQUESTS.clear()
    _no_listing_on_the_launcher(monkeypatch)

    by_job = build(_config(manifest, "job", "job"))

    assert not by_job.up_to_date
    assert by_job.version == by_launcher.version
    assert by_job.info.dropped == by_launcher.info.dropped
    listing_reasons = ("missing", "bad_row", "outside_source", "duplicate_key")
    assert {reason: by_job.info.dropped.get(reason) for reason in listing_reasons} == dict.fromkeys(
        listing_reasons, 1
    )
    # Every file of the version, kiln.json and errors.jsonl included, byte for byte.
    assert _published(by_job) == _published(by_launcher)
    # The job listed the first class's folder once and asked for the few
    # objects of the other classes one by one, as the launcher does.
    assert [p for p in object_store.LIST_REQUESTS if p.startswith(ROOT)] == [listed_folder]
    asked = [path for kind, path in object_store.OBJECT_REQUESTS if kind == "metadata"]
    assert asked and not [path for path in asked if path.startswith(listed_folder)]
    assert [name for name in object_store.names(BUCKET) if "/.listings/" in name] == []


def test_the_stamp_is_the_launchers_either_way(store, monkeypatch):
    manifest, _ = _jsonl_manifest(monkeypatch)

    def no_build_job(*args, **kwargs):
        raise AssertionError("the build job was constructed")

    for first, then in [("launcher", "job"), ("job", "launcher")]:
        built = build(_config(manifest, first, first))
        with monkeypatch.context() as patched:
            patched.setattr(job, "construct", no_build_job)
            again = build(_config(manifest, first, then))
        assert again.up_to_date and again.version == built.version

    # An object rewritten in place (a new time) changes the stamp: not up to date.
    some_image = sorted(_images().popitem()[1])[0]
    object_store.put(f"{ROOT}/{some_image}", object_store.get(f"{ROOT}/{some_image}"))
    with monkeypatch.context() as patched:
        patched.setattr(job, "construct", no_build_job)
        with pytest.raises(AssertionError, match="the build job was constructed"):
            build(_config(manifest, "launcher", "job"))


def test_a_csv_manifest_with_splits_and_classes_as_the_launcher_lists_it(store):
    by_class = _images()
    first, second, *_ = sorted(by_class)
    lines = ["path,label,split"]
    for name in (first, second):
        for i, key in enumerate(sorted(by_class[name])):
            lines.append(f"{key},{name},{'train' if i % 3 else 'test'}")
    lines += [
        f"{first}/nosplit.png,{first},",  # missing_split
        f"{first}/badsplit.png,{first},no-dashes",  # bad_row
        f"{sorted(by_class[first])[0]},{first},train,extra",  # bad_row: a field too many
    ]
    # A label outside source.classes: unknown_label.
    lines += [f"{key},{name},train" for name in sorted(by_class)[2:3] for key in by_class[name]]
    manifest = f"{ROOT}/manifest.csv"
    object_store.put(manifest, ("\n".join(lines) + "\n").encode())
    overrides = {
        "splits": {"from_source": True},
        "sharding": {"num_shards": {"train": 2, "test": 1}},
    }
    configs = {by: _config(manifest, by, by, **overrides) for by in ("launcher", "job")}
    for config in configs.values():
        config["source"]["classes"] = [first, second]
    by_launcher = build(configs["launcher"])
    by_job = build(configs["job"])
    assert by_job.version == by_launcher.version
    assert by_job.info.dropped == by_launcher.info.dropped
    assert {"missing_split", "bad_row", "unknown_label"} <= set(by_job.info.dropped)
    assert by_job.info.dropped["bad_row"] == 2
    assert _published(by_job) == _published(by_launcher)


def test_a_line_over_the_cap_is_dropped_by_the_job_as_by_the_launcher(
    store, demo_corpus, monkeypatch
):
    """A JSONL row with a huge embedded string, 50 times the cap (lowered to
    64 KiB here): one ``line_too_long`` row, read through on the worker
    without being held, and the row after it keeps its line number."""
    cap = 64 * 1024
    monkeypatch.setattr(text_lines, "MAX_LINE_BYTES", cap)
    keys = sorted(
        key for in_class in _images().values() for key in in_class if key not in demo_corpus.broken
    )[::5]
    rows = [json.dumps({"path": key, "label": key.split("/")[0]}) for key in keys]
    huge = json.dumps({"path": keys[0], "label": "x", "notes": "x" * (50 * cap)})
    manifest = f"{ROOT}/manifest.jsonl"
    lines = [*rows[:3], huge, "{not json", *rows[3:]]
    object_store.put(manifest, ("\n".join(lines) + "\n").encode())

    by_launcher = build(_config(manifest, "launcher", "launcher"))
    by_job = build(_config(manifest, "job", "job"))

    assert by_job.version == by_launcher.version
    assert by_job.info.dropped == {"line_too_long": 1, "bad_row": 1}
    published = _published(by_job)
    assert published == _published(by_launcher)
    errors = [json.loads(line) for line in published["errors.jsonl"].decode().splitlines()]
    assert [(row["key"], row["reason"]) for row in errors] == [
        ("manifest.jsonl:4", "line_too_long"),
        ("manifest.jsonl:5", "bad_row"),
    ]
    assert f"the line is {len(huge)} bytes long, more than the {cap} bytes" in errors[0]["message"]
    assert sum(split.num_examples for split in by_job.info.splits.values()) == len(keys)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (b"file,class\na.png,x\n", "manifest.csv: the first line must be a header"),
        (b"path,label\n\xff\xfe.png,x\n", "line 2 is not UTF-8 text (byte 0xff: invalid start"),
        (b"path,label,Label\na.png,x,y\n", "names the column label 2 times (columns 2, 3 of"),
    ],
    ids=["no_header", "not_utf8", "a_column_twice"],
)
def test_an_unusable_manifest_is_the_launchers_one_line(store, text, problem):
    manifest = f"{ROOT}/manifest.csv"
    object_store.put(manifest, text)
    with pytest.raises(ConfigError) as by_launcher:
        build(_config(manifest, "datasets", "launcher"))
    with pytest.raises(ConfigError) as by_job:
        build(_config(manifest, "datasets", "job"))
    message = str(by_job.value)
    assert message == str(by_launcher.value)
    assert "\n" not in message and problem in message
    assert message.startswith("config error in config: source.path: ")
    assert not [name for name in object_store.names(BUCKET) if "/.listings/" in name]


@pytest.mark.parametrize("listed_by", ["launcher", "job"])
def test_a_manifest_whose_every_row_was_dropped_is_bad_input_not_a_config_error(store, listed_by):
    """The nightly job whose images vanished: every row names a missing
    object. That is dropped input (exit 1 with the error report, or an empty
    dataset under errors.allow_empty), as when every image fails to decode;
    only a manifest naming nothing at all is a configuration error."""
    manifest = f"{ROOT}/gone.csv"
    object_store.put(manifest, b"path,label\ncircle/gone-1.png,circle\nstar/gone-2.png,star\n")
    with pytest.raises(BuildError, match=r"dropped 2 of 2 input files") as failed:
        build(_config(manifest, "datasets", listed_by))
    report = str(failed.value).rsplit(" ", 1)[-1].rstrip(")")
    assert report.endswith("/errors.jsonl")
    rows = [json.loads(line) for line in object_store.get(report).decode().splitlines()]
    assert [(row["key"], row["reason"]) for row in rows] == [
        ("circle/gone-1.png", "missing"),
        ("star/gone-2.png", "missing"),
    ]
    assert not object_store.names(f"{BUCKET}/datasets/shapes/LATEST")

    allowed = _config(
        manifest, "datasets", listed_by, errors={"max_fraction": 1.0, "allow_empty": True}
    )
    result = build(allowed)
    assert result.info.class_names == ["circle", "star"]
    assert sum(split.num_examples for split in result.info.splits.values()) == 0
    assert result.info.dropped == {"missing": 2}

    object_store.put(manifest, b"path,label\n")
    with pytest.raises(ConfigError, match="no usable input image"):
        build(dict(allowed, name="empty"))


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {"source": {"type": "manifest", "path": "manifest.csv", "listing": "job"}},
            "source.listing: job reads the manifest in the Beam job; source.path "
            "manifest.csv is a local file: use listing: launcher",
        ),
        (
            {"targets": {"label": {}, "boxes": {}}},
            "a manifest with targets (boxes, masks, extra columns) is listed by the launcher",
        ),
        (
            {"splits": {"fractions": {"train": 1.0}, "stratify": True, "split_by": "key"}},
            "splits.stratify assigns them there",
        ),
    ],
    ids=["local_manifest", "targets", "stratify"],
)
def test_a_manifest_listing_by_the_job_is_refused_where_it_is_not_built(store, change, problem):
    config = _config(f"{ROOT}/manifest.jsonl", "datasets", "job")
    config.update(change)
    with pytest.raises(ConfigError) as raised:
        build(config)
    assert problem in str(raised.value)
    assert object_store.names(f"{BUCKET}/datasets/") == []
