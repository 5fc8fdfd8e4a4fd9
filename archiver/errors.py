class UserError(Exception):
    """A mistake the user can fix: the CLI prints the message (one sentence) and exits 2, no traceback."""

    exit_code = 2


class ServerError(Exception):
    """TorchServe did not come up, or answered with an error; the CLI prints it and exits 1."""

    exit_code = 1
