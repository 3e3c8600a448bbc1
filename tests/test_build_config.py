"""Build config validation: every bad config stops before any work, with one
line naming the file and the field, and `kiln build` exits 2 without a traceback."""

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import make_config
from kiln import cli
from kiln.pipeline import ConfigError, config


def write_config(tmp_path, data, name="bad.yaml"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return str(path)


def with_changes(corpus, tmp_path, **changes):
    data = make_config(corpus.out_dir, output=str(tmp_path / "out"))
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


CASES = [
    # (changes, expected message after "config error in <file>: ")
    (
        {"splits": {"fractions": {"train": 0.8, "test": 0.1}}},
        "splits.fractions: must sum to 1, got 0.9",
    ),
    (
        {"splits": {"fractions": {"train": 1.0}, "from_source": True}},
        "splits: give either fractions or from_source: true, not both",
    ),
    (
        {"splits": {"fractions": {"train-a": 1.0}}},
        "splits.fractions.train-a: 'train-a' is not a valid name (letters, digits and '_')",
    ),
    (
        {"transforms": [{"resize": {"shorter_side": 40}}, {"blur": {"sigma": 2}}]},
        "transforms[1]: unknown offline transform 'blur' (known: center_crop,",
    ),
    (
        {"transforms": [{"resise": {"shorter_side": 40}}]},
        "transforms[0]: unknown offline transform 'resise'; did you mean 'resize'?",
    ),
    ({"transforms": [{"resize": {"shorter_side": "big"}}]}, "transforms[0].resize.shorter_side"),
    # A missing name the did-you-mean offers is one mistake: one line, not two.
    (
        {"transforms": [{"center_crop": {"sise": 32}}]},
        "transforms[0].center_crop.sise: unknown parameter; did you mean 'size'?",
    ),
    ({"colour": "red"}, "colour: unknown field (known: name, source, output, image, transforms"),
    ({"trasforms": []}, "trasforms: unknown field; did you mean 'transforms'?"),
    (
        {"splits": {"fraction": {"train": 1.0}}},
        "splits.fraction: unknown field; did you mean 'fractions'?",
    ),
    # The fractions one level too high: not "did you mean 'stratify'?".
    (
        {"splits": {"train": 0.8, "validation": 0.2}},
        "2 problems:\n  splits.train: unknown field; a split's fraction goes under "
        "splits.fractions: splits: {fractions: {train: 0.8, ...}}\n  splits.validation: "
        "unknown field; a split's fraction goes under splits.fractions: "
        "splits: {fractions: {validation: 0.2, ...}}",
    ),
    (
        {"source": {"type": "image_folder", "rot": "x"}},
        "source.rot: unknown field; did you mean 'root'?",
    ),
    (
        {"source": {"type": "image_folder", "folder": "x"}},
        "2 problems:\n  source.folder: unknown field (known: classes, allowed_roots, type, "
        "root, listing)\n  source.root: required field is missing",
    ),
    (
        {"sharding": {"target_shard_mb": "lots"}},
        "sharding.target_shard_mb: expected a number, got 'lots'",
    ),
    ({"image": {"channels": "3"}}, "image.channels: expected 1 or 3, got '3'"),
    ({"image": 3}, "image: expected a mapping, got 3"),
    ({"output": ""}, "output: must not be empty"),
    ({"name": None}, "name: required field is missing"),
    ({"name": "my data"}, "name: 'my data' is not a valid name"),
    ({"image": {"channels": 2}}, "image.channels: expected 1 or 3, got 2"),
    (
        {"encoding": {"format": "gif"}},
        "encoding.format: expected 'jpeg', 'png' or 'raw', got 'gif'",
    ),
    # A misspelt value gets a did-you-mean; one in another case, its value first.
    (
        {"encoding": {"format": "PNG"}},
        "encoding.format: expected 'jpeg', 'png' or 'raw', got 'PNG'; did you mean 'png'?",
    ),
    (
        {"splits": {"fractions": {"train": 1.0}, "split_by": "contents"}},
        "splits.split_by: expected 'content' or 'key', got 'contents'; did you mean 'content'?",
    ),
    (
        {"encoding": {"format": "jpeg", "quality": 101}},
        "encoding.quality: must be <= 100, got 101",
    ),
    ({"sharding": {"num_shards": 0}}, "sharding.num_shards: must be a positive integer, got 0"),
    (
        {"sharding": {"num_shards": {"train": 2, "test": 0}}},
        "sharding.num_shards: test: must be a positive integer, got 0",
    ),
    (
        {"sharding": {"compression": "zstd"}},
        "sharding.compression: expected 'none' or 'gzip', got 'zstd'",
    ),
    (
        {"errors": {"max_fraction": 1.5}},
        "errors.max_fraction: must be <= 1.0, got 1.5",
    ),
    (
        {"source": {"type": "folder", "root": "x"}},
        "source: type must be 'image_folder', 'manifest', 'coco' or 'voc', got 'folder'",
    ),
    (
        {"source": {"type": "imagefolder", "root": "x"}},
        "source: type must be 'image_folder', 'manifest', 'coco' or 'voc', got "
        "'imagefolder'; did you mean 'image_folder'?",
    ),
    ({"source": {"type": "image_folder"}}, "source.root: required field is missing"),
    (
        {"source": {"type": "manifest", "path": "/nonexistent/m.csv"}},
        "source.path: manifest not found: /nonexistent/m.csv",
    ),
    (
        {"plugins": ["no_such_module_for_kiln"]},
        "plugins[0]: cannot import module 'no_such_module_for_kiln'",
    ),
    ({"augment": [{"random_wobble": {}}]}, "augment[0]: unknown augmentation op 'random_wobble'"),
    (
        {"augment": ["random_flip_left_rigth"]},
        "augment[0]: unknown augmentation op 'random_flip_left_rigth'; "
        "did you mean 'random_flip_left_right'?",
    ),
    (
        # Every name as close as the closest is offered, not only the first.
        {"augment": ["random_flip"]},
        "augment[0]: unknown augmentation op 'random_flip'; "
        "did you mean 'random_flip_left_right' or 'random_flip_up_down'?",
    ),
    (
        {"augment": ["random_grey"]},
        "augment[0]: unknown augmentation op 'random_grey'; "
        "did you mean 'random_hue', 'random_grayscale' or 'random_crop'?",
    ),
    # Keras' deterministic layers ported into the list: the build does their work.
    (
        {"augment": ["random_flip_left_right", {"resize": {"size": 64}}]},
        "augment[1]: unknown augmentation op 'resize'; resizing is not random, so kiln does it "
        "once, in the build: the config's transforms: [resize: {size: [height, width]}]",
    ),
    (
        {"augment": [{"random_contrast": {"factor": 0.2}}]},
        "augment[0].random_contrast.factor: unknown parameter; did you mean 'factor_range'?; "
        "Keras' RandomContrast(f) is factor_range [1 - f, 1 + f]",
    ),
    (
        {"augment": [{"random_crop": {"size": "big"}}]},
        "augment[0].random_crop.size: expected a positive integer or [height, width], got 'big'",
    ),
    (
        {"augment": [{"random_brightness": {"max_delta": -1}}]},
        "augment[0].random_brightness.max_delta: must be >= 0.0, got -1",
    ),
    # to_grayscale makes one channel: stored as three, every image would be dropped.
    (
        {"transforms": [{"resize": {"shorter_side": 40}}, "to_grayscale"]},
        "transforms[1].to_grayscale: gives 1-channel images but image.channels is 3; "
        "set image.channels: 1",
    ),
    (
        {"image": {"channels": 1}, "transforms": [{"to_grayscale": {"keep_channels": True}}]},
        "transforms[0].to_grayscale: gives 3-channel images but image.channels is 1",
    ),
    # Strict types: a quoted number or a yes/no string is a mistake, not a value.
    (
        {"errors": {"max_fraction": "0.1"}},
        "errors.max_fraction: expected a number, got '0.1'",
    ),
    (
        {"splits": {"fractions": {"train": 1.0}, "split_by": "key", "stratify": "yes"}},
        "splits.stratify: expected true or false, got 'yes'",
    ),
    # A crop that fits no image the resize before it makes: every file would be dropped.
    (
        {
            "transforms": [
                {"resize": {"shorter_side": 72}},
                "equalize",
                {"center_crop": {"size": 96}},
            ]
        },
        "transforms[2].center_crop: a 96x96 (HxW) crop fits none of the images whose shorter "
        "side is 72 that transforms[0].resize makes (every file would be dropped); crop "
        "smaller or resize larger",
    ),
    (
        {"transforms": [{"resize": {"longer_side": 64}}, {"center_crop": {"size": [48, 80]}}]},
        "transforms[1].center_crop: a 48x80 (HxW) crop fits none of the images whose longer "
        "side is 64",
    ),
    (
        {"transforms": [{"resize": {"size": [32, 40]}}, {"center_crop": {"size": [32, 48]}}]},
        "transforms[1].center_crop: a 32x48 (HxW) crop fits none of the 32x40 (HxW) images",
    ),
    (
        {"transforms": [{"letterbox": {"size": 32}}, {"center_crop": {"size": 40}}]},
        "transforms[1].center_crop: a 40x40 (HxW) crop fits none of the 32x32 (HxW) images "
        "that transforms[0].letterbox makes",
    ),
]


@pytest.mark.parametrize(
    "changes, message", CASES, ids=[c[1].split(":")[0].split()[-1] for c in CASES]
)
def test_bad_config_names_the_field(demo_corpus, tmp_path, changes, message):
    path = write_config(tmp_path, with_changes(demo_corpus, tmp_path, **changes))
    with pytest.raises(ConfigError) as raised:
        config.load(path)
    text = str(raised.value)
    assert text.startswith(f"config error in {path}: {message}"), text
    assert ("\n" in text) == ("problems:" in message), text  # one problem, one line
    assert not any(words in text for words in PYDANTIC_WORDING), text


# What pydantic says (its class names, "Input should be", ...): kiln says it in its own words.
PYDANTIC_WORDING = ("Input should", "Extra inputs", "NoneType", "Field required", "Value error")


def test_every_problem_is_reported_at_once_in_file_order(demo_corpus, tmp_path, capsys):
    data = {
        "name": "shapes",
        "source": {"type": "image_folder", "root": str(demo_corpus.out_dir)},
        "output": str(tmp_path / "out"),
        "trasforms": [{"resize": {"shorter_side": 40}}],
        "image": {"channels": "3"},
        "splits": {"fraction": {"train": 1.0}},
        "sharding": {"target_shard_mb": "lots", "num_shards": 0},
        "augment": [{"random_crop": {"size": "big"}}, "random_wobble"],
        "plugins": ["no_such_module_for_kiln"],
    }
    path = write_config(tmp_path, data)
    with pytest.raises(ConfigError) as raised:
        config.load(path)
    problems = raised.value.problems
    assert [problem.split(":")[0] for problem in problems] == [
        "trasforms",
        "image.channels",
        "splits.fraction",
        "sharding.target_shard_mb",
        "sharding.num_shards",
        "augment[0].random_crop.size",
        "augment[1]",
        "plugins[0]",
    ], problems
    assert "did you mean 'transforms'?" in problems[0]
    assert problems[1] == "image.channels: expected 1 or 3, got '3'"
    assert "did you mean 'fractions'?" in problems[2]
    assert problems[3] == "sharding.target_shard_mb: expected a number, got 'lots'"
    assert str(raised.value).splitlines() == [
        f"config error in {path}: 8 problems:",
        *(f"  {problem}" for problem in problems),
    ]
    assert not any(words in str(raised.value) for words in PYDANTIC_WORDING)

    # The command line prints them as one block and exits 2.
    assert cli.main(["build", "--config", path]) == 2
    err = capsys.readouterr().err
    assert err == f"kiln build: error: {raised.value}\n"
    assert not (tmp_path / "out").exists()


def test_a_long_list_of_problems_is_cut(demo_corpus, tmp_path):
    data = with_changes(demo_corpus, tmp_path)
    data["augment"] = [f"random_nothing_{index}" for index in range(30)]
    with pytest.raises(ConfigError) as raised:
        config.load(write_config(tmp_path, data))
    lines = str(raised.value).splitlines()
    assert len(raised.value.problems) == 30
    assert lines[0].endswith("30 problems:") and lines[-1] == "  ... and 20 more"


def test_transform_and_augment_lists_report_every_wrong_entry(demo_corpus, tmp_path):
    from kiln import reader, transforms

    with pytest.raises(transforms.TransformConfigError) as raised:
        transforms.parse([{"resize": {"shorter_side": -1}}, "equalize", {"center_crop": {}}, 3])
    assert [problem.split(":")[0] for problem in raised.value.problems] == [
        "transforms[0].resize.shorter_side",
        "transforms[2].center_crop.size",
        "transforms[3]",
    ]
    with pytest.raises(reader.AugmentConfigError) as raised_augment:
        reader.validate(["random_flip_up_dwn", {"random_brightness": {"max_delta": "a lot"}}])
    assert str(raised_augment.value) == (
        "2 problems:\n"
        "  augment[0]: unknown augmentation op 'random_flip_up_dwn'; did you mean "
        "'random_flip_up_down'?\n"
        "  augment[1].random_brightness.max_delta: expected a number, got 'a lot'; max_delta is "
        "on kiln's [0, 1] scale: Keras' RandomBrightness(f), a fraction of its value_range, is "
        "max_delta f"
    )


def test_missing_source_and_output_inside_source(demo_corpus, tmp_path):
    missing = with_changes(
        demo_corpus, tmp_path, source={"type": "image_folder", "root": str(tmp_path / "nope")}
    )
    with pytest.raises(ConfigError, match=r"source.root: folder not found or empty: .*nope"):
        config.load(missing)
    inside = with_changes(demo_corpus, tmp_path, output=os.path.join(demo_corpus.out_dir, "out"))
    with pytest.raises(ConfigError, match=r"output: .* is inside the source folder"):
        config.load(inside)


def test_yaml_problems(tmp_path):
    with pytest.raises(ConfigError, match=r"config error in .*: not valid YAML"):
        config.load(write_config(tmp_path, "name: [unclosed\n"))
    with pytest.raises(ConfigError) as raised:
        config.load(write_config(tmp_path, "- just\n- a list\n"))
    assert str(raised.value).endswith(
        "expected a mapping of settings at the top level (key: value lines), got a list"
    )
    for empty in ("", "# only a comment\n", "---\n"):
        with pytest.raises(ConfigError) as raised:
            config.load(write_config(tmp_path, empty))
        assert str(raised.value) == (
            f"config error in {tmp_path / 'bad.yaml'}: the file is empty; a config needs at "
            f"least name, source and output (see docs/configuration.md)"
        )
    with pytest.raises(ConfigError, match=r"config file not found: .*missing.yaml"):
        config.load(str(tmp_path / "missing.yaml"))
    # safe_load: no Python objects from YAML tags
    for tag in (
        "!!python/object/apply:os.system ['touch pwned']",
        "!!python/object:os.PathLike {}",
        "!!python/name:os.system",
    ):
        with pytest.raises(ConfigError) as raised:
            config.load(write_config(tmp_path, f"name: x\nsource: {tag}\n"))
        assert str(raised.value).startswith(
            f"config error in {tmp_path / 'bad.yaml'}: not valid YAML (line 2): could not "
            f"determine a constructor for the tag 'tag:yaml.org,2002:python/"
        ), str(raised.value)
        assert "read with a safe loader" in str(raised.value)
    assert not (tmp_path / "pwned").exists() and not os.path.exists("pwned")


def test_duplicate_keys_are_refused_at_any_depth(demo_corpus, tmp_path, capsys):
    root = demo_corpus.out_dir
    bad = tmp_path / "bad.yaml"
    for text, line, key, first in [
        (
            f"name: shapes\nsource: {{type: image_folder, root: {root}}}\nname: other\n",
            3,
            "name",
            1,
        ),
        (
            f"name: shapes\nsource:\n  type: image_folder\n  root: {root}\n  root: /elsewhere\n",
            5,
            "root",
            4,
        ),
        (
            "name: s\ntransforms:\n  - resize: {shorter_side: 4, shorter_side: 8}\n",
            3,
            "shorter_side",
            3,
        ),
    ]:
        bad.write_text(text)
        with pytest.raises(ConfigError) as raised:
            config.load(str(bad))
        assert str(raised.value) == (
            f"config error in {bad}: line {line}: duplicate key {key!r} (first on line {first})"
        )
    # Through the command line: one line, exit 2.
    assert cli.main(["build", "--config", str(bad)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    # The same key in two mappings is no duplicate, and merged keys may be overridden.
    merged = tmp_path / "merged.yaml"
    merged.write_text(
        f"name: shapes\noutput: {tmp_path / 'out'}\n"
        f"source: &src {{type: image_folder, root: {tmp_path / 'nowhere'}}}\n"
        f"x-other: {{<<: *src, root: {root}}}\n"
    )
    with pytest.raises(ConfigError) as raised:
        config.load(str(merged))
    assert "duplicate key" not in str(raised.value) and "x-other: unknown field" in str(
        raised.value
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "name: shapes\nsource: {type: image_folder, root: ../data\noutput: x\n",
            "line 3, column 7: expected ',' or '}', but got ':' (while parsing a flow mapping "
            "at line 2, column 9)",
        ),
        (
            "name: shapes\n  source:\n\toutput: x\n",
            "line 2, column 9: mapping values are not allowed here",
        ),
    ],
)
def test_yaml_syntax_errors_name_the_file_on_one_line(tmp_path, text, problem):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as raised:
        config.load(str(bad))
    assert str(raised.value) == f"config error in {bad}: not valid YAML: {problem}"


def test_gray_images_from_to_grayscale_are_a_valid_config(demo_corpus, tmp_path):
    for image, options in (({"channels": 1}, {}), ({"channels": 3}, {"keep_channels": True})):
        resolved = config.load(
            with_changes(demo_corpus, tmp_path, image=image, transforms=[{"to_grayscale": options}])
        )
        assert resolved.to_json()["image"]["channels"] == image["channels"]


def test_resolved_config_fills_defaults_and_ignores_key_order(demo_corpus, tmp_path):
    data = with_changes(
        demo_corpus,
        tmp_path,
        splits={"fractions": {"train": 0.5, "test": 0.25, "validation": 0.25}},
    )
    reordered = dict(reversed(list(data.items())))
    reordered["splits"] = {"fractions": {"validation": 0.25, "test": 0.25, "train": 0.5}}
    first, second = config.load(data), config.load(reordered)
    assert first.fingerprint == second.fingerprint and first.to_json() == second.to_json()
    assert first.to_json()["image"] == {"channels": 3, "max_pixels": 89_478_485, "min_size": 1}
    assert first.to_json()["sharding"]["compression"] == "none"
    assert first.to_json()["encoding"] == {"format": "png", "quality": None}
    # Locations are provenance, outside the resolved config and its fingerprint.
    assert first.to_json()["source"] == {"type": "image_folder", "classes": None}
    assert first.provenance() == {
        "source": {"root": os.path.abspath(demo_corpus.out_dir), "allowed_roots": []}
    }
    assert "output" not in first.to_json()
    # Neither the output root nor the source's location changes the
    # fingerprint; a transform does.
    moved = config.load({**data, "output": str(tmp_path / "elsewhere")})
    assert moved.fingerprint == first.fingerprint
    elsewhere = tmp_path / "moved-images"
    shutil.copytree(demo_corpus.out_dir, elsewhere)
    source = {**data["source"], "root": str(elsewhere), "allowed_roots": [str(tmp_path)]}
    relocated = config.load({**data, "source": source})
    assert relocated.fingerprint == first.fingerprint
    assert relocated.provenance()["source"]["root"] == str(elsewhere)
    data["transforms"] = [{"resize": {"shorter_side": 41}}]
    assert config.load(data).fingerprint != first.fingerprint


def test_default_splits_are_all_train(demo_corpus, tmp_path):
    # (The base config's shard counts for validation and test would name
    # splits this build does not have: tests/test_config_checks.py.)
    resolved = config.load(with_changes(demo_corpus, tmp_path, splits=None, sharding=None))
    assert resolved.to_json()["splits"]["fractions"] == {"train": 1.0}


def test_cli_exits_2_with_one_line_and_creates_nothing(demo_corpus, tmp_path, capsys):
    data = with_changes(demo_corpus, tmp_path, splits={"fractions": {"train": 0.6, "test": 0.3}})
    path = write_config(tmp_path, data)
    assert cli.main(["build", "--config", path]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"kiln build: error: config error in {path}: splits.fractions: must sum to 1, got 0.9\n"
    )
    assert not (tmp_path / "out").exists()


def test_cli_subprocess_has_no_traceback(demo_corpus, tmp_path):
    path = write_config(
        tmp_path, with_changes(demo_corpus, tmp_path, transforms=[{"resize": {"shorter_side": -3}}])
    )
    completed = subprocess.run(
        [sys.executable, "-m", "kiln.pipeline", "--config", path],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 2
    assert "Traceback" not in completed.stderr
    assert (
        f"kiln build: error: config error in {path}: transforms[0].resize.shorter_side"
        in completed.stderr
    )
    assert completed.stdout == ""


# --- hostile configs ----------------------------------------------------------------------


def alias_bomb(levels, width=9):
    """A "billion laughs" YAML document: `width` ** `levels` strings in ~600 bytes."""
    lines = [
        "name: bomb",
        "source: {type: image_folder, root: /nowhere}",
        "output: /tmp/out",
        "lol: &l0 [" + ", ".join(['"lol"'] * width) + "]",
    ]
    for level in range(1, levels):
        lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * width) + "]")
    lines.append(f"transforms: *l{levels - 1}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [6, 9])
def test_a_yaml_alias_bomb_fails_fast_on_one_short_line(tmp_path, capsys, levels):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(levels))
    assert len(path.read_bytes()) < 1000  # 9**9 = 387 million values when expanded
    assert cli.main(["build", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"kiln build: error: config error in {path}: expands to more than 100000 "
        f"values (through YAML aliases?); a config is a few hundred settings\n"
    )


def test_small_aliases_are_still_fine(demo_corpus, tmp_path):
    text = (
        yaml.safe_dump(with_changes(demo_corpus, tmp_path))
        + "augment: [&flip random_flip_left_right, *flip]\n"
    )
    path = tmp_path / "aliases.yaml"
    path.write_text(text)
    assert (
        config.load(str(path)).to_json()["augment"]
        == [{"random_flip_left_right": {"probability": 0.5}}] * 2
    )


def test_recursive_deep_huge_and_non_utf8_configs_are_one_line_errors(tmp_path, capsys):
    cases = {
        "recursive.yaml": (b"name: x\ntransforms: &t [*t]\n", "a recursive YAML alias"),
        "deep.yaml": (
            b"name: x\ntransforms: " + b"[" * 40 + b"]" * 40 + b"\n",
            "nested more than 32 levels deep",
        ),
        "huge.yaml": (b"name: x\n" + b"# padding\n" * 120_000, "larger than 1 MiB"),
        "latin1.yaml": ("name: caf\u00e9\n".encode("latin-1"), "not UTF-8 text (byte 9, line 1"),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        assert cli.main(["build", "--config", str(path)]) == 2, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (name, err)
        assert len(err) < 400


def test_quoted_user_values_are_cut(demo_corpus, tmp_path):
    with pytest.raises(ConfigError) as raised:
        config.load(with_changes(demo_corpus, tmp_path, name="x/" * 50_000))
    message = str(raised.value)
    assert "is not a valid name" in message and len(message) < 300


# --- relative paths -------------------------------------------------------------------


TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def project_with_a_config(tmp_path, source, **keys):
    """tmp/project/{images/a/x.png, data/m.csv, configs/c.yaml} and a folder to run from."""
    project = tmp_path / "project"
    (project / "images" / "a").mkdir(parents=True)
    (project / "images" / "a" / "x.png").write_bytes(b"not decoded here")
    (project / "data").mkdir()
    (project / "data" / "m.csv").write_text("path,label\nimages/a/x.png,a\n")
    (project / "configs").mkdir()
    data = {"name": "rel", "source": source, "output": "../out", **keys}
    path = write_config(project / "configs", data, name="c.yaml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    return project, path, elsewhere


def test_relative_paths_resolve_against_the_config_files_folder(tmp_path, monkeypatch):
    project, path, elsewhere = project_with_a_config(
        tmp_path,
        {"type": "image_folder", "root": "../images", "allowed_roots": ["../shared", "/abs"]},
    )
    monkeypatch.chdir(elsewhere)
    spec = config.load(path)
    assert spec.config.source.root == str(project / "images")
    assert spec.config.source.allowed_roots == ["/abs", str(project / "shared")]
    assert spec.output_root == str(project / "out")
    # kiln.json saves where the files were as provenance, outside the version.
    assert spec.provenance()["source"]["root"] == str(project / "images")
    assert "root" not in spec.to_json()["source"]
    # A path on the command line is the user's: relative to where they are.
    assert config.load(path, output="here").output_root == str(elsewhere / "here")
    # A relative config path works the same.
    monkeypatch.chdir(project)
    assert config.load("configs/c.yaml").config.source.root == str(project / "images")

    project, path, elsewhere = project_with_a_config(
        tmp_path / "2", {"type": "manifest", "path": "../data/m.csv"}, output="gs://bucket/out"
    )
    monkeypatch.chdir(elsewhere)
    spec = config.load(path)
    assert spec.config.source.path == str(project / "data" / "m.csv")
    assert spec.output_root == "gs://bucket/out"


def test_a_mapping_has_no_folder_its_paths_are_relative_to_the_current_directory(
    tmp_path, monkeypatch
):
    project, _, _ = project_with_a_config(tmp_path, {"type": "image_folder", "root": "../images"})
    monkeypatch.chdir(project)
    spec = config.load(
        {"name": "rel", "source": {"type": "image_folder", "root": "images"}, "output": "out"}
    )
    assert spec.config.source.root == str(project / "images")
    assert spec.output_root == str(project / "out")


def test_a_missing_folder_says_where_it_was_looked_for(tmp_path, monkeypatch):
    project, path, elsewhere = project_with_a_config(
        tmp_path, {"type": "image_folder", "root": "images"}
    )
    monkeypatch.chdir(project)  # where images/ is: not where the config points
    with pytest.raises(ConfigError) as raised:
        config.load(path)
    assert str(raised.value) == (
        f"config error in {path}: source.root: folder not found or empty: "
        f"{project / 'configs' / 'images'} (source.root is 'images': relative paths in a "
        f"config resolve against the config file's folder, {project / 'configs'})"
    )
    project, path, elsewhere = project_with_a_config(
        tmp_path / "2", {"type": "manifest", "path": "m.csv"}
    )
    with pytest.raises(ConfigError, match=r"source.path: manifest not found: .*configs/m.csv "):
        config.load(path)


def test_a_source_root_that_is_a_file_says_so(tmp_path):
    """It said "folder not found or empty" of a file that is there."""
    project, path, _ = project_with_a_config(
        tmp_path, {"type": "image_folder", "root": "../data/m.csv"}
    )
    with pytest.raises(ConfigError) as raised:
        config.load(path)
    assert str(raised.value).startswith(
        f"config error in {path}: source.root: {project / 'data' / 'm.csv'} is a file, "
        f"not a folder (source.root is '../data/m.csv': "
    )


def test_an_environment_variable_in_a_path_is_refused_not_made_a_folder(
    tmp_path, monkeypatch, capsys
):
    """kiln does not expand `$HOME` or `${HOME}` in a config's paths. An
    `output: $HOME/datasets` used to be built, without a word, into a folder
    named `$HOME` beside the config, and LATEST where training looks stayed
    old. Now each such path is a config error naming its key; `~` still
    expands."""
    project, path, elsewhere = project_with_a_config(
        tmp_path,
        {"type": "image_folder", "root": "${KILN_TEST_DATA}/images", "allowed_roots": ["~/x"]},
        output="$HOME/datasets",
    )
    monkeypatch.setenv("KILN_TEST_DATA", str(project))
    monkeypatch.chdir(elsewhere)
    assert cli.main(["build", "--config", path]) == 2
    assert capsys.readouterr().err == (
        f"kiln build: error: config error in {path}: 2 problems:\n"
        "  source.root: '${KILN_TEST_DATA}/images' holds ${KILN_TEST_DATA}, an environment "
        "variable, which kiln does not expand (it would be a folder named "
        "'${KILN_TEST_DATA}'); write the path out (~ is expanded), or write the config "
        "from a template\n"
        "  output: '$HOME/datasets' holds $HOME, an environment variable, which kiln does not "
        "expand (it would be a folder named '$HOME'); write the path out (~ is expanded), or "
        "write the config from a template\n"
    )
    assert sorted(os.listdir(project / "configs")) == ["c.yaml"]
    # A dollar sign that names no variable is a character of the name.
    project, path, elsewhere = project_with_a_config(
        tmp_path / "2", {"type": "image_folder", "root": "../images"}, output="../out$/1"
    )
    assert config.load(path).output_root == str(project / "out$" / "1")


def test_the_demo_config_finds_the_repositorys_build_folder_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = config.load(os.path.join(TOP, "configs", "demo.yaml"), check_paths=False)
    assert spec.config.source.root == os.path.join(TOP, "build", "demo-data")
    assert spec.output_root == os.path.join(TOP, "build", "datasets")
