"""An outsider's attack on the engine's sequence batching (serving/engine/sequences.py, TorchServe 0.12's
``sequenceBatching: true``), served: one engine for the module inside a memory cgroup of its own (its workers
in it too), the model API on, the running-sum handler (samples/ts_stateful.py) under a few settings. Every
process of the engine is counted from the cgroup before and after.

- A sequence whose worker is scaled away while that worker starts again (after dying with the sequence's
  request) is served by the worker left: before, the request waited for ever (no one told the other worker
  to look), the client timing out.
- Sequence ids as long as a request head allows (60 KiB) cost an open sequence no more than a short one:
  before, the engine held each id for as long as its sequence stayed open.
- The id and end headers in any spelling reach the handler under TorchServe's names: before, two clients'
  ``TS_REQUEST_SEQUENCE_ID`` sequences were one state to the handler (sequence id ``None``).
- Clients that leave mid-sequence (an HTTP client closing while its request waits: 499; a gRPC
  StreamPredictions2 cancelled) have nothing run, and the sequence goes on in order (held before too).
- Unregistering answers a sequence's waiting requests 503 at once, the one in a batch as usual (held before).
"""

import http.client
import json
import os
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from archiver import properties
from helpers.engine_limits import engine_in_cgroup, engine_rss
from samples import ts_stateful
from serving.engine import ts_protos as ts_pb

pytestmark = pytest.mark.matrix  # about 45 s (an engine of four models, one loading 3 s); make test has the rules'
# property test (tests/engine/test_sequence_rules.py)
GROUP_LIMIT = 3 << 30  # the engine's cgroup: the engine, its fork server and five workers
LOAD_SECONDS = 3  # "pair"'s load: a worker started again stays STARTING that long
LONG_IDS, LONG_ID_BYTES = 600, 60_000


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("attack-sequences")
    store = root / "model-store"
    store.mkdir()
    ts_stateful.running_sum(
        store, "pair", idle_ms=60_000, workers=2, batch=4, sequences=4, queue=2, load_seconds=LOAD_SECONDS
    )
    ts_stateful.running_sum(store, "long", idle_ms=60_000, workers=1, batch=8, sequences=2000, queue=1)
    ts_stateful.running_sum(store, "cased", idle_ms=60_000, workers=1, batch=4, sequences=8, queue=2)
    ts_stateful.running_sum(store, "doomed", idle_ms=60_000, workers=1, batch=1, sequences=4, queue=4)
    properties.write_config(
        store,
        root / "config" / "config.properties",
        extra={"disable_token_authorization": "true", "enable_model_api": "true"},
    )
    with engine_in_cgroup(root, GROUP_LIMIT) as running:
        yield running
        cgroup = running.cgroup
    time.sleep(1)
    left = live(cgroup)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the engine outlived it in its cgroup: {left}"


# ---- helpers -------------------------------------------------------------------------------------------
def live(cgroup: Path) -> set:
    try:
        pids = {int(line) for line in (cgroup / "cgroup.procs").read_text().split()}
    except OSError:
        return set()
    return {pid for pid in pids if alive(pid)}


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def post(engine, model: str, body, headers=None, timeout: float = 30):
    """(status, answer) of one request, its headers spelled exactly as given; (None, error) at the timeout."""
    connection = http.client.HTTPConnection("127.0.0.1", engine.http, timeout=timeout)
    try:
        connection.request(
            "POST", f"/predictions/{model}", str(body).encode(), {"Content-Type": "text/plain", **(headers or {})}
        )
        answer = connection.getresponse()
        data = answer.read()
    except OSError as exc:
        return None, repr(exc)
    finally:
        connection.close()
    try:
        return answer.status, json.loads(data)
    except ValueError:
        return answer.status, data


def seq(sequence_id: str, end: bool = False) -> dict:
    return {"ts_request_sequence_id": sequence_id, **({"ts_request_sequence_end": "true"} if end else {})}


def manage(engine, method: str, path: str):
    connection = http.client.HTTPConnection("127.0.0.1", engine.http, timeout=120)
    try:
        connection.request(method, path)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def worker_pids(engine, model: str) -> set:
    return {w["pid"] for w in engine.workers(model)}


