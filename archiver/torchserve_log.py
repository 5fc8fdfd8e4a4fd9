"""What TorchServe's own logs say while it starts: which models it has registered (``startup_states``) and,
when it does not come up, why (``startup_problem``: a model it could not register, a crash-looping worker,
no Java). ``server`` is an archiver.server.Server (its ``logs`` directory, its ``home``, its ``models``)."""

import itertools
import re
from pathlib import Path
from typing import Dict, List, Optional

from serving.worker.ts_wire import RERAISE, cause_of

SNAPSHOT_RESTORE = re.compile(r"SnapshotManager - Validating snapshot ")
MODEL_REGISTERED = re.compile(r"ModelManager - Model (\S+) loaded\.$")


def startup_states(server, registering: str = "extracting") -> Dict[str, str]:
    """What TorchServe's log says of its models before its APIs answer: it registers the snapshot's
    models one after the other (unpacking each archive, installing its requirements when the per-model
    install is on), then binds its APIs. A model registered ('Model NAME loaded.') is ``loading`` (its
    workers start), the first one not registered yet ``registering``; {} before the snapshot is read."""
    lines = _log_lines(server.logs / "ts_log.log")
    if not any(SNAPSHOT_RESTORE.search(line) for line in lines):
        return {}
    registered = {m.group(1) for m in map(MODEL_REGISTERED.search, lines) if m}
    states = {}
    for name in server.models:
        states[name] = "loading" if name in registered else registering
        if name not in registered:
            break
    return states


RETRY = re.compile(r"WorkerThread - Retry worker: \d+ in \d+ seconds\.")  # once a death (0.9.0 and 0.12.0)
PY_ERROR = re.compile(r"MODEL_LOG - \s*([A-Za-z_.]*(?:Error|Exception)\b.*)$")
REGISTRATION_ERROR = re.compile(r"\[ERROR\] main org\.pytorch\.serve\.(?:snapshot|wlm)\.\w+ - (.*)$")
JAVA_EXCEPTION = re.compile(r"^(?:[a-z]\w*\.)+([A-Z]\w*(?:Exception|Error)): (.+)$")
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT")


def _log_lines(path: Path) -> List[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def registration_failure(server) -> Optional[str]:
    """Why TorchServe refused to register a model (a failed per-model pip install, an archive it
    cannot read): the error line and the lines it continues on (pip's own ERROR lines if there are
    any); None while there is none."""
    lines = _log_lines(server.logs / "ts_log.log")
    for number, line in enumerate(lines):
        match = REGISTRATION_ERROR.search(line)
        if match:
            more = list(itertools.takewhile(lambda text: not LOG_LINE.match(text), lines[number + 1 : number + 200]))
            more = [text.strip() for text in more if text.strip()]
            errors = [text for text in more if text.startswith("ERROR:")]
            return " ".join([match.group(1).strip()] + (errors or more[:3]))
    return None


def worker_failure(server) -> Optional[str]:
    """The worker's own error once workers have died twice (a crash loop), else None. A death is a retry
    TorchServe schedules: one death logs "died" and "failed" in several lines, before the worker's own
    error reaches model_log.log; ts_log.log holds each line twice, the time telling deaths apart."""
    deaths = len({line for line in _log_lines(server.logs / "ts_log.log") if RETRY.search(line)})
    if deaths < 2:
        return None
    return last_python_error(server) or "see the log"


def last_python_error(server) -> Optional[str]:
    """The worker's last real Python error: not TorchServe's re-raise of it, not its fallback import."""
    lines = _log_lines(server.logs / "model_log.log")
    errors = [m.group(1).strip() for m in map(PY_ERROR.search, lines) if m and not RERAISE.match(m.group(1))]
    return cause_of(errors)


WORKER_OF = re.compile(r"\bW-\d+-(\S+)_[^_\s]+-std(?:out|err) MODEL_LOG - ")  # W-9000-resnet18_1.0-stdout


def failing_model(server) -> Optional[str]:
    """The model whose worker logged the last Python error (its worker's name: W-PORT-MODEL_VERSION)."""
    for line in reversed(_log_lines(server.logs / "model_log.log")):
        error = PY_ERROR.search(line)
        worker = error and WORKER_OF.search(line)
        if worker and not RERAISE.match(error.group(1)):
            return worker.group(1)
    return None


def startup_problem(server) -> str:
    """The best reason the logs give for a server that did not come up; never access-log noise."""
    reason = registration_failure(server) or last_python_error(server)
    if reason:
        return reason
    out = _log_lines(Path(server.home) / "torchserve.out")
    if any("java not found" in line.lower() for line in out):  # TorchServe's launcher says only this
        return (
            "TorchServe found no Java: install Java 17 and put it on PATH or set JAVA_HOME "
            "('tsctl doctor' checks; --engine tsctl needs no Java)"
        )
    exceptions = [m.group(1) + ": " + m.group(2) for m in map(JAVA_EXCEPTION.match, out) if m]
    if exceptions:
        return exceptions[0]
    return f"no error in the logs; see {server.logs} and {Path(server.home) / 'torchserve.out'}"
