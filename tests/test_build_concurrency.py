"""Never publish a wrong dataset: builds of one dataset exclude each other, the
job must account for every listed file, and an empty dataset is not published
unless the config allows it.

The double-fire test starts ten real `kiln build` processes at the same moment,
round after round, as a scheduler firing twice (or ten times) would."""

import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

import kiln.reader
import object_store
from conftest import make_config
from kiln import cli
from kiln.errors import Busy
from kiln.pipeline import build, lock, publish, sources, storage
from kiln.pipeline.launcher import BuildError
from kiln.tools import verify
from test_build_publishing import add_image, small_corpus

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STARTS = 10
ROUNDS = 3


def run_kiln(args, env_extra=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(REPO, "src")] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    )
    env.update(env_extra or {})
    return subprocess.Popen(
        [sys.executable, "-m", "kiln.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_simultaneous_builds_publish_once_and_never_an_empty_or_partial_version(
    demo_corpus, tmp_path
):
    root = tmp_path / "images"
    keys = small_corpus(demo_corpus, root)
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(make_config(root, output=str(tmp_path / "out"))))
    dataset_root = tmp_path / "out" / "shapes"
    published = []
    for round_number in range(ROUNDS):
        add_image(demo_corpus, root, keys, f"round_{round_number}.png")
        reports = [tmp_path / f"report-{round_number}-{i}.json" for i in range(STARTS)]
        # The last two wait for the lock instead of giving up: they find the
        # dataset the first one published up to date (or build it themselves).
        processes = [
            run_kiln(
                ["build", "--config", str(config_path), "--quiet", "--report", str(report)]
                + (["--wait", "300"] if i >= STARTS - 2 else [])
            )
            for i, report in enumerate(reports)
        ]
        outcomes = []
        for process, report in zip(processes, reports, strict=True):
            out, err = process.communicate(timeout=600)
            status = json.loads(report.read_text())["status"]
            outcomes.append((process.returncode, status))
            if process.returncode == 3:
                assert status == "busy" and out == ""
                # One line of kiln's (TensorFlow's C++ start-up lines aside: issue 17).
                (line,) = [line for line in err.splitlines() if line.startswith("kiln")]
                assert line.startswith("kiln build: busy: another build of"), err
                assert "pid " in line and "--wait" in line, err
            else:
                assert process.returncode == 0, err
                assert status in ("built", "up_to_date") and out == "", (status, err)
        built = [status for _, status in outcomes if status == "built"]
        assert len(built) == 1, outcomes
        # The waiting ones never give up: one of them may even be the one that builds.
        assert {status for _, status in outcomes[-2:]} <= {"built", "up_to_date"}, outcomes

        latest = (dataset_root / "LATEST").read_text().rstrip("\n")
        versions = publish.DatasetRoot(str(dataset_root)).versions()
        published.append(latest)
        assert versions == sorted(set(published)), (versions, published)  # one new version
        for version in versions:
            assert verify.verify(str(dataset_root / version)).ok
            info = kiln.reader.info(str(dataset_root / version))
            assert sum(split.num_examples for split in info.splits.values()) > 0
        info = kiln.reader.info(str(dataset_root))
        total = sum(split.num_examples for split in info.splits.values())
        assert total == len(keys) + round_number + 1
        assert not [e for e in os.listdir(dataset_root) if e.startswith(".staging-")]


