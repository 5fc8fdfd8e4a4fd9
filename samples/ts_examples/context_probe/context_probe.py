"""What a worker gives a handler beyond the body (written for tsctl's conformance suite, issue #31 item 10):
a handler class whose ``initialize`` uses ``context.metrics`` and calls ``torch.set_num_threads(1)``, and
whose ``handle`` answers, per request of a batch, a JSON of

- ``header``: ``context.get_request_header(idx, "X-Probe")`` and the same header asked in lower case;
- ``status``: the status it set with ``context.set_response_status`` (299, "Probe Odd", for the odd
  indices of the batch; the even ones keep 200) and the batch's size;
- ``sys_path``: the worker's ``sys.path``, each entry named: MODEL_DIR, CWD, EMPTY (""), TS (TorchServe's
  package directory), SITE (the interpreter's own directories, consecutive ones as one), else OTHER;
- ``env``: the ``TS_*``, ``LOG_LOCATION``, ``METRICS_LOCATION``, ``PYTHONPATH`` and ``OMP_NUM_THREADS``
  variables, each path in them named as above;
- ``stdin``: "devnull", "closed" or what else file descriptor 0 is;
- ``threads``: ``torch.get_num_threads()`` before and after the handler's ``torch.set_num_threads(1)``;
- ``metrics``: the type of ``context.metrics`` in ``initialize`` and what adding a counter there did.
"""

import os
import stat
import sys
import sysconfig


def _label(path, model_dir, cwd):
    if path == "":
        return "EMPTY"
    real = os.path.realpath(path)
    if real == model_dir:
        return "MODEL_DIR"
    if real == cwd:
        return "CWD"
    import ts

    if real == os.path.realpath(os.path.dirname(ts.__file__)):
        return "TS"
    own = {os.path.realpath(sysconfig.get_path(key)) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    if real in own or real.startswith(os.path.realpath(sys.base_prefix)) or "site-packages" in real:
        return "SITE"
    return "OTHER"


def _labels(paths, model_dir, cwd):
    named = []
    for path in paths:
        label = _label(path, model_dir, cwd)
        if not (label == "SITE" and named and named[-1] == "SITE"):
            named.append(label)
    return named


def _stdin():
    try:
        mode = os.fstat(0)
    except OSError:
        return "closed"
    if stat.S_ISCHR(mode.st_mode) and mode.st_rdev == os.stat(os.devnull).st_rdev:
        return "devnull"
    for kind in ("FIFO", "SOCK", "REG", "CHR"):
        if getattr(stat, f"S_IS{kind}")(mode.st_mode):
            return kind.lower()
    return "other"


def _env(model_dir, cwd):
    names = [k for k in os.environ if k.startswith("TS_")]
    names += [k for k in ("LOG_LOCATION", "METRICS_LOCATION", "PYTHONPATH", "OMP_NUM_THREADS") if k in os.environ]
    shown = {}
    for name in sorted(names):
        value = os.environ[name]
        if name == "PYTHONPATH":
            value = _labels(value.split(os.pathsep), model_dir, cwd)
        elif os.path.isabs(value):
            value = _label(value, model_dir, cwd)
        shown[name] = value
    return shown


class ContextProbe:
    def __init__(self):
        self.initialized = False

    def initialize(self, context):
        import torch

        self.model_dir = os.path.realpath(context.system_properties.get("model_dir"))
        self.metrics = {"type": type(context.metrics).__name__}
        try:
            context.metrics.add_counter("ProbeLoads", 1)
            self.metrics["add_counter"] = "ok"
        except Exception as exc:  # noqa: BLE001 - what it raised is the answer
            self.metrics["add_counter"] = type(exc).__name__
        self.threads_before = torch.get_num_threads()
        torch.set_num_threads(1)
        self.initialized = True

    def handle(self, data, context):
        import torch

        cwd = os.path.realpath(os.getcwd())
        answers = []
        for idx, _ in enumerate(data):
            if idx % 2:
                context.set_response_status(299, "Probe Odd", idx)
            answers.append(
                {
                    "header": [context.get_request_header(idx, "X-Probe"), context.get_request_header(idx, "x-probe")],
                    "status": [299 if idx % 2 else 200, len(data)],
                    "cwd": _label(cwd, self.model_dir, ""),
                    "sys_path": _labels(sys.path, self.model_dir, cwd),
                    "env": _env(self.model_dir, cwd),
                    "stdin": _stdin(),
                    "threads": [self.threads_before, torch.get_num_threads()],
                    "metrics": self.metrics,
                }
            )
        return answers
