"""Determinism: the same inputs and config give byte-identical shards and
kiln.json, whatever the runner mode, the number of workers, the order in
which the input files were created, or the order of the rows of a manifest
none of whose rows is dropped (a dropped row's key names its line)."""

import hashlib
import json
import os
import random
import shutil
import textwrap

import pytest

from conftest import BASE_CONFIG, make_config, read_tree, run_kiln
from kiln.pipeline import ConfigError, build, config, demo_targets

BASE_TRANSFORMS = BASE_CONFIG["transforms"]


def digests(result):
    """file name -> sha256 of every file in the version folder (read from disk)."""
    out = {}
    for name in sorted(os.listdir(result.dataset_dir)):
        with open(os.path.join(result.dataset_dir, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def copy_files(source_dir, destination, order):
    """Copies a corpus file by file in the given order (creation order differs)."""
    for relative in order:
        target = os.path.join(destination, relative)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(source_dir, relative), target)


def corpus_listing(root):
    return sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files
    )


def test_same_bytes_across_creation_order_workers_and_running_mode(demo_corpus, tmp_path):
    images = str(tmp_path / "images")
    files = corpus_listing(demo_corpus.out_dir)
    copy_files(demo_corpus.out_dir, images, files)
    config = make_config(images, output=str(tmp_path / "first"))
    first = build(config)  # in-memory, one worker, all cores as image threads

    # Recreate the same files in the opposite order, then build with two
    # worker processes.
    shutil.rmtree(images)
    copy_files(demo_corpus.out_dir, images, list(reversed(files)))
    config["output"] = str(tmp_path / "second")
    second = build(config, ["--direct_num_workers=2", "--direct_running_mode=multi_processing"])

    assert not second.up_to_date
    assert second.version == first.version
    first_files, second_files = digests(first), digests(second)
    assert first_files == second_files
    shard_names = [n for n in first_files if ".tfrecord-" in n]
    assert len(shard_names) == 5  # 3 train, 1 validation, 1 test
    for split in first.info.splits.values():
        for shard in split.shards:
            assert first_files[shard.filename] == shard.sha256  # kiln.json matches the file
    with (
        open(os.path.join(first.dataset_dir, "kiln.json"), "rb") as a,
        open(os.path.join(second.dataset_dir, "kiln.json"), "rb") as b,
    ):
        assert a.read() == b.read()


def test_shuffled_manifest_rows_and_threads_give_the_same_bytes(demo_corpus, tmp_path):
    keys = [k for k in corpus_listing(demo_corpus.out_dir) if k not in demo_corpus.broken]
    rows = [f"{k},{k.split('/')[0]}" for k in keys]
    results = []
    for attempt, args in enumerate(
        [[], ["--direct_num_workers=2", "--direct_running_mode=multi_threading"]]
    ):
        random.Random(attempt).shuffle(rows)
        config = make_config(
            demo_corpus.out_dir,
            output=str(tmp_path / f"out{attempt}"),
            source={
                "type": "manifest",
                "path": _place_manifest(demo_corpus, tmp_path, rows),
                "allowed_roots": [demo_corpus.out_dir],
            },  # where the link leads
            sharding={"num_shards": 2, "compression": "gzip"},
            encoding={"format": "jpeg", "quality": 90},
        )
        results.append(build(config, args, image_threads=1 + attempt))
    first, second = results
    assert first.version == second.version
    assert digests(first) == digests(second)
    assert all(
        s.filename.endswith(".gz") for split in first.info.splits.values() for s in split.shards
    )


def _place_manifest(corpus, tmp_path, rows):
    """A manifest beside a symlink to the corpus, with paths relative to it."""
    folder = tmp_path / "listed"
    folder.mkdir(exist_ok=True)
    link = folder / "images"
    if not link.exists():
        link.symlink_to(corpus.out_dir, target_is_directory=True)
    manifest = folder / "manifest.csv"
    manifest.write_text("path,label\n" + "".join(f"images/{row}\n" for row in rows))
    return str(manifest)


