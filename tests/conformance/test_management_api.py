"""TorchServe's management API and token authorization, the same calls to TorchServe 0.12 and to tsctl's
engine (tests/helpers/management.py: one of each for the module, both with TorchServe's defaults but
``enable_model_api=true``), statuses and bodies compared after normalising pids, worker ids, times and
memory. Where the engine answers otherwise on purpose, the test says what each answers (the list is in
docs/engines.md).

The smoke (the default run, 8 to 15 s: most of it the two servers starting) compares the token checks
and the read-only calls; the rest is ``matrix``.
"""

import http.client
import time
import urllib.parse

import grpc
import pytest

from archiver import server
from helpers.management import SIDES, build_store, normal, pair, query, write_config
from helpers.paths import short_tmp

TOKEN_FAILED = "Token Authorization failed. Token either incorrect, expired, or not provided correctly"
TOKEN_API_FAILED = "Token Authentication failed. Token either incorrect, expired, or not provided correctly"
INVALID_KEY = {"code": 400, "type": "InvalidKeyException", "message": TOKEN_FAILED}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("management")
    build_store(root)
    return root


@pytest.fixture(scope="module")
def servers(root):
    homes = {side: short_tmp(f"mg-{side[:2]}-") for side in SIDES}
    with pair(root, write_config(root), homes) as running:
        yield running


def same(servers, method, path, **options):
    """The answer both give to one call (normalised), after asserting they are equal."""
    answers = {side: servers[side].call(method, path, **options) for side in SIDES}
    got = {side: (status, normal(body)) for side, (status, body) in answers.items()}
    assert got["torchserve"] == got["tsctl"], (method, path, got)
    return got["tsctl"]


def each(servers, method, path, **options):
    """Each side's answer (normalised), for calls where they differ on purpose."""
    return {side: (lambda a: (a[0], normal(a[1])))(servers[side].call(method, path, **options)) for side in SIDES}


def test_smoke_keys_listing_and_describe(servers):
    for key in (None, "Bearer wrong-key", "management", "bearer KEY", "API"):
        assert same(servers, "POST", "/predictions/echo", key=key, body=b"hi") == (400, INVALID_KEY)
    for key in (None, "Bearer wrong-key", "inference", "API"):
        assert same(servers, "GET", "/models", key=key) == (400, INVALID_KEY)
    assert same(servers, "GET", "/nowhere", key=None) == (400, INVALID_KEY)  # the key before the route
    answers = each(
        servers, "POST", "/predictions/echo", key="inference", body=b"hi", headers={"Content-Type": "text/plain"}
    )
    assert {(status, body["echo"]) for status, body in answers.values()} == {(200, "hi")}, answers
    assert same(servers, "GET", "/models") == (200, {"models": [{"modelName": "echo", "modelUrl": "echo.mar"}]})
    status, described = same(servers, "GET", "/models/echo")
    assert status == 200 and described[0]["minWorkers"] == 1 and described[0]["loadedAtStartup"] is False
    assert same(servers, "GET", "/models/nope")[1]["type"] == "ModelNotFoundException"
    assert same(servers, "GET", "/models/echo/9.9")[1]["type"] == "ModelVersionNotFoundException"
    assert same(servers, "GET", "/token?type=inference", key="management") == (
        400,
        {"code": 400, "type": "InvalidKeyException", "message": TOKEN_API_FAILED},
    )


def raw_answer(base: str, method: str, path: str, key: str, body=None):
    """(status, the body's bytes as sent) of one call."""
    parts = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        connection.request(method, path, body=body, headers={"Authorization": f"Bearer {key}"})
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def test_error_bodies_are_torchserves_byte_for_byte(servers):
    """Every error the engine makes itself is TorchServe's frontend's body as it sends it: indented by two
    spaces, a line break after (one builder: handlers/errors.py's frontend_error); before, an unknown model
    on /predictions was compact JSON on the engine."""
    calls = (("POST", "/predictions/nope"), ("POST", "/predictions/echo/9.9"), ("GET", "/nowhere"))
    for method, path in calls:
        answers = {
            side: raw_answer(
                servers[side].srv.inference,
                method,
                path,
                servers[side].key("inference"),
                b"x" if method == "POST" else None,
            )
            for side in SIDES
        }
        assert answers["tsctl"] == answers["torchserve"], (method, path, answers)
        assert answers["tsctl"][0] >= 400 and answers["tsctl"][1].startswith(b'{\n  "code": '), answers
    ping = {
        side: raw_answer(servers[side].srv.inference, "GET", "/ping", servers[side].key("inference")) for side in SIDES
    }
    assert ping["tsctl"] == ping["torchserve"] == (200, b'{\n  "status": "Healthy"\n}\n'), ping
    engine = servers["tsctl"]
    status, body = raw_answer(engine.srv.inference, "POST", "/v1/models/nope:predict", engine.key("inference"), b"{}")
    assert status == 404 and body.startswith(b'{\n  "code": 404,') and body.endswith(b'"\n}\n'), body  # KServe's too


