"""A file sent to MLServer as ``tsctl predict --content-type`` sends it, and its answer read as a client reads
it: the JSON of output-0's one BYTES element (tests/engine/test_mlserver.py, tests/conformance/
test_body_decoding.py and test_conformance.py's MLServer column)."""

import json
from typing import Tuple

from archiver import engines, server
from handlers.errors import error_message

MLSERVER = engines.ENGINES["mlserver"]
ONE_ANSWER = [("output-0", "BYTES", [1])]  # (name, datatype, shape) of every output of one request's answer


class AnswerShape(AssertionError):
    """A 200 whose outputs are not one BYTES ``output-0`` of one element."""


def read_v2(status: int, body) -> object:
    """What a client reads of one request's v2 response: the JSON of output-0's one BYTES element (its
    outputs checked to be just that: AnswerShape otherwise), or the error's message."""
    if status != 200:
        return error_message(body)
    outputs = body.get("outputs") if isinstance(body, dict) else None
    shape = [(o.get("name"), o.get("datatype"), o.get("shape")) for o in outputs or [] if isinstance(o, dict)]
    if shape != ONE_ANSWER or len(outputs) != 1:
        raise AnswerShape(f"outputs {shape or body!r:.300} != {ONE_ANSWER}")
    return json.loads(outputs[0]["data"][0])


def ask_v2(srv, model: str, body: bytes, kind: str, timeout: float = 120) -> Tuple[int, object]:
    """(status, what a client reads) for ``body`` of Content-Type ``kind`` ("": none) sent to ``model`` as
    ``tsctl predict --content-type KIND`` sends it: one BYTES element (``as_request=False``: a JSON file
    is a body, not a v2 request)."""
    request, _ = MLSERVER.request_body(body, kind, as_request=False)
    status, answer = server.request(
        engines.predict_url(srv, model), request, "POST", {"Content-Type": "application/json"}, timeout
    )
    return status, read_v2(status, answer)
