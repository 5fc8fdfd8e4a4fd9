"""What every tsctl command shares: how it reports our errors, how it prints a report, and the checks
of what it was given (input files, the running server).

Each command parses its flags, calls one function, prints, and exits 0 on success, 2 for a user
mistake (one sentence, no traceback), 1 when the server or model fails.
"""

from contextlib import contextmanager
from pathlib import Path

import click

from ..errors import ServerFailure, UserError
from ..output import print_json, print_json_error

INTERRUPTED = "interrupted (Ctrl-C)"
INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C ended (click's own Abort: 1)


class Command(click.Command):
    """Runs the command and turns our errors into one line on stderr and an honest exit code; with
    ``--json``, the error is also a JSON document on stdout (``print_json_error``), for our errors and
    for click's own (a bad flag or value: click prints its usage lines on stderr and exits 2)."""

    def parse_args(self, ctx, args):
        as_json = "--json" in args  # before parsing, which consumes the list
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as error:
            if as_json:
                print_json_error(error.format_message(), error.exit_code)
            raise

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except our_errors() as error:
            if ctx.params.get("as_json"):
                print_json_error(str(error), error.exit_code)
            click.secho(f"error: {error}", fg="red", err=True)
            ctx.exit(error.exit_code)
        except KeyboardInterrupt:  # Ctrl-C: what ran cleans up as it unwinds (LocalModel, the staged writes)
            if ctx.params.get("as_json"):
                print_json_error(INTERRUPTED, INTERRUPTED_EXIT)
            click.secho(f"error: {INTERRUPTED}", fg="red", err=True)
            ctx.exit(INTERRUPTED_EXIT)


def our_errors() -> tuple:
    """The errors a command reports in one line (tsctl's own, and the archive readers'); imported when
    asked, so that --help loads no handlers."""
    from handlers.archives import ArchiveError
    from handlers.signing import SignatureError

    return (UserError, ServerFailure, ArchiveError, SignatureError)


@contextmanager
def handler_errors(archive):
    """Around an archive's handler run in-process: our errors pass as they are, any other (the handler's
    own, failing to load or to answer) becomes one line naming ``archive`` (``handler_failure``)."""
    try:
        yield
    except our_errors():
        raise
    except Exception as exc:
        raise handler_failure(archive, exc) from None


# The archive's own handlers/ copy raises these in its worker: matched by name; and LocalModel a socket
# path too long (a TMPDIR too deep, serving/worker/sockets.py).
USER_MISTAKES = {
    ("handlers.loading", "ModelLoadError"),
    ("handlers.settings", "SettingsError"),
    ("serving.worker.sockets", "SocketPathError"),
}


def handler_failure(archive, exc: Exception) -> Exception:
    """One line for a handler that failed to load or run in-process: the user's mistake (weights,
    settings: exit 2), else the handler's failure (exit 1)."""
    # a LoadError names the exception its worker raised (serving/local_model.py)
    module, _, name = getattr(exc, "error_type", f"{type(exc).__module__}.{type(exc).__name__}").rpartition(".")
    if (module, name) in USER_MISTAKES:
        return UserError(f"{archive}: {exc}")
    return ServerFailure(f"{archive}: the handler failed to load: {name}: {exc}")


def emit(report: dict, as_text, as_json: bool):
    """Print a command's report: as one JSON document (--json), else the lines ``as_text`` makes of it."""
    if as_json:
        print_json(report)
        return
    for line in as_text(report):
        click.echo(line)


def input_file(path: str) -> Path:
    """An input given on the command line: an existing regular file, else one-line UserError."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"input {path} is a directory: give the files in it")
    if not p.is_file():
        raise UserError(f"input {path} does not exist: check the path")
    return p


def running_server(home, model=None):
    """The live server 'tsctl serve' started from ``home`` (serving ``model``, when given), else one
    UserError saying where it looked and about --home (or which models it serves)."""
    from .. import engines, server

    srv = server.running(home)
    if model is not None:
        engines.require_model(srv, model)
    return srv
