"""`kiln build`'s checks of what a new user gets wrong: a ``--base`` that names
no version (also when the dataset is up to date). Real builds on the
DirectRunner, through the command line where its output matters.
"""

from __future__ import annotations

import json

import yaml

from conftest import backdated, make_config
from kiln import cli
from test_build_publishing import small_corpus


def write_config(path, config) -> str:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


# --- --base VERSION -----------------------------------------------------------------------


def test_a_base_that_names_no_version_fails_also_when_the_dataset_is_up_to_date(
    demo_corpus, tmp_path, capsys
):
    """A cron line with a bad ``--base`` fails the first night, not the first
    night the inputs change."""
    root = tmp_path / "images"
    small_corpus(demo_corpus, root)
    backdated(root)
    output = tmp_path / "out"
    config = write_config(tmp_path / "config.yaml", make_config(root, output=str(output)))
    assert cli.main(["build", "--config", config, "--quiet"]) == 0
    version = (output / "shapes" / "LATEST").read_text().strip()
    capsys.readouterr()

    report = tmp_path / "report.json"
    argv = ["build", "--config", config, "--quiet", "--base", "nothex", "--report", str(report)]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"kiln build: error: --base nothex: no complete version nothex in {output / 'shapes'}\n"
    )
    written = json.loads(report.read_text())
    assert (written["status"], written["exit_code"]) == ("usage_error", 2)
    assert (output / "shapes" / "LATEST").read_text().strip() == version

    # A base that is a complete version: the up-to-date dataset stays so.
    assert cli.main(["build", "--config", config, "--quiet", "--base", version]) == 0
    assert capsys.readouterr().err == ""
    assert (output / "shapes" / "LATEST").read_text().strip() == version
