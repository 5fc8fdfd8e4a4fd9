class UserError(Exception):
    """A mistake the user can fix: the CLI prints the message (one sentence) and exits 2, no traceback."""

    exit_code = 2


class ServerFailure(Exception):
    """TorchServe did not come up, or answered with an error; the CLI prints it and exits 1."""

    exit_code = 1


def make_directory(path, flag: str):
    """Make directory ``path`` (and its parents) for ``flag``, or a one-line UserError saying why not: a
    file in the way, no permission."""
    from pathlib import Path

    path = Path(path)
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            raise UserError(f"{flag} {path}: {part} is a file, not a directory: give a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot create it ({exc.strerror}): give a directory you can write") from None
    return path
