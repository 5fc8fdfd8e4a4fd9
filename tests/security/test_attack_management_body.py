"""An outsider's attack on the engine's management API with big bodies (#43 case 4): a register whose JSON
body is as big as ``max_request_size`` allows. That bound is sized for inference (64 MiB here, as a store
of image models sets it), and the engine parsed the body whole into Python objects: a 60 MiB body of
``[],`` was answered after 36.6 s with the engine at 1.7 GB (69 s and 2.7 GB for the attacker). A
management call's body is now bounded by ``body_limit.MAX_MANAGEMENT_BODY`` (64 KiB) before it is read:
413 over REST, RESOURCE_EXHAUSTED over TorchServe's gRPC management API.

One engine for the module, inside a memory cgroup of its own (1 GiB), echo 1.0 on one worker as the
neighbour that must keep answering, the model API on; the engine's peak memory (VmHWM, reset before each
attack) and its pids checked around each attack."""

import http.client
import json

import grpc
import pytest

from archiver import server
from helpers.cgroups import peak_rss, reset_peak
from helpers.engine import snapshot_entry, write_config
from helpers.engine_limits import engine_in_cgroup
from helpers.management import build_store
from serving.engine import ts_protos as pb
from serving.engine.body_limit import MAX_MANAGEMENT_BODY

MAX_REQUEST = 64 << 20  # max_request_size, sized for inference
GROWTH = 32 << 20  # bytes the engine's peak may grow by while it refuses a body


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("management-body")
    build_store(root)
    config = root / "config" / "config.properties"
    config.parent.mkdir()
    write_config(config, {"echo": snapshot_entry("echo.mar", 1, 1, 0, 60)}, "enable_model_api=true\n")
    config.write_text(config.read_text().replace("max_request_size=16777216", f"max_request_size={MAX_REQUEST}"))
    with engine_in_cgroup(root, 1 << 30) as running:
        yield running


def state(engine) -> dict:
    """The engine's pid, its models and their workers' pids (from describe), and that the neighbour answers."""
    status, listed = engine.get("/models")
    assert status == 200, listed
    status, answer = engine.post("/predictions/echo", b"neighbour")
    assert status == 200 and answer["echo"] == "neighbour", answer
    return {"engine": engine.process.pid, "models": listed, "workers": [w["pid"] for w in engine.workers("echo")]}


def json_body(size: int) -> bytes:
    """A register's JSON body of about ``size`` bytes: its url, and a list of empty lists (each ``[],`` three
    bytes that json.loads makes a 56-byte list)."""
    return b'{"url": "echo2.mar", "x": [' + b"[]," * (size // 3) + b"[]]}"


def refused(status: int, body, size_text: str):
    assert status == 413, (status, body)
    assert body["code"] == 413 and body["type"] == "RequestEntityTooLarge", body
    assert size_text in body["message"] and f"{MAX_MANAGEMENT_BODY:,}" in body["message"], body


def chunked_register(engine, body: bytes, timeout: float = 30):
    """(status, JSON answer) of a register whose body is sent chunked (no Content-Length), 16 KiB a chunk."""
    connection = http.client.HTTPConnection("127.0.0.1", engine.http, timeout=timeout)
    try:
        chunks = (body[at : at + (16 << 10)] for at in range(0, len(body), 16 << 10))
        try:
            connection.request("POST", "/models", chunks, {"Content-Type": "application/json"}, encode_chunked=True)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while it was sent: the answer is read below
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


def grpc_register(engine, url: str, timeout: float = 30):
    """(status code, details) of TorchServe's gRPC RegisterModel with ``url``."""
    with grpc.insecure_channel(f"127.0.0.1:{engine.ts_grpc_management}") as channel:
        call = channel.unary_unary(
            f"/{pb.MANAGEMENT_SERVICE}/RegisterModel", response_deserializer=pb.ManagementResponse.FromString
        )
        try:
            call(pb.RegisterModelRequest(url=url).SerializeToString(), timeout=timeout)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as exc:
            return exc.code(), exc.details()


def test_a_big_register_body_is_refused_before_it_is_read(engine):
    """8 MiB of JSON, by Content-Length and chunked: 413 in TorchServe's shape at once, nothing registered,
    the engine's peak within GROWTH, the neighbour answering, no pid changed. Before the fix the body
    was parsed (a quarter of a GB) and echo 2.0 registered: 200."""
    before = state(engine)
    peak_before = reset_peak(engine.process.pid)
    body = json_body(8 << 20)
    status, answer = server.request(
        engine.url + "/models", body, "POST", {"Content-Type": "application/json"}, timeout=60
    )
    refused(status, answer, f"{len(body):,} bytes")
    status, answer = chunked_register(engine, json_body(128 << 10))
    refused(status, answer, "at least")
    grown = peak_rss(engine.process.pid) - peak_before
    print(f"engine peak grew {grown:,} bytes for an {len(body):,}-byte register body")
    assert grown < GROWTH, grown
    assert state(engine) == before


def test_a_small_register_body_still_registers(engine):
    """TorchServe's JSON register, well under the bound, registers as before."""
    body = json.dumps({"url": "echo2.mar", "initial_workers": 0}).encode()
    status, answer = engine.post("/models", body, "application/json")
    assert status == 200 and "registered with 0 initial workers" in answer["status"], answer
    status, answer = server.request(engine.url + "/models/echo/2.0", None, "DELETE", timeout=60)
    assert status == 200, answer


def test_a_big_grpc_register_is_refused_before_it_is_parsed(engine):
    """TorchServe's gRPC RegisterModel with a 128 KiB url: RESOURCE_EXHAUSTED from gRPC itself (before: the
    message was parsed and the url looked up in the store, its NOT_FOUND details, the url, too big for the
    client's bound on trailing metadata)."""
    before = state(engine)
    code, details = grpc_register(engine, "x" * (128 << 10) + ".mar")
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details, (code, details[:200])
    assert grpc_register(engine, "nothere.mar")[0] == grpc.StatusCode.NOT_FOUND  # a small call still answers
    assert state(engine) == before


@pytest.mark.matrix  # about 10 s: 60 MiB sent four times at once
def test_the_attackers_60_mib_bodies_at_once_leave_the_engine_within_its_cgroup(engine):
    """The attacker's call, four at once: each 413 before its body is read, the engine's peak within GROWTH
    (before: OOM-killed in its 1 GiB cgroup, a body parsed needing 1.7 GB), the neighbour answering."""
    import concurrent.futures

    before = state(engine)
    peak_before = reset_peak(engine.process.pid)
    body = json_body(60 << 20)

    def attack(_):
        return server.request(engine.url + "/models", body, "POST", {"Content-Type": "application/json"}, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for status, answer in pool.map(attack, range(4)):
            refused(status, answer, f"{len(body):,} bytes")
    assert peak_rss(engine.process.pid) - peak_before < GROWTH
    assert state(engine) == before