def test_a_second_build_is_busy_while_the_first_holds_the_lock(demo_corpus, tmp_path, capsys):
    config = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    dataset_root = str(tmp_path / "out" / "shapes")
    with lock.DatasetLock(dataset_root):
        with pytest.raises(
            Busy,
            match=rf"another build of {dataset_root} is running "
            rf"\(pid {os.getpid()} on ",
        ):
            build(config)
        report = tmp_path / "report.json"
        assert cli.main(["build", "--config", str(config_path), "--report", str(report)]) == 3
        err = capsys.readouterr().err
        assert err.startswith("kiln build: busy: another build of") and err.count("\n") == 1
        assert json.loads(report.read_text())["status"] == "busy"
        # The report of the build that holds the lock (as it wrote it when it
        # started) stays: a busy run over it did nothing, and a scheduler
        # reading `busy` would lose track of the running (or killed) build.
        from kiln.pipeline import build_report

        running = build_report.running("shapes", dataset_root, str(config_path))
        running["pid"] = os.getpid() + 1
        build_report.write(str(report), running)
        assert cli.main(["build", "--config", str(config_path), "--report", str(report)]) == 3
        assert capsys.readouterr().err.startswith("kiln build: busy: another build of")
        assert json.loads(report.read_text()) == running
        started = time.monotonic()
        with pytest.raises(Busy, match="after waiting 1 s"):
            build(config, wait=1)
        assert time.monotonic() - started >= 1
    assert not os.path.exists(os.path.join(dataset_root, "LATEST"))
    assert build(config).info.splits["train"].num_examples > 0  # free again


def test_a_killed_holder_leaves_no_stale_lock_on_a_local_disk(tmp_path):
    dataset_root = str(tmp_path / "shapes")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from kiln.pipeline import lock\n"
            "with lock.DatasetLock(sys.argv[1]):\n"
            "    print('held', flush=True); time.sleep(600)\n",
            dataset_root,
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "src")),
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(Busy, match=f"pid {holder.pid} on "):
        lock.DatasetLock(dataset_root).__enter__()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with lock.DatasetLock(dataset_root, wait=5) as held:  # the kernel released it
        assert held.holder().pid == os.getpid()


def test_object_store_lock_excludes_and_a_stale_one_is_broken(monkeypatch):
    object_store.reset()
    dataset_root = "memgs://bucket/datasets/shapes"
    path = dataset_root + "/.lock"
    with lock.DatasetLock(dataset_root) as held:
        assert object_store.names(path) == [path]
        with pytest.raises(Busy):
            lock.DatasetLock(dataset_root).__enter__()
        held.check()
    assert object_store.names(path) == []  # released: deleted

    # A builder that died: its heartbeat stops; past the limit the lock is broken.
    dead = lock.Holder(
        pid=1,
        host="elsewhere",
        started="2026-01-01T00:00:00+00:00",
        token="dead",
        heartbeat=time.time() - lock.STALE_AFTER_SECONDS - 1,
    )
    object_store.put(path, dead.to_bytes())
    with lock.DatasetLock(dataset_root, wait=2) as held:
        assert held.holder().token != "dead"
    # A live one (fresh heartbeat) is not broken.
    object_store.put(
        path,
        lock.Holder(
            pid=1, host="elsewhere", started="now", token="live", heartbeat=time.time()
        ).to_bytes(),
    )
    with pytest.raises(Busy, match="pid 1 on elsewhere"):
        lock.DatasetLock(dataset_root, wait=1).__enter__()
    object_store.reset()


def a_dead_pid() -> int:
    """The pid of a process of this machine that has ended."""
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(ended.stdout)


