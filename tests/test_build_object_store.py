"""A build whose source and output are on an object store (no directories,
rename = copy + delete), through the in-memory `memgs://` store: the same
code paths as gs://, minus the network."""

import hashlib
import threading

import pytest
from apache_beam.io.filesystem import BeamIOError

import object_store
from conftest import make_config, put_folder
from kiln.pipeline import build, sources, storage
from kiln.pipeline.error_report import DroppedFile
from kiln.pipeline.launcher import BuildError
from kiln.schemas import RECORD

BUCKET = f"{object_store.SCHEME}://bucket"


@pytest.fixture
def store(corpus_on_memgs):
    """The demo corpus under ``memgs://bucket/images`` (`BUCKET`)."""
    assert corpus_on_memgs == BUCKET


def test_build_publishes_on_an_object_store(store, build_dataset, demo_corpus):
    stale = f"{BUCKET}/datasets/shapes/.staging-0123456789ab-dead/shapes-train.tfrecord-x"
    object_store.put(stale, b"left by a killed build")
    object_store.EVENTS.clear()

    config = make_config(f"{BUCKET}/images", output=f"{BUCKET}/datasets")
    result = build(config)  # the in-memory local runner: one process, one store

    root = f"{BUCKET}/datasets/shapes"
    version_dir = f"{root}/{result.version}"
    assert result.dataset_dir == version_dir
    assert object_store.get(f"{root}/LATEST").decode() == result.version + "\n"
    assert not [p for p in object_store.names(root) if "/.staging-" in p]  # stale one too
    published = [p[len(version_dir) + 1 :] for p in object_store.names(version_dir + "/")]
    shard_names = [s.filename for split in result.info.splits.values() for s in split.shards]
    assert set(shard_names) | {"errors.jsonl", "kiln.json"} <= set(published)

    # Same records as the local build of the same files: keys are relative to
    # the root, and the shards are byte-identical.
    local = build_dataset()
    for name, split in result.info.splits.items():
        assert [s.sha256 for s in split.shards] == [
            s.sha256 for s in local.info.splits[name].shards
        ]
        for shard in split.shards:
            data = object_store.get(f"{version_dir}/{shard.filename}")
            assert hashlib.sha256(data).hexdigest() == shard.sha256
    first_shard = object_store.get(f"{version_dir}/{shard_names[0]}")
    key = RECORD.decode(first_shard[12 : 12 + int.from_bytes(first_shard[:8], "little")])["key"]
    assert not key.decode().startswith(("/", BUCKET))

    # Visibility order: every file of the version before its kiln.json, LATEST last
    # (then only kiln's note that it wrote LATEST, which no reader reads).
    writes = [path for kind, path in object_store.EVENTS if kind == "write"]
    into_version = [p for p in writes if p.startswith(version_dir + "/")]
    assert into_version[-1] == f"{version_dir}/kiln.json"
    assert writes[-2:] == [f"{root}/LATEST", f"{root}/.published/.named"]

    # Unchanged: up to date, nothing written but (at most) LATEST.
    object_store.EVENTS.clear()
    again = build(config)
    assert again.up_to_date and again.version == result.version
    # The lock object is created and deleted around the check.
    assert [e for e in object_store.EVENTS if e[1] not in (f"{root}/LATEST", f"{root}/.lock")] == []
    assert f"{root}/.lock" not in object_store.names(root)


@pytest.mark.parametrize("folder", ["scans[2024]", "scans*", "scans?"])
def test_a_source_folder_whose_name_holds_a_wildcard_is_read_as_named(
    store, build_dataset, demo_corpus, folder
):
    """Beam reads * ? [ in a match pattern as wildcards: the folder
    ``scans[2024]`` was 'not found or empty' (its pattern matched
    ``scans2``...), though its files were there."""
    put_folder(demo_corpus.out_dir, f"{BUCKET}/{folder}")
    # Beside it, what the unescaped pattern would match instead.
    put_folder(demo_corpus.out_dir, f"{BUCKET}/scans2")
    result = build(make_config(f"{BUCKET}/{folder}", output=f"{BUCKET}/datasets"))
    local = build_dataset()
    assert result.info.splits == local.info.splits