def wait_for(check, timeout: float = 60, what: str = ""):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.3)


def settled(servers, before: dict):
    """Every process each side ran before runs still, and nothing else (no worker left, none lost)."""
    for side in SIDES:
        wait_for(lambda: servers[side].descendants() == before[side], 30, f"{side}'s processes as before")


@pytest.mark.matrix  # two registers, two scales, an unregister on each side: about 25 s
def test_register_scale_set_default_and_unregister(servers):
    before = {side: servers[side].descendants() for side in SIDES}
    register = "/models" + query(url="echo2.mar", initial_workers=1, synchronous="true")
    registered = 'Model "echo" Version: 2.0 registered with 1 initial workers'
    assert same(servers, "POST", register) == (200, {"status": registered})
    conflict = "Model version 2.0 is already registered for model echo"
    assert same(servers, "POST", register) == bad(409, "ConflictStatusException", conflict)
    status, described = same(servers, "GET", "/models/echo/all")
    assert [m["modelVersion"] for m in described] == ["1.0", "2.0"] and described[1]["modelUrl"] == "echo2.mar"
    assert same(servers, "PUT", "/models/echo/2.0/set-default") == (
        200,
        {"status": 'Default version successfully updated for model "echo" to "2.0"'},
    )
    assert same(servers, "GET", "/models")[1]["models"] == [{"modelName": "echo", "modelUrl": "echo2.mar"}]
    assert same(servers, "PUT", "/models/echo" + query(min_worker=2, synchronous="true")) == (
        200,
        {"status": "Workers scaled to 2 for model: echo"},
    )
    status, described = same(servers, "GET", "/models/echo")
    assert (described[0]["minWorkers"], [w["status"] for w in described[0]["workers"]]) == (2, ["READY", "READY"])
    assert same(servers, "PUT", "/models/echo/2.0" + query(min_worker=1)) == (
        202,
        {"status": "Processing worker updates..."},
    )
    for side in SIDES:
        wait_for(lambda: len(servers[side].workers("echo", "2.0")) == 1, 60, f"{side} scaled down")
    default = "Cannot remove default version for model echo"
    assert same(servers, "DELETE", "/models/echo/2.0") == bad(403, "InvalidModelVersionException", default)
    assert same(servers, "PUT", "/models/echo/1.0/set-default")[0] == 200
    assert same(servers, "DELETE", "/models/echo/2.0") == (200, {"status": 'Model "echo" unregistered'})
    status, described = same(servers, "GET", "/models/echo/all")
    assert [m["modelVersion"] for m in described] == ["1.0"]
    settled(servers, before)


@pytest.mark.matrix  # models of no worker, listed in pages: about 10 s
def test_pages_and_a_model_without_workers(servers):
    for name in ("a1", "a2", "a3"):
        message = (
            f'Model "{name}" Version: 1.0 registered with 0 initial workers. Use scale workers API to add '
            "workers for the model."
        )
        assert same(servers, "POST", "/models" + query(url="echo.mar", model_name=name)) == (200, {"status": message})
    for options in (
        {"limit": 2},
        {"limit": 2, "next_page_token": 2},
        {"limit": 0},
        {"limit": 500},
        {"next_page_token": 9},
        {"limit": 1, "next_page_token": 3},
        {"limit": -1},
    ):
        status, page = same(servers, "GET", "/models" + query(**options))
        assert status == 200 and "models" in page, page
    assert same(servers, "GET", "/models" + query(limit=2))[1] == {
        "nextPageToken": "2",
        "models": [{"modelName": "a1", "modelUrl": "echo.mar"}, {"modelName": "a2", "modelUrl": "echo.mar"}],
    }
    status, body = same(servers, "POST", "/predictions/a1", key="inference", body=b"x")
    assert (status, body["type"]) == (503, "ServiceUnavailableException") and "has no worker" in body["message"]
    assert same(servers, "PUT", "/models/a1" + query(min_worker=1, synchronous="true"))[0] == 200
    answers = each(servers, "POST", "/predictions/a1", key="inference", body=b"x")
    assert {status for status, _ in answers.values()} == {200}, answers
    for name in ("a1", "a2", "a3"):
        assert same(servers, "DELETE", f"/models/{name}") == (200, {"status": f'Model "{name}" unregistered'})


