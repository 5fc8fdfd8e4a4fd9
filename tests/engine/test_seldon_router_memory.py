"""Issue #43, cases 13 and 14: the Seldon Core 1 router (serving/runtimes/seldon_components.py ``Router``) under the
real wrapper (seldon-core-microservice of seldon-core 1.17.1, samples/runtime_env.py's venv) in a memory cgroup of the
export's figure (archiver/export/seldon/core1.py ``ROUTER_RESOURCES``: 256Mi), attacked as a client of the graph
would: each message it cannot afford is Seldon's error shape with a 4xx, what it affords is answered, its worker
is never restarted and its memory's peak stays below the limit. Before the fix (its limits were the Model's,
64 MiB a body and any values) a 63 MiB ``strData`` and 8 MiB of ``[],`` in ``meta`` OOM-killed its worker (the
connection dropped, the cgroup at 256 MiB), and NaN in ``meta`` was answered as ``NaN``, a 200 that is not JSON."""

import json
import re

import pytest

from archiver.export.kube import memory_bytes
from archiver.export.seldon import core1
from helpers import seldon_graph
from helpers.cgroups import MemoryLimit
from samples import runtime_env

MiB = 1 << 20
ENV = {"MODEL_NAME": "serving.runtimes.seldon_components.Router", "SERVICE_TYPE": "ROUTER", "GRPC_WORKERS": "0"}


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    """(url, its log, its memory cgroup): the router of three children (weights 50,30,20) in the memory the export
    gives its container."""
    python = runtime_env.ensure_seldon()
    memory = MemoryLimit(None, memory_bytes(core1.ROUTER_RESOURCES["memory"]))
    if memory.cgroup is None:
        pytest.skip("no memory cgroup can be made here: the router's memory cannot be limited as a pod's is")
    logs = tmp_path_factory.mktemp("router")
    parameters = [core1.parameter("weights", "50,30,20", "STRING")]
    unit = seldon_graph.start_unit("router", ENV, parameters, python, logs, join=memory.join)
    graph = seldon_graph.Graph({}, {"router": unit})
    try:
        seldon_graph.wait_ready(unit, 120)
        yield f"http://127.0.0.1:{unit.port}/route", unit.log, memory
    finally:
        graph.stop()
        memory.release()


def route(url: str, body: bytes):
    """The router's status and answer, read as JSON (a body that is not JSON fails the test); 0 and None when it
    dropped the connection (its worker killed)."""
    try:
        status, answer = seldon_graph.post(url, body, timeout=60)
    except (ConnectionError, OSError) as error:
        return 0, repr(error)
    return status, strict_json(answer)


def strict_json(text: bytes):
    """JSON as RFC 8259 has it: NaN and Infinity are not (Python's json reads them; Go's does not)."""

    def refuse(constant):
        raise AssertionError(f"{constant} in an answer: not JSON ({text[:200]!r})")

    return json.loads(text, parse_constant=refuse)


def empty_lists(count: int) -> bytes:
    return b'{"strData": "", "meta": {"a": [' + b",".join([b"[]"] * count) + b"]}}"


def assert_refused(answer, status: int, code: int, *words: str):
    assert status == code and set(answer) == {"status"}, (status, str(answer)[:300])
    error = answer["status"]
    assert error["status"] == 1 and error["code"] == -1 and error["reason"] == "MICROSERVICE_BAD_DATA", error
    assert all(word in error["info"] for word in words), error


def limit_in(answer) -> int:
    return int(re.search(r"limit of ([\d,]+)", answer["status"]["info"]).group(1).replace(",", ""))


def assert_alive(url: str, log, memory: MemoryLimit, boots: int):
    meta = {"puid": "p1", "tags": {"client": "neighbour"}}
    status, answer = route(url, json.dumps({"strData": "x", "meta": meta}).encode())
    assert status == 200 and answer["meta"] == meta and answer["data"]["ndarray"][0][0] in (0, 1, 2), answer
    assert log.read_text(errors="replace").count("Booting worker") == boots, "the router's worker was restarted"
    assert memory.peak() < memory.limit, f"the router's memory reached its limit ({memory.peak():,} bytes)"


def boots_of(log) -> int:
    return log.read_text(errors="replace").count("Booting worker")


@pytest.mark.matrix  # the seldon-core venv (32 s to build) and the router: make test reads the bounds in-process
def test_the_router_holds_only_what_its_memory_affords(router):
    url, log, memory = router
    boots = boots_of(log)
    assert_alive(url, log, memory, boots)
    # 63 MiB of strData: the Model's 64 MiB limit, past the router's 256 MiB (OOM-killed before)
    status, answer = route(url, b'{"strData": "' + b"A" * (63 * MiB) + b'"}')
    assert_refused(answer, status, 413, "bytes", "256 MiB of memory")
    body_limit = limit_in(answer)
    # 8 MiB of nested empty arrays in meta: 2.8 million values, about 180 MiB parsed (OOM-killed before)
    status, answer = route(url, empty_lists(8 * MiB // 3))
    assert_refused(answer, status, 413, "values", "256 MiB of memory")
    values_limit = limit_in(answer)
    # what it affords it answers: a body at its limit, a meta of as many values
    status, answer = route(url, b'{"strData": "' + b"A" * (body_limit - 15) + b'"}')
    assert status == 200 and answer["meta"] == {}, str(answer)[:300]
    status, answer = route(url, empty_lists(values_limit - 3))  # the lists, their commas, the two objects
    assert status == 200 and len(answer["meta"]["a"]) == values_limit - 3, str(answer)[:300]
    # meta nested deeper than 32 levels: refused before it is echoed
    status, answer = route(url, b'{"strData": "", "meta": {"a": ' + b"[" * 40 + b"]" * 40 + b"}}")
    assert_refused(answer, status, 413, "max_json_depth")
    assert_alive(url, log, memory, boots)


@pytest.mark.matrix
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_nan_in_meta_is_refused_not_answered_as_invalid_json(router, value):
    """Flask's jsonify writes NaN and Infinity (and 1e400, read as Infinity) as they are: the answer was a 200
    whose body was not JSON (json.loads of Python reads it; Go's executor does not)."""
    url, log, memory = router
    boots = boots_of(log)
    body = b'{"strData": "", "meta": {"tags": {"score": ' + value.encode() + b"}}}"
    status, answer = seldon_graph.post(url, body, timeout=60)
    assert_refused(strict_json(answer), status, 400, "NaN or Infinity")
    assert_alive(url, log, memory, boots)


@pytest.mark.matrix  # 30 s: every size the attacker sent
@pytest.mark.parametrize("kind", ["strData", "meta"])
def test_every_size_is_answered_or_refused_and_the_router_lives(router, kind):
    url, log, memory = router
    boots = boots_of(log)
    sizes = [1, 2, 4, 8, 16, 20, 21, 24, 32, 48, 63] if kind == "strData" else [1, 2, 4, 6, 8]
    for mib in sizes:
        if kind == "strData":
            body = b'{"strData": "' + b"A" * (mib * MiB) + b'"}'
        else:
            body = empty_lists(mib * MiB // 3)
        status, answer = route(url, body)
        assert status == 200 or status == 413 and answer["status"]["reason"] == "MICROSERVICE_BAD_DATA", (mib, status)
        assert_alive(url, log, memory, boots)
