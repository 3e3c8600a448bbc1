"""`kiln verify`: an intact build passes; a flipped byte, a truncated or deleted shard,
edited metadata (kiln.json against its checksum, the reports against their sha256),
a wrong duplicates report and records that do not match the schema are each found and
named; the reader refuses an edited kiln.json too."""

import hashlib
import json
import os
import re
import shutil

import pytest
import tensorflow as tf

import kiln
import kiln.reader
from kiln import cli
from kiln.schemas import (
    METADATA_FILENAME,
    RECORD,
    DatasetInfo,
    MetadataChecksumError,
    MetadataError,
)
from kiln.schemas.metadata import content_checksum
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


def edit_metadata(folder, change, reseal=False):
    """Edits kiln.json in place; with `reseal`, records the new content's
    checksum too (a consistent forgery: only the other files can tell)."""
    path = os.path.join(folder, "kiln.json")
    with open(path) as f:
        data = json.load(f)
    change(data)
    if reseal:
        data["checksum"] = content_checksum(data)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)


def edit_lines(folder, name, change):
    """Rewrites a report file (errors.jsonl, duplicates.jsonl) through `change(rows)`."""
    path = os.path.join(folder, name)
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    change(rows)
    with open(path, "w") as f:
        f.writelines(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n" for row in rows)


def only_problem(folder):
    result = verify.verify(folder)
    assert not result.ok
    return result.problems[0], result


def run_cli(folder, capsys, *flags):
    code = cli.main(["verify", *flags, folder])
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
    assert out == (
        f"kiln verify: OK: {result.dataset_dir}: {checked.num_shards} shards, "
        f"{checked.num_records} records match kiln.json\n"
    )
    assert run_cli(result.dataset_dir, capsys, "--quiet") == (0, "")  # for cron


def test_smallest_size_of_images_of_varying_size_is_checked(build_dataset, tmp_path):
    """kiln.json's smallest_size (what load checks crops against when the
    sizes vary) must be the least height and width the records hold: a
    consistent forgery (checksum resealed) is found by reading the records,
    and a malformed one is refused as metadata."""
    result = build_dataset(transforms=[], sharding={"num_shards": 1})
    least = result.info.smallest_size
    assert result.info.image_size is None and least is not None
    assert verify.verify(result.dataset_dir).ok
    folder = str(tmp_path / "forged")
    shutil.copytree(result.dataset_dir, folder)
    edit_metadata(folder, lambda data: data.update(smallest_size=[least[0] - 1, least[1]]), True)
    problem, found = only_problem(folder)
    assert [str(p) for p in found.problems] == [
        f"kiln.json: smallest_size is {[least[0] - 1, least[1]]}, the records' least height "
        f"and least width are {least}"
    ]
    malformed = str(tmp_path / "malformed")
    shutil.copytree(result.dataset_dir, malformed)
    edit_metadata(malformed, lambda data: data.update(smallest_size=[0, least[1]]), True)
    problem, _ = only_problem(malformed)
    assert problem.message == (
        f"{malformed}/kiln.json: smallest_size must be [height, width] of positive integers, "
        f"got [0, {least[1]}]"
    )
    with pytest.raises(MetadataError, match="smallest_size must be"):
        kiln.reader.load(malformed)


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
    assert run_cli(folder, capsys, "--quiet") == (code, out)  # problems are never quiet


def test_quiet_prints_one_line_however_many_problems(version_copy, capsys):
    """Cron mails whatever verify prints: under --quiet a damaged dataset is
    one line, the first problem and how many more there are; without it
    every problem has its line."""
    folder, info = version_copy
    for index in (0, 1):
        with open(shard_path(folder, info, index=index), "r+b") as f:
            f.truncate(f.seek(0, os.SEEK_END) - 3)
    problems = verify.verify(folder).problems
    assert len(problems) >= 2
    code, out = run_cli(folder, capsys)
    lines = out.splitlines()
    assert code == 1 and lines[0] == f"kiln verify: FAILED: {folder}: {problems[0]}"
    assert lines[1:] == [f"{len(problems) - 1} more problem(s):"] + [
        f"  {problem}" for problem in problems[1:]
    ]
    assert run_cli(folder, capsys, "--quiet") == (
        1,
        f"kiln verify: FAILED: {folder}: {problems[0]} (and {len(problems) - 1} more "
        f"problem(s): `kiln verify {folder}` lists them)\n",
    )


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
    checksum, result = only_problem(folder)
    assert checksum.where == "kiln.json"
    assert "kiln.json was modified after it was written: checksum " in checksum.message
    problem = result.problems[1]  # and what else disagrees, checked against the edited file
    assert problem.where == first.filename
    assert problem.message == (
        f"holds {first.num_records} records, kiln.json says {first.num_records + 1}"
    )

    def restore_count_and_change_sha256(data):
        shard = data["splits"]["train"]["shards"][0]
        shard["num_records"] -= 1
        shard["sha256"] = "0" * 64

    edit_metadata(folder, restore_count_and_change_sha256, reseal=True)
    problem, _ = only_problem(folder)
    assert (problem.where, problem.message) == (
        first.filename,
        f"sha256 is {first.sha256}, kiln.json says {'0' * 64}",
    )


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
    assert result.problems[0].where == "kiln.json"
    messages = [str(p) for p in result.problems if p.where == "split 'train'"]
    assert messages[0] == (
        f"split 'train': num_examples is {train.num_examples + 2}, "
        f"the shards hold {train.num_examples}"
    )
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
    assert [p.where for p in result.problems] == [".", "errors.jsonl", "errors.jsonl"]
    assert "shapes-train.tfrecord-00000-of-00003.tmp-1234" in result.problems[0].message
    assert result.problems[1].message.startswith("modified after it was written: sha256 is ")
    assert "kiln.json says {" in result.problems[2].message

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

    edit_metadata(folder, update, reseal=True)
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

    name = rewrite_shard(
        folder, DatasetInfo.loads(open(os.path.join(folder, "kiln.json")).read()), "test", 0, garble
    )
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


# --- metadata the files cannot contradict: kiln.json's checksum, the reports' sha256 ----


def _set_first_mean(data):
    data["splits"]["train"]["statistics"]["mean"][0] += 10.0  # normalize=True reads it


def _add_augmentation(data):
    data["augment"].append({"random_flip_up_down": {"probability": 0.5}})


def _one_example_fewer(data):
    data["splits"]["test"]["num_examples"] -= 1


def _zero_sha256(data):
    data["splits"]["validation"]["shards"][0]["sha256"] = "0" * 64


def _one_channel(data):
    data["channels"] = 1


# Each edit of kiln.json, and (where the files can contradict it) the problem
# verify finds besides the checksum: (where, text in the message), or None.
KILN_JSON_EDITS = {
    "statistics mean": (_set_first_mean, None),
    "augment list": (_add_augmentation, None),
    "num_examples": (_one_example_fewer, ("split 'test'", "num_examples is")),
    "shard sha256": (
        _zero_sha256,
        ("shapes-validation.tfrecord-00000-of-00001", f"kiln.json says {'0' * 64}"),
    ),
    "channels": (
        _one_channel,
        ("shapes-train.tfrecord-00000-of-00003", "3 channels, the dataset stores 1"),
    ),
}


@pytest.mark.parametrize("edit", list(KILN_JSON_EDITS))
def test_an_edited_kiln_json_fails_verify_and_the_reader(version_copy, capsys, edit):
    folder, _ = version_copy
    change, also = KILN_JSON_EDITS[edit]
    edit_metadata(folder, change)
    modified = f"{folder}/kiln.json was modified after it was written: checksum "

    result = verify.verify(folder)
    assert result.problems[0].where == "kiln.json"
    assert result.problems[0].message.startswith(modified)
    if also is None:
        assert len(result.problems) == 1
    else:
        assert any(p.where == also[0] and also[1] in p.message for p in result.problems[1:]), (
            result.problems
        )
    code, out = run_cli(folder, capsys)
    assert code == 1 and out.startswith(f"kiln verify: FAILED: {folder}: kiln.json: {modified}")

    with pytest.raises(MetadataChecksumError, match=re.escape(modified)):
        kiln.reader.info(folder)
    with pytest.raises(MetadataError, match=re.escape(modified)):
        kiln.reader.load(folder, "train", batch_size=4, normalize=True)


def test_an_edited_error_report_fails_verify(version_copy, capsys):
    folder, info = version_copy
    edit_lines(folder, "errors.jsonl", lambda rows: rows[0].update(message="looked fine to me"))
    problem, result = only_problem(folder)
    assert [p.where for p in result.problems] == ["errors.jsonl"]
    assert problem.message.startswith("modified after it was written: sha256 is ")
    assert problem.message.endswith(f", kiln.json says {info.errors_sha256}")
    code, out = run_cli(folder, capsys)
    assert code == 1 and out.splitlines()[0].endswith(f"kiln.json says {info.errors_sha256}")
    # Training does not read the report, so the reader does not check it.
    assert kiln.reader.info(folder) == info

    os.remove(os.path.join(folder, "errors.jsonl"))
    problem, _ = only_problem(folder)
    assert (problem.where, problem.message) == (
        "errors.jsonl",
        f"missing (kiln.json records its sha256 {info.errors_sha256})",
    )


def test_a_removed_checksum_is_refused(version_copy):
    folder, _ = version_copy
    edit_metadata(folder, lambda data: data.pop("checksum"))
    message = "kiln.json records no checksum, which format version 2 and later always write"
    with pytest.raises(MetadataChecksumError, match=message):
        kiln.reader.info(folder)
    problem, _ = only_problem(folder)
    assert problem.where == "kiln.json" and message in problem.message


def test_format_1_without_checksum_loads_unchecked(version_copy):
    folder, info = version_copy

    def as_format_1(data):  # what kiln wrote before format 2
        data["format_version"] = 1
        for name in ("checksum", "errors_sha256", "duplicates_sha256"):
            del data[name]

    edit_metadata(folder, as_format_1)
    old = kiln.reader.info(folder)
    assert (old.format_version, old.checksum, old.errors_sha256) == (1, None, None)
    assert old.splits == info.splits
    assert verify.verify(folder).ok  # nothing recorded to check the reports against
    # An edit is not noticed in format 1 (this is what format 2 adds).
    edit_metadata(folder, _set_first_mean)
    assert (
        kiln.reader.info(folder).splits["train"].statistics.mean[0]
        == info.splits["train"].statistics.mean[0] + 10.0
    )


def test_lowering_the_format_version_does_not_skip_the_checksum(version_copy):
    folder, _ = version_copy
    edit_metadata(folder, lambda data: data.update(format_version=1))
    with pytest.raises(MetadataChecksumError, match="was modified after it was written"):
        kiln.reader.info(folder)


@pytest.mark.parametrize("value", [0, -3, 1.5, True, "2", None])
@pytest.mark.parametrize("checksum", ["dropped", "resealed"])
def test_a_format_version_no_kiln_writes_is_refused_everywhere(
    version_copy, capsys, value, checksum
):
    # 0, a negative number, a fraction or a boolean read as a number would
    # pass for format 1, which has no checksum: the file is refused instead,
    # by the reader, `kiln inspect` and `kiln verify` alike.
    folder, _ = version_copy

    def change(data):
        data["format_version"] = value
        if checksum == "dropped":
            del data["checksum"]

    edit_metadata(folder, change, reseal=checksum == "resealed")
    source = os.path.join(folder, METADATA_FILENAME)
    message = (
        f"{source}: format_version must be a positive integer (this kiln writes "
        f"{kiln.FORMAT_VERSION}), got {json.dumps(value)}"
    )
    with pytest.raises(MetadataError) as raised:
        kiln.reader.info(folder)
    assert str(raised.value) == message
    with pytest.raises(MetadataError, match=re.escape(message)):
        kiln.reader.load(folder, batch_size=4)
    assert cli.main(["inspect", folder]) != 0
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"kiln inspect: error: {message}"], err
    # verify reports a kiln.json that does not load as the dataset's problem.
    assert verify.verify(folder).problems == [verify.Problem(METADATA_FILENAME, message)]
    code, out = run_cli(folder, capsys)
    assert code != 0 and message in out, out


