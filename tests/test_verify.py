"""`kiln verify`: an intact build passes; a flipped byte, a truncated or deleted shard,
edited metadata and records that do not match the schema are each found and named."""

import json
import os
import shutil

import pytest
import tensorflow as tf

from kiln import cli
from kiln.schemas import RECORD, DatasetInfo
from kiln.tools import verify

GZIP = {"sharding": {"num_shards": 2, "compression": "gzip"}}


@pytest.fixture
def version_copy(build_dataset, tmp_path):
    """A writable copy of the base build's version folder, and its metadata."""
    result = build_dataset()
    copy = tmp_path / result.version
    shutil.copytree(result.dataset_dir, copy)
    return str(copy), result.info


def shard_path(folder, info, split="train", index=1):
    return os.path.join(folder, info.splits[split].shards[index].filename)


def edit_metadata(folder, change):
    path = os.path.join(folder, "kiln.json")
    with open(path) as f:
        data = json.load(f)
    change(data)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)


def only_problem(folder):
    result = verify.verify(folder)
    assert not result.ok
    return result.problems[0], result


def run_cli(folder, capsys):
    code = cli.main(["verify", folder])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("overrides", [{}, GZIP], ids=["plain", "gzip"])
def test_an_intact_build_passes(build_dataset, capsys, overrides):
    result = build_dataset(**overrides)
    checked = verify.verify(result.dataset_root)  # follows LATEST
    assert checked.ok, checked.problems
    assert checked.dataset_dir == result.dataset_dir
    assert checked.num_shards == sum(len(s.shards) for s in result.info.splits.values())
    assert checked.num_records == sum(s.num_examples for s in result.info.splits.values())
    code, out = run_cli(result.dataset_dir, capsys)
    assert code == 0
    assert out == (f"kiln verify: OK: {result.dataset_dir}: {checked.num_shards} shards, "
                   f"{checked.num_records} records match kiln.json\n")


def test_a_flipped_byte_is_a_crc_error_in_that_shard(version_copy, capsys):
    folder, info = version_copy
    path = shard_path(folder, info)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x01  # inside some record's data: only its CRC can tell
    open(path, "wb").write(bytes(data))
    problem, result = only_problem(folder)
    assert problem.where == os.path.basename(path)
    assert "CRC mismatch" in problem.message and "sha256 is" in problem.message
    assert [p.where for p in result.problems] == [problem.where]  # the other shards are fine
    code, out = run_cli(folder, capsys)
    assert code == 1
    assert out.startswith(f"kiln verify: FAILED: {folder}: {problem.where}: ")


def test_a_flipped_byte_in_a_gzip_shard(build_dataset, tmp_path):
    result = build_dataset(**GZIP)
    folder = str(tmp_path / "gz")
    shutil.copytree(result.dataset_dir, folder)
    path = shard_path(folder, result.info, index=0)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10
    open(path, "wb").write(bytes(data))
    problem, _ = only_problem(folder)
    assert problem.where == os.path.basename(path)
    assert "record" in problem.message


def test_a_truncated_shard(version_copy):
    folder, info = version_copy
    path = shard_path(folder, info, "validation", 0)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 100)
    problem, _ = only_problem(folder)
    assert problem.where == os.path.basename(path)
    assert f"{size - 100} bytes, kiln.json says {size}" in problem.message
    assert "cut short" in problem.message


def test_a_deleted_shard(version_copy, capsys):
    folder, info = version_copy
    path = shard_path(folder, info, "test", 0)
    os.remove(path)
    problem, _ = only_problem(folder)
    assert problem.where == os.path.basename(path)
    assert problem.message.startswith("missing")
    code, out = run_cli(folder, capsys)
    assert code == 1 and os.path.basename(path) in out.splitlines()[0]


def test_edited_metadata(version_copy):
    folder, info = version_copy
    first = info.splits["train"].shards[0]

    def recount(data):
        data["splits"]["train"]["shards"][0]["num_records"] += 1
    edit_metadata(folder, recount)
    problem, _ = only_problem(folder)
    assert problem.where == first.filename
    assert problem.message == (f"holds {first.num_records} records, kiln.json says "
                               f"{first.num_records + 1}")

    def restore_count_and_change_sha256(data):
        shard = data["splits"]["train"]["shards"][0]
        shard["num_records"] -= 1
        shard["sha256"] = "0" * 64
    edit_metadata(folder, restore_count_and_change_sha256)
    problem, _ = only_problem(folder)
    assert (problem.where, problem.message) == (
        first.filename, f"sha256 is {first.sha256}, kiln.json says {'0' * 64}")


