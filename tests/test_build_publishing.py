"""Publishing under failure and over time: a build killed with SIGKILL at any
moment never harms what readers see, a retried shard write leaves one correct
file, and --keep prunes old versions but never LATEST's."""

import dataclasses
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import yaml

import kiln.reader
import object_store
from conftest import make_config, read_tree, run_kiln
from kiln import cli
from kiln.pipeline import build, publish
from kiln.schemas import MetadataError
from kiln.tools import verify
from test_build import corpus_files
from test_pipeline_steps import read_tfrecords, run_write_shards, sharded_records

TESTS = os.path.dirname(os.path.abspath(__file__))
# The kiln under test (this checkout's src, or what PYTHONPATH names first).
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))


def small_corpus(corpus, root, every=5):
    """Every `every`-th good demo image under `root`; returns the keys."""
    keys = [k for k in corpus_files(corpus) if k not in corpus.broken][::every]
    for key in keys:
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(os.path.join(corpus.out_dir, key), root / key)
    return keys


def add_image(corpus, root, keys, name):
    """A new input file (a copy of a demo image under a new key): a new version."""
    shutil.copyfile(os.path.join(corpus.out_dir, keys[0]), root / keys[0].split("/")[0] / name)


# --- retries ----------------------------------------------------------------------------


def test_shards_written_again_leave_one_correct_file_each(tmp_path):
    """Beam may run a bundle again (a retry, or a speculative copy on Dataflow)
    over what an earlier attempt left: a complete shard, or a partial temp file."""
    records = sharded_records(40) + sharded_records(5, "test", seed=3)
    config = {"num_shards": {"train": 3, "test": 1}, "target_shard_mb": 1, "compression": "none"}
    folder = run_write_shards(tmp_path, records, config)
    shards = sorted(e for e in os.listdir(folder) if not e.startswith("."))
    first = {name: verify._size_and_sha256(os.path.join(folder, name)) for name in shards}
    temp = os.path.join(folder, ".work", "tmp")
    os.makedirs(temp, exist_ok=True)
    with open(os.path.join(temp, shards[0] + ".0badc0ffee"), "wb") as f:
        f.write(b"an attempt that died half-way")

    run_write_shards(tmp_path, list(reversed(records)), config)  # every shard written again
    assert sorted(e for e in os.listdir(folder) if not e.startswith(".")) == shards
    assert {name: verify._size_and_sha256(os.path.join(folder, name)) for name in shards} == first
    by_split = {
        "train": sorted(r for r in records if r.split == "train"),
        "test": sorted(r for r in records if r.split == "test"),
    }
    for split, expected in by_split.items():
        read = [
            record
            for name in shards
            if f"-{split}." in name
            for record in read_tfrecords(os.path.join(folder, name))
        ]
        assert read == [r.record for r in expected]


def one_split_corpus(demo_corpus, tmp_path, *, num_shards: int):
    """A small image folder (`small_corpus`) under ``tmp_path/images``, and a
    config building it into ``tmp_path/out`` as one train split of
    `num_shards` shards, also written as ``tmp_path/config.yaml``.

    Returns (root, keys, config, config path)."""
    root = tmp_path / "images"
    keys = small_corpus(demo_corpus, root)
    config = make_config(
        str(root),
        output=str(tmp_path / "out"),
        sharding={"num_shards": num_shards},
        splits={"fractions": {"train": 1.0}},
    )
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return root, keys, config, path


# --- pruning --------------------------------------------------------------------------


def test_keep_prunes_old_versions_but_never_latest(demo_corpus, tmp_path, capsys):
    root, keys, config, _ = one_split_corpus(demo_corpus, tmp_path, num_shards=1)
    first = build(config)
    add_image(demo_corpus, root, keys, "added.png")  # an added file: a new version
    second = build(config)
    with open(root / keys[1], "rb") as f:
        other = f.read()
    with open(root / keys[2], "wb") as f:  # a changed file: another one
        f.write(other)
    third = build(config, keep=2)
    assert len({first.version, second.version, third.version}) == 3
    assert third.pruned == (first.version,)
    dataset_root = third.dataset_root
    assert publish.DatasetRoot(dataset_root).versions() == sorted([second.version, third.version])
    assert not os.path.exists(first.dataset_dir)
    stamped = {p.read_text() for p in (tmp_path / "out" / "shapes" / ".stamps").iterdir()}
    assert stamped == {second.version, third.version}
    with pytest.raises(MetadataError):
        kiln.reader.info(first.dataset_dir)

    # A roll-back: LATEST names an older version. Pruning to one keeps the
    # newest and LATEST's.
    publish.DatasetRoot(dataset_root).point_latest(second.version)
    removed = publish.DatasetRoot(dataset_root).staging_dirs()
    assert publish.DatasetRoot(dataset_root).prune(1) == []  # newest + LATEST: both kept
    assert removed == [] and publish.DatasetRoot(dataset_root).versions() == sorted(
        [second.version, third.version]
    )
    os.remove(root / "circle" / "added.png")
    os.remove(root / keys[2])
    shutil.copyfile(os.path.join(demo_corpus.out_dir, keys[2]), root / keys[2])
    fourth = build(config, keep=1)  # inputs of the first version again: rebuilt
    assert fourth.version == first.version and not fourth.up_to_date
    assert fourth.pruned == (third.version, second.version)
    assert publish.DatasetRoot(dataset_root).versions() == [first.version]

    # The command: --keep in the summary and the report, and never below 1.
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    add_image(demo_corpus, root, keys, "again.png")
    report = tmp_path / "report.json"
    assert cli.main(["build", "--config", str(path), "--keep", "1", "--report", str(report)]) == 0
    fifth = json.loads(report.read_text())
    assert fifth["pruned"] == [first.version]
    assert f"  pruned: 1 old version(s): {first.version}" in capsys.readouterr().out
    assert cli.main(["build", "--config", str(path), "--keep", "0"]) == 2
    assert "--keep must be at least 1" in capsys.readouterr().err
    assert publish.DatasetRoot(dataset_root).versions() == [fifth["version"]]


def test_a_latest_that_is_not_text_is_a_bogus_latest(demo_corpus, tmp_path, capfd):
    """A LATEST holding bytes that are not UTF-8 (a damaged file, a bad
    rollback by hand) was an internal error (exit 70, UnicodeDecodeError) of
    build, inspect and verify. The build takes it as a LATEST naming a
    version that is not there; inspect and verify refuse the path as no
    dataset (exit 2), in one line naming LATEST."""
    _, _, _, path = one_split_corpus(demo_corpus, tmp_path, num_shards=1)
    assert cli.main(["build", "--config", str(path), "--quiet"]) == 0
    dataset_root = tmp_path / "out" / "shapes"
    version = (dataset_root / "LATEST").read_text().strip()
    capfd.readouterr()
    for command in (["verify", "--quiet"], ["inspect"]):
        (dataset_root / "LATEST").write_bytes(b"\xff\n")
        assert cli.main([*command, str(dataset_root)]) == 2
        out, err = capfd.readouterr()
        assert out == ""
        assert err.startswith(f"kiln {command[0]}: error: {dataset_root / 'LATEST'} is not text")
        assert err.count("\n") == 1, err

    report = tmp_path / "report.json"
    assert cli.main(["build", "--config", str(path), "--report", str(report)]) == 0
    written = json.loads(report.read_text())
    assert (written["status"], written["version"]) == ("up_to_date", version)
    assert written["previous_version"] == "\\xff"  # what LATEST named, shown escaped
    assert (dataset_root / "LATEST").read_text() == version + "\n"
    assert verify.verify(str(dataset_root)).ok


