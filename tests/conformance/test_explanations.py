"""TorchServe's explanations (``InferenceRequestHandler``: POST /explanations/NAME[/VERSION], KServe's
``/v1/models/NAME:explain`` and ``/v2/models/NAME/explain``): the frontend adds the header ``explain:
True`` and BaseHandler.handle calls the handler's ``explain_handle``; on /predictions and /explanations it
adds ``url_path``, what follows NAME/VERSION. The engine does the same (serving/engine/app.py ``forward``),
checked against TorchServe 0.12 with samples/ts_examples/explain/'s handler (make matrix) and on the
engine alone (make test); a toolkit handler, which has no explanations, answers 501 naming the paths to
use."""

import json
import urllib.error
import urllib.request

import pytest

from archiver import properties
from helpers import side_by_side
from helpers.engine import Engine
from helpers.models import package_resnet
from samples import ts_examples
from serving.local_model import LocalModel, RequestInput

HANDLER = ts_examples.STAND_INS / "explain" / "explain_handler.py"
CALLS = [  # (path, body, whether the handler explains)
    ("/predictions/why", b"abc", False),
    ("/predictions/why/1.0", b"abc", False),
    ("/predictions/why/1.0/a/b", b"abcd", False),
    ("/explanations/why", b"abc", True),
    ("/explanations/why/1.0/c", b"ab", True),
    ("/v1/models/why:predict", b'{"instances": [1]}', False),
    ("/v1/models/why:explain", b'{"instances": [1]}', True),
    ("/v2/models/why/infer", b'{"inputs": []}', False),
    ("/v2/models/why/explain", b'{"inputs": []}', True),
]


def root_with_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("explain")
    example = ts_examples.Example("why", str(HANDLER), [])
    ts_examples.package(example, "torch-model-archiver", root / "model-store")
    properties.write_config(
        root / "model-store", root / "config" / "config.properties", extra={"disable_token_authorization": "true"}
    )
    return root


def answers(port: int) -> list:
    got = []
    for path, body, _ in CALLS:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}",
            data=body,
            method="POST",
            headers={"Content-Type": "application/octet-stream", "explain": "True"},
        )
        try:  # a client's own explain header changes nothing: the frontend's is the handler's
            with urllib.request.urlopen(request, timeout=60) as answer:
                got.append((path, answer.status, json.loads(answer.read())))
        except urllib.error.HTTPError as exc:
            got.append((path, exc.code, exc.read().decode()[:200]))
    return got


def test_the_engine_calls_explain_handle_as_torchserves_headers_ask(tmp_path_factory):
    root = root_with_store(tmp_path_factory)
    engine = Engine(root).wait_ready()
    try:
        got = answers(engine.http)
    finally:
        assert engine.stop() == 0
    ran = {path: (status, body["ran"] if isinstance(body, dict) else body) for path, status, body in got}
    assert ran == {path: (200, "explain_handle" if explains else "inference") for path, _, explains in CALLS}, got
    paths = {path: body.get("url_path") for path, _, body in got}
    assert paths["/predictions/why/1.0/a/b"] == "a/b" and paths["/explanations/why/1.0/c"] == "c"
    assert paths["/predictions/why"] == "" and paths["/v1/models/why:predict"] is None


@pytest.mark.matrix
def test_the_engine_answers_as_torchserve(tmp_path_factory):
    root = root_with_store(tmp_path_factory)
    with side_by_side.started(root, "tsx-") as (torchserve, engine):
        assert answers(side_by_side.http_port(torchserve)) == answers(engine.http)


def test_a_toolkit_handler_refuses_an_explanation_in_one_line(image_sample, jpegs, tmp_path):
    archive = package_resnet(image_sample, tmp_path / "store")
    with LocalModel(archive) as model:
        asked = [RequestInput(jpegs[0], {"Content-Type": "image/jpeg", "explain": flag}) for flag in ("True", "False")]
        explained, predicted = model.predict(asked)
    assert explained.status == 501 and "gives no explanations" in explained.json()["message"], explained
    assert predicted.status == 200