def test_an_object_store_lock_of_a_dead_process_of_this_machine_is_broken_at_once(caplog):
    """A build killed on this machine leaves its lock object with a fresh
    heartbeat: the next build there breaks it at once, not 10 minutes later.
    Elsewhere nothing is known of the process but its last heartbeat."""
    object_store.reset()
    dataset_root = "memgs://bucket/datasets/shapes"
    path = dataset_root + "/.lock"
    me = lock.Holder.me()
    dead = dataclasses.replace(me, pid=a_dead_pid(), token="dead", heartbeat=time.time())
    object_store.put(path, dead.to_bytes())
    with caplog.at_level(logging.WARNING, logger="kiln.pipeline.lock"):
        with lock.DatasetLock(dataset_root) as held:  # no --wait: at once
            assert held.holder().token == held._me.token
    assert caplog.messages == [
        f"breaking the stale lock {path} of {dead.describe()}: its process {dead.pid} on this "
        f"machine is not running"
    ]

    # Not known to be dead: on another machine, in a container of this one
    # (its own pids), written by a kiln that did not record its pid namespace,
    # or alive (this process). The line says what is known.
    old_kiln = {k: v for k, v in dataclasses.asdict(dead).items() if k != "namespace"}
    for holder in (
        dataclasses.replace(dead, host="elsewhere"),
        dataclasses.replace(dead, namespace=me.namespace + "-container"),
        lock.Holder(**old_kiln),
        dataclasses.replace(me, token="alive"),
    ):
        holder = dataclasses.replace(holder, heartbeat=time.time() - 42)
        object_store.put(path, holder.to_bytes())
        with pytest.raises(Busy) as busy:
            lock.DatasetLock(dataset_root).__enter__()
        assert re.fullmatch(
            rf"another build holds the lock of {dataset_root} \({re.escape(holder.describe())}, "
            rf"last heartbeat 4[23] s ago; broken after 600 s without one\); nothing was done "
            rf"\(kiln build --wait SECONDS waits for it\)",
            str(busy.value),
        ), str(busy.value)
        assert object_store.get(path) == holder.to_bytes()

    # A stale heartbeat is broken at once too (it took a second try, or --wait).
    silent = dataclasses.replace(dead, host="elsewhere", heartbeat=time.time() - 601)
    object_store.put(path, silent.to_bytes())
    with lock.DatasetLock(dataset_root) as held:
        assert held.holder().token == held._me.token
    object_store.reset()


def test_a_lost_listing_fails_the_build_instead_of_publishing_an_empty_dataset(
    demo_corpus, tmp_path, monkeypatch
):
    """What two builds sharing a staging folder did: the listing vanished under
    the job, which then read nothing and published 0 examples with exit 0."""
    config = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    write = sources.Listing.write

    def write_then_lose(self, path):
        write(self, path)
        os.remove(path)

    monkeypatch.setattr(sources.Listing, "write", write_then_lose)
    with pytest.raises(
        BuildError,
        match=r"did not account for every input file \(the image "
        r"step read 0 of the 63 listed files; 0 stored \+ 0 "
        r"dropped != 63 listed\); nothing was published",
    ):
        build(config)
    dataset_root = tmp_path / "out" / "shapes"
    assert sorted(os.listdir(dataset_root)) == [".lock"]  # no version, no LATEST, no staging


def test_an_empty_dataset_is_published_only_when_the_config_allows_it(demo_corpus, tmp_path):
    config = make_config(
        demo_corpus.out_dir,
        output=str(tmp_path / "out"),
        image={"min_size": 10_000},
        errors={"max_fraction": 1.0},
    )
    with pytest.raises(
        BuildError,
        match=r"no example was stored \(all 63 input files were "
        r"dropped\); .* errors.allow_empty: true",
    ):
        build(config)
    assert not os.path.exists(tmp_path / "out" / "shapes" / "LATEST")
    config["errors"]["allow_empty"] = True
    result = build(config)
    assert sum(split.num_examples for split in result.info.splits.values()) == 0
    assert result.info.dropped == {"empty": 1, "not_an_image": 1, "too_small": 61}


def test_a_class_whose_every_file_was_dropped_stays_with_zero_examples(
    demo_corpus, tmp_path, caplog
):
    root = tmp_path / "images"
    keys = small_corpus(demo_corpus, root)
    for key in keys:
        if key.startswith("star/"):
            (root / key).write_bytes(b"not an image")
    config = make_config(root, output=str(tmp_path / "out"), errors={"max_fraction": 0.5})
    with caplog.at_level("WARNING", logger="kiln.pipeline.launcher"):
        result = build(config)
    assert result.info.class_names == ["circle", "square", "star", "triangle"]
    assert all(split.class_counts["star"] == 0 for split in result.info.splits.values())
    assert "class(es) with no example (no file listed, or every one dropped): star" in caplog.text