# --- the duplicates report --------------------------------------------------------------


def test_duplicates_report_lists_the_groups_and_verifies(duplicates_build, capsys):
    result, groups = duplicates_build
    folder = result.dataset_dir
    with open(os.path.join(folder, "duplicates.jsonl"), "rb") as f:
        data = f.read()
    rows = [json.loads(line) for line in data.decode().splitlines()]
    assert [row["keys"] for row in rows] == sorted(groups, key=lambda keys: rows_sha(rows, keys))
    assert [row["sha256"] for row in rows] == sorted(row["sha256"] for row in rows)
    stored = {key: split for split in result.info.splits for key in split_keys(result, split)}
    for row in rows:
        assert row["splits"] == [stored[key] for key in row["keys"]]
    assert data == b"".join(json.dumps(row, sort_keys=True).encode() + b"\n" for row in rows)
    assert result.info.duplicates == 3  # a group of three and a pair
    assert hashlib.sha256(data).hexdigest() == result.info.duplicates_sha256
    assert verify.verify(folder).ok


def test_a_wrong_duplicates_report_fails_verify(duplicates_build, tmp_path):
    result, groups = duplicates_build
    folder = str(tmp_path / "copy")
    shutil.copytree(result.dataset_dir, folder)
    edit_lines(folder, "duplicates.jsonl", lambda rows: rows.pop())
    problems = verify.verify(folder).problems
    assert [p.where for p in problems] == ["duplicates.jsonl"] * 3
    assert problems[0].message.startswith("modified after it was written: sha256 is ")
    assert "kiln.json counts 3" in problems[1].message
    assert "the records hold 2" in problems[2].message

    # A consistent forgery (sha256 and checksum recorded anew) still differs from the records.
    fresh = str(tmp_path / "forged")
    shutil.copytree(result.dataset_dir, fresh)
    edit_lines(
        fresh,
        "duplicates.jsonl",
        lambda rows: rows.__setitem__(
            0,
            {**rows[0], "keys": [rows[0]["keys"][0], "circle/elsewhere.png", *rows[0]["keys"][2:]]},
        ),
    )
    with open(os.path.join(fresh, "duplicates.jsonl"), "rb") as f:
        sha256 = hashlib.sha256(f.read()).hexdigest()
    edit_metadata(fresh, lambda data: data.update(duplicates_sha256=sha256), reseal=True)
    problem, result = only_problem(fresh)
    assert [p.where for p in result.problems] == ["duplicates.jsonl"]
    assert "'circle/elsewhere.png'" in problem.message and "the records hold" in problem.message