def test_a_latest_that_is_a_link_to_the_version_folder_is_refused_in_one_line(
    demo_corpus, tmp_path, capfd
):
    """A rollback by hand that made LATEST a symbolic link to the version
    folder (``ln -s <version> LATEST``, as for a "current" link) was an
    internal error (exit 70, IsADirectoryError) of verify, inspect and diff,
    and a raw IsADirectoryError of the reader. Now the path is no dataset
    (exit 2), in one line naming LATEST, and the reader's MetadataError."""
    _, _, _, path = one_split_corpus(demo_corpus, tmp_path, num_shards=1)
    assert cli.main(["build", "--config", str(path), "--quiet"]) == 0
    dataset_root = tmp_path / "out" / "shapes"
    version = (dataset_root / "LATEST").read_text().strip()
    (dataset_root / "LATEST").unlink()
    (dataset_root / "LATEST").symlink_to(version)
    capfd.readouterr()
    latest = dataset_root / "LATEST"
    for command in (["verify", "--quiet"], ["inspect"], ["diff", str(dataset_root / version)]):
        assert cli.main([*command, str(dataset_root)]) == 2
        out, err = capfd.readouterr()
        assert out == ""
        assert err.startswith(f"kiln {command[0]}: error: {latest} is a folder"), err
        assert err.count("\n") == 1, err
    with pytest.raises(MetadataError, match="write the version's name into it"):
        kiln.reader.info(str(dataset_root))


KILN_JSON_DAMAGES = {
    # was an internal error (exit 70, a raw UnicodeDecodeError) everywhere
    "not UTF-8 text (byte 0xff at position 10)": b'{"name": "\xff"}',
    "not valid JSON": b'{"name": ',
    "expected a JSON object": b"[1, 2]",
}


@pytest.mark.parametrize("problem", KILN_JSON_DAMAGES)
def test_a_kiln_json_that_is_not_a_json_object_is_refused_in_one_line(
    demo_corpus, tmp_path, capfd, problem
):
    """A published version's kiln.json that is not UTF-8, not JSON or not
    an object: inspect and diff refuse it (exit 2) and verify fails it
    (exit 1), each in one line naming the file and what is wrong; the
    reader raises MetadataError so too. The build takes it as a damaged
    version (as a kiln.json that does not check out): not up to date, not a
    base, rebuilt and published again."""
    _, _, _, path = one_split_corpus(demo_corpus, tmp_path, num_shards=1)
    assert cli.main(["build", "--config", str(path), "--quiet"]) == 0
    dataset_root = tmp_path / "out" / "shapes"
    version = (dataset_root / "LATEST").read_text().strip()
    good = tmp_path / "good"
    shutil.copytree(dataset_root / version, good)
    kiln_json = dataset_root / version / "kiln.json"
    os.chmod(kiln_json, 0o600)
    kiln_json.write_bytes(KILN_JSON_DAMAGES[problem])
    said = f"{kiln_json}: {problem}"
    capfd.readouterr()
    for command, code, line in (
        (["inspect", str(dataset_root)], 2, f"kiln inspect: error: {said}"),
        (["diff", str(good), str(dataset_root)], 2, f"kiln diff: error: {said}"),
        (["verify", str(dataset_root)], 1, f"kiln verify: FAILED: {dataset_root / version}: "),
    ):
        assert cli.main(command) == code, command
        out, err = capfd.readouterr()
        printed = (out + err).strip("\n")
        assert printed.count("\n") == 0 and printed.startswith(line), printed
        assert said in printed
    for read in (
        lambda: kiln.reader.info(str(dataset_root)),
        lambda: kiln.reader.load(str(dataset_root), "train", batch_size=2),
    ):
        with pytest.raises(MetadataError) as raised:
            read()
        assert str(raised.value).startswith(said)

    report = tmp_path / "report.json"
    assert cli.main(["build", "--config", str(path), "--quiet", "--report", str(report)]) == 0
    written = json.loads(report.read_text())
    assert (written["status"], written["version"]) == ("built", version)
    assert written["incremental"]["used"] is False
    # Read three times (up to date? the base? already published?), warned once.
    assert [said in warning for warning in written["warnings"]].count(True) == 1, written
    assert verify.verify(str(dataset_root)).ok


@pytest.mark.parametrize("inputs", ["unchanged", "added"])
def test_a_damaged_kiln_json_is_one_warning_line_per_build(demo_corpus, tmp_path, inputs):
    """LATEST's version with a damaged kiln.json: the build reads it to see
    whether it is up to date, whether to reuse its records, whether its
    version is already published and what changed since: one warning line
    on stderr and in the report's warnings, not one per read. Its inputs
    unchanged, the version is rebuilt in place; a file added, a new version
    is published (with no diff line: no second warning for the diff)."""
    root, keys, _, path = one_split_corpus(demo_corpus, tmp_path, num_shards=1)
    assert cli.main(["build", "--config", str(path), "--quiet"]) == 0
    dataset_root = tmp_path / "out" / "shapes"
    version = (dataset_root / "LATEST").read_text().strip()
    kiln_json = dataset_root / version / "kiln.json"
    os.chmod(kiln_json, 0o600)
    kiln_json.write_bytes(kiln_json.read_bytes()[:100])  # truncated
    if inputs == "added":
        add_image(demo_corpus, root, keys, "added.png")
    report = tmp_path / "report.json"
    built = run_kiln(
        "build", "--config", str(path), "--progress-every", "0", "--report", str(report)
    )
    assert built.returncode == 0, built.stderr
    warned = [line for line in built.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warned) == 1 and f"{kiln_json}: not valid JSON" in warned[0], built.stderr
    written = json.loads(report.read_text())
    assert written["warnings"] == [warned[0].split(": ", 1)[1]], written
    assert (written["version"] == version) == (inputs == "unchanged")
    assert verify.verify(str(dataset_root)).ok