def test_a_failed_build_keeps_only_its_error_report_on_an_object_store(store):
    config = make_config(
        f"{BUCKET}/images", output=f"{BUCKET}/datasets", errors={"max_fraction": 0.02}
    )
    with pytest.raises(BuildError, match=r"The rows are in .*/\.staging-.*/errors\.jsonl"):
        build(config)
    staged = [
        name for name in object_store.names(f"{BUCKET}/datasets/shapes/") if "/.staging-" in name
    ]
    assert [name.rsplit("/", 1)[1] for name in staged] == ["errors.jsonl"], staged


def test_an_incremental_build_reads_its_base_from_the_object_store(store, demo_corpus):
    config = make_config(f"{BUCKET}/images", output=f"{BUCKET}/datasets")
    base = build(config)
    good = sorted(
        name[len(f"{BUCKET}/images/") :]
        for name in object_store.names(f"{BUCKET}/images/")
        if name[len(f"{BUCKET}/images/") :] not in demo_corpus.broken
    )
    # One image changes: its bytes become another image's.
    object_store.put(f"{BUCKET}/images/{good[0]}", object_store.get(f"{BUCKET}/images/{good[1]}"))

    result = build(config)
    full = build(dict(config, output=f"{BUCKET}/full"))

    stored = sum(split.num_examples for split in base.info.splits.values())
    assert result.incremental.used and result.incremental.reused == stored - 1
    assert result.version == full.version and result.info == full.info
    for name in [s.filename for split in full.info.splits.values() for s in split.shards] + [
        "kiln.json",
        "index.jsonl",
    ]:
        assert object_store.get(f"{result.dataset_dir}/{name}") == object_store.get(
            f"{full.dataset_dir}/{name}"
        )


def test_an_image_folder_on_an_object_store_lists_without_a_request_per_object(store, demo_corpus):
    # One listing holds every object's size and time, and an object store has
    # no special files to refuse: a request per object would make 10M images
    # 10M sequential round trips on the launcher (BENCHMARKS.md, Listing).
    object_store.OBJECT_REQUESTS.clear()
    source = sources.ImageFolderSource(type="image_folder", root=f"{BUCKET}/images")
    with source.list_files(splits_from_source=False) as listing:
        assert listing.num_files + listing.num_dropped == len(object_store.names(BUCKET))
        rows = {row.key: row for row in listing.files()}
    assert object_store.OBJECT_REQUESTS == []
    some_key = sorted(rows)[0]
    assert rows[some_key].size == len(object_store.get(f"{BUCKET}/images/{some_key}"))


def _list_manifest(rows: list[tuple[str, str]]):
    """Lists a manifest of ``(path, label)`` rows put beside the images; returns its
    files, its dropped rows and the requests the listing made."""
    manifest = f"{BUCKET}/images/manifest.csv"
    text = "path,label\n" + "".join(f"{path},{label}\n" for path, label in rows)
    object_store.put(manifest, text.encode())
    object_store.OBJECT_REQUESTS.clear()
    object_store.LIST_REQUESTS.clear()
    source = sources.ManifestSource(type="manifest", path=manifest)
    with source.list_files(splits_from_source=False) as listing:
        files = [(f.key, f.uri, f.size, f.mtime) for f in listing.files()]
        dropped = list(listing.dropped())
    return files, dropped, list(object_store.OBJECT_REQUESTS), object_store.LIST_REQUESTS[:]


