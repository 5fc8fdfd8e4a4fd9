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
    "shadow",
    "simulate",
    "doctor",
    "export kserve",
    "export seldon",
    "export check",
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


def test_the_help_and_docs_name_every_catalogue_handler():
    """--handler's and --from's help and the docs (README.md, docs/) come from or follow handlers/catalogue.py:
    each toolkit handler is named with its task, and each start of tsctl init."""
    from pathlib import Path

    from handlers.catalogue import HANDLERS, STARTS

    root = Path(__file__).resolve().parents[2]
    docs = "\n".join(p.read_text() for p in [root / "README.md", *sorted((root / "docs").rglob("*.md"))])
    package_help = "".join(CliRunner().invoke(main, ["package", "--help"]).output.split())  # unwrapped
    init_help = "".join(CliRunner().invoke(main, ["init", "--help"]).output.split())
    for name, handler in HANDLERS.items():
        assert "".join(f"{name}: {handler.task}".split()) in package_help, name
        assert f"`{name}`" in docs, f"the docs do not name the toolkit handler {name}"
    for name in STARTS:
        assert name in init_help and f"`{name}`" in docs, name
