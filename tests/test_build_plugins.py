"""User-registered transforms and augmentations: imported only from the modules a
config's ``plugins:`` names, validated before the build, usable on fresh Beam
worker processes; the reader never imports a module a dataset's files name."""

import json
import os
import re
import sys
import tempfile
import textwrap

import numpy as np
import pytest
import yaml

import kiln
from conftest import make_config, run_kiln
from kiln import cli
from kiln.pipeline import ConfigError, build, config
from reader.fresh_process import run_python
from test_build import expected_pixels, read_split

TRANSFORMS_MODULE = "kiln_test_user_transforms"
AUGMENT_MODULE = "kiln_test_user_augment"
UNNAMED_MODULE = "kiln_test_never_named"
FAULTY_MODULE = "kiln_test_faulty_augment"

SOURCES = {
    TRANSFORMS_MODULE: """
        import numpy as np
        from kiln.transforms import register

        @register()
        def invert_colours(image: np.ndarray) -> np.ndarray:
            return 255 - image
    """,
    AUGMENT_MODULE: """
        import tensorflow as tf
        from kiln.reader import register_augmentation

        @register_augmentation("random_invert_colours")
        def random_invert_colours(image, seed, *, probability: float = 0.5):
            invert = tf.random.stateless_uniform([], seed) < probability
            return tf.where(invert, 1.0 - image, image)
    """,
    # Ops `load` refuses the first time it traces them (`check_op`).
    FAULTY_MODULE: """
        import tensorflow as tf
        from kiln.reader import register_augmentation

        @register_augmentation("stateful_gain", geometric=False)
        def stateful_gain(image, seed):
            return image * tf.random.uniform([], 0.5, 1.0)

        @register_augmentation("half_size", geometric=False)
        def half_size(image, seed):
            return image[::2, ::2]

        @register_augmentation("uint8_output", geometric=False)
        def uint8_output(image, seed):
            return tf.cast(image * 255.0, tf.uint8)

        def _flip(image, seed):
            flip = tf.random.stateless_uniform([], seed) < 0.5
            return tf.where(flip, image[:, ::-1], image)

        def _flip_targets(image, targets, seed):
            flip = tf.random.uniform([]) < 0.5  # stateful: not the image form's coin
            return tf.where(flip, image[:, ::-1], image), targets.flip_left_right(flip)

        register_augmentation(
            "stateful_mirror", with_targets=_flip_targets, supports=["boxes"]
        )(_flip)

        # A good op that needs images of 100 pixels.
        def _centre(image, *, size: int = 100):
            return image[:size, :size]

        @register_augmentation("user_crop_100", geometric=False, inference=_centre)
        def user_crop_100(image, seed, *, size: int = 100):
            return tf.image.stateless_random_crop(image, [size, size, 3], seed)
    """,
    # Would register the same names and leave a mark if it were ever imported.
    UNNAMED_MODULE: """
        import os
        open(os.environ["KILN_TEST_IMPORT_MARK"], "w").close()
    """,
}