def rows_sha(rows, keys):
    return next(row["sha256"] for row in rows if row["keys"] == keys)


def split_keys(result, split):
    paths = [os.path.join(result.dataset_dir, s.filename) for s in result.info.splits[split].shards]
    return [RECORD.parse(r)["key"].numpy().decode() for r in tf.data.TFRecordDataset(paths)]


def test_a_version_folder_named_for_another_version_fails(build_dataset, tmp_path, capsys):
    """A rollback by hand that renamed a version folder to another version's
    id: LATEST then names records of another version. A dataset folder copied
    under another name (a download from a bucket) stays intact."""
    result = build_dataset()
    root = tmp_path / "downloaded-shapes"
    shutil.copytree(result.dataset_root, root)
    assert verify.verify(str(root)).ok
    renamed = "0123456789ab"
    os.rename(root / result.version, root / renamed)
    (root / "LATEST").write_text(renamed + "\n")
    code, out = run_cli(str(root), capsys)
    assert code == 1
    assert out.splitlines()[0] == (
        f"kiln verify: FAILED: {root / renamed}: {METADATA_FILENAME}: it is version "
        f"{result.version}, but its folder is named {renamed} (builds and LATEST find a version "
        f"by its folder's name: a renamed or misplaced copy?)"
    )


def test_incomplete_version_folders_are_a_note_not_a_failure(build_dataset, tmp_path, capsys):
    result = build_dataset()
    root = str(tmp_path / "shapes")
    shutil.copytree(result.dataset_root, root)
    # A build killed while it copied its version to an object store left it.
    incomplete = os.path.join(root, "0123456789ab")
    shutil.copytree(result.dataset_dir, incomplete)
    os.remove(os.path.join(incomplete, METADATA_FILENAME))
    code, out = run_cli(root, capsys)
    assert code == 0
    assert out.splitlines()[1:] == [
        "note: incomplete version folder(s), no kiln.json (left by an interrupted build or "
        f"prune; never read; the next kiln build deletes them): {incomplete}"
    ]
    assert run_cli(root, capsys, "--quiet") == (0, "")  # for cron: the dataset is intact


