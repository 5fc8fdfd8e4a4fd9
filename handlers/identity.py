"""What a toolkit archive says about its handler: ``MAR-INF/tsctl.json``, written by ``tsctl package``.

    {"toolkit": "0.1.0", "entry": "my_handler.py:handle", "module": "my_handler", "class": "Sentiment",
     "bases": ["handlers.text_classification.TextClassifier", ...], "input": "text", "splits": false}

``tsctl package`` finds the handler class behind the entry point (a toolkit handler, or a subclass
of one in the user's ``--handler`` file), validates its ``handler:`` settings and merges its
requirements, then records it here. Everything after packaging asks this record, never the
manifest's handler string: whether an archive is a toolkit handler (config's
``decode_input_request``, export's batch sizes under KServe's envelopes), what its requests hold
(``input``: image, text, tensor, any), and whether its pre/post can run apart from its model as a
KServe transformer (``splits``). An archive without the record (torch-model-archiver's, or a
handler that is not a toolkit one) is treated as a handler of its own. No torch here: the CLI reads
it without loading any model code.
"""

import json
from typing import Optional

from . import archives

RECORD = "MAR-INF/tsctl.json"
VERSION = "0.1.0"  # the toolkit's version, as pyproject.toml says
MAX_RECORD_BYTES = 64 << 10


def describe(declared, entry: str, module: str) -> dict:
    """The record for the handler class of ``module`` that ``declared`` (a catalogue.Declared) describes,
    served by ``entry``."""
    return {
        "toolkit": VERSION,
        "entry": entry,
        "module": module,
        "class": declared.class_name,
        "bases": list(declared.bases),
        "input": declared.input,
        "splits": declared.splits,
        "v2": declared.v2,  # KServe v2 model metadata (serving/v2_metadata.py)
    }


def encode(record: dict) -> bytes:
    return (json.dumps(record, indent=2, sort_keys=True) + "\n").encode("utf-8")


def read(archive: archives.ArchiveLike) -> Optional[dict]:
    """The archive's record (an Archive's, read once; a path is opened for the call), or None when it has
    none (not a toolkit handler). A record that is not a JSON object is refused (ArchiveError) rather
    than guessed at."""
    with archives.opened(archive) as opened:
        record = opened.read_json(RECORD, MAX_RECORD_BYTES)
        if record is None:
            return None
        if not isinstance(record, dict) or not isinstance(record.get("input"), str):
            raise archives.ArchiveError(f"{opened.path}: {RECORD} is not a tsctl handler record: package it again")
        return record
