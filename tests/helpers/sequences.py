"""A request of a sequence (sequence batching, serving/engine/sequences.py), as a stateful model's client
sends it: ``ts_request_sequence_id`` (none: the server opens a sequence), ``ts_request_sequence_end``."""

from archiver import server


def post(url: str, model: str, body, sequence=None, end=False, timeout: float = 30):
    """(status, answer) of POST url/predictions/MODEL; a frontend's error answer as (type, message)."""
    headers = {"Content-Type": "text/plain"}
    if sequence:
        headers["ts_request_sequence_id"] = sequence
    if end:
        headers["ts_request_sequence_end"] = "true"
    status, answer = server.request(f"{url}/predictions/{model}", str(body).encode(), "POST", headers, timeout)
    if isinstance(answer, dict) and "message" in answer:
        answer = (answer.get("type"), answer["message"])
    return status, answer
