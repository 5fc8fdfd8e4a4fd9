"""An archive's handler in this process: ``tsctl run`` and in-process ``tsctl verify``.

``run`` answers as ``tsctl predict`` does against a server ``tsctl config`` configured: each file is
one request (its content type from its suffix) in a batch of its own, as predict's requests reach a
worker one after the other; the handler gets the bodies as that worker would (a toolkit archive raw,
``decode_input_request=false``, as tsctl config and the tsctl engine set it; any other TorchServe's
default, parsed), with the archive's batchSize as its context's. A worker's log is not a terminal:
while the handler runs here its log lines and warnings are kept, not printed (``quiet_logs``; a
handler logs a traceback for a request it refuses, TorchServe one for a batch that failed), and a
batch the handler failed as a whole (TorchServe's frontend answers 503 ``Prediction failed``, 500
``Worker died.`` ...) is one ServerError naming the archive, the input and the handler's own error.

Nothing here imports torch until a model is loaded.
"""

import base64
import contextlib
import json
import logging
import traceback
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

from .errors import ServerError

# TorchServe's frontend's answers for a batch that failed as a whole (serving/ts_wire.batch_error).
FRONTEND_ERROR = "InternalServerException"


@contextlib.contextmanager
def quiet_logs() -> Iterator[List[logging.LogRecord]]:
    """Keep every log record (and warning) emitted inside instead of printing it; yields the list."""
    records: List[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    keep, root = Keep(logging.DEBUG), logging.getLogger()
    root.addHandler(keep)  # with a handler on the root, logging's last resort (stderr) stays silent
    logging.captureWarnings(True)
    try:
        yield records
    finally:
        logging.captureWarnings(False)
        root.removeHandler(keep)


def handler_error(records: Sequence[logging.LogRecord], model_dir: Optional[Path] = None) -> Optional[str]:
    """The handler's own error among the log records: the last exception logged, as ``Type: message``
    and, when it was raised in the archive's code, where (``file.py:LINE in function``)."""
    for record in reversed(records):
        exc_info = record.exc_info or getattr(record, "raised", None)  # log_text keeps it as ``raised``
        if not exc_info or exc_info[1] is None:
            continue
        exc = exc_info[1]
        text = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
        where = None
        for frame in traceback.extract_tb(exc.__traceback__):
            if model_dir is not None and Path(frame.filename).is_relative_to(model_dir):
                where = f"{Path(frame.filename).relative_to(model_dir)}:{frame.lineno} in {frame.name}"
        return f"{text} ({where})" if where else text
    return None


def failed_whole(response) -> bool:
    """True for TorchServe's frontend's answer to a batch the handler failed as a whole."""
    if response.status < 500:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("type") == FRONTEND_ERROR


def batch_size(archive) -> int:
    """The batchSize a server gives the archive (an Archive): its model-config.yaml's (as 'tsctl config'
    writes it), else 1."""
    value = archive.config.get("batchSize", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def run(
    archive,
    paths: Sequence[Path],
    public_key: Optional[str] = None,
    progress: Callable[[str], None] = lambda message: None,
    expected: Tuple[Optional[str], Optional[str]] = (None, None),
) -> List[Tuple[Path, object]]:
    """(path, Response) for each file, answered as ``tsctl predict`` would be answered (module
    docstring). The handler's failure to load is raised as it is (the caller names it); its failure on
    a batch is a ServerError naming ``archive``, the input and the handler's error. With ``public_key``
    the archive must be signed as ``expected`` (name, version; None: any)."""
    from handlers import identity
    from handlers.archives import opened

    with opened(archive) as archive, quiet_logs() as records:  # the archive read once: record, config, files
        raw = identity.read(archive) is not None  # a toolkit handler: served with decode_input_request=false
        progress(f"loading {archive.path.name}")
        from serving.testing import LocalModel  # torch: seconds

        model = LocalModel(
            archive,
            batch_size=batch_size(archive),
            decode_input_request=not raw,
            public_key=public_key,
            expected=expected,
        )
        with model:
            answered = []
            for number, path in enumerate(paths, 1):
                seen = len(records)
                [response] = model.predict([Path(path)])
                if failed_whole(response):
                    cause = handler_error(records[seen:], model.model_dir) or response.json().get("message")
                    raise ServerError(f"{archive.path}: the handler failed on {path}: {cause}")
                answered.append((Path(path), response))
                progress(f"{number}/{len(paths)} {path}: {response.status}")
    return answered


def line(path, response) -> str:
    """``PATH: STATUS ANSWER`` as 'tsctl predict' prints it (a binary answer by its size and type)."""
    answer = response.answer()
    if isinstance(answer, bytes):
        return f"{path}: {response.status} <{len(answer):,} bytes of {response.content_type}>"
    return f"{path}: {response.status} {json.dumps(answer)}"


def as_json(path, response) -> dict:
    """One result of 'tsctl run --json' (docs/json-output.md): a binary answer in base64, flagged."""
    answer = response.answer()
    binary = isinstance(answer, bytes)
    return {
        "path": str(path),
        "status": response.status,
        "content_type": response.content_type,
        "answer": base64.b64encode(answer).decode("ascii") if binary else answer,
        "base64": binary,
    }
