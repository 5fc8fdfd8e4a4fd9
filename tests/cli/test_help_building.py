"""Every option of init, package, inspect, config, export kserve and export seldon says what it is for in
``--help``: a description of its own, not a bare flag or only its default."""

import click
import pytest
from click.testing import CliRunner

from archiver.cli import main

COMMANDS = [("init",), ("package",), ("inspect",), ("config",), ("export", "kserve"), ("export", "seldon")]


def command_of(path):
    command = main
    for name in path:
        command = command.commands[name]
    return command


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_option_has_a_description(path):
    command = command_of(path)
    context = click.Context(command, info_name=path[-1])
    options = [p for p in command.get_params(context) if p.param_type_name == "option" and not p.hidden]
    assert options, path  # its own options, and --help
    missing = [param.opts[-1] for param in options if not (param.help or "").strip()]
    assert missing == [], f"tsctl {' '.join(path)}: options without a description: {missing}"
    # and --help shows each description beside its flag
    result = CliRunner().invoke(main, [*path, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for param in options:
        first_words = " ".join(param.help.split()[:3])
        assert first_words in text, (param.opts, first_words)