def test_moving_the_source_keeps_the_version(demo_corpus, tmp_path):
    """Versions name content and processing, not locations: the same keys and
    bytes under another folder give the same version and the same shards;
    kiln.json records where each build read from as provenance."""
    first_root = tmp_path / "here" / "images"
    shutil.copytree(demo_corpus.out_dir, first_root)
    config = make_config(str(first_root), output=str(tmp_path / "first"))
    first = build(config)

    # Moved (modification times kept): the stamp matches, nothing is built.
    moved_root = tmp_path / "there" / "renamed"
    moved_root.parent.mkdir()
    os.rename(first_root, moved_root)
    config["source"]["root"] = str(moved_root)
    again = build(config)
    assert again.up_to_date and again.version == first.version

    # Copied with new modification times, into another output: built again,
    # to the same version and byte-identical shards.
    copied_root = tmp_path / "copied"
    copy_files(str(moved_root), str(copied_root), corpus_listing(str(moved_root)))
    config["source"]["root"] = str(copied_root)
    config["output"] = str(tmp_path / "second")
    second = build(config)
    assert not second.up_to_date
    assert second.version == first.version
    assert second.info.config == first.info.config
    assert second.info.config_fingerprint == first.info.config_fingerprint
    shards = [n for n in digests(first) if ".tfrecord-" in n]
    assert len(shards) == 5
    assert {n: digests(second)[n] for n in shards} == {n: digests(first)[n] for n in shards}
    assert first.info.provenance == {"source": {"root": str(first_root), "allowed_roots": []}}
    assert second.info.provenance == {"source": {"root": str(copied_root), "allowed_roots": []}}

    # Another file's bytes under the same key is another version.
    changed = sorted(k for k in corpus_listing(str(copied_root)) if k not in demo_corpus.broken)[0]
    other = sorted(k for k in corpus_listing(str(copied_root)) if k not in demo_corpus.broken)[-1]
    shutil.copyfile(copied_root / other, copied_root / changed)
    assert build(config).version != first.version


def test_a_square_size_written_as_a_pair_is_the_same_config(demo_corpus, tmp_path):
    """A size is one int for a square or ``[height, width]`` (docs/transforms.md):
    ``size: 32`` and ``size: [32, 32]`` are one config, so they give one
    version and byte-identical files, and a rebuild with the other spelling
    is up to date instead of a new version that processes every image again."""
    as_int = make_config(demo_corpus.out_dir, output=str(tmp_path / "as-int"))
    first = build(as_int)

    as_pair = make_config(
        demo_corpus.out_dir,
        output=str(tmp_path / "as-pair"),
        transforms=[{"resize": {"shorter_side": 40}}, {"center_crop": {"size": [32, 32]}}],
    )
    second = build(as_pair)
    assert second.version == first.version
    assert digests(second) == digests(first)
    assert second.info.config["transforms"][1] == {"center_crop": {"size": 32}}

    as_pair["output"] = as_int["output"]
    again = build(as_pair)
    assert again.up_to_date and again.version == first.version


def test_a_flip_pair_written_the_other_way_round_is_the_same_config(tmp_path):
    """A flip pair swaps two keypoints, so ``[[left, right]]`` and
    ``[[right, left]]`` are one config: one version, byte-identical files, and
    a rebuild with the other spelling is up to date instead of a new version
    that processes every image again."""
    data = tmp_path / "data"
    demo_targets.generate(data, num_images=6, seed=3, include_broken=False)

    def config(output, flip_pairs):
        return {
            "name": "scenes",
            "source": {
                "type": "manifest",
                "path": str(data / demo_targets.MANIFEST),
                "classes": list(demo_targets.CLASSES),
            },
            "output": str(tmp_path / output),
            "encoding": {"format": "png"},
            "targets": {
                "boxes": {},
                "keypoints": {"names": list(demo_targets.KEYPOINTS), "flip_pairs": flip_pairs},
            },
        }

    as_named = config("as-named", [["left", "right"]])
    first = build(as_named)
    swapped = config("swapped", [["right", "left"]])
    second = build(swapped)
    assert second.version == first.version
    assert digests(second) == digests(first)
    assert second.info.config["targets"]["keypoints"]["flip_pairs"] == [["left", "right"]]

    swapped["output"] = as_named["output"]
    again = build(swapped)
    assert again.up_to_date and again.version == first.version