# ---- clients leaving mid-sequence ----------------------------------------------------------------------
def test_clients_leaving_mid_sequence_have_nothing_run(engine):
    """While the sequence's worker holds its first request (sleep 2), an HTTP client sends a second and
    closes (499), and a StreamPredictions2 call sends a third and is cancelled: neither runs (their 100 and
    1000 would show in the sum), the next request is the sequence's second, and both slots are free."""
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, engine, "pair", "sleep 2", seq("L"))
        time.sleep(0.5)
        raw = socket.create_connection(("127.0.0.1", engine.http), timeout=10)
        raw.sendall(
            b"POST /predictions/pair HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
            b"ts_request_sequence_id: L\r\nContent-Length: 3\r\n\r\n100"
        )
        with grpc.insecure_channel(f"127.0.0.1:{engine.ts_grpc}") as channel:
            stream = channel.stream_stream(
                f"/{ts_pb.INFERENCE_SERVICE}/StreamPredictions2",
                request_serializer=ts_pb.PredictionsRequest.SerializeToString,
                response_deserializer=ts_pb.PredictionResponse.FromString,
            )
            hold = threading.Event()

            def messages():
                yield ts_pb.PredictionsRequest(model_name="pair", sequence_id="L", input={"data": b"1000"})
                hold.wait(10)

            call = stream(messages(), timeout=30)
            time.sleep(0.5)
            call.cancel()
            hold.set()
        raw.close()
        assert first.result()[0] == 200
    status, answer = post(engine, "pair", 4, seq("L", end=True))
    assert (status, answer) == (200, {"sum": 4, "count": 2, "start": False, "end": True}), (status, answer)


# ---- a sequence's worker scaled away while it starts again ---------------------------------------------
def test_a_sequence_whose_worker_is_scaled_away_while_it_restarts_is_served(engine):
    """s1's worker dies with its request and starts again (LOAD_SECONDS); s1's next request waits for it;
    the model is scaled to one worker, which retires the starting one: the worker left takes s1. Before the
    fix nothing woke that worker: the request was still unanswered at the client's 20 s timeout."""
    assert post(engine, "pair", 1, seq("s0"))[0] == 200
    assert post(engine, "pair", 2, seq("s1"))[0] == 200
    before = worker_pids(engine, "pair")
    status, answer = post(engine, "pair", "die", seq("s1"))
    assert status == 503 and "Worker died" in json.dumps(answer), (status, answer)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(post, engine, "pair", 5, seq("s1"), 20)
        time.sleep(0.3)
        started = time.monotonic()
        assert manage(engine, "PUT", "/models/pair?min_worker=1&max_worker=1")[0] in (200, 202)
        status, answer = waiting.result()
    print(f"s1's request after its worker was scaled away: {status} in {time.monotonic() - started:.1f} s")
    assert (status, answer) == (200, {"sum": 5, "count": 1, "start": False, "end": False}), (status, answer)
    after = worker_pids(engine, "pair")
    assert len(after) == 1 and after <= before
    assert post(engine, "pair", 3, seq("s0"))[1]["sum"] == 4  # s0's own worker kept its state


# ---- ids and headers -----------------------------------------------------------------------------------
def test_long_sequence_ids_hold_no_memory(engine):
    """600 sequences, each named by a 60 KiB id and never ended (60 s idle): the engine's memory grows by
    the sequences' count, not their ids' bytes (before: the ids held, +35 MiB and more)."""
    pad = "x" * LONG_ID_BYTES
    before = engine_rss(engine)
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda k: post(engine, "long", 1, seq(f"{pad}-{k}"))[0], range(LONG_IDS)))
    grown = engine_rss(engine) - before
    print(f"{LONG_IDS} open sequences of {LONG_ID_BYTES:,}-byte ids: engine +{grown / 2**20:.1f} MiB")
    assert statuses == [200] * LONG_IDS
    assert grown < 12 << 20, f"the engine grew {grown / 2**20:.0f} MiB"
    assert post(engine, "long", 2, seq(f"{pad}-7"))[1] == {"sum": 3, "count": 2, "start": False, "end": False}


def test_sequence_headers_in_any_spelling_reach_the_handler(engine):
    """Two clients spell the header TS_REQUEST_SEQUENCE_ID and Ts_Request_Sequence_Id: each keeps its own
    sum (before: the handler read ``None`` for both, B's first answer 12), and an end header spelled
    TS_REQUEST_SEQUENCE_END reaches it."""
    assert post(engine, "cased", 5, {"TS_REQUEST_SEQUENCE_ID": "A"})[1]["sum"] == 5
    status, answer = post(engine, "cased", 7, {"Ts_Request_Sequence_Id": "B"})
    assert (status, answer["sum"]) == (200, 7), (status, answer)
    status, answer = post(engine, "cased", 1, {"TS_REQUEST_SEQUENCE_ID": "A", "TS_REQUEST_SEQUENCE_END": "true"})
    assert answer == {"sum": 6, "count": 2, "start": False, "end": True}, answer


# ---- unregistering while a sequence waits --------------------------------------------------------------
def test_unregistering_answers_a_sequences_waiting_requests(engine):
    """One request of D in its worker (sleep 2), three waiting: DELETE answers the three 503 at once, the
    first 200; the worker's process is gone after."""
    pids = worker_pids(engine, "doomed")
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(post, engine, "doomed", "sleep 2", seq("D"))
        time.sleep(0.5)
        rest = [pool.submit(post, engine, "doomed", k, seq("D")) for k in range(3)]
        time.sleep(0.3)
        assert manage(engine, "DELETE", "/models/doomed")[0] == 200
        assert first.result()[0] == 200
        assert [f.result()[0] for f in rest] == [503] * 3
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)]
    assert live(engine.cgroup)  # the engine itself serves on
