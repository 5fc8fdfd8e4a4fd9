"""TorchServe's worker with its metrics on a channel of their own: what the tsctl engine runs for a worker.

    python serving/worker/worker_launch.py FD .../ts/model_service_worker.py --sock-type unix --sock-name ...

TorchServe's worker writes everything to stdout: its log, the handler's prints, and the metrics its
``ts.metrics.caching_metric`` logger emits (``[METRICS]HandlerTime.ms:...``, what ``context.metrics``
records). A frontend reading metrics from stdout also reads any line a handler prints, request data
included. This sends that one logger's records to the pipe ``FD`` instead (one record a line, line
breaks in a record escaped), then runs ``model_service_worker.py`` unchanged, as ``__main__``, with
the rest of the arguments: the worker is otherwise exactly TorchServe's (its own ``sys.path``, its
logging on stdout), but that it is a child subreaper (``subreaper``: what it forks stays below it).
The engine reads metrics from ``FD`` only (``worker_process.start_worker``).

Run by path, not with ``-m``: this file's folder is taken off ``sys.path`` first, and the worker's
path is then the one TorchServe gives it (the model's folder on ``PYTHONPATH``). Standard library only.
"""

import os
import sys

if sys.path and os.path.realpath(sys.path[0] or os.curdir) == os.path.dirname(os.path.realpath(__file__)):
    del sys.path[0]  # handlers/ is not a folder of top-level modules: nothing is imported from it

import logging  # noqa: E402
import runpy  # noqa: E402

METRICS_LOGGER = "ts.metrics.caching_metric"  # the logger TorchServe's CachingMetric.emit_metrics writes to


class OneLine(logging.Formatter):
    """A record as one line: a line break in it (a dimension's value) cannot start another."""

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace("\r", "\\r").replace("\n", "\\n")


def subreaper():
    """Make the worker a child subreaper (Linux's PR_SET_CHILD_SUBREAPER): what its handler forks stays
    below it even once it double-forks and leaves the worker's session, and is ended with it
    (serving/worker/process_tree.py, which this file, run by path, cannot import)."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # 36: PR_SET_CHILD_SUBREAPER
    except (AttributeError, OSError):  # no prctl: not Linux
        pass


def main():
    subreaper()
    fd, script = int(sys.argv[1]), sys.argv[2]
    channel = logging.StreamHandler(os.fdopen(fd, "w", encoding="utf-8", errors="replace", buffering=1))
    channel.setFormatter(OneLine("%(message)s"))
    metrics = logging.getLogger(METRICS_LOGGER)
    metrics.addHandler(channel)
    metrics.setLevel(logging.INFO)
    metrics.propagate = False  # not on stdout as well
    sys.argv = [script, *sys.argv[3:]]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