def test_a_manifest_on_an_object_store_lists_its_folders_not_each_row(
    store, demo_corpus, monkeypatch
):
    # A metadata request per row would make 10M rows 10M round trips one after another
    # (docs/dataflow.md, "Listing at scale"): the rows' folders are listed once each.
    # Every folder here is listed, however few its rows (the per-row rule is tested below).
    monkeypatch.setattr(sources, "_PER_ROW_MAX_OBJECTS", 0)
    images = f"{BUCKET}/images"
    keys = [name[len(images) + 1 :] for name in object_store.names(images + "/")]
    classes = sorted({key.split("/")[0] for key in keys})
    object_store.put(f"{images}/{classes[0]}/deeper/extra.png", b"not an image, but an object")
    keys.append(f"{classes[0]}/deeper/extra.png")

    def rows(count: int) -> list[tuple[str, str]]:
        """`count` rows of existing objects, then a missing one in each class folder,
        one in a folder with no objects, and one outside the source."""
        chosen = sorted(keys)[:count]
        return (
            [(key, key.split("/")[0]) for key in chosen]
            + [(f"{name}/missing.png", name) for name in classes]
            + [("nowhere/missing.png", classes[0]), ("memgs://other/x.png", classes[0])]
        )

    small = _list_manifest(rows(len(classes)))
    large = _list_manifest(rows(len(keys)))

    # No request per row, and the same listings whatever the number of rows: one per
    # folder the rows name (the nested one comes with its class folder's), none
    # outside the source.
    expected_listings = sorted([f"{images}/{name}/" for name in classes] + [f"{images}/nowhere/"])
    for _, _, per_object, listings in (small, large):
        assert per_object == []
        assert sorted(listings) == expected_listings

    # Every existing object with its size and time, as a metadata request would give.
    files, dropped, _, _ = large
    assert files == sorted(
        (key, f"{images}/{key}", len(object_store.get(f"{images}/{key}")), mtime)
        for key in keys
        for _, mtime in [object_store.OBJECTS[f"{images}/{key}"]]
    )
    # A row naming a missing object is dropped as before: `missing`.
    missing = sorted([f"{name}/missing.png" for name in classes] + ["nowhere/missing.png"])
    assert [d for d in dropped if d.reason != "outside_source"] == _missing(missing)
    assert [(d.key, d.reason) for d in dropped if d.reason == "outside_source"] == [
        ("memgs://other/x.png", "outside_source")
    ]


def _put_folder(folder: str, count: int) -> list[str]:
    """Puts `count` small objects in `folder`; returns their URIs, sorted."""
    uris = [f"{folder}/{i:05d}.png" for i in range(count)]
    for i, uri in enumerate(uris):
        object_store.put(uri, b"x" * (1 + i % 7))
    return uris


def _expected_files(uris: list[str]) -> list[tuple[str, str, int, float]]:
    """What a metadata request says of each of `uris`, as `_list_manifest` returns files."""
    prefix = f"{BUCKET}/images/"
    return sorted(
        (uri[len(prefix) :], uri, len(data), mtime)
        for uri in uris
        for data, mtime in [object_store.OBJECTS[uri]]
    )


def _missing(keys: list[str]) -> list[DroppedFile]:
    images = f"{BUCKET}/images"
    return [
        DroppedFile(
            key,
            "list",
            "missing",
            f"{images}/{key}",
            f"listed in manifest.csv but not found ([Errno 2] No such object: '{images}/{key}')",
        )
        for key in sorted(keys)
    ]


def test_a_few_rows_of_a_large_folder_are_asked_for_one_by_one(store, monkeypatch):
    # A listing is of the whole folder: 5 rows out of a folder of 40 objects (millions,
    # scaled down with the limit) are 5 metadata requests, with no listing of the folder.
    monkeypatch.setattr(sources, "_PER_ROW_MAX_OBJECTS", 8)
    big = _put_folder(f"{BUCKET}/images/big", 40)
    chosen = big[::10] + [big[-1]]
    rows = [(uri.split("/images/")[1], "big") for uri in chosen] + [("big/missing.png", "big")]

    files, dropped, per_object, listings = _list_manifest(rows)

    assert listings == []
    assert sorted(per_object) == sorted(
        [("metadata", uri) for uri in chosen] + [("metadata", f"{BUCKET}/images/big/missing.png")]
    )
    assert files == _expected_files(chosen)
    assert dropped == _missing(["big/missing.png"])