def modules_on_sys_path(tmp_path_factory, name: str, sources: dict[str, str]):
    """A new folder holding one module per ``{module: source}``, on
    sys.path while the fixture that yields from this lives."""
    folder = tmp_path_factory.mktemp(name)
    for module, source in sources.items():
        (folder / f"{module}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    yield from modules_on_sys_path(tmp_path_factory, "plugins", SOURCES)


@pytest.fixture
def mark(tmp_path, monkeypatch):
    path = tmp_path / "imported"
    monkeypatch.setenv("KILN_TEST_IMPORT_MARK", str(path))
    return path


def test_user_ops_need_their_module_named_in_the_config(plugin_dir, demo_corpus, tmp_path, mark):
    base = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    with pytest.raises(
        ConfigError,
        match=r"transforms\[0\]: unknown offline transform "
        r"'invert_colours' \(known: .*\); a transform of your own is registered with "
        r"@kiln\.transforms\.register in a module the config names under plugins:",
    ):
        config.load({**base, "transforms": ["invert_colours"]})
    with pytest.raises(
        ConfigError,
        match=r"augment\[0\]: unknown augmentation op "
        r"'random_invert_colours'",
    ):
        config.load({**base, "augment": ["random_invert_colours"]})
    assert TRANSFORMS_MODULE not in sys.modules and AUGMENT_MODULE not in sys.modules

    resolved = config.load(
        {
            **base,
            "transforms": ["invert_colours"],
            "augment": [{"random_invert_colours": {"probability": 0.25}}],
            "plugins": [TRANSFORMS_MODULE, AUGMENT_MODULE],
        }
    )
    assert resolved.to_json()["augment"] == [{"random_invert_colours": {"probability": 0.25}}]
    with pytest.raises(ConfigError, match=r"augment\[0\].random_invert_colours.probability"):
        config.load(
            {
                **base,
                "augment": [{"random_invert_colours": {"probability": "often"}}],
                "plugins": [AUGMENT_MODULE],
            }
        )
    # Nothing imports a module the config does not name.
    assert UNNAMED_MODULE not in sys.modules and not mark.exists()


@pytest.mark.parametrize(
    "op, refused",
    [
        ("stateful_gain", "gave different outputs for the same seed: it uses stateful"),
        ("half_size", r"changes the image size \(32x32 in, 16x16 out\)"),
        ("uint8_output", "returned a uint8 image"),
    ],
)
def test_a_user_op_load_would_refuse_at_its_first_trace_is_a_config_error(
    plugin_dir, demo_corpus, tmp_path, op, refused
):
    """`load` traces a list's own ops the first time and refuses those whose
    randomness is not their seed's, whose output is not float32 or whose size
    changes without an inference form: the build checks the same before any
    work, not after publishing a default list that training cannot load."""
    base = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    augment = ["random_flip_left_right", op]
    with pytest.raises(ConfigError, match=rf"augment\[1\]\.{op}: augmentation op '{op}' {refused}"):
        config.load({**base, "augment": augment, "plugins": [FAULTY_MODULE]})
    assert not (tmp_path / "out").exists()


def test_a_user_op_is_checked_on_a_large_enough_image_when_the_size_is_not_known(
    plugin_dir, demo_corpus, tmp_path
):
    """Without transforms that fix the stored size, the check guesses one: a
    crop of 100 pixels failed on its first guess (64x64) with TensorFlow's
    error, and the build stopped as an internal error."""
    base = make_config(demo_corpus.out_dir, output=str(tmp_path / "out"))
    loaded = config.load(
        {**base, "transforms": [], "augment": ["user_crop_100"], "plugins": [FAULTY_MODULE]}
    )
    assert loaded.to_json()["augment"] == [{"user_crop_100": {"size": 100}}]


def test_a_user_op_refused_on_the_one_size_the_job_stored_is_not_published(plugin_dir, tmp_path):
    """The config check guessed a size (no transform fixes it) and the op
    passed on it; the job stored images of one size, 48x64, on which `load`
    checks the op and refuses it: the build publishes nothing."""
    import cv2

    from kiln.pipeline import BuildError

    for index in range(4):
        folder = tmp_path / "images" / ("a" if index % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(folder / f"{index}.png"), np.full((48, 64, 3), 40 * index, np.uint8))
    spec = {
        "name": "small",
        "source": {"type": "image_folder", "root": str(tmp_path / "images")},
        "output": str(tmp_path / "out"),
        "encoding": {"format": "png"},
        "augment": ["user_crop_100"],
        "plugins": [FAULTY_MODULE],
    }
    with pytest.raises(
        BuildError,
        match=r"augment\[0\]\.user_crop_100: augmentation op 'user_crop_100' failed on an image "
        r"of the size it gets here \(48x64x3\).*on the images the job stored \(all 48x64\), "
        r"kiln.reader.load would refuse this augment list, so nothing was published",
    ):
        build(spec)
    assert not [p for p in (tmp_path / "out" / "small").iterdir() if not p.name.startswith(".")]


def test_the_with_targets_form_of_a_user_op_is_checked_before_the_build(plugin_dir, tmp_path):
    """On a dataset with boxes the op's with_targets form is what `load`
    runs, so that is the form checked, on the records' targets as `load`
    decodes them."""
    (tmp_path / "a.png").write_bytes(b"")  # never read: the config check lists nothing
    (tmp_path / "m.jsonl").write_text(
        json.dumps({"path": "a.png", "objects": [{"bbox": [1, 1, 5, 5], "class": "cat"}]}) + "\n"
    )
    base = {
        "name": "boxes",
        "source": {"type": "manifest", "path": str(tmp_path / "m.jsonl"), "classes": ["cat"]},
        "output": str(tmp_path / "out"),
        "targets": {"boxes": {}},
        "plugins": [FAULTY_MODULE],
    }
    with pytest.raises(
        ConfigError, match=r"augment\[0\]\.stateful_mirror: augmentation op 'stateful_mirror' gave"
    ):
        config.load({**base, "augment": ["stateful_mirror"]})
    # Its image form alone (a classification dataset) passes: it draws from its seed.
    config.load({**base, "targets": {"label": {}}, "augment": ["stateful_mirror"]})


def test_plugin_transforms_run_on_fresh_worker_processes(
    plugin_dir, demo_corpus, tmp_path, monkeypatch, mark
):
    # Beam's multi_processing workers are new interpreters: they find the
    # plugin through PYTHONPATH (as Dataflow workers find it installed).
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join([str(plugin_dir)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
    )
    data = make_config(
        demo_corpus.out_dir,
        output=str(tmp_path / "out"),
        transforms=[
            {"resize": {"shorter_side": 40}},
            {"center_crop": {"size": 32}},
            "invert_colours",
        ],
        augment=["random_invert_colours"],
        plugins=[TRANSFORMS_MODULE, AUGMENT_MODULE],
        sharding={"num_shards": 1},
    )
    result = build(data, ["--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    assert result.info.dropped == {reason: 1 for reason in demo_corpus.broken.values()}
    for record in read_split(result, "train"):
        np.testing.assert_array_equal(
            record["image"], 255 - expected_pixels(demo_corpus, record["key"])
        )
    assert not mark.exists()

    # The reader, in a fresh process: the stored augment list names the user
    # op; loading does not import its module (a dataset's files are data) and
    # says which one to import. After the import, it reads.
    out = run_python(
        textwrap.dedent(f"""
        import sys
        import kiln.reader
        root = sys.argv[1]
        try:
            kiln.reader.load(root, "train", batch_size=4, seed=0)
        except kiln.reader.AugmentConfigError as e:
            print("refused:", e)
        print("imported:", {AUGMENT_MODULE!r} in sys.modules)
        import {AUGMENT_MODULE}
        images, labels = next(iter(kiln.reader.load(root, "train", batch_size=4, seed=0)))
        print("batch:", tuple(images.shape))
    """),
        result.dataset_root,
        env={"PYTHONPATH": os.environ["PYTHONPATH"]},
    )
    lines = out.strip().splitlines()
    assert lines[0].startswith("refused: ")
    assert "unknown augmentation op 'random_invert_colours'" in lines[0]
    # kiln.json stores them in name order (the order they are imported in).
    assert f"built with plugins: ['{AUGMENT_MODULE}', '{TRANSFORMS_MODULE}']" in lines[0]
    assert lines[1:] == ["imported: False", "batch: (4, 32, 32, 3)"]

    # kiln preview: the same refusal, naming the --plugin flags that pass them
    # (it suggested built-in ops only: "did you mean 'random_hue', ...?").
    sheet = str(tmp_path / "sheet.png")
    previewed = run_kiln("preview", result.dataset_root, "-o", sheet, "--n", "2")
    assert previewed.returncode == 2, previewed.stderr
    assert previewed.stderr.endswith(
        f"built with plugins: ['{AUGMENT_MODULE}', '{TRANSFORMS_MODULE}']; a dataset's files "
        "import nothing: pass the one that registers the op "
        f"(--plugin {AUGMENT_MODULE} --plugin {TRANSFORMS_MODULE})\n"
    ), previewed.stderr
    previewed = run_kiln(
        "preview",
        result.dataset_root,
        "-o",
        sheet,
        "--n",
        "2",
        "--plugin",
        AUGMENT_MODULE,
        pythonpath=[plugin_dir],
    )
    assert previewed.returncode == 0 and os.path.exists(sheet), previewed.stderr


EDITED_MODULE = "kiln_test_edited_plugin"
EDITED_SOURCE = """
    import numpy as np
    from kiln.transforms import register

    @register()
    def brighten(image: np.ndarray) -> np.ndarray:
        return np.minimum(image.astype(np.int16) + {offset}, 255).astype(np.uint8)
"""
BUILD_SCRIPT = """
import json, sys
from kiln import cli
code = cli.main(["build", "--config", sys.argv[1], "--quiet", "--report", sys.argv[2]])
print(json.dumps(json.load(open(sys.argv[2]))))
sys.exit(code)
"""


def test_an_edit_to_a_plugin_module_makes_a_new_version(demo_corpus, tmp_path):
    # Each nightly build is a new process, which imports the plugin as its
    # file is now: an edit to it is a new version, built without reuse; an
    # unchanged file is up to date.
    folder = tmp_path / "plugins"
    folder.mkdir()
    data = make_config(
        demo_corpus.out_dir,
        output=str(tmp_path / "out"),
        transforms=[{"resize": {"shorter_side": 40}}, {"center_crop": {"size": 32}}, "brighten"],
        plugins=[EDITED_MODULE],
    )
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(data))
    source_root = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
    env = {"PYTHONPATH": os.pathsep.join([source_root, str(folder)])}

    def nightly(offset: int) -> dict:
        (folder / f"{EDITED_MODULE}.py").write_text(
            textwrap.dedent(EDITED_SOURCE.format(offset=offset))
        )
        report = tmp_path / "report.json"
        return json.loads(run_python(BUILD_SCRIPT, str(config_path), str(report), env=env))

    first = nightly(10)
    assert first["status"] == "built"
    assert nightly(10)["status"] == "up_to_date"
    edited = nightly(20)
    assert edited["status"] == "built" and edited["version"] != first["version"]
    assert edited["incremental"]["reused"] == 0, edited["incremental"]
    dataset = tmp_path / "out" / data["name"]
    before, after = (
        json.loads((dataset / report["version"] / "kiln.json").read_text())
        for report in (first, edited)
    )
    assert before["processing"]["fingerprint"] != after["processing"]["fingerprint"]
    shards = [[s["sha256"] for s in info["splits"]["train"]["shards"]] for info in (before, after)]
    assert shards[0] != shards[1]


STOPPING_MODULE = "kiln_test_stopping_plugin"
STOPPING_SOURCE = """
    import os
    import sys

    import numpy as np
    from kiln.transforms import register

    @register(geometry="none")
    def stop_here(image: np.ndarray) -> np.ndarray:
        if os.environ["KILN_TEST_STOP_WITH"] == "exit":
            sys.exit(0)
        raise KeyboardInterrupt  # no signal: the plugin's own
"""
STOPPED_LINE = re.compile(
    r"kiln build: internal error: kiln\.pipeline\.images\.TransformAborted: stopped the job: "
    r"offline transform 'stop_here' \(module 'kiln_test_stopping_plugin', "
    r"kiln_test_stopping_plugin\.py, line (?P<line>\d+)\) raised (?P<raised>.+) on "
    r"(?P<file>\S+); nothing was published \(unexpected; the traceback is in "
    r"(?P<traceback>\S+\.traceback\.txt); --verbose prints it\)\n"
)


@pytest.fixture(scope="module")
def stopping_plugin(tmp_path_factory):
    """The folder of `STOPPING_MODULE`, on sys.path (imported once: the
    registry keeps its transform)."""
    yield from modules_on_sys_path(
        tmp_path_factory, "stopping-plugin", {STOPPING_MODULE: STOPPING_SOURCE}
    )


@pytest.mark.parametrize(
    "stop_with, pipeline_args",
    [
        ("exit", []),
        ("keyboard_interrupt", []),
        ("exit", ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]),
    ],
)
def test_a_plugin_that_exits_is_an_internal_error_naming_it(
    stopping_plugin, demo_corpus, tmp_path, monkeypatch, capfd, stop_with, pipeline_args
):
    # sys.exit() (or a KeyboardInterrupt that no Ctrl-C sent) in a plugin
    # transform is no file's problem, nor an Exception the image step drops
    # the file for: a bug in the plugin, exit 70 as docs/cli.md says, naming
    # it. It was exit 1, "the Beam job failed ...: SystemExit: 0".
    # multi_processing workers are new interpreters: they find it on PYTHONPATH.
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join([str(stopping_plugin)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
    )
    monkeypatch.setenv("KILN_TEST_STOP_WITH", stop_with)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    data = make_config(
        demo_corpus.out_dir,
        output=str(tmp_path / "out"),
        transforms=["stop_here"],
        plugins=[STOPPING_MODULE],
    )
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(data))
    report = tmp_path / "report.json"
    code = cli.main(
        ["build", "--config", str(config_path), "--quiet", "--report", str(report), *pipeline_args]
    )
    err = capfd.readouterr().err
    assert code == 70, err
    line = STOPPED_LINE.fullmatch(err)
    assert line, err  # the build's only word, one line (no worker's traceback first)
    raised = {"exit": "SystemExit: 0", "keyboard_interrupt": "KeyboardInterrupt"}[stop_with]
    assert line["raised"] == raised
    raising_line = textwrap.dedent(STOPPING_SOURCE).splitlines()[int(line["line"]) - 1]
    statement = {"exit": "sys.exit(0)", "keyboard_interrupt": "raise KeyboardInterrupt"}
    assert raising_line.strip().startswith(statement[stop_with])
    assert line["file"].startswith(str(demo_corpus.out_dir))
    assert raised in open(line["traceback"], encoding="utf-8").read()
    written = json.loads(report.read_text())
    assert written["status"] == "internal_error" and written["exit_code"] == 70, written
    # Nothing published, no staging folder left.
    dataset = tmp_path / "out" / data["name"]
    assert sorted(os.listdir(dataset)) == [".lock"]


SPOILING_MODULE = "kiln_test_report_spoiler"
# A transform that, as a build runs, puts a file where the folder of its
# --report is (a disk gone read-only, a volume unmounted), then ends the
# build as KILN_TEST_END_WITH says.
SPOILING_SOURCE = """
    import os
    import shutil
    import signal
    import sys

    import numpy as np
    from kiln.transforms import register

    @register(geometry="none")
    def spoil_report(image: np.ndarray) -> np.ndarray:
        folder = os.environ["KILN_TEST_REPORT_FOLDER"]
        try:
            shutil.rmtree(folder)
            with open(folder, "x") as f:
                f.write("a file where the report's folder was")
        except OSError:  # another worker's call did it
            pass
        end_with = os.environ["KILN_TEST_END_WITH"]
        if end_with == "exit":
            sys.exit(0)
        if end_with == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        raise ValueError("not this image")
"""


@pytest.fixture(scope="module")
def spoiling_plugin(tmp_path_factory):
    yield from modules_on_sys_path(
        tmp_path_factory, "spoiling-plugin", {SPOILING_MODULE: SPOILING_SOURCE}
    )


@pytest.mark.parametrize(
    "end_with, code, line",
    [
        ("raise", 1, r"kiln build: failed: dropped \d+ of \d+ input files .*"),
        (
            "exit",
            70,
            r"kiln build: internal error: .* raised SystemExit: 0 on .*--verbose prints it\)",
        ),
        ("sigterm", 143, r"kiln build: terminated \(SIGTERM\)"),
    ],
    ids=["failed", "internal_error", "terminated"],
)
def test_a_failed_build_whose_report_cannot_be_written_says_so_in_its_line(
    spoiling_plugin, demo_corpus, tmp_path, monkeypatch, capfd, end_with, code, line
):
    # The report stayed `running` and, under --quiet, only the build's line
    # showed: the report's failure was logged, and --quiet drops logs. The
    # build's own exit code stands (nothing was published; 73 would say it was).
    reports = tmp_path / "reports"
    reports.mkdir()
    report = reports / "report.json"
    data = make_config(
        demo_corpus.out_dir,
        output=str(tmp_path / "out"),
        transforms=["spoil_report"],
        plugins=[SPOILING_MODULE],
    )
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(data))
    argv = ["build", "--config", str(config_path), "--quiet", "--report", str(report)]
    env = {"KILN_TEST_REPORT_FOLDER": str(reports), "KILN_TEST_END_WITH": end_with}
    if end_with == "sigterm":  # the signal is the process's: a process of its own
        completed = run_kiln(*argv, pythonpath=[spoiling_plugin], **env)
        returncode, out, err = completed.returncode, completed.stdout, completed.stderr
    else:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        returncode = cli.main(argv)
        out, err = capfd.readouterr()
    assert (returncode, out) == (code, ""), err
    assert re.fullmatch(
        line + re.escape(f"; --report {report}: cannot write it: ") + r"[^;\n]+\n", err
    ), err
    assert reports.is_file()  # what the plugin made of it
    dataset = tmp_path / "out" / data["name"]
    assert not (dataset / "LATEST").exists()


@pytest.mark.parametrize("mode", ["multi_processing", "multi_threading"])
def test_a_job_failing_on_local_workers_prints_only_kilns_line(
    stopping_plugin, demo_corpus, tmp_path, monkeypatch, mode
):
    # Beam's SDK workers print the traceback of a bundle that raised on
    # their stderr (the command's: they are its processes or its threads),
    # whatever the log level, before kiln's line says what failed: ~90 lines
    # a worker, under --quiet too. --verbose still shows them.
    data = make_config(
        demo_corpus.out_dir,
        output=str(tmp_path / "out"),
        transforms=["stop_here"],
        plugins=[STOPPING_MODULE],
    )
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(data))
    workers = (f"--direct_running_mode={mode}", "--direct_num_workers=2")
    # As a shell starts it: not what an in-process kiln.cli.main set for its workers.
    monkeypatch.delenv("KILN_QUIET_WORKER_TRACEBACKS", raising=False)

    def failed(*argv):
        completed = run_kiln(
            *argv,
            pythonpath=[stopping_plugin],
            KILN_TEST_STOP_WITH="exit",
            TMPDIR=str(tmp_path),  # where the traceback file goes
        )
        assert completed.returncode == 70 and completed.stdout == "", completed.stderr
        return completed.stderr

    quiet = failed("build", "--config", str(config_path), "--quiet", *workers)
    assert STOPPED_LINE.fullmatch(quiet), quiet
    loud = failed("build", "--config", str(config_path), "--progress-every", "0", *workers)
    assert STOPPED_LINE.fullmatch(loud), loud
    verbose = failed("-v", "build", "--config", str(config_path), "--progress-every", "0", *workers)
    assert 'sdk_worker.py", line' in verbose and ", in _execute\n" in verbose
    last = verbose.splitlines(keepends=True)[-1]
    assert STOPPED_LINE.fullmatch(last), verbose[-2000:]