def bad(status: int, kind: str, message: str) -> tuple:
    return status, {"code": status, "type": kind, "message": message}


def refused_alike(servers, root):
    """Bad calls both answer with the same 4xx (or TorchServe's 500 for a store file named by URL)."""
    store = root / "model-store"
    not_found, version = "ModelNotFoundException", "ModelVersionNotFoundException"
    no_version = "Model version: 9.9 does not exist for model: echo"
    calls = [
        ("GET", "/models/nope", bad(404, not_found, "Model not found: nope")),
        ("GET", "/models/echo/9.9", bad(404, version, no_version)),
        ("PUT", "/models/nope" + query(min_worker=1), bad(404, not_found, "Model not found: nope")),
        ("PUT", "/models/echo/9.9" + query(min_worker=1), bad(404, version, no_version)),
        (
            "PUT",
            "/models/echo" + query(min_worker=3, max_worker=2),
            bad(400, "BadRequestException", "max_worker cannot be less than min_worker."),
        ),
        ("DELETE", "/models/nope", bad(404, not_found, "Model not found: nope")),
        ("DELETE", "/models/echo/9.9", bad(404, version, no_version)),
        ("PUT", "/models/nope/1.0/set-default", bad(404, not_found, "Model not found: nope")),
        ("PUT", "/models/echo/9.9/set-default", bad(404, version, "Model version 9.9 does not exist for model echo")),
        ("POST", "/models", bad(400, "BadRequestException", "Parameter url is required.")),
        ("POST", "/models?url=", bad(404, not_found, "empty url")),
        ("POST", "/models?url=../echo.mar", bad(404, not_found, "Relative path is not allowed in url: ../echo.mar")),
        ("POST", "/models?url=nothere.mar", bad(404, not_found, "Model not found at: nothere.mar")),
        (
            "POST",
            "/models" + query(url="http://example.com/x.mar"),
            bad(404, not_found, "Given URL http://example.com/x.mar does not match any allowed URL(s)"),
        ),
        (
            "POST",
            "/models" + query(url=f"file://{store}/echo.mar"),
            bad(500, "InternalServerException", "Model file already exists echo.mar"),
        ),
        ("POST", "/models/echo", bad(405, "MethodNotAllowedException", NOT_ALLOWED)),
        ("PATCH", "/models/echo", bad(405, "MethodNotAllowedException", NOT_ALLOWED)),
        ("PUT", "/models", bad(405, "MethodNotAllowedException", NOT_ALLOWED)),
        ("GET", "/models/echo/all/extra", bad(404, "ResourceNotFoundException", NOT_FOUND)),
    ]
    for method, path, expected in calls:
        assert same(servers, method, path) == expected, (method, path)
    assert same(servers, "POST", "/predictions/nope", key="inference", body=b"x") == bad(
        404, not_found, "Model not found: nope"
    )
    assert same(servers, "POST", "/predictions/echo/9.9", key="inference", body=b"x") == bad(404, version, no_version)


NOT_ALLOWED = "Requested method is not allowed, please refer to API document."
NOT_FOUND = "Requested resource is not found, please refer to API document."


