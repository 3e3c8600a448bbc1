"""Tests for `kiln lint`: the corpus of good and bad snippets, the API and the command."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from kiln import cli
from kiln.tools import lint

CORPUS = pathlib.Path(__file__).parent / "lint_corpus"
CORPUS_FILES = sorted(CORPUS.glob("*.py"))
_EXPECT = re.compile(r"#.*\bexpect:\s*(?P<codes>K\d{3}(?:\s*,\s*K\d{3})*)")


def expected_findings(path: pathlib.Path) -> set[tuple[int, str]]:
    """(line, code) pairs marked with ``# expect: CODE[, CODE]`` comments."""
    expected = set()
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        match = _EXPECT.search(text)
        if match:
            expected.update((number, code.strip()) for code in match.group("codes").split(","))
    return expected


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.name)
def test_corpus_file_reports_exactly_the_marked_findings(path):
    found = {(f.line, f.code) for f in lint.lint_file(path)}
    expected = expected_findings(path)
    missed = sorted(expected - found)
    false_alarms = sorted(found - expected)
    assert not missed and not false_alarms, (
        f"{path.name}: missed (line, code) {missed}; not expected {false_alarms}"
    )


def test_corpus_covers_every_code_and_has_clean_files():
    marked = set()
    clean = []
    for path in CORPUS_FILES:
        codes = {code for _, code in expected_findings(path)}
        marked |= codes
        if not codes:
            clean.append(path.name)
    assert marked == set(lint.RULES)
    assert {"clean_stateless.py", "not_traced.py"} <= set(clean)


def test_finding_format_is_one_line_with_location_code_and_fix():
    source = textwrap.dedent("""\
        import tensorflow as tf

        def augment(image):
            print(image)
            return image

        ds = tf.data.Dataset.range(3).map(augment)
        """)
    [finding] = lint.lint_source(source, "train.py")
    assert (finding.path, finding.line, finding.col, finding.code) == ("train.py", 4, 5, "K103")
    line = finding.format()
    assert line == (
        "train.py:4:5: K103 `print()` runs once, at trace time, and shows a symbolic "
        "Tensor, not the elements (fix: use tf.print, which runs for every element)"
    )
    assert "\n" not in line


def test_syntax_error_is_one_k000_finding_at_the_error_line():
    [finding] = lint.lint_file(CORPUS / "syntax_error.py")
    assert finding.code == "K000"
    assert finding.line == 6
    assert "syntax error" in finding.message
    # Code valid for a newer Python (PEP 695 on 3.11) is a syntax error here: say which Python.
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f"syntax error (as Python {version} reads it): " in finding.message


def test_finding_reported_inside_the_callee_not_at_the_map_call():
    source = textwrap.dedent("""\
        import random
        import tensorflow as tf

        def build(files):
            return tf.data.TFRecordDataset(files).map(outer)

        def outer(record):
            return inner(record)

        def inner(record):
            return record + random.random()
        """)
    [finding] = lint.lint_source(source)
    assert (finding.line, finding.code) == (11, "K101")


def test_callee_parameter_is_a_tensor_only_when_the_caller_passes_one():
    source = textwrap.dedent("""\
        import tensorflow as tf

        def helper(value):
            if value > 0:
                return 1
            return 0

        def augment(image):
            return helper(3) + helper(image)

        ds = tf.data.Dataset.range(3).map(augment)
        """)
    assert [(f.line, f.code) for f in lint.lint_source(source)] == [(4, "K104")]
    only_config = source.replace("helper(3) + helper(image)", "helper(3) + image")
    assert lint.lint_source(only_config) == []


def test_call_chain_is_followed_up_to_the_depth_limit():
    depth = lint.MAX_CALL_DEPTH
    functions = "\n".join(f"def f{i}(x):\n    return f{i + 1}(x)\n" for i in range(depth + 2))
    source = (
        "import tensorflow as tf\n"
        + functions
        + f"def f{depth + 2}(x):\n    print(x)\n    return x\n"
        + "ds = tf.data.Dataset.range(3).map(f0)\n"
    )
    assert lint.lint_source(source) == []  # beyond the limit: not followed
    shallow = source.replace("map(f0)", "map(f3)")
    assert [f.code for f in lint.lint_source(shallow)] == ["K103"]


def test_mutually_recursive_functions_terminate():
    source = textwrap.dedent("""\
        import tensorflow as tf

        def ping(x):
            return pong(x)

        def pong(x):
            print(x)
            return ping(x)

        ds = tf.data.Dataset.range(3).map(ping)
        """)
    assert [(f.line, f.code) for f in lint.lint_source(source)] == [(7, "K103")]


