"""Every command's --help runs and describes every option, and every command whose output a script
would read takes --json (its schema in docs/json-output.md, checked by the tests it names)."""

import click
import pytest
from click.testing import CliRunner

from archiver.cli import main

ROOT_DOC = "docs/json-output.md"
JSON_COMMANDS = {
    "init",
    "package",
    "inspect",
    "config",
    "serve",
    "stop",
    "predict",
    "run",
    "verify",
    "bench",
    "doctor",
    "export kserve",
    "export seldon",
}


def commands(group=main, prefix=""):
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        if isinstance(command, click.Group):
            yield from commands(command, path + " ")
        yield path, command


ALL = dict(commands())


@pytest.mark.parametrize("path", sorted(ALL))
def test_help_runs_and_describes_every_option(path):
    done = CliRunner().invoke(main, [*path.split(), "--help"])
    assert done.exit_code == 0, done.output
    undescribed = [p.opts[0] for p in ALL[path].params if isinstance(p, click.Option) and not (p.help or "").strip()]
    assert not undescribed, f"tsctl {path}: options without a description: {undescribed}"


@pytest.mark.parametrize("path", sorted(JSON_COMMANDS))
def test_commands_scripts_read_take_json_and_document_it(path):
    from pathlib import Path

    assert "--json" in [opt for p in ALL[path].params for opt in p.opts], f"tsctl {path} has no --json"
    doc = (Path(__file__).resolve().parents[2] / ROOT_DOC).read_text()
    section = doc.split(f"## tsctl {path}\n", 1)[1].split("\n## ", 1)[0]
    assert "(to be written)" not in section and "```" in section, f"{ROOT_DOC}: tsctl {path} has no schema"