def test_file_names_are_read_as_utf8_or_the_build_is_refused(demo_corpus, tmp_path):
    """Keys and class names are file names read as UTF-8. Where Python's
    locale decodes them otherwise (here C, with UTF-8 mode and locale
    coercion off: ASCII), a build of the same files would make another
    dataset (the names dropped as not UTF-8, or read as Latin-1), so it is
    refused, saying how to run it; with PYTHONUTF8=1 the same locale builds
    the names as they are."""
    images = tmp_path / "images"
    shutil.copytree(demo_corpus.out_dir, images)
    first = sorted(
        n for n in os.listdir(images / "circle") if f"circle/{n}" not in demo_corpus.broken
    )[0]
    os.rename(images / "circle" / first, images / "circle" / ("ñandú" + os.path.splitext(first)[1]))
    config = tmp_path / "build.yaml"
    config.write_text(
        json.dumps(make_config(str(images), output=str(tmp_path / "out"))), encoding="utf-8"
    )
    ascii_locale = {"LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0"}

    refused = run_kiln("build", "--config", str(config), PYTHONUTF8="0", **ascii_locale)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        "kiln build: error: source.root is local and Python reads local file names as ascii, "
        "not UTF-8 (the locale's encoding): the same files would give other keys and another "
        "version; run kiln with PYTHONUTF8=1, or in a UTF-8 locale (LC_ALL=C.UTF-8)"
    )
    assert not (tmp_path / "out").exists()

    built = run_kiln("build", "--config", str(config), "--quiet", PYTHONUTF8="1", **ascii_locale)
    assert built.returncode == 0, built.stderr
    dataset = tmp_path / "out" / "shapes"
    version = (dataset / "LATEST").read_text().strip()
    with open(dataset / version / "index.jsonl", encoding="utf-8") as f:
        keys = {json.loads(line)["key"] for line in f}
    assert any(key.startswith("circle/ñandú.") for key in keys)


def test_sharding_written_another_way_for_the_same_shards_is_the_same_config(demo_corpus, tmp_path):
    """``num_shards: 1`` and ``num_shards: {train: 1, validation: 1, test: 1}``
    cut every split alike, and ``target_shard_mb`` sizes nothing when
    ``num_shards`` fixes every split: one config, so one version and
    byte-identical files (the tiny target here spills a run per record, which
    changes no byte), and a rebuild with the other spelling is up to date
    instead of a new version that processes every image again. (A count for a
    split the build does not have is a config error: tests/test_config_checks.py.)"""
    one = make_config(demo_corpus.out_dir, output=str(tmp_path / "one"), sharding={"num_shards": 1})
    first = build(one)
    per_split = make_config(
        demo_corpus.out_dir,
        output=str(tmp_path / "per-split"),
        sharding={
            "num_shards": {"train": 1, "validation": 1, "test": 1},
            "target_shard_mb": 0.001,
        },
    )
    second = build(per_split)
    assert second.version == first.version
    assert read_tree(second.dataset_dir) == read_tree(first.dataset_dir)
    assert second.info.config["sharding"] == {
        "num_shards": 1,
        "target_shard_mb": 128.0,
        "compression": "none",
    }
    per_split["output"] = one["output"]
    again = build(per_split)
    assert again.up_to_date and again.version == first.version


