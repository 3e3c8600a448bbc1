"""End to end: build generated corpora on the local runner, read every shard
back with tf.data, and check records, pixels, metadata, errors and publishing."""

import gc
import hashlib
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from conftest import NUM_DEMO_IMAGES as NUM_GOOD
from conftest import make_config
from kiln import cli, schemas
from kiln.errors import ConfigError
from kiln.pipeline import BuildError, build, launcher, publish
from kiln.schemas import RECORD
from kiln.schemas.tfds_metadata import tfds_files
from kiln.transforms import decode_image, encode_image, functional


def read_split(result, split):
    """Every record of a split, in shard order, decoded with TF ops."""
    info = result.info
    paths = [os.path.join(result.dataset_dir, s.filename) for s in info.splits[split].shards]
    compression = "GZIP" if info.compression == "gzip" else None
    records = []
    for serialized in tf.data.TFRecordDataset(paths, compression_type=compression):
        parsed = RECORD.parse(serialized)
        image = schemas.decode_image(
            parsed["image"],
            parsed["height"],
            parsed["width"],
            info.channels,
            info.encoding["format"],
        )
        records.append(
            {
                "key": parsed["key"].numpy().decode(),
                "label": int(parsed["label"]),
                "sha256": parsed["sha256"].numpy().decode(),
                "image": image.numpy(),
                "channels": int(parsed["channels"]),
                "encoded": parsed["image"].numpy(),
            }
        )
    return records


def read_all(result):
    return {split: read_split(result, split) for split in result.info.splits}


def read_jsonl(dataset_dir, name):
    with open(os.path.join(dataset_dir, name)) as f:
        return [json.loads(line) for line in f]


def split_of(result, key):
    return next(
        split for split, records in read_all(result).items() if key in [r["key"] for r in records]
    )


def corpus_files(corpus):
    keys = []
    for class_name in sorted(os.listdir(corpus.out_dir)):
        for name in sorted(os.listdir(os.path.join(corpus.out_dir, class_name))):
            keys.append(f"{class_name}/{name}")
    return keys


def expected_pixels(corpus, key, channels=3):
    """The base config's transforms applied directly: resize (the kernel), then a NumPy crop."""
    with open(os.path.join(corpus.out_dir, key), "rb") as f:
        image = decode_image(f.read(), channels=channels)
    image = functional.resize(image, shorter_side=40)
    top, left = (image.shape[0] - 32) // 2, (image.shape[1] - 32) // 2
    return image[top : top + 32, left : left + 32]


def file_sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_png_build_reads_back_exactly(build_dataset, demo_corpus):
    result = build_dataset()
    info = result.info
    records = read_all(result)

    good = [k for k in corpus_files(demo_corpus) if k not in demo_corpus.broken]
    assert sorted(r["key"] for rs in records.values() for r in rs) == sorted(good)
    assert info.class_names == ["circle", "square", "star", "triangle"]
    assert sorted(info.splits) == ["test", "train", "validation"]
    for split, rs in records.items():
        assert len(rs) == info.splits[split].num_examples > 0
        counts = {name: 0 for name in info.class_names}
        for r in rs:
            class_name = r["key"].split("/")[0]
            assert r["label"] == info.class_names.index(class_name)
            counts[class_name] += 1
            with open(os.path.join(demo_corpus.out_dir, r["key"]), "rb") as f:
                assert r["sha256"] == hashlib.sha256(f.read()).hexdigest()
            np.testing.assert_array_equal(
                r["image"], expected_pixels(demo_corpus, r["key"]), err_msg=r["key"]
            )
        assert info.splits[split].class_counts == counts
    assert info.image_size == [32, 32] and info.channels == 3