def test_a_stalled_holder_whose_lock_was_broken_does_not_write_it_back(monkeypatch, caplog):
    """A build stalled past the stale limit loses its lock to the next one.
    When it wakes, its heartbeat must not overwrite the new holder's lock
    (before, it wrote its own back: the new holder then failed its check
    before publishing, and the stalled one went on to publish)."""
    object_store.reset()
    dataset_root = "memgs://bucket/datasets/shapes"
    path = dataset_root + "/.lock"
    monkeypatch.setattr(lock, "HEARTBEAT_SECONDS", 0.05)
    stalled = lock.DatasetLock(dataset_root)
    stalled.__enter__()
    try:
        # Its heartbeat looks old (the build stalled): the next build breaks it.
        monkeypatch.setattr(lock, "STALE_AFTER_SECONDS", 0.0)
        with caplog.at_level(logging.WARNING, logger="kiln.pipeline.lock"):
            with lock.DatasetLock(dataset_root) as taker:
                monkeypatch.setattr(lock, "STALE_AFTER_SECONDS", 600.0)
                time.sleep(0.5)  # ten heartbeats of the stalled build
                assert lock.Holder.from_bytes(object_store.get(path)).token == taker._me.token
                taker.check()  # still its own: it may publish
                with pytest.raises(Exception, match="lost the lock"):
                    stalled.check()
        assert f"lost the lock {path} to {taker._me.describe()}" in caplog.messages
    finally:
        stalled.__exit__(None, None, None)
    object_store.reset()


def test_two_builds_breaking_one_stale_lock_take_it_once():
    """Both read the same stale lock; the first replaces it; the second's
    replacement (of the stale bytes it read) fails instead of deleting the
    lock just taken."""
    object_store.reset()
    dataset_root = "memgs://bucket/datasets/shapes"
    path = dataset_root + "/.lock"
    dead = lock.Holder(pid=1, host="elsewhere", started="then", token="dead", heartbeat=1.0)
    object_store.put(path, dead.to_bytes())
    store = storage.store_for(path)
    stale = store.read_bytes(path)  # what the second build read
    with lock.DatasetLock(dataset_root) as first:
        assert not store.replace_if_unchanged(path, stale, b"second")
        assert lock.Holder.from_bytes(object_store.get(path)).token == first._me.token
        first.check()
    object_store.reset()


def test_a_lock_file_deleted_under_a_running_build_stops_it_before_it_publishes(
    demo_corpus, tmp_path, capsys, monkeypatch
):
    """`rm .lock` while a build holds it (a "stale" lock cleared by hand, a
    cleanup job): the next build locks a new file of that name and runs
    beside it. The first one went on and published last, its LATEST over the
    newer build's: readers went back to inputs without the file added since.
    Now it finds its lock file gone before publishing and fails."""
    from test_build_publishing import one_split_corpus

    root, keys, _, path = one_split_corpus(demo_corpus, tmp_path, num_shards=1)
    assert cli.main(["build", "--config", str(path), "--quiet"]) == 0
    dataset_root = tmp_path / "out" / "shapes"
    add_image(demo_corpus, root, keys, "first.png")  # the running build lists it
    enter = publish.PublishTransaction.__enter__
    second = []

    def lock_deleted_and_another_build_run(transaction):
        entered = enter(transaction)
        if not second:
            os.remove(dataset_root / lock.LOCK_FILENAME)
            add_image(demo_corpus, root, keys, "second.png")
            process = run_kiln(["build", "--config", str(path), "--quiet"])
            second.append((process.wait(timeout=600), process.stderr.read()))
        return entered

    monkeypatch.setattr(publish.PublishTransaction, "__enter__", lock_deleted_and_another_build_run)
    code = cli.main(["build", "--config", str(path), "--quiet"])
    assert second == [(0, "")]  # not busy: the lock file it found was a new one
    newer = kiln.reader.info(str(dataset_root))
    assert newer.splits["train"].num_examples == len(keys) + 2
    (line,) = capsys.readouterr().err.splitlines()
    assert code == 1, line
    assert line.startswith(f"kiln build: failed: lost the lock {dataset_root / lock.LOCK_FILENAME}")
    assert "nothing was published" in line
    assert kiln.reader.info(str(dataset_root)).version == newer.version  # LATEST stays
    assert verify.verify(str(dataset_root)).ok