def test_select_and_ignore_by_code_prefix():
    path = CORPUS / "resolution.py"
    everything = {f.code for f in lint.lint_file(path)}
    assert {"K101", "K102", "K103", "K104", "K105"} <= everything
    assert {f.code for f in lint.lint_file(path, select=["K101", "K103"])} == {"K101", "K103"}
    assert {
        f.code for f in lint.lint_file(path, select=["K10"], ignore=["K104", "K105"])
    } == everything - {"K104", "K105"}
    with pytest.raises(ValueError, match="unknown code 'K999'"):
        lint.lint_source("", select=["K999"])


def test_k000_is_never_filtered():
    findings = lint.lint_file(CORPUS / "syntax_error.py", select=["K101"], ignore=["K0"])
    assert [f.code for f in findings] == ["K000"]


def test_lint_paths_walks_directories_sorted_by_file_and_line(tmp_path):
    bad = "import tensorflow as tf\nds = tf.data.Dataset.range(1).map(lambda x: print(x))\n"
    (tmp_path / "b.py").write_text(bad)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("\n" + bad)
    for skipped in (".venv", "__pycache__", "build"):
        (tmp_path / skipped).mkdir()
        (tmp_path / skipped / "c.py").write_text(bad)
    (tmp_path / "notes.txt").write_text(bad)
    findings = lint.lint_paths([tmp_path, tmp_path / "b.py"])
    assert [(pathlib.Path(f.path).relative_to(tmp_path).as_posix(), f.line) for f in findings] == [
        ("b.py", 2),
        ("pkg/a.py", 3),
    ]
    with pytest.raises(FileNotFoundError, match=r"missing\.py"):
        lint.lint_paths([tmp_path / "missing.py"])


def test_undecodable_file_is_reported_not_raised(tmp_path):
    path = tmp_path / "latin.py"
    path.write_bytes(b"# -*- coding: utf-8 -*-\nname = '\xff'\n")
    [finding] = lint.lint_file(path)
    assert finding.code == "K000" and "decode" in finding.message
    assert (finding.line, finding.col) == (2, 9)  # the first byte not in UTF-8


# --- the command ---------------------------------------------------------------


