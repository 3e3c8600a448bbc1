"""``source.listing: job``: an image folder on an object store listed by a
Beam job over its class folders (`kiln.pipeline.listing_job`), through the
in-memory ``memgs://`` store and the local runner: the same bytes, stamp
and version as the launcher's listing, with no row per object on the
launcher."""

import pytest
from apache_beam.io.filesystem import BeamIOError

import object_store
from conftest import make_config, put_folder
from kiln.errors import ConfigError
from kiln.pipeline import build, job, listing

BUCKET = f"{object_store.SCHEME}://bucket"
ROOT = f"{BUCKET}/images"
# Beside the demo corpus's classes: a file above the class folders, a hidden
# file and folder, and a file one folder too deep (all but the hidden ones
# dropped as unexpected_location, in both listings).
STRAYS = ["stray.txt", ".hidden", ".cache/circle/x.png", "circle/deeper/x.png"]


@pytest.fixture
def store(demo_corpus):
    object_store.reset()
    put_folder(demo_corpus.out_dir, ROOT)
    for name in STRAYS:
        object_store.put(f"{ROOT}/{name}", b"not in the layout")
    yield
    object_store.reset()


def _config(output: str, listed_by: str, **overrides) -> dict:
    config = make_config(ROOT, output=f"{BUCKET}/{output}", errors={"max_fraction": 0.5})
    config["source"] = dict(config["source"], listing=listed_by)
    config.update(overrides)
    return config


def _published(result) -> dict[str, bytes]:
    prefix = result.dataset_dir + "/"
    return {name[len(prefix) :]: object_store.get(name) for name in object_store.names(prefix)}


def _source_listings() -> list[str]:
    """The listings of the source's prefixes since the last reset, sorted."""
    return sorted(prefix for prefix in object_store.LIST_REQUESTS if prefix.startswith(ROOT))


def _no_listing_on_the_launcher(monkeypatch) -> None:
    """Fails the build if the launcher opens its own listing (a row per object)."""

    def refuse(self):
        raise AssertionError("the launcher listed the objects itself")

    monkeypatch.setattr(listing.ListingWriter, "__init__", refuse)


def test_the_job_lists_the_class_folders_into_the_same_bytes(store, monkeypatch):
    by_launcher = build(_config("launcher", "launcher"))
    object_store.LIST_REQUESTS.clear()
    _no_listing_on_the_launcher(monkeypatch)

    by_job = build(_config("job", "job"))

    assert not by_job.up_to_date
    assert by_job.version == by_launcher.version
    assert by_job.info.dropped == by_launcher.info.dropped
    assert by_launcher.info.dropped["unexpected_location"] == 2  # stray.txt, circle/deeper/x.png
    # Every file of the version, kiln.json and errors.jsonl included, byte for byte.
    assert _published(by_job) == _published(by_launcher)
    # The launcher asked for the root's folders (and, checking the config,
    # whether the root has a file: `has_files`, one object); the job listed
    # each class folder once.
    classes = by_launcher.info.class_names
    assert len(classes) > 1
    assert _source_listings() == sorted(
        [f"{ROOT}/", f"{ROOT}/ (folders)", *(f"{ROOT}/{name}/" for name in classes)]
    )
    # The listing job's files are gone with the build.
    assert [name for name in object_store.names(BUCKET) if "/.listings/" in name] == []


def test_an_unchanged_source_is_up_to_date_without_the_build_job(store, monkeypatch):
    # The stamp combined in the listing job is the launcher's: a dataset built
    # from the launcher's listing is up to date when the job lists it.
    first = build(_config("datasets", "launcher"))

    def no_build_job(*args, **kwargs):
        raise AssertionError("the build job was constructed")

    with monkeypatch.context() as patched:
        patched.setattr(job, "construct", no_build_job)
        again = build(_config("datasets", "job"))
        assert again.up_to_date and again.version == first.version
        assert again.counters == {}

        # A rewritten object (a new time) changes the stamp: the build job runs.
        name = f"{ROOT}/{first.info.class_names[0]}"
        some_image = object_store.names(name + "/")[0]
        object_store.put(some_image, object_store.get(some_image))
        with pytest.raises(AssertionError, match="the build job was constructed"):
            build(_config("datasets", "job"))
    rebuilt = build(_config("datasets", "job"))
    assert not rebuilt.up_to_date and rebuilt.version == first.version  # same bytes