@pytest.mark.matrix  # about 20 s: TorchServe takes some of these, and is put back each time
def test_bad_input_is_one_4xx_changes_nothing_and_leaks_no_worker(servers, root):
    engine, torchserve = servers["tsctl"], servers["torchserve"]
    before = {
        "engine": engine.descendants(),
        "listed": same(servers, "GET", "/models"),
        "described": same(servers, "GET", "/models/echo/all"),
    }
    refused_alike(servers, root)
    absent = f"file://{root / 'model-store'}/absent.mar"
    got = each(servers, "POST", "/models" + query(url=absent))
    assert {status for status, _ in got.values()} == {400}, got
    assert got["tsctl"][1]["message"].startswith(got["torchserve"][1]["message"]), got  # the engine says why too

    # TorchServe takes these (and changes state: put back after each); the engine refuses them, changing nothing.
    differing = [
        ("PUT", "/models/echo" + query(min_worker="abc", synchronous="true"), "min_worker='abc' is not a whole number"),
        ("GET", "/models" + query(limit="abc"), "limit='abc' is not a whole number"),
        ("PUT", "/models/echo" + query(min_worker=0, synchronous="true"), "min_worker is 0"),
        ("PUT", "/models/echo" + query(min_worker=1, max_worker=101, synchronous="true"), "max_worker is 101"),
        ("POST", "/models" + query(url="echo2.mar", batch_size=0, initial_workers=1), "batch_size is 0"),
        ("POST", "/models" + query(url="echo2.mar", initial_workers=-1), "initial_workers is -1"),
    ]
    for method, path, message in differing:
        got = each(servers, method, path)
        assert got["torchserve"][0] in (200, 202), (path, got)
        assert got["tsctl"][0] == 400 and got["tsctl"][1]["message"].startswith(message), (path, got)
        put_back(torchserve)
    got = each(servers, "POST", "/models" + query(url="broken.mar", initial_workers=1, synchronous="true"))
    assert got["torchserve"] == bad(
        500, "InternalServerException", "Failed to start workers for model broken version: 1.0"
    )
    assert got["tsctl"] == bad(
        400,
        "InvalidModelException",
        "Failed to start workers for model broken version: 1.0: RuntimeError: this model cannot load",
    ), got
    assert torchserve.call("GET", "/models/broken")[0] == 200  # TorchServe keeps it, with no worker
    assert engine.call("GET", "/models/broken")[0] == 404
    put_back(torchserve)
    assert same(servers, "GET", "/models") == before["listed"]
    assert same(servers, "GET", "/models/echo/all") == before["described"]
    wait_for(lambda: engine.descendants() == before["engine"], 30, "the engine's processes as before")


def put_back(torchserve):
    """TorchServe as the module's servers start: echo 1.0 alone, 1 to 2 workers, no other model."""
    for name in ("broken", "echo/2.0"):
        torchserve.call("DELETE", f"/models/{name}")
    status, _ = torchserve.call("PUT", "/models/echo/1.0" + query(min_worker=1, max_worker=2, synchronous="true"))
    assert status == 200


GRPC_PING = {
    "torchserve": "/org.pytorch.serve.grpc.inference.InferenceAPIsService/Ping",
    "tsctl": "/inference.GRPCInferenceService/ServerLive",
}


def grpc_call(side, key) -> tuple:
    """(status code, details) of a unary call to the side's gRPC inference port with ``key`` as its
    ``authorization`` metadata (None: none); both methods take an empty message."""
    metadata = [] if key is None else [("authorization", key)]
    with grpc.insecure_channel(side.srv.grpc) as channel:
        call = channel.unary_unary(GRPC_PING[side.name], request_serializer=None, response_deserializer=None)
        try:
            call(b"", metadata=metadata, timeout=30)
        except grpc.RpcError as exc:
            return exc.code(), exc.details()
    return grpc.StatusCode.OK, None


@pytest.mark.matrix  # about 5 s
def test_token_api_kserve_paths_metrics_and_grpc(servers):
    old = {side: servers[side].key("management") for side in SIDES}
    assert same(servers, "POST", "/token?type=management", key="API") == (200, "\n")
    assert all(servers[side].key("management") != old[side] for side in SIDES)
    for side in SIDES:  # the old key no longer opens the API, the new one does
        assert servers[side].call("GET", "/models", key=f"Bearer {old[side]}") == (400, INVALID_KEY)
    assert same(servers, "GET", "/models")[0] == 200
    api_failed = (400, {"code": 400, "type": "InvalidKeyException", "message": TOKEN_API_FAILED})
    for path, key in (
        ("/token?type=wrong", "API"),
        ("/token", "API"),
        ("/token?type=inference", "management"),
        ("/token?type=inference", None),
    ):
        assert same(servers, "GET", path, key=key) == api_failed, path
    assert same(servers, "GET", "/token?type=inference", key="API", api="inference") == (400, INVALID_KEY)
    assert same(servers, "GET", "/token?type=inference", key="inference", api="inference") == bad(
        404, "ResourceNotFoundException", NOT_FOUND
    )
    for method, path in (
        ("POST", "/v1/models/echo:predict"),
        ("POST", "/v2/models/echo/infer"),
        ("GET", "/v2/health/ready"),
        ("GET", "/ping"),
    ):
        body = b"{}" if method == "POST" else None
        assert same(servers, method, path, key=None, body=body) == (400, INVALID_KEY), path
    assert {servers[side].call("GET", "/ping", key="inference")[0] for side in SIDES} == {200}
    assert {server.request(servers[side].srv.metrics_url, timeout=30)[0] for side in SIDES} == {200}  # no key
    for side in SIDES:
        inference = servers[side].key("inference")
        for key in (None, "Bearer wrong", f"Bearer {servers[side].key('management')}", f"bearer {inference}"):
            assert grpc_call(servers[side], key) == (grpc.StatusCode.PERMISSION_DENIED, TOKEN_FAILED), (side, key)
        assert grpc_call(servers[side], f"Bearer {inference}") == (grpc.StatusCode.OK, None), side