def test_cli_clean_file_exits_0(capsys):
    assert cli.main(["lint", str(CORPUS / "clean_stateless.py")]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert "0 findings in 1 checked file" in err


def test_cli_quiet_prints_nothing_when_clean_and_only_the_findings_otherwise(capsys):
    # cron mails any output, and a pre-commit hook shows it on every commit.
    assert cli.main(["lint", "--quiet", str(CORPUS / "clean_stateless.py")]) == 0
    assert capsys.readouterr() == ("", "")
    path = str(CORPUS / "resolution.py")
    assert cli.main(["lint", "--quiet", path]) == 1
    out, err = capsys.readouterr()
    assert err == ""
    assert len(out.splitlines()) == len(expected_findings(CORPUS / "resolution.py")) > 0
    assert all(line.startswith(path + ":") for line in out.splitlines())


def test_cli_findings_exit_1_one_line_each_sorted(capsys):
    paths = [CORPUS / "resolution.py", CORPUS / "methods.py"]
    assert cli.main(["lint", *map(str, paths)]) == 1
    lines = capsys.readouterr().out.splitlines()
    expected = sorted(
        (str(path), line, code) for path in paths for line, code in expected_findings(path)
    )
    parsed = []
    for text in lines:
        match = re.match(r"^(.+\.py):(\d+):(\d+): (K\d{3}) .+ \(fix: .+\)$", text)
        assert match, text
        parsed.append((match.group(1), int(match.group(2)), match.group(4)))
    assert parsed == sorted(parsed) == expected


def test_cli_select_ignore(capsys):
    path = str(CORPUS / "resolution.py")
    assert cli.main(["lint", "--select", "K104,K105", "--ignore", "K105", path]) == 1
    codes = {line.split()[1] for line in capsys.readouterr().out.splitlines()}
    assert codes == {"K104"}
    assert cli.main(["lint", "--select", "K102", str(CORPUS / "control_flow.py")]) == 0


def test_cli_unknown_code_is_a_usage_error(capsys):
    assert cli.main(["lint", "--ignore", "X1", str(CORPUS / "noqa.py")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kiln lint: error: ignore: unknown code 'X1'")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("select", ["", " ", ","])
def test_cli_empty_select_is_a_usage_error_not_a_silent_pass(capsys, select):
    # `kiln lint --select "$CODES" src/` with an empty variable must not pass CI.
    assert cli.main(["lint", "--select", select, str(CORPUS / "noqa.py")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("kiln lint: error: select: no code given")
    assert len(err.strip().splitlines()) == 1
    assert cli.main(["lint", "--ignore", select, str(CORPUS / "noqa.py")]) == 1


def test_cli_missing_path_is_a_usage_error(capsys, tmp_path):
    missing = tmp_path / "nope.py"
    assert cli.main(["lint", str(CORPUS / "noqa.py"), str(missing)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip() == f"kiln lint: error: no such file or directory: {missing}"


def test_cli_directory_without_python_files_is_a_usage_error(capsys, tmp_path):
    assert cli.main(["lint", str(tmp_path)]) == 2
    assert "no Python files found" in capsys.readouterr().err


def test_cli_syntax_error_is_reported_and_other_files_still_checked(capsys):
    broken, bad = CORPUS / "syntax_error.py", CORPUS / "noqa.py"
    assert cli.main(["lint", str(broken), str(bad)]) == 1
    out, err = capsys.readouterr()
    assert f"{broken}:6:" in out and " K000 syntax error" in out
    assert f"{bad}:11:" in out
    assert "1 file could not be parsed" in err


def test_cli_only_unparsable_files_exit_2(capsys):
    assert cli.main(["lint", str(CORPUS / "syntax_error.py")]) == 2
    out, err = capsys.readouterr()
    assert "K000" in out and "0 checked files" in err


def test_cli_json_format(capsys):
    paths = [
        CORPUS / "syntax_error.py",
        CORPUS / "chained_pipeline.py",
        CORPUS / "clean_stateless.py",
    ]
    assert cli.main(["lint", "--format", "json", *map(str, paths)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["files_checked"] == 2 and report["files_unparsable"] == 1
    found = {(f["path"], f["line"], f["code"]) for f in report["findings"]}
    expected = {(str(p), line, code) for p in paths for line, code in expected_findings(p)}
    assert found == expected
    assert set(report["findings"][0]) == {"path", "line", "col", "code", "message", "fix"}


def test_cli_help_lists_codes_examples_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["lint", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for code in lint.RULES:
        assert code in text
    assert "kiln lint --format json" in text and "exit codes:" in text and "# kiln: noqa" in text


def test_lint_does_not_import_tensorflow_or_the_checked_code(tmp_path):
    marker = tmp_path / "imported"
    target = tmp_path / "train.py"
    target.write_text(f"open({str(marker)!r}, 'w').close()\nimport tensorflow\n")
    script = (
        "import sys\nfrom kiln import cli\n"
        f"code = cli.main(['lint', {str(target)!r}])\n"
        "assert 'tensorflow' not in sys.modules, 'kiln lint imported tensorflow'\n"
        "sys.exit(code)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert not marker.exists()


# --- the documentation ---------------------------------------------------------

DOCS = pathlib.Path(__file__).parent.parent / "docs" / "lint.md"
_DOC_BLOCK = re.compile(
    r"```python\n# (?P<kind>bad|fixed|clean)(?:: (?P<code>K\d{3}))?\n(?P<body>.*?)```", re.DOTALL
)


def doc_examples() -> list[tuple[str, str | None, str]]:
    """(kind, code, source) of every marked ```python block in docs/lint.md."""
    return [
        (m.group("kind"), m.group("code"), m.group("body"))
        for m in _DOC_BLOCK.finditer(DOCS.read_text())
    ]


def test_docs_show_a_bad_and_a_fixed_example_for_every_code():
    examples = doc_examples()
    text = DOCS.read_text()
    for code in lint.RULES:
        assert f"### {code}:" in text, f"docs/lint.md has no section for {code}"
        if code != lint.SYNTAX_ERROR_CODE:
            kinds = {kind for kind, example_code, _ in examples if example_code == code}
            assert kinds == {"bad", "fixed"}, f"{code}: {kinds}"


@pytest.mark.parametrize(
    "kind, code, source", [e for e in doc_examples() if e[0] == "bad"], ids=lambda v: str(v)[:8]
)
def test_docs_bad_example_gets_exactly_its_code(kind, code, source):
    assert {f.code for f in lint.lint_source(source, "example.py")} == {code}


def test_docs_fixed_examples_lint_clean_and_run_under_tensorflow(tmp_path):
    import runpy

    fixed = [(code, source) for kind, code, source in doc_examples() if kind in ("fixed", "clean")]
    assert len(fixed) >= 9
    for number, (code, source) in enumerate(fixed):
        assert lint.lint_source(source, "example.py") == [], f"fixed example for {code}"
        path = tmp_path / f"example_{number}.py"  # a real file, so AutoGraph can read it
        path.write_text(source)
        namespace = runpy.run_path(str(path))
        elements = list(namespace["ds"].as_numpy_iterator())
        assert elements, f"fixed example for {code} produced no elements"


def test_function_first_reached_deep_is_checked_again_when_reached_shallow():
    depth = lint.MAX_CALL_DEPTH
    # f0 -> ... -> f9 -> shared (depth 10, the limit) -> leaf (too deep from here).
    chain = "\n".join(f"def f{i}(x):\n    return f{i + 1}(x)\n" for i in range(depth - 1))
    source = (
        "import tensorflow as tf\n"
        + chain
        + f"def f{depth - 1}(x):\n    return shared(x)\n"
        + "def shared(x):\n    return leaf(x)\n"
        + "def leaf(x):\n    print(x)\n    return x\n"
        + "deep = tf.data.Dataset.range(3).map(f0)\n"
        + "shallow = tf.data.Dataset.range(3).map(shared)\n"
    )
    assert [f.code for f in lint.lint_source(source)] == ["K103"]


def test_deeply_nested_generated_code_is_reported_not_a_crash():
    for terms in (600, 5000):  # too deep for the checker; too deep for the parser
        body = " + ".join(["x"] * terms)
        source = (
            f"import tensorflow as tf\ndef f(x):\n    return {body}\n"
            "ds = tf.data.Dataset.range(3).map(f)\n"
        )
        [finding] = lint.lint_source(source, "generated.py")
        assert finding.code == "K000" and "nested too deeply" in finding.message


# --- functions imported from another checked file --------------------------------------


def _write_files(root: pathlib.Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_function_imported_from_another_checked_file_is_checked_there(tmp_path):
    _write_files(
        tmp_path,
        {
            "imgutils.py": """\
                import cv2

                def blur(image, size=5):
                    if size > 3:  # configuration from the caller: fine
                        size = 3
                    return cv2.GaussianBlur(image, (size, size), 0)

                def to_label(label):
                    return label.numpy().decode()

                def unused(image):
                    print("not called from traced code")
                """,
            "train.py": """\
                import tensorflow as tf
                import imgutils
                from imgutils import blur

                def preprocess(image, label):
                    return image, imgutils.to_label(label)

                ds = tf.data.Dataset.from_tensor_slices(([0.0], ["a"]))
                ds = ds.map(preprocess).map(lambda image, label: (image, label)).map(blur)
                """,
        },
    )
    found = [(pathlib.Path(f.path).name, f.line, f.code) for f in lint.lint_paths([tmp_path])]
    assert found == [("imgutils.py", 6, "K108"), ("imgutils.py", 9, "K102")]
    # Alone, a file does not have the other's source (and flake8 checks files alone).
    assert lint.lint_file(tmp_path / "train.py") == []
    assert lint.lint_file(tmp_path / "imgutils.py") == []


def test_imported_function_followed_through_packages_and_relative_imports(tmp_path):
    _write_files(
        tmp_path,
        {
            "pkg/__init__.py": "from .ops.colour import jitter\n",
            "pkg/ops/__init__.py": "",
            "pkg/ops/colour.py": """\
                import random

                def jitter(image):
                    return image * random.uniform(0.9, 1.1)
                """,
            "pkg/ops/geometry.py": """\
                from . import colour
                from ..ops.colour import jitter

                def flip_and_jitter(image):
                    print("tracing")
                    return colour.jitter(jitter(image))
                """,
            "pkg/train.py": """\
                import tensorflow as tf
                from pkg import jitter
                from pkg.ops import geometry

                ds = tf.data.Dataset.range(3).map(jitter).map(geometry.flip_and_jitter)
                """,
            # Two scripts' helpers.py: the one next to the importing script is used.
            "scripts/helpers.py": "def same(image):\n    return image\n",
            "scripts/run.py": (
                "import tensorflow as tf\nimport helpers\n"
                "ds = tf.data.Dataset.range(3).map(helpers.same)\n"
            ),
            "tools/helpers.py": "def same(image):\n    print(image)\n    return image\n",
        },
    )
    found = [
        (pathlib.Path(f.path).relative_to(tmp_path).as_posix(), f.line, f.code)
        for f in lint.lint_paths([tmp_path])
    ]
    assert found == [("pkg/ops/colour.py", 4, "K101"), ("pkg/ops/geometry.py", 5, "K103")]


def test_cli_reports_findings_in_the_imported_file(capsys, tmp_path):
    _write_files(
        tmp_path,
        {
            "helpers.py": "def show(image):\n    print(image)\n    return image\n",
            "train.py": (
                "import tensorflow as tf\nfrom helpers import show\n"
                "ds = tf.data.Dataset.range(3).map(show)\n"
            ),
        },
    )
    assert cli.main(["lint", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out.startswith(f"{tmp_path / 'helpers.py'}:2:5: K103 ")
    assert "1 finding in 2 checked files" in err