def test_staging_folders_are_a_note_not_a_failure(build_dataset, tmp_path, capsys):
    from kiln.pipeline.lock import DatasetLock

    result = build_dataset()
    root = str(tmp_path / "shapes")
    shutil.copytree(result.dataset_root, root)
    # A build killed with SIGKILL left it; the next build deletes it.
    staging = os.path.join(root, ".staging-0123456789ab-dead")
    os.makedirs(os.path.join(staging, ".work"))
    with open(os.path.join(staging, ".work", "listing.sqlite"), "wb") as f:
        f.write(b"x" * 2048)
    code, out = run_cli(root, capsys)
    assert code == 0
    lines = out.splitlines()[1:]
    assert lines[0] == "note: staging folder(s) of builds that did not finish (never read):"
    assert re.fullmatch(
        rf"  {re.escape(staging)}  1 file\(s\), 2\.0 KiB, last written \d+ s ago", lines[1]
    )
    assert lines[2].startswith("  no build holds the dataset's lock: left by a build that was")
    assert lines[2].endswith(f"while no build runs: rm -r {staging}")
    assert len(lines) == 3
    with DatasetLock(root):
        code, out = run_cli(root, capsys)
    assert code == 0
    assert out.splitlines()[-1].startswith("  a build of the dataset is running: it holds the lock")
    assert run_cli(root, capsys, "--quiet") == (0, "")  # for cron: the dataset is intact