def test_jpeg_build_is_within_jpeg_tolerance(build_dataset, demo_corpus):
    result = build_dataset(encoding={"format": "jpeg", "quality": 95})
    assert result.info.encoding == {"format": "jpeg", "quality": 95}
    errors = []
    for rs in read_all(result).values():
        for r in rs:
            expected = expected_pixels(demo_corpus, r["key"])
            # Exact: the stored bytes are the expected pixels, JPEG-encoded.
            assert r["encoded"] == encode_image(expected, format="jpeg", quality=95), r["key"]
            difference = np.abs(r["image"].astype(np.int16) - expected.astype(np.int16))
            errors.append(difference.mean())
    # Read back by TF: JPEG loss only. The demo's noise backgrounds at 32x32
    # are JPEG's worst case (up to ~18 levels mean); typical is 2-5.
    assert max(errors) < 25 and np.mean(errors) < 6


def test_raw_grayscale_build_reads_back_exactly(build_dataset, demo_corpus):
    result = build_dataset(image={"channels": 1}, encoding={"format": "raw"})
    assert result.info.channels == 1
    for rs in read_all(result).values():
        for r in rs:
            assert r["channels"] == 1
            np.testing.assert_array_equal(
                r["image"], expected_pixels(demo_corpus, r["key"], channels=1)
            )