def test_sharding_spellings_share_a_fingerprint_only_for_the_same_shards(demo_corpus):
    """Which spellings of ``sharding`` are one config (see the test above), and
    which are not: a count per split that leaves a split to ``target_shard_mb``,
    or counts that differ, or splits that come from the source (their names
    are known only from the listing)."""

    def fingerprint(sharding, splits=None):
        overrides = {"sharding": sharding} | ({"splits": splits} if splits else {})
        return config.load(make_config(demo_corpus.out_dir, output="out", **overrides)).fingerprint

    every = {"train": 2, "validation": 2, "test": 2}
    assert (
        fingerprint({"num_shards": 2})
        == fingerprint({"num_shards": every})
        == fingerprint({"num_shards": every, "target_shard_mb": 7})
        == fingerprint({"num_shards": 2, "target_shard_mb": 7})
    )
    uneven = {"train": 3, "validation": 1, "test": 1}
    assert fingerprint({"num_shards": uneven}) == fingerprint(
        {"num_shards": uneven, "target_shard_mb": 0.5}
    )
    assert fingerprint({"num_shards": uneven}) != fingerprint({"num_shards": 3})
    assert fingerprint({}) == fingerprint({"num_shards": {}}) == fingerprint({"num_shards": None})
    # A split left to target_shard_mb: it sizes that split's shards.
    some = {"num_shards": {"train": 2}}
    assert fingerprint(some) != fingerprint({**some, "target_shard_mb": 7})
    assert fingerprint(some) != fingerprint({"num_shards": 2})
    # Splits from the source: a count per split may leave one to the target.
    from_source = {"from_source": True}
    assert fingerprint({"num_shards": 2}, from_source) == fingerprint(
        {"num_shards": 2, "target_shard_mb": 7}, from_source
    )
    assert fingerprint({"num_shards": {"train": 2}}, from_source) != fingerprint(
        {"num_shards": {"train": 2}, "target_shard_mb": 7}, from_source
    )


# Two plugin modules, each registering an offline transform.
PLUGIN_SOURCES = {
    "kiln_test_order_a": """
        import numpy as np
        from kiln.transforms import register

        @register()
        def order_a_invert(image: np.ndarray) -> np.ndarray:
            return 255 - image
    """,
    "kiln_test_order_b": """
        import numpy as np
        from kiln.transforms import register

        @register()
        def order_b_darken(image: np.ndarray) -> np.ndarray:
            return image // 2
    """,
}


@pytest.fixture
def plugin_modules(tmp_path, monkeypatch):
    folder = tmp_path / "plugins"
    folder.mkdir()
    for name, source in PLUGIN_SOURCES.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(folder))


def test_the_order_plugins_are_listed_in_is_not_part_of_the_config(
    plugin_modules, demo_corpus, tmp_path
):
    """``plugins:`` are imported in name order, each once, whatever the order
    written: [b, a] and [a, b] (and [a, b, a]) register the same functions,
    so they are one config, one version, byte-identical files."""

    def with_plugins(output, plugins):
        return make_config(
            demo_corpus.out_dir,
            output=str(tmp_path / output),
            plugins=plugins,
            transforms=[*BASE_TRANSFORMS, "order_a_invert", "order_b_darken"],
        )

    first = build(with_plugins("ab", ["kiln_test_order_a", "kiln_test_order_b"]))
    second = build(
        with_plugins("ba", ["kiln_test_order_b", "kiln_test_order_a", "kiln_test_order_b"])
    )
    assert second.version == first.version
    assert read_tree(second.dataset_dir) == read_tree(first.dataset_dir)
    assert second.info.config["plugins"] == ["kiln_test_order_a", "kiln_test_order_b"]


# Registers a transform of the name given: two such modules clash.
CLASHING_SOURCE = """
import numpy as np
from kiln.transforms import register

@register("{name}")
def clashing(image: np.ndarray) -> np.ndarray:
    return image
"""


@pytest.mark.parametrize("order", [["c", "d"], ["d", "c"]])
def test_two_plugins_registering_one_name_are_a_config_error_in_either_order(
    demo_corpus, tmp_path, monkeypatch, order
):
    # Imported in name order, the second of the pair to register the name is
    # refused, whichever order the config lists them in: never a build whose
    # transform depends on the order written. (Modules and name of their own
    # per case: a module imported once stays registered.)
    tag = "".join(order)
    for letter in "cd":
        source = CLASHING_SOURCE.format(name=f"kiln_test_clash_{tag}")
        (tmp_path / f"kiln_test_clash_{tag}_{letter}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = [f"kiln_test_clash_{tag}_{letter}" for letter in order]
    with pytest.raises(ConfigError) as refused:
        config.load(make_config(demo_corpus.out_dir, output="out", plugins=plugins))
    index = plugins.index(f"kiln_test_clash_{tag}_d")
    assert (
        f"plugins[{index}]: importing module 'kiln_test_clash_{tag}_d' raised ValueError: an "
        f"offline transform named 'kiln_test_clash_{tag}' is already registered"
    ) in str(refused.value)
    assert f"kiln_test_clash_{tag}_c'" not in str(refused.value)