def test_keep_prunes_the_stamps_no_build_can_use_again(demo_corpus, tmp_path):
    """Each build of touched, unchanged files records another input stamp
    of the same version (one a night): --keep deleted those of pruned
    versions only, so they piled up. Kept: each kept version's newest
    stamp, which is the one a build of those files finds again."""
    root, keys, config, _ = one_split_corpus(demo_corpus, tmp_path, num_shards=1)
    stamps = tmp_path / "out" / "shapes" / ".stamps"

    def stamped():
        return sorted(path.read_text() for path in stamps.iterdir())

    first = build(config)
    for night in range(3):  # touched, not changed: the same version, a new stamp each
        os.utime(root / keys[night], (1000 + night, 1000 + night))
        again = build(config, keep=2)
        assert (again.version, again.up_to_date) == (first.version, False)
        assert stamped() == [first.version]

    add_image(demo_corpus, root, keys, "added.png")
    second = build(config, keep=2)
    assert stamped() == sorted([first.version, second.version])
    # The inputs of the last night again: the stamp kept finds first's version up to date.
    os.remove(root / keys[0].split("/")[0] / "added.png")
    back = build(config, keep=2)
    assert (back.version, back.up_to_date) == (first.version, True)
    assert stamped() == sorted([first.version, second.version])

    # Stamps naming no kept version (a version deleted by hand, a damaged file) go too.
    (stamps / ("0" * 64)).write_text("ffffffffffff")
    (stamps / ("1" * 64)).write_bytes(b"\xff")
    add_image(demo_corpus, root, keys, "another.png")
    third = build(config, keep=2)  # first was published again after second: second goes
    assert third.pruned == (second.version,)
    assert stamped() == sorted([first.version, third.version])


def roll_back(dataset_root, version):
    """What a user does to roll back: write the old version into LATEST, atomically."""
    time.sleep(0.05)  # later than the publication: file times tick in milliseconds
    temp = os.path.join(dataset_root, ".LATEST.by-hand")
    with open(temp, "w") as f:
        f.write(version + "\n")
    os.replace(temp, os.path.join(dataset_root, "LATEST"))


def test_a_rollback_by_hand_stands_until_the_inputs_change(demo_corpus, tmp_path, capsys):
    """`echo OLD > LATEST`: the next nightly build of the same inputs finds
    its version up to date, and used to point LATEST back at it."""
    root, keys, config, path = one_split_corpus(demo_corpus, tmp_path, num_shards=1)
    first = build(config)
    add_image(demo_corpus, root, keys, "added.png")
    second = build(config)
    dataset = publish.DatasetRoot(second.dataset_root)
    assert dataset.latest() == second.version
    roll_back(second.dataset_root, first.version)

    # The nightly run: up to date as `second`, LATEST left as set, both kept.
    report = tmp_path / "report.json"
    argv = ["build", "--config", str(path), "--report", str(report), "--keep", "1"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"kiln build: shapes is up to date: version {second.version}\n")
    assert (
        f"  LATEST -> {first.version}, set by hand after {second.version} was published: "
        f"left as is (write {second.version} into LATEST to publish it again)\n"
    ) in out
    written = json.loads(report.read_text())
    assert written["status"] == "up_to_date" and written["version"] == second.version
    assert written["latest"] == first.version and written["latest_set_by_hand"] is True
    assert written["changes"] is None and written["pruned"] == []
    assert dataset.latest() == first.version
    assert dataset.versions() == sorted([first.version, second.version])

    # A touched file: a new stamp, the same content, so the same version: still left.
    os.utime(root / keys[1], (1, 1))
    again = build(config)
    assert not again.up_to_date and again.version == second.version
    assert again.latest_set_by_hand == first.version and dataset.latest() == first.version

    # Changed inputs make a new version, which is published: the rollback is over.
    add_image(demo_corpus, root, keys, "another.png")
    third = build(config)
    assert third.latest_set_by_hand is None and dataset.latest() == third.version
    assert third.previous_version == first.version and third.changes is not None
    # Publishing by hand what was rolled back from: a later build leaves it.
    roll_back(second.dataset_root, second.version)
    os.remove(root / keys[0].split("/")[0] / "another.png")
    fourth = build(config)
    assert fourth.version == second.version and fourth.latest_set_by_hand is None
    assert dataset.latest() == second.version


def images_on_the_object_store(demo_corpus):
    """An emptied in-memory store (`object_store`) holding every sixth good
    demo image under ``<bucket>/images``: the bucket and the keys."""
    bucket = f"{object_store.SCHEME}://bucket"
    object_store.reset()
    keys = [k for k in corpus_files(demo_corpus) if k not in demo_corpus.broken][::6]
    for key in keys:
        with open(os.path.join(demo_corpus.out_dir, key), "rb") as f:
            object_store.put(f"{bucket}/images/{key}", f.read())
    return bucket, keys


def memgs_config(bucket, num_shards):
    """A config building `images_on_the_object_store` into ``<bucket>/datasets``."""
    return make_config(
        f"{bucket}/images",
        output=f"{bucket}/datasets",
        sharding={"num_shards": num_shards},
        splits={"fractions": {"train": 1.0}},
    )


def test_a_rollback_whose_latest_keeps_an_old_file_time_stands(demo_corpus, tmp_path):
    """A rollback that copies a saved LATEST back with its time (`cp -p`,
    `rsync -a`, `tar x`) wrote a LATEST older than the publication it rolls
    back: it was taken for a build stopped before writing LATEST, and the
    next nightly build of the same inputs undid it."""
    root, keys, config, _ = one_split_corpus(demo_corpus, tmp_path, num_shards=1)
    first = build(config)
    saved = tmp_path / "LATEST.saved"
    shutil.copy2(os.path.join(first.dataset_root, "LATEST"), saved)  # cp -p
    os.utime(saved, (1, 1))  # as old as a backup is
    add_image(demo_corpus, root, keys, "added.png")
    second = build(config)
    shutil.copy2(saved, os.path.join(first.dataset_root, "LATEST"))  # cp -p back: rolled back
    dataset = publish.DatasetRoot(first.dataset_root)
    assert dataset.latest() == first.version

    again = build(config)  # the nightly run, the same inputs
    assert (again.up_to_date, again.version) == (True, second.version)
    assert again.latest_set_by_hand == first.version and dataset.latest() == first.version


def test_keep_on_an_object_store(demo_corpus):
    """No directories, no atomic rename: each pruned version loses its kiln.json
    first, then every other object under its prefix."""
    bucket, keys = images_on_the_object_store(demo_corpus)
    try:
        config = memgs_config(bucket, num_shards=1)
        first = build(config)
        object_store.put(
            f"{bucket}/images/{keys[0].split('/')[0]}/added.png",
            object_store.get(f"{bucket}/images/{keys[1]}"),
        )
        object_store.EVENTS.clear()
        second = build(config, keep=1)
        assert second.pruned == (first.version,)
        assert publish.DatasetRoot(second.dataset_root).versions() == [second.version]
        assert object_store.names(first.dataset_dir + "/") == []
        deleted = [
            path
            for kind, path in object_store.EVENTS
            if kind == "delete" and path.startswith(first.dataset_dir + "/")
        ]
        assert deleted[0] == f"{first.dataset_dir}/kiln.json" and len(deleted) > 3
        assert object_store.get(f"{second.dataset_root}/LATEST").decode() == second.version + "\n"
        assert object_store.names(f"{second.dataset_dir}/kiln.json")

        # A rollback by hand stands on an object store too (one object write).
        third = build(dict(config, transforms=[{"resize": {"shorter_side": 40}}]))
        time.sleep(0.05)
        object_store.put(f"{second.dataset_root}/LATEST", second.version.encode() + b"\n")
        again = build(dict(config, transforms=[{"resize": {"shorter_side": 40}}]), keep=1)
        assert again.up_to_date and again.version == third.version
        assert again.latest_set_by_hand == second.version and again.pruned == ()
        assert object_store.get(f"{second.dataset_root}/LATEST").decode() == second.version + "\n"
    finally:
        object_store.reset()