@pytest.mark.matrix  # its own pair of servers, keys of 30 s: about 50 s
def test_expired_keys_and_the_model_api_off(root):
    config = write_config(root, "short.properties", enable_model_api="false", token_expiration_min="0.5")
    homes = {side: short_tmp(f"mx-{side[:2]}-") for side in SIDES}
    with pair(root, config, homes) as servers:
        assert same(servers, "POST", "/token?type=inference", key="API") == (200, "\n")
        made = time.monotonic()
        for method, path in (("POST", "/models?url=echo2.mar"), ("DELETE", "/models/echo"), ("PUT", "/models")):
            assert same(servers, method, path) == bad(405, "MethodNotAllowedException", NOT_ALLOWED), path
        for path in ("/models/echo" + query(min_worker=1, synchronous="true"), "/models/echo/1.0/set-default"):
            got = each(servers, "PUT", path)  # TorchServe 0.12 scales and sets the default with the model API off
            assert got["torchserve"][0] == 200 and got["tsctl"] == bad(405, "MethodNotAllowedException", NOT_ALLOWED)
        answers = each(servers, "POST", "/predictions/echo", key="inference", body=b"x")
        assert {status for status, _ in answers.values()} == {200}
        time.sleep(max(0.0, made + 31 - time.monotonic()))
        assert same(servers, "POST", "/predictions/echo", key="inference", body=b"x") == (400, INVALID_KEY)
        assert same(servers, "GET", "/models") == (400, INVALID_KEY)  # its key, made at start, expired too
        for kind in ("inference", "management"):
            assert same(servers, "POST", f"/token?type={kind}", key="API") == (200, "\n")  # the API key never expires
        answers = each(servers, "POST", "/predictions/echo", key="inference", body=b"x")
        assert {status for status, _ in answers.values()} == {200}
        assert same(servers, "GET", "/models")[0] == 200


@pytest.mark.matrix  # TorchServe's gRPC management API, the model API and tokens on: about 5 s
def test_grpc_management_calls_with_the_model_api_on(servers, tmp_path):
    from helpers import ts_grpc

    stubs = ts_grpc.generate(tmp_path / "stubs")
    call = ts_grpc.call

    def run(side, wanted, key="management"):
        srv = servers[side].srv
        metadata = [("authorization", f"Bearer {servers[side].key(key)}")] if key else []
        wanted = [{**w, "metadata": metadata} for w in wanted]
        return ts_grpc.calls(stubs, srv.ts_grpc_inference, srv.ts_grpc_management, wanted)

    calls = [
        call("RegisterModel", url="echo2.mar", initial_workers=1, synchronous=True),
        call("ScaleWorker", model_name="echo", model_version="2.0", min_worker=2, synchronous=True),
        call("SetDefault", model_name="echo", model_version="2.0"),
        call("ListModels", limit=10),
        call("SetDefault", model_name="echo", model_version="1.0"),
        call("UnregisterModel", model_name="echo", model_version="2.0"),
        call("UnregisterModel", model_name="nope"),
        call("ScaleWorker", model_name="echo", model_version="9.9", min_worker=1),
        call("SetDefault", model_name="echo", model_version="9.9"),
        call("RegisterModel", url="nothere.mar"),
    ]
    got = {side: run(side, calls) for side in SIDES}
    assert got["torchserve"] == got["tsctl"], got
    assert [r["code"] for r in got["tsctl"]] == ["OK"] * 6 + ["NOT_FOUND"] * 3 + ["NOT_FOUND"], got["tsctl"]
    assert got["tsctl"][0]["messages"] == [{"msg": 'Model "echo" Version: 2.0 registered with 1 initial workers'}]
    assert got["tsctl"][6]["details"] == "Model not found: nope\norg.pytorch.serve.archive.model.ModelNotFoundException"
    for key in (None, "inference"):  # the management API's key only
        for side in SIDES:
            [denied] = run(side, [call("ListModels", limit=1)], key)
            assert (denied["code"], denied["details"]) == ("PERMISSION_DENIED", TOKEN_FAILED), (side, key, denied)
