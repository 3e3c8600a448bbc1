"""Every shell and Python block in README.md and docs/*.md runs, against the demo build.

A user pastes these blocks into a terminal or a Python file; here each one
runs as pasted, in a workspace laid out like a checkout after `make demo`:
``configs/demo.yaml``, ``build/demo-data`` and the dataset it builds in
``build/datasets/shapes`` (built once per session, by the same two commands
`make demo` runs), the detection demo ``build/datasets/shapes-detection``
(`make demo-detection`'s two commands), a ``.venv/bin/activate`` that puts this checkout's `kiln`
and `python` first on the PATH, and a small training project (``train.py``,
``src/``, ``scripts/train.py``: docs/lint.md's clean examples) for the
`kiln lint` commands. A shell block runs under ``bash -e`` (every command
must succeed), a Python block as a file in a fresh interpreter.

Conventions in the Markdown:

- A block that cannot run here (it needs Cloud Storage, Dataflow, a server)
  is preceded by ``<!-- docs-test: skip (needs Dataflow) -->`` with the
  reason; they are listed as `test_blocks_not_run_say_why`'s cases, and
  their number is kept small (`MAX_NOT_RUN`).
- A Python block whose first line names a file (``# my_project/augmentations.py``)
  is that file: it is written into the workspace and imported as a module.
- docs/lint.md's ``# bad: K101`` / ``# fixed: K101`` / ``# clean`` blocks
  are the linter's examples, checked by tests/test_lint.py (a bad block is
  wrong on purpose): here only their count is compared.
- ``print(...)  # prints OUTPUT`` documents what the print prints: OUTPUT
  must be a line of the block's output.
- ``kiln verify: OK: ...`` lines quote what ``kiln verify`` prints for the
  demo dataset (the version written as ``<version>``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from test_lint import doc_examples as lint_examples

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = ["README.md"] + [
    os.path.join("docs", name)
    for name in sorted(os.listdir(os.path.join(REPO, "docs")))
    if name.endswith(".md")
]
LANGUAGES = {"sh": "shell", "bash": "shell", "shell": "shell", "python": "python"}
MAX_NOT_RUN = 15

_FENCE = re.compile(r"^```(?P<language>\S*)\s*$")
_SKIP = re.compile(r"^<!-- docs-test: skip \((?P<reason>[^)]+)\) -->$")
_LINT_EXAMPLE = re.compile(r"^# (bad|fixed|clean)(: K\d{3})?$")
_FILE_BLOCK = re.compile(r"^# (?P<path>[\w/.-]+\.py)$")
_DOCUMENTED_PRINT = re.compile(r"^\s*print\(.*\)\s+# prints (?P<output>.+)$")


@dataclasses.dataclass(frozen=True)
class Block:
    """A fenced code block of a document."""

    document: str
    line: int  # of the opening fence, 1-based
    language: str
    source: str
    not_run: str | None  # the reason of its skip marker

    @property
    def name(self) -> str:
        return f"{self.document}:{self.line}"

    @property
    def kind(self) -> str:
        first = self.source.split("\n", 1)[0]
        if self.language == "python" and _LINT_EXAMPLE.match(first):
            return "lint example"
        if self.language == "python" and _FILE_BLOCK.match(first):
            return "file"
        return LANGUAGES[self.language]


def blocks(document: str) -> list[Block]:
    """The shell and Python blocks of `document`, with their skip markers."""
    with open(os.path.join(REPO, document), encoding="utf-8") as f:
        lines = f.read().split("\n")
    found, index = [], 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        language = fence.group("language")
        previous = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        skip = _SKIP.match(previous.strip())
        if language in LANGUAGES:
            found.append(
                Block(
                    document,
                    index + 1,
                    language,
                    "\n".join(lines[index + 1 : end]) + "\n",
                    skip.group("reason") if skip else None,
                )
            )
        elif skip:
            raise AssertionError(f"{document}:{index + 1}: a skip marker on a {language!r} block")
        index = end + 1
    return found


ALL = [block for document in DOCUMENTS for block in blocks(document)]
RUN = [block for block in ALL if block.not_run is None and block.kind != "lint example"]
NOT_RUN = [block for block in ALL if block.not_run is not None]


# --- the workspace ------------------------------------------------------------------


@pytest.fixture(scope="session")
def workspace(tmp_path_factory):
    """A folder laid out like a checkout after `make demo` (see the module docstring)."""
    from kiln import cli

    root = tmp_path_factory.mktemp("docs-workspace")
    shutil.copytree(os.path.join(REPO, "configs"), root / "configs")
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    shims = {
        "python": f'exec {sys.executable} "$@"\n',
        "kiln": f'exec {sys.executable} -m kiln.cli "$@"\n',
    }
    for name, body in shims.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "activate").write_text(f'PATH="{bin_dir}:$PATH"\nexport PATH\n')

    # A training project for the `kiln lint` commands: the linter's clean examples.
    clean = [source for kind, _, source in lint_examples() if kind in ("fixed", "clean")]
    for relative, source in [
        ("train.py", clean[0]),
        ("scripts/train.py", clean[1]),
        *((f"src/augment_{i}.py", source) for i, source in enumerate(clean)),
    ]:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(source)

    # What `make demo` runs, from the workspace's top.
    previous = os.getcwd()
    os.chdir(root)
    try:
        assert cli.main(["demo-data", "build/demo-data"]) == 0
        assert cli.main(["build", "--config", "configs/demo.yaml", "--quiet"]) == 0
        # `make demo-detection`, for the "Detection and segmentation" blocks (a few seconds).
        assert cli.main(["demo-data", "build/demo-detection", "--targets"]) == 0
        assert cli.main(["build", "--config", "configs/demo-detection.yaml", "--quiet"]) == 0
    finally:
        os.chdir(previous)
    return root


def environment(workspace) -> dict[str, str]:
    bin_dirs = [str(workspace / ".venv" / "bin"), os.path.dirname(sys.executable)]
    return dict(
        os.environ,
        PATH=os.pathsep.join([*bin_dirs, os.environ.get("PATH", "")]),
        PYTHONPATH=os.pathsep.join([os.path.join(REPO, "src"), str(workspace)]),
        TF_CPP_MIN_LOG_LEVEL="3",
    )


def run(block: Block, workspace) -> subprocess.CompletedProcess:
    scratch = workspace / ".docs-test"
    scratch.mkdir(exist_ok=True)
    if block.kind == "shell":
        command = ["bash", "-e", "-o", "pipefail", "-c", block.source]
    elif block.kind == "file":
        path = _FILE_BLOCK.match(block.source.split("\n", 1)[0]).group("path")
        (workspace / path).parent.mkdir(parents=True, exist_ok=True)
        (workspace / path).write_text(block.source)
        module = path[: -len(".py")].replace("/", ".")
        command = [sys.executable, "-c", f"import {module}"]
    else:
        # A real file, so AutoGraph can read the functions' source.
        script = scratch / f"{block.document.replace('/', '_')}-{block.line}.py"
        script.write_text(block.source)
        command = [sys.executable, str(script)]
    return subprocess.run(
        command,
        cwd=workspace,
        env=environment(workspace),
        capture_output=True,
        text=True,
        timeout=600,
    )


# --- the tests ----------------------------------------------------------------------


@pytest.mark.parametrize("block", RUN, ids=[block.name for block in RUN])
def test_block_runs_as_pasted(block, workspace):
    completed = run(block, workspace)
    assert completed.returncode == 0, (
        f"{block.name} ({block.kind}) exited {completed.returncode}:\n{block.source}\n"
        f"--- stdout:\n{completed.stdout[-3000:]}\n--- stderr:\n{completed.stderr[-3000:]}"
    )
    printed = completed.stdout.splitlines()
    for line in block.source.splitlines():
        documented = _DOCUMENTED_PRINT.match(line) if block.kind == "python" else None
        if documented:
            assert documented.group("output") in printed, (block.name, line, printed)


@pytest.mark.parametrize(
    "block", NOT_RUN, ids=[f"{block.name} ({block.not_run})" for block in NOT_RUN]
)
def test_blocks_not_run_say_why(block):
    # Each one is listed in the test output with its reason (the test id).
    assert block.not_run and block.kind != "lint example", block.name


def test_few_blocks_are_not_run_and_every_other_one_is():
    assert len(NOT_RUN) <= MAX_NOT_RUN, [block.name for block in NOT_RUN]
    checked_elsewhere = [block for block in ALL if block.kind == "lint example"]
    assert all(block.document == os.path.join("docs", "lint.md") for block in checked_elsewhere)
    assert sorted(block.source.split("\n", 1)[1] for block in checked_elsewhere) == sorted(
        source for _, _, source in lint_examples()
    )
    assert len(RUN) + len(NOT_RUN) + len(checked_elsewhere) == len(ALL)
    assert len(RUN) >= 20  # the README's and the guides' blocks: none lost by the parser


def test_documented_verify_output_is_the_demos(workspace):
    completed = subprocess.run(
        [sys.executable, "-m", "kiln.cli", "verify", "build/datasets/shapes"],
        cwd=workspace,
        env=environment(workspace),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr
    version = (workspace / "build" / "datasets" / "shapes" / "LATEST").read_text().strip()
    printed = completed.stdout.strip().replace(version, "<version>")
    documented = [
        line
        for document in DOCUMENTS
        for line in open(os.path.join(REPO, document), encoding="utf-8").read().splitlines()
        if line.startswith("kiln verify: OK: ")
    ]
    assert documented and all(line == printed for line in documented), (printed, documented)


def test_the_readmes_own_record_parser_reads_gzip_compressed_shards(workspace):
    """The README's parser "without kiln.reader", built from kiln.json alone,
    pasted for a build of the detection demo with `sharding.compression: gzip`
    (a documented option): it reads the shards as kiln.json says they are
    stored, not as uncompressed TFRecords ("corrupted record at 0")."""
    from kiln import cli

    (block,) = [b for b in RUN if b.document == "README.md" and "schema.parse(" in b.source]
    demo = "build/datasets/shapes-detection"
    assert f'"{demo}"' in block.source
    config = (workspace / "configs" / "demo-detection.yaml").read_text()
    assert "\nname: shapes-detection\n" in config and "\nsharding:\n" in config
    config = config.replace("\nname: shapes-detection\n", "\nname: shapes-detection-gzip\n")
    config = config.replace("\nsharding:\n", "\nsharding:\n  compression: gzip\n")
    (workspace / "configs" / "demo-detection-gzip.yaml").write_text(config)
    previous = os.getcwd()
    os.chdir(workspace)
    try:
        assert cli.main(["build", "--config", "configs/demo-detection-gzip.yaml", "--quiet"]) == 0
    finally:
        os.chdir(previous)
    gzip_block = dataclasses.replace(
        block,
        document=f"{block.document}-gzip",
        source=block.source.replace(f'"{demo}"', f'"{demo}-gzip"'),
    )
    completed = run(gzip_block, workspace)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.splitlines()[-1] == "8 8 8"


def test_no_placeholder_looks_like_a_real_version():
    # A made-up version id (`.../shapes/3f2a9c1b0d4e`) fails when pasted: docs
    # write <version>, or <output>/<name>, which follows LATEST.
    for document in DOCUMENTS:
        text = open(os.path.join(REPO, document), encoding="utf-8").read()
        for match in re.finditer(r"/[0-9a-f]{12}\b", text):
            line = text.count("\n", 0, match.start()) + 1
            raise AssertionError(f"{document}:{line}: {match.group()} looks like a real version")


def test_the_parser_reads_markers_and_kinds(tmp_path, monkeypatch):
    document = tmp_path / "x.md"
    document.write_text(
        textwrap.dedent(
            """\
            ```sh
            echo run
            ```

            <!-- docs-test: skip (needs Dataflow) -->

            ```python
            import apache_beam
            ```

            ```python
            # pkg/module.py
            X = 1
            ```

            ```yaml
            not: run
            ```
            """
        )
    )
    monkeypatch.setattr(sys.modules[__name__], "REPO", str(tmp_path))
    found = blocks("x.md")
    assert [(b.line, b.kind, b.not_run) for b in found] == [
        (1, "shell", None),
        (7, "python", "needs Dataflow"),
        (11, "file", None),
    ]
