"""The Dockerfile: its Beam SDK image matches the Beam version setup.py pins,
it installs kiln with the pipeline extra, and it ends with `pip check`.
(No docker engine here, so the image itself is not built.)"""

import pathlib
import re
import sys

TOP = pathlib.Path(__file__).resolve().parent.parent


def instructions():
    """(instruction, the comment above it) for every instruction.

    Consecutive instructions without a blank line between them form a group
    that shares the comment above the group.
    """
    out, comments, previous_was_instruction = [], [], False
    for line in (TOP / "Dockerfile").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comments.append(stripped)
            previous_was_instruction = False
        elif stripped:
            if previous_was_instruction:
                comments = out[-1][1]
            out.append((stripped, comments))
            comments, previous_was_instruction = [], True
        else:  # a blank line ends a comment: the header is nobody's reason
            comments, previous_was_instruction = [], False
    return out


def test_base_image_is_the_pinned_beam_sdk():
    beam_version = re.search(r'^BEAM_VERSION = "([^"]+)"', (TOP / "setup.py").read_text(),
                             re.M).group(1)
    first, _ = instructions()[0]
    match = re.fullmatch(r"FROM apache/beam_python(\d+)\.(\d+)_sdk:(\S+)", first)
    assert match, first
    assert match.group(3) == beam_version
    # The launcher's Python must match the container's: the tests run on it.
    assert (int(match.group(1)), int(match.group(2))) == sys.version_info[:2]


def test_installs_kiln_with_the_pipeline_extra_and_ends_with_pip_check():
    lines = [line for line, _ in instructions()]
    assert any(re.fullmatch(r'RUN pip install .*"\.\[pipeline\]"', line) for line in lines)
    assert lines[-1] == "RUN pip check"


def test_every_instruction_says_why():
    for line, comments in instructions():
        assert comments, f"no comment above: {line}"