def test_many_rows_of_a_folder_list_it(store, monkeypatch):
    monkeypatch.setattr(sources, "_PER_ROW_MAX_OBJECTS", 8)
    big = _put_folder(f"{BUCKET}/images/big", 40)
    chosen = big[:20]
    rows = [(uri.split("/images/")[1], "big") for uri in chosen] + [("big/missing.png", "big")]

    files, dropped, per_object, listings = _list_manifest(rows)

    assert listings == [f"{BUCKET}/images/big/"]
    assert per_object == []
    assert files == _expected_files(chosen)
    assert dropped == _missing(["big/missing.png"])


def test_a_manifest_mixes_listed_folders_and_rows_asked_for(store, monkeypatch):
    # Decided per folder: a listed folder brings the folders below it, whatever their
    # counts; a folder whose rows are asked for leaves a crowded folder below it to its
    # own listing; each object is found once either way. A folder outside the source
    # (the bucket's top, here) is neither, and hides no folder below it.
    monkeypatch.setattr(sources, "_PER_ROW_MAX_OBJECTS", 8)
    images = f"{BUCKET}/images"
    few = _put_folder(f"{images}/few", 30)  # 2 rows: asked for
    crowded_below_few = _put_folder(f"{images}/few/crowded", 30)  # 12 rows: listed
    sparse_below_few = _put_folder(f"{images}/few/sparse", 30)  # 1 row: asked for
    many = _put_folder(f"{images}/many", 30)  # 10 rows: listed
    few_below_many = _put_folder(f"{images}/many/few", 30)  # 2 rows: with many's listing
    sibling = _put_folder(f"{images}/many-sibling", 30)  # sorts between many/ and its folders
    chosen = (
        few[:2] + crowded_below_few[:12] + sparse_below_few[:1] + many[:10] + few_below_many[:2]
    ) + sibling[:3]
    missing = ["few/missing.png", "many/few/missing.png", "few/crowded/missing.png"]
    outside = f"{BUCKET}/outside.png"
    object_store.put(outside, b"outside the source")
    rows = (
        [(outside, "x")]
        + [(uri[len(images) + 1 :], "x") for uri in chosen]
        + [(key, "x") for key in missing]
    )

    files, dropped, per_object, listings = _list_manifest(rows)

    assert sorted(listings) == [f"{images}/few/crowded/", f"{images}/many/"]
    asked = few[:2] + sparse_below_few[:1] + sibling[:3] + [f"{images}/few/missing.png"]
    assert sorted(per_object) == sorted(("metadata", uri) for uri in asked)
    assert files == _expected_files(chosen)
    assert [d for d in dropped if d.reason == "missing"] == _missing(missing)
    assert [(d.key, d.reason) for d in dropped if d.reason != "missing"] == [
        (outside, "outside_source")
    ]


def test_a_failed_prefix_listing_stops_the_concurrent_walk_with_its_error(store):
    prefixes = [f"{BUCKET}/images/{name}/" for name in ("a", "b", "c")] + ["nosuchscheme://x/"]
    with pytest.raises(ValueError, match="nosuchscheme://x/"):
        list(storage.walk_prefixes(prefixes))
    assert not [t for t in threading.enumerate() if t.name.startswith("kiln-list-")]


def test_an_object_asked_for_is_left_out_if_missing_and_any_other_error_stops_the_walk(
    store, monkeypatch
):
    objects = _put_folder(f"{BUCKET}/images/some", 3)
    missing = f"{BUCKET}/images/some/missing.png"
    found = list(storage.walk_prefixes([], objects + [missing]))
    assert sorted((m.path, m.size_in_bytes) for m in found) == [
        (uri, len(object_store.get(uri))) for uri in objects
    ]

    def refuse(self, path):
        raise BeamIOError("Metadata operation failed", {path: PermissionError(path)})

    monkeypatch.setattr(object_store.InMemoryObjectStore, "metadata", refuse)
    with pytest.raises(BeamIOError, match="Metadata operation failed"):
        list(storage.walk_prefixes([], objects))
    assert not [t for t in threading.enumerate() if t.name.startswith("kiln-list-")]