def test_splits_and_classes_from_the_folders_as_the_launcher_finds_them(store):
    # root/<split>/<class>/<image>, with a split folder that is not a split
    # name, a file directly in a split folder, and source.classes leaving a
    # class out (its files dropped as unknown_label).
    root = f"{BUCKET}/by-split"
    images = [name for name in object_store.names(ROOT + "/") if name.count("/") == 5]
    for index, name in enumerate(images):
        split = "test" if index % 3 == 0 else "train"
        object_store.put(f"{root}/{split}/{name[len(ROOT) + 1 :]}", object_store.get(name))
    for name in ["not-a-split!/circle/x.png", "train/loose.png", "test/.hidden/x.png"]:
        object_store.put(f"{root}/{name}", b"not in the layout")
    classes = sorted({name.split("/")[4] for name in images})
    built = {}
    for listed_by in ("launcher", "job"):
        config = _config(
            listed_by,
            listed_by,
            splits={"from_source": True},
            sharding={"num_shards": 2},
            errors={"max_fraction": 0.9},
        )
        config["source"] = dict(config["source"], root=root, classes=classes[:-1])
        object_store.LIST_REQUESTS.clear()
        built[listed_by] = build(config)
    by_launcher, by_job = built["launcher"], built["job"]
    assert by_launcher.info.dropped["unknown_label"] > 0
    assert by_launcher.info.dropped["unexpected_location"] == 2
    assert sorted(by_job.info.splits) == ["test", "train"]
    assert by_job.version == by_launcher.version
    assert _published(by_job) == _published(by_launcher)
    # The folders of the root and of each split folder; then every class folder.
    listed = sorted(p for p in object_store.LIST_REQUESTS if p.startswith(root))
    assert listed == sorted(
        [
            f"{root}/",  # the config check (`has_files`)
            f"{root}/ (folders)",
            *(f"{root}/{split}/ (folders)" for split in ("not-a-split!", "test", "train")),
            f"{root}/not-a-split!/circle/",
            *(f"{root}/{split}/{name}/" for split in ("test", "train") for name in classes),
        ]
    )


def test_a_store_without_a_folder_listing_lists_the_root_in_the_job(store, monkeypatch):
    # Beam's filesystems have no delimiter listing: on a store kiln cannot ask
    # for folders, the job lists the whole root as one element (still not on
    # the launcher, but on one worker).
    by_launcher = build(_config("launcher", "launcher"))
    monkeypatch.delattr(object_store.InMemoryObjectStore, "list_folder_level")
    _no_listing_on_the_launcher(monkeypatch)
    object_store.LIST_REQUESTS.clear()
    by_job = build(_config("job", "job"))
    assert _published(by_job) == _published(by_launcher)
    assert _source_listings() == [f"{ROOT}/", f"{ROOT}/"]  # the config check's, the job's


def test_a_folder_that_cannot_be_listed_is_one_line_naming_it(store, monkeypatch):
    listed = object_store.InMemoryObjectStore._list
    refused = f"{ROOT}/circle/"

    def refuse_one(self, prefix):
        if prefix == refused:
            raise BeamIOError("List failed", {prefix: PermissionError("403 Forbidden")})
        return listed(self, prefix)

    monkeypatch.setattr(object_store.InMemoryObjectStore, "_list", refuse_one)
    with pytest.raises(ConfigError) as raised:
        build(_config("datasets", "job"))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        f"config error in config: source.root: {ROOT}: cannot list {refused}: "
    )
    assert "List failed" in message
    assert not [name for name in object_store.names(BUCKET) if "/.listings/" in name]
    assert not [name for name in object_store.names(f"{BUCKET}/datasets/") if "/.staging-" in name]


def test_a_source_without_a_usable_image_says_so_as_the_launcher_does(store):
    object_store.reset()
    for name in ["stray.png", "circle/deeper/x.png", "circle/.hidden.png"]:
        object_store.put(f"{ROOT}/{name}", b"not in the layout")
    with pytest.raises(ConfigError) as by_launcher:
        build(_config("datasets", "launcher"))
    with pytest.raises(ConfigError) as by_job:
        build(_config("datasets", "job"))
    assert str(by_job.value) == str(by_launcher.value)
    assert "no usable input image (2 dropped while listing, e.g. circle/deeper/x.png:" in str(
        by_job.value
    )


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {"source": {"type": "image_folder", "root": "images", "listing": "job"}},
            "source.listing: job lists an object store's folders in the Beam job; "
            "source.root images is a local folder: use listing: launcher",
        ),
        (
            {"splits": {"fractions": {"train": 1.0}, "stratify": True, "split_by": "key"}},
            "source.listing: job keeps the files' names out of the launcher, and "
            "splits.stratify assigns them there",
        ),
        (
            {"source": {"type": "image_folder", "root": ROOT, "listing": "workers"}},
            "source.listing: expected 'launcher' or 'job', got 'workers'",
        ),
    ],
    ids=["local_root", "stratify", "unknown_value"],
)
def test_a_listing_by_the_job_is_refused_where_it_cannot_work(store, change, problem):
    config = _config("datasets", "job")
    config.update(change)
    with pytest.raises(ConfigError) as raised:
        build(config)
    assert problem in str(raised.value)
    assert object_store.names(f"{BUCKET}/datasets/") == []


def test_an_incremental_build_from_the_jobs_listing(store, demo_corpus):
    # The build job joins the listing job's files with the base version's
    # records (JoinBase sized by the summary's count) as it does the launcher's.
    base = build(_config("datasets", "job"))
    images = [
        name
        for name in object_store.names(ROOT + "/")
        if name[len(ROOT) + 1 :] not in demo_corpus.broken
        and name.count("/") == 5
        and "/." not in name
    ]
    object_store.put(images[0], object_store.get(images[1]))  # one image changes

    result = build(_config("datasets", "job"))
    full = build(_config("full", "launcher"))

    stored = sum(split.num_examples for split in base.info.splits.values())
    assert result.incremental.used and result.incremental.reused == stored - 1
    assert result.version == full.version
    assert _published(result) == _published(full)