def test_a_lock_taken_while_the_version_was_copied_stops_the_build_before_latest(demo_corpus):
    """On an object store a stalled build's lock can be broken and taken by
    the next build. Taken while this one copied its version into place
    (minutes on a large dataset, after its last check), it must not write
    LATEST over the new holder's: it fails, naming the lock, and publishes
    nothing."""
    from kiln.pipeline import lock

    bucket, _ = images_on_the_object_store(demo_corpus)
    config = memgs_config(bucket, num_shards=1)
    lock_path = f"{bucket}/datasets/shapes/.lock"
    taker = lock.Holder.me()
    taker = dataclasses.replace(taker, token=taker.token + "-taker")
    taken = []

    def take_the_lock(kind, path):
        # The copy's last object: the version's kiln.json, not the staging one.
        if kind == "write" and re.fullmatch(
            rf"{bucket}/datasets/shapes/[0-9a-f]{{12}}/kiln.json", path
        ):
            taken.append(path)
            object_store.put(lock_path, taker.to_bytes())

    try:
        object_store.WATCHERS[:] = [take_the_lock]
        with pytest.raises(Exception, match=f"lost the lock {re.escape(lock_path)}"):
            build(config)
        assert taken
        assert not object_store.names(f"{bucket}/datasets/shapes/LATEST")
        assert lock.Holder.from_bytes(object_store.get(lock_path)).token == taker.token
    finally:
        object_store.reset()


# --- SIGKILL ----------------------------------------------------------------------------

# Runs `kiln build` and SIGKILLs itself right after one publishing step
# returns: the moments a random delay almost never hits.
KILL_AFTER = textwrap.dedent("""
    import os, signal, sys
    from kiln import cli
    from kiln.pipeline import launcher, publish
    owner = {"launcher": launcher, "publish": publish}[sys.argv[1]]
    *path, name = sys.argv[2].split(".")
    for part in path:
        owner = getattr(owner, part)
    original = getattr(owner, name)

    def then_die(*args, **kwargs):
        result = original(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(owner, name, then_die)
    sys.exit(cli.main(["build", *sys.argv[3:]]))
""")
PRECISE_KILLS = [
    ("publish", "DatasetRoot.record_published"),  # version in place, stamped, LATEST not yet
    ("publish", "write_tfds_metadata"),  # staging complete but for kiln.json
]


