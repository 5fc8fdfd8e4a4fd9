"""The PNGs commands draw (``bench --capacity --plot``, ``simulate --plot``): matplotlib, from the ``bench``
extra, loaded only when a plot is asked for, and a figure written or refused in one line."""

from ..errors import UserError


def pyplot():
    """matplotlib.pyplot with the file-only backend, or one line saying which extra has it."""
    try:
        import matplotlib
    except ImportError:
        raise UserError("--plot needs matplotlib: pip install 'tsctl[bench]' (or uv sync --extra bench)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(figure, path: str, dpi: int):
    """Write ``figure`` to ``path`` as --plot asked, and close it."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    try:
        figure.savefig(path, dpi=dpi)
    except OSError as exc:
        raise UserError(f"--plot {path}: cannot write it ({exc.strerror})") from None
    finally:
        plt.close(figure)