def test_edited_split_counts(version_copy):
    folder, info = version_copy
    train = info.splits["train"]
    some_class = next(name for name, n in train.class_counts.items() if n)

    def edit(data):
        split = data["splits"]["train"]
        split["num_examples"] += 2
        split["class_counts"][some_class] += 2
        split["statistics"]["count"] += 1
    edit_metadata(folder, edit)
    result = verify.verify(folder)
    messages = [str(p) for p in result.problems if p.where == "split 'train'"]
    assert messages[0] == (f"split 'train': num_examples is {train.num_examples + 2}, "
                           f"the shards hold {train.num_examples}")
    assert any("class_counts are" in m for m in messages)
    assert any(f"statistics count {train.statistics.count + 1} pixels" in m for m in messages)


def test_unparsable_json_stray_files_and_error_report(version_copy):
    folder, info = version_copy
    open(os.path.join(folder, "shapes-train.tfrecord-00000-of-00003.tmp-1234"), "wb").close()
    with open(os.path.join(folder, "errors.jsonl")) as f:
        rows = f.readlines()
    with open(os.path.join(folder, "errors.jsonl"), "w") as f:
        f.writelines(rows[1:])
    result = verify.verify(folder)
    assert [p.where for p in result.problems] == [".", "errors.jsonl"]
    assert "shapes-train.tfrecord-00000-of-00003.tmp-1234" in result.problems[0].message
    assert "kiln.json says" in result.problems[1].message

    with open(os.path.join(folder, "kiln.json"), "w") as f:
        f.write('{"name": "shapes", ')  # cut off
    problem, _ = only_problem(folder)
    assert problem.where == "kiln.json" and "not valid JSON" in problem.message


def rewrite_shard(folder, info, split, index, change):
    """Rewrites a shard with valid framing and CRCs after `change(records)`, and
    records its new size and sha256 in kiln.json: only record checks can tell."""
    shard = info.splits[split].shards[index]
    path = os.path.join(folder, shard.filename)
    records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    change(records)
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    size, sha256 = verify._size_and_sha256(path)

    def update(data):
        entry = data["splits"][split]["shards"][index]
        entry["num_bytes"], entry["sha256"] = size, sha256
    edit_metadata(folder, update)
    return shard.filename


def test_records_are_parsed_and_decoded_with_the_schema(version_copy):
    folder, info = version_copy

    def relabel(records):
        record = RECORD.decode(records[1])
        records[1] = RECORD.encode(dict(record, label=len(info.class_names)))
    name = rewrite_shard(folder, info, "train", 0, relabel)
    problem, _ = only_problem(folder)
    assert problem.where == name
    assert problem.message.startswith("record 1 (key ")
    assert f"label {len(info.class_names)} is not a class id" in problem.message

    def garble(records):
        records[0] = b"not a tf.train.Example"
    name = rewrite_shard(folder, DatasetInfo.loads(open(os.path.join(folder, "kiln.json")).read()),
                         "test", 0, garble)
    result = verify.verify(folder)
    assert [p.where for p in result.problems][:2] == [info.splits["train"].shards[0].filename, name]
    assert result.problems[1].message.startswith("record 0: ")

    def wrong_size(records):
        record = RECORD.decode(records[0])
        records[0] = RECORD.encode(dict(record, height=record["height"] + 1))
    fresh = str(folder) + "-2"
    shutil.copytree(folder, fresh)
    name = rewrite_shard(fresh, info, "validation", 0, wrong_size)
    problems = {p.where: p.message for p in verify.verify(fresh).problems}
    assert "the image decodes to" in problems[name]


def test_not_a_dataset_exits_2(tmp_path, capsys):
    assert cli.main(["verify", str(tmp_path)]) == 2
    assert "is not a kiln dataset" in capsys.readouterr().err
