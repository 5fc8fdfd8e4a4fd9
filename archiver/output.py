"""What commands print besides their answer: ``--json`` (one JSON document on stdout, its schema in
docs/json-output.md) and progress on long waits (lines on stderr, only when stdout is a terminal, so
pipes and scripts see the answer alone)."""

import json
import sys
import time

import click


def json_option(f):
    """``--json``: the command prints one JSON document on stdout instead of its text."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="Print the result as one JSON document on stdout (schema: docs/json-output.md).",
    )(f)


def print_json(data) -> None:
    click.echo(json.dumps(data, indent=2))


def print_json_error(message: str, exit_code: int) -> None:
    """A failed ``--json`` command's document (docs/json-output.md, "Errors"): ``{"error": {"message",
    "exit_code"}}`` on stdout, besides the ``error: ...`` line on stderr and the exit code."""
    print_json({"error": {"message": message, "exit_code": exit_code}})


class Progress:
    """``progress("loading resnet18")`` prints ``[  3.2 s] loading resnet18`` on stderr when stdout is a
    terminal and the command prints text, else nothing. Elapsed seconds count from its creation."""

    def __init__(self, enabled: bool = None):
        self.enabled = sys.stdout.isatty() if enabled is None else enabled
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        if self.enabled:
            click.echo(f"[{time.monotonic() - self.started:5.1f} s] {message}", err=True)

    @classmethod
    def for_command(cls, as_json: bool = False) -> "Progress":
        """Progress for a command: off with --json, else on when stdout is a terminal."""
        return cls(False) if as_json else cls()


def quiet(message: str) -> None:
    """The progress of a caller that wants none (plain functions called from tests)."""