def test_metadata_describes_the_files(build_dataset, demo_corpus):
    result = build_dataset()
    info = result.info
    records = read_all(result)
    root = result.dataset_root

    with open(os.path.join(root, "LATEST")) as f:
        assert f.read().strip() == result.version == info.version
    assert result.dataset_dir == os.path.join(root, result.version)
    assert not [e for e in os.listdir(root) if e.startswith(".staging-")]
    listed = sorted(os.listdir(result.dataset_dir))
    shard_files = sorted(s.filename for split in info.splits.values() for s in split.shards)
    assert listed == sorted(
        shard_files
        + ["duplicates.jsonl", "errors.jsonl", "index.jsonl", "kiln.json"]
        + list(tfds_files(info))
    )
    assert [s.filename for s in info.splits["train"].shards] == [
        f"shapes-train.tfrecord-{i:05d}-of-00003" for i in range(3)
    ]

    for name, split in info.splits.items():
        for shard in split.shards:
            path = os.path.join(result.dataset_dir, shard.filename)
            assert file_sha256(path) == shard.sha256
            assert os.path.getsize(path) == shard.num_bytes
            assert sum(1 for _ in tf.data.TFRecordDataset(path)) == shard.num_records
        # Statistics of the stored pixels, against NumPy over what was read back.
        pixels = np.concatenate([r["image"].reshape(-1, 3) for r in records[name]]).astype(float)
        assert split.statistics.count == pixels.shape[0]
        np.testing.assert_allclose(split.statistics.mean, pixels.mean(axis=0), rtol=1e-9)
        np.testing.assert_allclose(split.statistics.std, pixels.std(axis=0), rtol=1e-9)

    with open(os.path.join(result.dataset_dir, "kiln.json")) as f:
        text = f.read()
    assert text == info.dumps()  # canonical JSON
    data = json.loads(text)
    assert data["config"]["transforms"][0] == {
        "resize": {"shorter_side": 40, "longer_side": None, "size": None, "interpolation": "auto"}
    }
    assert "output" not in data["config"]  # where a dataset lives is not part of it
    assert data["schema"] == RECORD.to_json()
    assert data["dropped"] == {reason: 1 for reason in demo_corpus.broken.values()}
    # The reports beside kiln.json are pinned by their sha256, kiln.json by its own checksum.
    for name, field in [
        ("errors.jsonl", "errors_sha256"),
        ("duplicates.jsonl", "duplicates_sha256"),
        ("index.jsonl", "index_sha256"),
    ]:
        assert data[field] == file_sha256(os.path.join(result.dataset_dir, name))
    assert data["checksum"] == schemas.metadata.content_checksum(data) == info.checksum
    assert data["format_version"] == 2
    assert open(os.path.join(result.dataset_dir, "duplicates.jsonl"), "rb").read() == b""

    with open(os.path.join(result.dataset_dir, "errors.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert [(r["key"], r["stage"], r["reason"]) for r in rows] == [
        (key, "decode", reason) for key, reason in sorted(demo_corpus.broken.items())
    ]
    assert all(r["uri"] == os.path.join(demo_corpus.out_dir, r["key"]) for r in rows)


def test_gzip_shards(build_dataset):
    result = build_dataset(sharding={"num_shards": 2, "compression": "gzip"})
    assert result.info.compression == "gzip"
    for split in result.info.splits.values():
        assert [s.filename[-3:] for s in split.shards] == [".gz", ".gz"]
        for shard in split.shards:
            path = os.path.join(result.dataset_dir, shard.filename)
            assert file_sha256(path) == shard.sha256
    plain = build_dataset()
    assert {k: v.num_examples for k, v in result.info.splits.items()} == {
        k: v.num_examples for k, v in plain.info.splits.items()
    }
    assert [r["key"] for r in read_split(result, "test")] == [
        r["key"] for r in read_split(plain, "test")
    ]  # same order: sort by key hash


def copy_corpus(corpus, destination):
    shutil.copytree(corpus.out_dir, destination)
    return str(destination)


def test_rebuild_is_up_to_date_and_changes_make_new_versions(demo_corpus, tmp_path, monkeypatch):
    root = copy_corpus(demo_corpus, tmp_path / "images")
    config = make_config(root, output=str(tmp_path / "out"))
    first = build(config)
    assert not first.up_to_date
    counters = first.counters
    assert (counters["files_read"], counters["images_decoded"], counters["records_written"]) == (
        63,
        60,
        60,
    )
    assert counters["shards_written"] == 5
    assert {k: v for k, v in counters.items() if k.startswith("dropped_")} == {
        f"dropped_{reason}": 1 for reason in demo_corpus.broken.values()
    }

    # Unchanged inputs: no Beam job at all.
    def no_job(*args, **kwargs):
        raise AssertionError("an up-to-date rebuild must not construct the Beam job")

    with monkeypatch.context() as patch:
        patch.setattr(launcher, "construct_pipeline", no_job)
        again = build(config)
    assert again.up_to_date and again.version == first.version
    assert again.info.dumps() == first.info.dumps()

    # A changed file gives a new version; the old one stays readable.
    good = [k for k in corpus_files(demo_corpus) if k not in demo_corpus.broken]
    circle, square, star = (next(k for k in good if k.startswith(c)) for c in ("ci", "sq", "st"))
    with open(os.path.join(root, square), "rb") as f:
        replacement = f.read()
    with open(os.path.join(root, circle), "wb") as f:
        f.write(replacement)
    second = build(config)
    assert second.version != first.version and not second.up_to_date
    assert second.info.duplicates == 1  # the circle file is now a copy of the square one
    assert read_jsonl(second.dataset_dir, "duplicates.jsonl") == [
        {
            "sha256": hashlib.sha256(replacement).hexdigest(),
            "keys": sorted([circle, square]),
            "splits": [split_of(second, key) for key in sorted([circle, square])],
        }
    ]
    with open(os.path.join(first.dataset_root, "LATEST")) as f:
        assert f.read() == second.version + "\n"
    assert os.path.exists(os.path.join(first.dataset_dir, "kiln.json"))

    # A removed file gives another new version.
    os.remove(os.path.join(root, star))
    third = build(config)
    assert len({first.version, second.version, third.version}) == 3
    assert sum(s.num_examples for s in third.info.splits.values()) == 59


def test_too_many_dropped_files_fail_the_build_and_publish_nothing(demo_corpus, tmp_path, capsys):
    config = make_config(
        demo_corpus.out_dir, output=str(tmp_path / "out"), errors={"max_fraction": 0.02}
    )
    with pytest.raises(
        BuildError, match=r"dropped 3 of 63 input files .* errors.max_fraction 2.0%"
    ):
        build(config)
    dataset_root = tmp_path / "out" / "shapes"
    entries = os.listdir(dataset_root)
    assert "LATEST" not in entries
    # The staging folder keeps its error report for the user, and nothing
    # else (no shard, index or work file: GBs at scale); the next build
    # removes it. The lock file stays (unlocked): see kiln.pipeline.lock.
    (staging,) = [e for e in entries if e != ".lock"]
    assert sorted(entries) == [".lock", staging] and staging.startswith(".staging-")
    assert os.listdir(dataset_root / staging) == ["errors.jsonl"]
    assert len((dataset_root / staging / "errors.jsonl").read_text().splitlines()) == 3

    # The command: exit code 1 and one line saying why.
    import yaml

    path = tmp_path / "strict.yaml"
    path.write_text(yaml.safe_dump(config))
    assert cli.main(["build", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kiln build: failed: dropped 3 of 63 input files (4.8%)")
    assert "Traceback" not in err
    assert "LATEST" not in os.listdir(dataset_root)

    config["errors"] = {"max_fraction": 0.1}
    result = build(config)
    assert sorted(os.listdir(dataset_root)) == sorted(
        [".file-stamps", ".lock", ".published", ".stamps", "LATEST", result.version]
    )


def test_cli_builds_and_prints_a_summary(demo_corpus, tmp_path, capsys):
    import yaml

    config = make_config(demo_corpus.out_dir, output=str(tmp_path / "ignored"))
    path = tmp_path / "shapes.yaml"
    path.write_text(yaml.safe_dump(config))
    out_root = tmp_path / "out"
    assert (
        cli.main(
            ["build", "--config", str(path), "--output", str(out_root), "--image-threads", "2"]
        )
        == 0
    )
    printed = capsys.readouterr().out
    latest = (out_root / "shapes" / "LATEST").read_text()
    assert latest.endswith("\n") and latest.count("\n") == 1  # one line, as text files end
    latest = latest.rstrip("\n")
    assert f"dataset: {out_root / 'shapes' / latest}" in printed
    info = publish.DatasetRoot(str(out_root / "shapes")).read_info(latest)
    for name, split in info.splits.items():
        assert f"{name}" in printed and f"{split.num_examples}" in printed
    assert "dropped: 3 (corrupt: 1, empty: 1, not_an_image: 1)" in printed
    assert "duplicates: 0" in printed
    assert not (tmp_path / "ignored").exists()

    assert cli.main(["build", "--config", str(path), "--output", str(out_root)]) == 0
    assert "is up to date" in capsys.readouterr().out
    # The command freezes the garbage collector's view while it builds, and
    # undoes it: run in a long-lived process, it must not leave objects immortal.
    assert gc.get_freeze_count() == 0


def write_manifest(path, rows, header="path,label,split"):
    path.write_text(header + "\n" + "".join(row + "\n" for row in rows))
    return str(path)


def test_split_names_that_differ_only_in_case_are_refused(demo_corpus, tmp_path):
    images = copy_corpus(demo_corpus, tmp_path / "data" / "images")
    good = [k for k in corpus_files(demo_corpus) if k not in demo_corpus.broken][:6]
    splits = ["train", "Train", "test", "train", "TEST", "test"]
    rows = [f"images/{k},{k.split('/')[0]},{split}" for k, split in zip(good, splits, strict=True)]
    manifest = write_manifest(tmp_path / "data" / "manifest.csv", rows)
    config = make_config(
        images,
        output=str(tmp_path / "out"),
        source={"type": "manifest", "path": manifest},
        splits={"from_source": True},
    )
    with pytest.raises(ConfigError) as raised:
        build(config)
    assert str(raised.value) == (
        f"config error in config: source.path: {manifest}: the source names splits that "
        f"differ only in case ('TEST' and 'test'; 'Train' and 'train'): each would be a split "
        f"of its own; name them alike"
    )
    assert not (tmp_path / "out" / "shapes" / "LATEST").exists()  # nothing was built


def test_a_build_that_drops_too_much_quotes_the_first_row_of_its_main_reason(demo_corpus, tmp_path):
    # Paths written relative to the folder above the manifest's (a newcomer's
    # mistake): every row is missing, and the failure line shows where kiln
    # looked, without opening errors.jsonl.
    copy_corpus(demo_corpus, tmp_path / "data" / "images")
    good = sorted(k for k in corpus_files(demo_corpus) if k not in demo_corpus.broken)[:6]
    rows = [f"data/images/{k},{k.split('/')[0]}" for k in good]
    manifest = write_manifest(tmp_path / "data" / "manifest.csv", rows, header="path,label")
    config = make_config(
        tmp_path, output=str(tmp_path / "out"), source={"type": "manifest", "path": manifest}
    )
    with pytest.raises(BuildError) as raised:
        build(config)
    message = str(raised.value)
    looked_for = tmp_path / "data" / "data" / "images" / good[0]
    assert (
        f"(missing: 6); nothing was published. The first missing: data/images/{good[0]}: "
        f"listed in manifest.csv but not found ([Errno 2] No such file or directory: "
        f"'{looked_for}'). The rows are in "
    ) in message, message
    assert "\n" not in message


def test_manifest_source_with_splits_and_bad_rows(demo_corpus, tmp_path):
    # The manifest lives beside a copy of the corpus; paths are relative to it.
    images = copy_corpus(demo_corpus, tmp_path / "data" / "images")
    good = [k for k in corpus_files(demo_corpus) if k not in demo_corpus.broken]
    keys = good[:24]  # circles and squares
    star = next(k for k in good if k.startswith("star/"))
    rows = [
        f"images/{k},{k.split('/')[0]},{'train' if i % 3 else 'test'}" for i, k in enumerate(keys)
    ]
    rows += [
        "images/circle/missing.png,circle,train",  # missing file
        f"images/{keys[0]},circle,train,extra",  # too many fields
        f"images/{star},hexagon,train",  # not in source.classes
        f"{os.path.join(images, keys[1])},{keys[1].split('/')[0]},test",  # absolute path
    ]
    manifest = write_manifest(tmp_path / "data" / "manifest.csv", list(reversed(rows)))
    config = make_config(
        images,
        output=str(tmp_path / "out"),
        source={
            "type": "manifest",
            "path": manifest,
            "classes": ["circle", "square", "star", "triangle"],
            "allowed_roots": [images],
        },  # the absolute path
        splits={"from_source": True},
        errors={"max_fraction": 0.5},
    )
    result = build(config)
    records = read_all(result)
    assert sorted(result.info.splits) == ["test", "train"]
    assert sorted(r["key"] for r in records["test"]) == sorted(
        [f"images/{k}" for i, k in enumerate(keys) if i % 3 == 0] + [os.path.join(images, keys[1])]
    )
    assert len(records["train"]) == 16
    for r in records["train"]:
        assert r["label"] == result.info.class_names.index(r["key"].split("/")[1])
    with open(os.path.join(result.dataset_dir, "errors.jsonl")) as f:
        reasons = sorted((json.loads(line)["reason"], json.loads(line)["key"]) for line in f)
    assert reasons == [
        ("bad_row", "manifest.csv:4"),
        ("missing", "images/circle/missing.png"),
        ("unknown_label", f"images/{star}"),
    ]
    assert result.info.duplicates == 1 and result.duplicates_across_splits == 1
    # Which files: the one file listed twice, by a relative and an absolute path.
    copies = sorted([f"images/{keys[1]}", os.path.join(images, keys[1])])
    with open(os.path.join(images, keys[1]), "rb") as f:
        content = hashlib.sha256(f.read()).hexdigest()
    assert read_jsonl(result.dataset_dir, "duplicates.jsonl") == [
        {
            "sha256": content,
            "keys": copies,
            "splits": ["test" if key.startswith("/") else "train" for key in copies],
        }
    ]
    assert {k: v for k, v in result.counters.items() if k.startswith("dropped_")} == {
        "dropped_bad_row": 1,
        "dropped_missing": 1,
        "dropped_unknown_label": 1,
    }


def test_jsonl_manifest_and_split_folders(demo_corpus, tmp_path):
    # image_folder with root/<split>/<class>/<image>
    keys = [k for k in corpus_files(demo_corpus) if k not in demo_corpus.broken][:12]
    for i, key in enumerate(keys):
        destination = tmp_path / "by_split" / ("val" if i % 4 == 0 else "train") / key
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(demo_corpus.out_dir, key), destination)
    config = make_config(
        str(tmp_path / "by_split"), output=str(tmp_path / "out1"), splits={"from_source": True}
    )
    result = build(config)
    assert {k: v.num_examples for k, v in result.info.splits.items()} == {"train": 9, "val": 3}
    assert {r["key"] for r in read_split(result, "val")} == {
        f"val/{k}" for i, k in enumerate(keys) if i % 4 == 0
    }

    # The same files through a JSONL manifest with absolute paths, fractions split.
    lines = [
        json.dumps({"path": os.path.join(demo_corpus.out_dir, k), "label": k.split("/")[0]})
        for k in keys
    ] + ["{not json"]
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    config = make_config(
        demo_corpus.out_dir,
        output=str(tmp_path / "out2"),
        source={
            "type": "manifest",
            "path": str(tmp_path / "m.jsonl"),
            "allowed_roots": [demo_corpus.out_dir],
        },
        errors={"max_fraction": 0.1},
    )
    result = build(config)
    assert sum(s.num_examples for s in result.info.splits.values()) == 12
    assert result.info.dropped == {"bad_row": 1}


def test_size_limits_drop_files_with_a_reason(build_dataset, demo_corpus):
    max_pixels, min_size = 110 * 110, 56
    result = build_dataset(
        image={"channels": 3, "max_pixels": max_pixels, "min_size": min_size},
        errors={"max_fraction": 1.0},
    )
    expected = {}
    for key in corpus_files(demo_corpus):
        if key in demo_corpus.broken:
            continue
        with open(os.path.join(demo_corpus.out_dir, key), "rb") as f:
            height, width = decode_image(f.read()).shape[:2]
        if height * width > max_pixels:
            expected[key] = "too_many_pixels"
        elif min(height, width) < min_size:
            expected[key] = "too_small"
    assert "too_many_pixels" in expected.values() and "too_small" in expected.values()
    with open(os.path.join(result.dataset_dir, "errors.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    # (A broken file may now be refused for its declared size before its
    # damage is found: the header is checked first.)
    reasons = {r["key"]: r["reason"] for r in rows}
    assert {k: v for k, v in reasons.items() if k not in demo_corpus.broken} == expected
    assert set(demo_corpus.broken) <= set(reasons)
    kept = sum(s.num_examples for s in result.info.splits.values())
    assert kept == NUM_GOOD - len(expected)
    assert sum(result.info.dropped.values()) == len(rows) == len(expected) + len(demo_corpus.broken)


def test_beam_works_out_each_dofns_state_specs_once_while_a_job_is_built_and_run(monkeypatch):
    """Beam inspects every method of a DoFn for state and timer specs each
    time it builds, validates or translates its step; while kiln builds and
    runs a job, that happens once per DoFn object, and Beam's own function
    is back after."""
    import apache_beam as beam
    from apache_beam.transforms import userstate

    calls = []
    original = userstate.get_dofn_specs

    def counting(dofn):
        calls.append(dofn)
        return original(dofn)

    monkeypatch.setattr(userstate, "get_dofn_specs", counting)
    count = userstate.ReadModifyWriteStateSpec("count", beam.coders.VarIntCoder())
    state_param = beam.DoFn.StateParam(count)

    class CountFn(beam.DoFn):
        def process(self, element, state=state_param):
            yield element

    fn, other = CountFn(), CountFn()
    with launcher._beam_lookups_once():
        first = userstate.get_dofn_specs(fn)
        assert userstate.is_stateful_dofn(fn)
        userstate.validate_stateful_dofn(fn)
        second = userstate.get_dofn_specs(fn)
        userstate.get_dofn_specs(other)
        assert calls == [fn, other]
        assert first == second == ({count}, set())
        assert first[0] is not second[0]  # each caller gets sets of its own
    assert userstate.get_dofn_specs is counting
    userstate.get_dofn_specs(fn)
    assert calls == [fn, other, fn]


def test_signatures_are_worked_out_once_per_function_while_a_job_is_built_and_run(monkeypatch):
    """Beam asks for the signature of the same few functions (DoFn's own
    methods) thousands of times a build; while kiln builds and runs a job,
    each function's is worked out once, a bound method's from its function
    whatever it is bound to, with the answer Beam's own gives; after, every
    Beam module that calls it has Beam's function back."""
    import inspect

    import apache_beam as beam
    from apache_beam.transforms import core, ptransform, util
    from apache_beam.typehints import decorators

    calls = []
    original = decorators.get_signature

    def counting(func):
        calls.append(func)
        return original(func)

    for module in (decorators, core, ptransform, util):
        monkeypatch.setattr(module, "get_signature", counting)

    class AddFn(beam.DoFn):
        def process(self, element, offset=1):
            yield element + offset

    def plain(a, b=2):
        return a + b

    first, second = AddFn(), AddFn()
    with launcher._beam_lookups_once():
        answers = [
            core.get_function_args_defaults(first.process),
            core.get_function_args_defaults(second.process),
            core.get_function_args_defaults(plain),
            core.get_function_args_defaults(plain),
        ]
        signature = decorators.get_signature(first.process)
        assert util.get_signature(plain) == inspect.signature(plain)
        assert ptransform.get_signature is decorators.get_signature
        assert len(calls) == 2  # once for AddFn.process, once for plain
        assert calls[0] == first.process and calls[1] is plain
    assert answers == [(["element", "offset"], [1])] * 2 + [(["a", "b"], [2])] * 2
    assert signature == inspect.signature(second.process)  # without self
    for module in (decorators, core, ptransform, util):
        assert module.get_signature is counting
    core.get_function_args_defaults(plain)
    assert len(calls) == 3


def test_pipeline_option_views_are_made_once_per_class_while_a_job_is_built_and_run():
    """A view of the pipeline options costs an argparse parser of every
    registered option, and Beam asks for one per step it applies; while kiln
    builds and runs a job each options object makes one view per class,
    which sees and makes the same changes as any other view."""
    from apache_beam.options.pipeline_options import (
        DirectOptions,
        PipelineOptions,
        StandardOptions,
    )

    options = launcher.pipeline_options(["--direct_num_workers=2"])
    with launcher._beam_lookups_once():
        view = options.view_as(StandardOptions)
        assert options.view_as(StandardOptions) is view
        assert options.view_as(DirectOptions).direct_num_workers == 2
        view.streaming = True
        assert options.view_as(StandardOptions).streaming is True
    assert options.view_as(StandardOptions) is not view
    assert options.view_as(StandardOptions).streaming is True
    assert PipelineOptions.view_as.__module__ == "apache_beam.options.pipeline_options"


def test_local_jobs_sample_beam_state_every_few_ms_and_restore_the_default():
    """Ending a bundle joins Beam's state-sampler thread, which sleeps up to
    its sampling period: with Beam's 200 ms every bundle of a local job
    waited for nothing. While a local job runs the period is short; after
    it, and for other runners, Beam's own default holds."""
    from apache_beam.runners.worker import statesampler

    default = statesampler.StateSampler("before", None).sampling_period_ms
    assert default > launcher.LOCAL_SAMPLING_PERIOD_MS
    with launcher._short_state_sampling(launcher.pipeline_options()):
        sampler = statesampler.StateSampler("during", None)
        assert sampler.sampling_period_ms == launcher.LOCAL_SAMPLING_PERIOD_MS
    assert statesampler.StateSampler("after", None).sampling_period_ms == default
    remote = launcher.pipeline_options(["--runner=DataflowRunner"])
    with launcher._short_state_sampling(remote):
        assert statesampler.StateSampler("remote", None).sampling_period_ms == default


def test_the_first_builds_summary_says_what_to_do_next(demo_corpus, tmp_path):
    from kiln.pipeline.command import summary

    output = tmp_path / "my datasets"  # a space: the commands are quoted for the shell
    config = make_config(demo_corpus.out_dir, output=str(output))
    first = build(config)
    root = str(output / "shapes")
    assert summary(first).splitlines()[-1] == (
        f"  next: kiln inspect '{root}'; kiln preview '{root}' -o preview.png; "
        f'train with kiln.reader.load("{root}", "train", batch_size=64, seed=1)'
    )
    # Later builds (here: up to date) are a scheduler's routine: no such line.
    again = build(config)
    assert again.up_to_date and "  next: " not in summary(again)