def start_build(config_path, *kill_after, flags=()):
    """`kiln build --config config_path --quiet [flags]` in a new process group (a
    session, so killing it kills any worker it started); output goes to a
    log file beside the config, read back by `log`."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(
        [SOURCE_ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    )
    command = ["-c", KILL_AFTER, *kill_after] if kill_after else ["-m", "kiln.pipeline"]
    with open(os.path.join(os.path.dirname(config_path), "build.log"), "w") as out:
        return subprocess.Popen(
            [sys.executable, *command, "--config", str(config_path), "--quiet", *flags],
            env=env,
            start_new_session=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def log(config_path):
    with open(os.path.join(os.path.dirname(config_path), "build.log")) as f:
        return f.read()[-4000:]


def run_and_watch(config_path, dataset_root):
    """Runs a build to completion, watching the dataset root. Returns seconds
    from the start until a staging folder appeared, until LATEST appeared,
    and until the process ended."""
    started = time.monotonic()
    process = start_build(config_path)
    staged = published = None
    while process.poll() is None:
        elapsed = time.monotonic() - started
        entries = os.listdir(dataset_root) if os.path.isdir(dataset_root) else []
        if staged is None and any(e.startswith(".staging-") for e in entries):
            staged = elapsed
        if published is None and "LATEST" in entries:
            published = elapsed
        time.sleep(0.005)
    assert process.returncode == 0, log(config_path)
    ended = time.monotonic() - started
    return staged or 0.0, published or ended, ended


def assert_nothing_half_written(dataset_root, previous, verified):
    """What a reader can see is whole, and the previous LATEST is intact.

    "Visible" is everything a reader can open: LATEST, and every entry of the
    dataset root whose name does not start with '.' (staging folders, stamps
    and temp files are hidden, and never read). LATEST must name a complete
    version, every visible folder must be a complete version that `kiln
    verify` passes, and the version LATEST named before the build must still
    pass and read back through kiln.reader. A complete version never
    changes, so each is verified once (`verified` holds their names).
    """
    with open(os.path.join(dataset_root, "LATEST")) as f:
        latest = f.read().rstrip("\n")
    visible = sorted(e for e in os.listdir(dataset_root) if not e.startswith("."))
    assert latest in visible, (latest, visible)
    for entry in visible:
        if entry != "LATEST" and entry not in verified:
            checked = verify.verify(os.path.join(dataset_root, entry))
            assert checked.ok, (entry, checked.problems)
            verified.add(entry)
    assert previous in visible
    info = kiln.reader.info(dataset_root)  # follows LATEST
    records = kiln.reader.load(dataset_root, "train", batch_size=None, shuffle=False, augment=None)
    assert sum(1 for _ in records) == info.splits["train"].num_examples
    return latest


def test_a_version_is_on_disk_before_latest_names_it(demo_corpus, tmp_path, monkeypatch):
    """A power loss cannot be staged here; what is observable is the order
    of the fsyncs: every file of the published version and its folder are
    fsynced before LATEST is written (LATEST's own fsync), and the dataset
    folder (LATEST's rename) after it. Shards used to be fsynced never."""
    synced = []  # (device, inode) of each fsync, in order
    real_fsync = os.fsync

    def recording_fsync(fd):
        status = os.fstat(fd)
        synced.append((status.st_dev, status.st_ino))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    root, keys, config, _ = one_split_corpus(demo_corpus, tmp_path, num_shards=2)
    build(config)
    add_image(demo_corpus, root, keys, "added.png")
    synced.clear()
    result = build(config)  # a second version: LATEST replaced, not created
    monkeypatch.undo()

    def last_fsync(path):
        status = os.stat(path)
        identity = (status.st_dev, status.st_ino)
        assert identity in synced, f"{path} was never fsynced"
        return max(i for i, synced_id in enumerate(synced) if synced_id == identity)

    version_paths = [result.dataset_dir] + [
        os.path.join(directory, name)
        for directory, _, names in os.walk(result.dataset_dir)
        for name in names
    ]
    assert len(version_paths) > 3  # shards, reports, kiln.json
    latest = last_fsync(os.path.join(result.dataset_root, "LATEST"))
    assert max(last_fsync(path) for path in version_paths) < latest
    assert last_fsync(result.dataset_root) > latest


def test_a_build_killed_at_any_moment_leaves_latest_intact(demo_corpus, tmp_path):
    root, keys, config, config_path = one_split_corpus(demo_corpus, tmp_path, num_shards=2)
    dataset_root = str(tmp_path / "out" / "shapes")
    verified = set()

    staged, published, duration = run_and_watch(config_path, dataset_root)
    latest = assert_nothing_half_written(
        dataset_root, publish.DatasetRoot(dataset_root).latest(), verified
    )

    # Random moments (seeded) from the start to the end of a build. Imports
    # take most of a small build's time, so every other trial falls in the
    # window where it writes: from just before its staging folder appeared
    # until LATEST was written in the measured build.
    rng = random.Random(4)
    trials = 10
    killed = 0
    for trial in range(trials):
        add_image(demo_corpus, root, keys, f"extra_{trial}.png")
        process = start_build(config_path)
        step = (trial // 2 + rng.random()) / (trials // 2)
        time.sleep(
            duration * step if trial % 2 == 0 else 0.9 * staged + (published - 0.9 * staged) * step
        )
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:  # it finished (and published) before the moment came
            pass
        code = process.wait(timeout=60)
        killed += code == -signal.SIGKILL
        latest = assert_nothing_half_written(dataset_root, latest, verified)
    assert killed >= 1

    # The moments between publishing steps, exactly.
    for trial, (module, step) in enumerate(PRECISE_KILLS):
        add_image(demo_corpus, root, keys, f"precise_{trial}.png")
        process = start_build(config_path, module, step)
        assert process.wait(timeout=300) == -signal.SIGKILL, log(config_path)
        assert assert_nothing_half_written(dataset_root, latest, verified) == latest, step
    assert [e for e in os.listdir(dataset_root) if e.startswith(".staging-")]

    # The next build cleans up and publishes.
    process = start_build(config_path)
    assert process.wait(timeout=300) == 0, log(config_path)
    final = assert_nothing_half_written(dataset_root, latest, verified)
    assert final != latest
    hidden = sorted(e for e in os.listdir(dataset_root) if e.startswith("."))
    assert hidden == [".file-stamps", ".lock", ".published", ".stamps"]
    assert not [e for e in os.listdir(os.path.join(dataset_root, ".stamps")) if "tmp" in e]
    # File stamps only of complete versions, the new one's among them.
    complete = {
        e
        for e in os.listdir(dataset_root)
        if os.path.exists(os.path.join(dataset_root, e, "kiln.json"))
    }
    file_stamps = set(os.listdir(os.path.join(dataset_root, ".file-stamps")))
    assert final in file_stamps and file_stamps <= complete
    info = kiln.reader.info(dataset_root)
    assert info.splits["train"].num_examples == len(keys) + trials + len(PRECISE_KILLS)

    # The build killed just before replacing LATEST had stamped its version:
    # with its inputs back, a rebuild finds it up to date and points LATEST at it.
    for trial in range(1, len(PRECISE_KILLS)):
        os.remove(root / keys[0].split("/")[0] / f"precise_{trial}.png")
    again = build(str(config_path))
    assert again.up_to_date and publish.DatasetRoot(dataset_root).latest() == again.version
    assert again.info.splits["train"].num_examples == len(keys) + trials + 1


def test_what_a_prune_killed_half_way_leaves_is_deleted_by_the_next_build(
    demo_corpus, tmp_path, caplog
):
    """SIGKILL while --keep prunes: the pruned version has lost its kiln.json
    (deleted first) but keeps its shards and its records. Pruning counts
    complete versions only, so no later build would delete it."""
    root, keys, config, config_path = one_split_corpus(demo_corpus, tmp_path, num_shards=2)
    first = build(config)
    add_image(demo_corpus, root, keys, "second.png")
    # The first delete of a local build is the pruned version's kiln.json.
    process = start_build(
        config_path, "publish", "storage.LocalStore.delete", flags=["--keep", "1"]
    )
    assert process.wait(timeout=300) == -signal.SIGKILL, log(config_path)
    dataset = publish.DatasetRoot(first.dataset_root)
    second = dataset.latest()
    assert second != first.version
    assert sorted(os.listdir(first.dataset_dir)) == [
        n for n in sorted(os.listdir(dataset.version_dir(second))) if n != "kiln.json"
    ]
    stamps = tmp_path / "out" / "shapes" / ".stamps"
    assert first.version in {p.read_text() for p in stamps.iterdir()}
    published = tmp_path / "out" / "shapes" / ".published"

    def records():  # the publication records (not the hidden note of LATEST)
        return sorted(n for n in os.listdir(published) if not n.startswith("."))

    assert records() == sorted([first.version, second])
    kept = read_tree(dataset.version_dir(second))

    again = build(config)  # up to date: no new version, and the leftover goes
    assert again.up_to_date and again.version == second
    assert not os.path.exists(first.dataset_dir)
    assert {p.read_text() for p in stamps.iterdir()} == {second}
    assert records() == [second]
    assert dataset.versions() == [second] and dataset.latest() == second
    assert read_tree(dataset.version_dir(second)) == kept  # what readers use is untouched
    assert verify.verify(again.dataset_dir).ok
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(
        f"deleting the incomplete version folder {first.dataset_dir}" in m for m in warned
    ), warned
    # A folder kiln did not make is not kiln's to delete.
    (tmp_path / "out" / "shapes" / "notes").mkdir()
    (tmp_path / "out" / "shapes" / "notes" / "README").write_text("mine")
    build(config)
    assert (tmp_path / "out" / "shapes" / "notes" / "README").read_text() == "mine"


# Runs `kiln build` commands one after another in one process on the
# in-memory object store (which lives in that process), and sends the
# process a real SIGTERM at the first write or delete of the store that
# matches a step's pattern, as a scheduler stopping the task would. Prints
# each step's exit code and the store's object names.
ON_MEMGS = textwrap.dedent("""
    import json, logging, os, re, signal, sys
    tests, steps = sys.argv[1], json.loads(sys.argv[2])
    sys.path.insert(0, tests)
    import object_store
    from kiln import cli

    results = []
    for step in steps:
        # Each step as a process of its own: an interrupted one turned logging off.
        logging.disable(logging.NOTSET)
        for uri, path in step.get("put", {}).items():
            with open(path, "rb") as f:
                object_store.put(uri, f.read())
        at = step.get("sigterm_at")
        fired = []

        def watch(kind, path, at=at, fired=fired, count=step.get("sigterms", 1)):
            if at and not fired and kind == at[0] and re.fullmatch(at[1], path):
                fired.append(path)
                for _ in range(count):
                    os.kill(os.getpid(), signal.SIGTERM)

        object_store.WATCHERS[:] = [watch]
        code = cli.main(step["argv"]) if "argv" in step else None
        object_store.WATCHERS[:] = []
        names = object_store.names()
        latest = [n for n in names if n.endswith("/LATEST")]
        results.append({
            "code": code,
            "fired": fired,
            "names": names,
            "latest": object_store.get(latest[0]).decode() if latest else None,
        })
    print("RESULTS " + json.dumps(results), flush=True)
    os._exit(0)  # not the exit code an interrupted build registered
""")


def run_on_memgs(steps, tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=SOURCE_ROOT)
    completed = subprocess.run(
        [sys.executable, "-c", ON_MEMGS, TESTS, json.dumps(steps)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULTS ")]
    assert lines, completed.stdout + completed.stderr[-4000:]
    return json.loads(lines[-1][len("RESULTS ") :]), completed.stderr


def test_a_publish_or_prune_stopped_by_sigterm_on_an_object_store(demo_corpus, tmp_path):
    """A version is copied into place file by file on an object store. SIGTERM
    during the copy: the build deletes the part it copied on its way out
    (exit 143). During --keep's pruning, after publishing, a SIGTERM waits
    for the build's end; a second one stops the prune (exit 143), and the
    half-pruned version is deleted by the next build, with its records."""
    bucket = f"{object_store.SCHEME}://bucket"
    root = f"{bucket}/datasets/shapes"
    keys = [k for k in corpus_files(demo_corpus) if k not in demo_corpus.broken][::6]
    images = {f"{bucket}/images/{key}": os.path.join(demo_corpus.out_dir, key) for key in keys}
    config = make_config(
        f"{bucket}/images",
        output=f"{bucket}/datasets",
        sharding={"num_shards": 2},
        splits={"fractions": {"train": 1.0}},
    )
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))

    def argv(report, *flags):
        return ["build", "--config", str(config_path), "--quiet", "--report", report, *flags]

    version_file = rf"{re.escape(root)}/[0-9a-f]{{12}}/[^/]+"
    added = {
        f"{bucket}/images/{keys[0].split('/')[0]}/added.png": images[f"{bucket}/images/{keys[1]}"]
    }
    results, err = run_on_memgs(
        [
            {"put": images, "argv": argv("first.json")},
            {"put": added, "argv": argv("copy.json"), "sigterm_at": ["write", version_file]},
            {
                "argv": argv("prune.json", "--keep", "1"),
                "sigterm_at": ["delete", rf"{re.escape(root)}/[0-9a-f]{{12}}/kiln\.json"],
                "sigterms": 2,
            },
            {"argv": argv("after.json")},
        ],
        tmp_path,
    )
    first, copy, prune, after = results
    reports = {
        name: json.loads((tmp_path / f"{name}.json").read_text())
        for name in ("first", "copy", "prune", "after")
    }
    v1 = reports["first"]["version"]
    assert first["code"] == 0 and v1, err

    def under(names, prefix):
        return [n for n in names if n.startswith(prefix)]

    # Stopped while copying its version: nothing of it is left, nor of its staging.
    assert copy["code"] == 143 and copy["fired"], (copy, err)
    v2 = copy["fired"][0][len(root) + 1 :].split("/")[0]
    assert v2 != v1 and reports["copy"]["status"] == "interrupted"
    assert under(copy["names"], f"{root}/{v2}/") == []
    assert not [n for n in copy["names"] if "/.staging-" in n]
    assert copy["latest"] == v1 + "\n"

    # Stopped (a second signal) while pruning v1 after publishing v2: v1 lost its kiln.json only.
    assert prune["code"] == 143 and prune["fired"] == [f"{root}/{v1}/kiln.json"], (prune, err)
    v1_left = under(prune["names"], f"{root}/{v1}/")
    assert v1_left and f"{root}/{v1}/kiln.json" not in v1_left
    assert f"{root}/.published/{v1}" in prune["names"]
    assert f"{root}/{v2}/kiln.json" in prune["names"] and prune["latest"] == v2 + "\n"
    v2_files = under(prune["names"], f"{root}/{v2}/")

    # The next build (up to date) deletes the leftover and its records; v2 stays whole.
    assert after["code"] == 0 and reports["after"]["status"] == "up_to_date", err
    assert reports["after"]["version"] == v2
    assert under(after["names"], f"{root}/{v1}/") == []
    assert f"{root}/.published/{v1}" not in after["names"]
    assert under(after["names"], f"{root}/.published/") == [
        f"{root}/.published/.named",  # the version kiln last wrote into LATEST
        f"{root}/.published/{v2}",
    ]
    assert len(under(after["names"], f"{root}/.stamps/")) == 1
    assert under(after["names"], f"{root}/{v2}/") == v2_files
    assert any(
        m.startswith(f"deleting the incomplete version folder {root}/{v1}")
        for m in reports["after"]["warnings"]
    ), reports["after"]["warnings"]


# `kiln build` in a process of its own that sends itself a real SIGTERM as the
# build starts comparing its version with the previous one (for the summary's
# "changes since" and the report's `changes`), as a scheduler stopping the task
# then would; the comparison itself runs as always.
SIGTERM_WHILE_COMPARING = textwrap.dedent("""
    import os, signal, sys
    from kiln import cli
    from kiln.schemas import version_diff

    compare = version_diff.compare

    def compare_after_sigterm(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return compare(*args, **kwargs)

    version_diff.compare = compare_after_sigterm
    sys.exit(cli.main(sys.argv[1:]))
""")


def test_a_sigterm_while_comparing_with_the_previous_version_publishes_nothing(
    demo_corpus, tmp_path
):
    """The comparison with the previous version reads both record indexes
    (seconds for a large dataset). It came after LATEST was written: a
    SIGTERM then exited 143, "nothing was published", with the new version
    published. Now it comes before: LATEST stays, and the next build
    publishes the complete version as up to date."""
    root, keys, config, path = one_split_corpus(demo_corpus, tmp_path, num_shards=1)
    first = build(config)
    dataset = publish.DatasetRoot(first.dataset_root)
    add_image(demo_corpus, root, keys, "added.png")
    env = dict(os.environ, PYTHONPATH=SOURCE_ROOT, TF_CPP_MIN_LOG_LEVEL="3")

    def stopped_build(report):
        argv = ["build", "--config", str(path), "--report", str(report)]
        return subprocess.run(
            [sys.executable, "-c", SIGTERM_WHILE_COMPARING, *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    # Stopped after the job, while comparing; and then stopped on the up-to-date
    # path, which also compares before naming the version.
    for report in (tmp_path / "job.json", tmp_path / "up-to-date.json"):
        stopped = stopped_build(report)
        assert (stopped.returncode, stopped.stderr) == (143, "kiln build: terminated (SIGTERM)\n")
        assert json.loads(report.read_text())["status"] == "interrupted"
        assert dataset.latest() == first.version
        assert not [e for e in os.listdir(first.dataset_root) if e.startswith(".staging-")]
    new = [v for v in dataset.versions() if v != first.version]
    assert len(new) == 1 and dataset.is_complete(new[0])

    # The next build of the same inputs publishes it, as up to date.
    again = build(config)
    assert again.up_to_date and again.version == new[0] and dataset.latest() == new[0]
    assert again.previous_version == first.version and again.changes is not None
    assert verify.verify(first.dataset_root).ok


# `kiln build` in a process of its own that sends itself real signals (argv[2],
# comma-separated) right after a function of the build's end returns (argv[1]:
# `build_report.succeeded`, as it writes the summary into its report;
# `publish.DatasetRoot.point_latest`, the moment LATEST names the new version,
# before the staging folder is removed and old versions are pruned): a
# scheduler's stop or a Ctrl-C that comes once the build has published.
SIGNAL_AFTER_PUBLISHING = textwrap.dedent("""
    import functools, os, signal, sys
    from kiln import cli
    from kiln.pipeline import build_report, publish

    owner, name = {
        "succeeded": (build_report, "succeeded"),
        "point_latest": (publish.DatasetRoot, "point_latest"),
    }[sys.argv[1]]
    original = getattr(owner, name)

    @functools.wraps(original)
    def then_signals(*args, **kwargs):
        result = original(*args, **kwargs)
        for signum in sys.argv[2].split(","):
            os.kill(os.getpid(), getattr(signal, signum))
        return result

    setattr(owner, name, then_signals)
    sys.exit(cli.main(sys.argv[3:]))
""")


@pytest.mark.parametrize(
    "signum, flags", [("SIGTERM", ("--quiet",)), ("SIGINT", ())], ids=["SIGTERM", "SIGINT"]
)
def test_a_signal_once_the_version_is_published_leaves_a_true_report(
    demo_corpus, tmp_path, signum, flags
):
    """A SIGTERM or Ctrl-C that came after LATEST named the new version,
    while the summary was printed and the report written, exited 143 or 130
    ("terminated": nothing published, the docs say) and left the report
    `running`, as a build killed outright does, though the version was
    published. The build is done by then: it writes its report, `built`,
    and exits 0."""
    root, keys, config, path = one_split_corpus(demo_corpus, tmp_path, num_shards=1)
    report = tmp_path / "report.json"
    finished = subprocess.run(
        [sys.executable, "-c", SIGNAL_AFTER_PUBLISHING, "succeeded", signum]
        + ["build", "--config", str(path), "--report", str(report), *flags],
        env=dict(os.environ, PYTHONPATH=SOURCE_ROOT, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert (finished.returncode, finished.stderr) == (0, ""), finished.stderr
    written = json.loads(report.read_text())
    assert (written["status"], written["exit_code"]) == ("built", 0)
    dataset = publish.DatasetRoot(os.path.dirname(written["dataset_dir"]))
    assert dataset.latest() == written["version"]
    assert (finished.stdout == "") == ("--quiet" in flags)
    if "--quiet" not in flags:
        assert finished.stdout.startswith(f"kiln build: built shapes version {written['version']}")


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_signal_as_latest_is_written_lets_the_build_finish_its_cleanup(
    demo_corpus, tmp_path, signum
):
    """Between LATEST naming the new version and the build's end, the
    staging folder is removed and `--keep` prunes old versions: a stop
    there exited 143 or 130 ("nothing was published") with a report
    `interrupted`, of a published version, and left the old versions. The
    build is done once LATEST is written: it finishes, its report says
    `built`, and it exits 0."""
    root, keys, config, path = one_split_corpus(demo_corpus, tmp_path, num_shards=1)
    first = build(config)
    dataset = publish.DatasetRoot(first.dataset_root)
    add_image(demo_corpus, root, keys, "added.png")
    report = tmp_path / "report.json"
    finished = subprocess.run(
        [sys.executable, "-c", SIGNAL_AFTER_PUBLISHING, "point_latest", signum]
        + ["build", "--config", str(path), "--report", str(report), "--keep", "1", "--quiet"],
        env=dict(os.environ, PYTHONPATH=SOURCE_ROOT, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert (finished.returncode, finished.stdout, finished.stderr) == (0, "", "")
    written = json.loads(report.read_text())
    assert (written["status"], written["exit_code"]) == ("built", 0)
    assert dataset.latest() == written["version"] != first.version
    assert dataset.versions() == [written["version"]]  # --keep 1 pruned the first
    assert not [e for e in os.listdir(first.dataset_root) if e.startswith(".staging-")]


def test_a_second_signal_once_the_version_is_published_still_stops_the_build(demo_corpus, tmp_path):
    """The first signal waits for the report; a second one (a report write
    that hangs on an unreachable bucket) stops the build as before: one
    line, exit 143, the version published."""
    root, keys, config, path = one_split_corpus(demo_corpus, tmp_path, num_shards=1)
    stopped = subprocess.run(
        [sys.executable, "-c", SIGNAL_AFTER_PUBLISHING, "succeeded", "SIGINT,SIGTERM"]
        + ["build", "--config", str(path), "--quiet"],
        env=dict(os.environ, PYTHONPATH=SOURCE_ROOT, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert (stopped.returncode, stopped.stderr) == (143, "kiln build: terminated (SIGTERM)\n")
    dataset = publish.DatasetRoot(str(tmp_path / "out" / "shapes"))
    assert dataset.latest() is not None and dataset.is_complete(dataset.latest())


# `kiln build` in a process of its own that sends itself a real SIGTERM as soon
# as the build's listing has been moved beside an existing version (into
# `.file-stamps/<version>/`): the moment a scheduler's stop can come while the
# build keeps the listing a version was built from.
SIGTERM_AFTER_KEEPING_THE_LISTING = textwrap.dedent("""
    import os, signal, sys
    from kiln import cli

    replace = os.replace

    def replace_then_sigterm(source, target, *args, **kwargs):
        replace(source, target, *args, **kwargs)
        parts = str(target).split(os.sep)
        if ".file-stamps" in parts and parts[-1] == "listing.jsonl":
            os.kill(os.getpid(), signal.SIGTERM)

    os.replace = replace_then_sigterm
    sys.exit(cli.main(sys.argv[1:]))
""")


def test_a_sigterm_while_keeping_a_listing_never_leaves_it_without_its_build_start(
    demo_corpus, tmp_path
):
    """A version's kept listing without `.build-started` is trusted by its
    stamps alone, with no check of the stamps as recent as the build that
    listed them ("racily clean"). A build of an existing version (a file
    touched) replaces that version's listing; stopped between moving the
    listing there and writing when the build started, it left exactly that."""
    root, keys, config, path = one_split_corpus(demo_corpus, tmp_path, num_shards=1)
    first = build(config)
    dataset = publish.DatasetRoot(first.dataset_root)
    assert dataset.file_stamps(first.version) and dataset.build_started(first.version)
    os.utime(root / keys[1], (1, 1))  # a new stamp, the same bytes: the same version
    stopped = subprocess.run(
        [sys.executable, "-c", SIGTERM_AFTER_KEEPING_THE_LISTING]
        + ["build", "--config", str(path)],
        env=dict(os.environ, PYTHONPATH=SOURCE_ROOT, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert (stopped.returncode, stopped.stderr) == (143, "kiln build: terminated (SIGTERM)\n")
    assert dataset.latest() == first.version and dataset.is_complete(first.version)
    if dataset.file_stamps(first.version):
        assert dataset.build_started(first.version) is not None
    # The next build finishes what was stopped: the same version, its listing kept whole.
    again = build(config)
    assert again.version == first.version and dataset.latest() == first.version
    assert dataset.file_stamps(first.version) and dataset.build_started(first.version)


def test_a_published_version_whose_kiln_json_was_edited_is_rebuilt_not_reused(
    demo_corpus, tmp_path
):
    root = tmp_path / "images"
    small_corpus(demo_corpus, root)
    config = make_config(root, output=str(tmp_path / "out"))
    first = build(config)
    metadata = os.path.join(first.dataset_dir, "kiln.json")
    with open(metadata) as f:
        edited = f.read().replace('"num_examples": ', '"num_examples": 1', 1)
    with open(metadata, "w") as f:
        f.write(edited)
    with pytest.raises(MetadataError, match="modified after it was written"):
        kiln.reader.info(first.dataset_dir)

    again = build(config)  # not "up to date" on a damaged version: built and replaced
    assert not again.up_to_date and again.version == first.version
    assert kiln.reader.info(again.dataset_dir).splits == first.info.splits
    assert verify.verify(again.dataset_dir).ok
    assert build(config).up_to_date


# --- repair -------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--rehash", "--full"])
def test_a_damaged_published_version_is_repaired_by_rehash_or_full(
    demo_corpus, tmp_path, capsys, flag
):
    """A shard of LATEST's version truncated, another deleted: `kiln verify`
    fails; `kiln build --rehash` (or `--full`) builds the same version again
    and replaces the damaged files with its copy, so verify passes and the
    folder holds a clean build's bytes."""
    _, _, config, path = one_split_corpus(demo_corpus, tmp_path, num_shards=3)
    first = build(config)
    shards = first.info.splits["train"].filenames
    with open(os.path.join(first.dataset_dir, shards[0]), "r+b") as f:
        f.truncate(100)
    os.remove(os.path.join(first.dataset_dir, shards[2]))
    assert cli.main(["verify", first.dataset_root]) == 1
    assert build(config).up_to_date  # the stamp and kiln.json are trusted
    capsys.readouterr()

    report = tmp_path / "report.json"
    assert cli.main(["build", "--config", str(path), flag, "--report", str(report)]) == 0
    result = json.loads(report.read_text())
    assert result["status"] == "built" and result["version"] == first.version
    repaired = [w for w in result["warnings"] if w.startswith(f"repaired version {first.version}")]
    assert len(repaired) == 1 and shards[0] in repaired[0] and shards[2] in repaired[0]
    assert shards[1] not in repaired[0]
    dataset = publish.DatasetRoot(first.dataset_root)
    assert dataset.latest() == first.version and dataset.staging_dirs() == []
    capsys.readouterr()
    assert cli.main(["verify", first.dataset_root]) == 0
    clean = build(dict(config, output=str(tmp_path / "clean")))
    assert clean.version == first.version
    assert read_tree(first.dataset_dir) == read_tree(clean.dataset_dir)


@pytest.mark.parametrize("full", [True, False], ids=["--full", "--rehash"])
def test_damaged_tfds_metadata_is_repaired_by_rehash_or_full(demo_corpus, tmp_path, caplog, full):
    """kiln.json records no sha256 of the TFDS files, but `kiln verify` fails
    on one that differs from it (TFDS would name the classes otherwise) or
    is missing beside the others: `--rehash` or `--full` builds the same
    version and writes them again from its kiln.json, as it replaces a
    damaged shard."""
    import tensorflow_datasets as tfds  # test-only dependency (the dev extra)

    root = tmp_path / "images"
    small_corpus(demo_corpus, root)
    config = make_config(root, output=str(tmp_path / "out"))
    first = build(config)
    labels = os.path.join(first.dataset_dir, "image.class.label.labels.txt")
    features = os.path.join(first.dataset_dir, "features.json")
    with open(labels, "w") as f:  # reversed: other names for the ids
        f.write("".join(f"{name}\n" for name in reversed(first.info.class_names)))
    with open(features, "a") as f:
        f.write(" ")
    os.remove(os.path.join(first.dataset_dir, "dataset_info.json"))  # beside the others

    def tfds_class_names():
        builder = tfds.builder_from_directory(first.dataset_dir)
        return builder.info.features["image/class/label"].names

    with pytest.raises(tfds.core.dataset_info.DatasetInfoFileError):
        tfds_class_names()
    problems = [problem.where for problem in verify.verify(first.dataset_dir).problems]
    assert problems == ["dataset_info.json", "features.json", "image.class.label.labels.txt"]

    with caplog.at_level("WARNING", logger="kiln.pipeline.tfds_export"):
        again = build(config, full=full, rehash=not full)
    assert again.version == first.version and not again.up_to_date
    repaired = [r.getMessage() for r in caplog.records if "TFDS metadata" in r.getMessage()]
    assert len(repaired) == 1 and repaired[0].startswith(f"repaired version {first.version}")
    assert repaired[0].endswith(": dataset_info.json, features.json, image.class.label.labels.txt")
    assert verify.verify(first.dataset_dir).ok
    assert tfds_class_names() == first.info.class_names
    clean = build(dict(config, output=str(tmp_path / "clean")))
    assert read_tree(first.dataset_dir) == read_tree(clean.dataset_dir)


def test_a_damaged_published_version_is_repaired_on_an_object_store(demo_corpus):
    """No rename there: each damaged object is written again whole, by the
    build's copy, and the version's objects end as a clean build's."""
    bucket, _ = images_on_the_object_store(demo_corpus)
    try:
        config = memgs_config(bucket, num_shards=2)
        first = build(config)
        shards = [f"{first.dataset_dir}/{name}" for name in first.info.splits["train"].filenames]
        object_store.put(shards[0], object_store.get(shards[0])[:100])
        del object_store.OBJECTS[shards[1]]
        errors = f"{first.dataset_dir}/errors.jsonl"
        object_store.put(errors, b'{"edited": true}\n')
        # Not recorded in kiln.json: written again from it.
        object_store.put(f"{first.dataset_dir}/features.json", b"{}\n")

        again = build(config, rehash=True)
        assert again.version == first.version and not again.up_to_date
        clean = build(dict(config, output=f"{bucket}/clean"))
        assert clean.version == first.version

        def objects(folder):
            return {
                name[len(folder) :]: object_store.get(name)
                for name in object_store.names(folder + "/")
            }

        assert objects(first.dataset_dir) == objects(clean.dataset_dir)
        assert publish.DatasetRoot(first.dataset_root).latest() == first.version
    finally:
        object_store.reset()
