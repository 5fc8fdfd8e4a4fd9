"""An outsider's attack on the engine's load metrics and its job queue: clients that leave while their
request waits (REST: the socket closed; gRPC: the client process killed), a worker killed holding a batch.

``ts_requests_in_flight`` must come back to 0, never below; ``ts_queue_size`` must count the requests
still waiting, and a request that was given up on must not keep the queue full for the next client
(before: each stayed in the job queue until a worker reached it, counted by ts_queue_size while
ts_requests_in_flight no longer counted it, and ``job_queue_size`` of them answered 503 to every live
request meanwhile: a client that connects and leaves at once, for free, denied the model to others).

``test_job_queue_forgets_clients_that_left`` is the smoke (well under 1 s); the served test runs a real
engine inside a memory cgroup of its own, its pids checked before and after (about 30 s, -m matrix).
"""

import asyncio
import base64
import json
import signal
import socket
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import grpc_client, waiting
from helpers.engine import snapshot_entry, write_config
from helpers.engine_limits import archive_handler, engine_in_cgroup
from serving.engine.job_queue import Job, JobQueue
from serving.worker.ts_wire import RequestInput

QUEUE = 3
OCTETS = "application/octet-stream"  # the handler gets the bytes
HANDLER = '''\
import os
import signal
import time


def handle(data, context):
    """Sleeps the seconds its first body says; a body "die" kills the worker holding it."""
    if data is None:
        return None
    bodies = [bytes(row.get("body") or b"") for row in data]
    if b"die" in bodies:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(float(bodies[0]))
    return ["slept" for _ in data]
'''


def test_job_queue_forgets_clients_that_left():
    async def scenario():
        queue = JobQueue(QUEUE)
        loop = asyncio.get_running_loop()
        left = [Job(RequestInput(b"", {}), loop.create_future()) for _ in range(QUEUE)]
        for job in left:
            assert await queue.put(job)
            job.done.cancel()  # what submit's await does when its client leaves
        assert await queue.put(Job(RequestInput(b"live", {}), loop.create_future())), (
            "a queue of clients that left: 503"
        )
        assert len(queue) == 1
        assert [job.request.body for job in await queue.batch(QUEUE + 1, 0)] == [b"live"]

    asyncio.run(scenario())


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("queue")
    (root / "slow.py").write_text(HANDLER)
    (root / "model-store").mkdir()
    archive_handler(root / "slow.py", ["slow"], root / "model-store")
    (root / "config").mkdir()
    write_config(
        root / "config" / "config.properties",
        {"slow": snapshot_entry("slow.mar", 1, 1, 0, 60)},
        f"job_queue_size={QUEUE}\n",
    )
    with engine_in_cgroup(root, 2 << 30) as running:
        yield running


def load(engine) -> dict:
    status, text = engine.get("/metrics")
    assert status == 200, text
    names = ("ts_queue_size", "ts_requests_in_flight")
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("model_name") == "slow" and sample.name in names
    }


def until(engine, wanted, seconds: float = 10) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        got = load(engine)
        assert got["ts_requests_in_flight"] >= 0 and got["ts_queue_size"] >= 0, got
        if wanted(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def send_and_leave(engine, body: bytes = b"1"):
    """A POST whose client closes its socket once the request is sent."""
    with socket.create_connection(("127.0.0.1", engine.http), timeout=10) as sock:
        sock.sendall(
            b"POST /predictions/slow HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        time.sleep(0.2)


def pids(engine) -> set:
    return {engine.process.pid} | {int(w["pid"]) for w in engine.workers("slow")}


@pytest.mark.matrix
def test_clients_that_leave_free_the_queue_and_the_counters_return_to_zero(engine):
    import concurrent.futures

    before = pids(engine)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        held = pool.submit(engine.post, "/predictions/slow", b"20", OCTETS, 40)  # the worker's batch, 20 s
        until(engine, lambda got: got["ts_requests_in_flight"] == 1)
        payload = json.dumps([base64.b64encode(b"x").decode()])
        command = [sys.executable, grpc_client.__file__, f"127.0.0.1:{engine.grpc}", "slow"]
        grpc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        grpc.stdin.write(payload.encode())
        grpc.stdin.close()
        queued = until(engine, lambda got: got["ts_requests_in_flight"] == 2)  # tritonclient's start, then its call
        assert queued == {"ts_queue_size": 1, "ts_requests_in_flight": 2}, queued
        for _ in range(QUEUE - 1):
            send_and_leave(engine)
        grpc.send_signal(signal.SIGKILL)
        grpc.wait(10)
        left = until(engine, lambda got: got["ts_requests_in_flight"] == 1 and got["ts_queue_size"] == 0, 3)
        assert left == {"ts_queue_size": 0, "ts_requests_in_flight": 1}, left  # only the worker's batch
        live = pool.submit(engine.post, "/predictions/slow", b"1", OCTETS, 30)  # a queue of gone clients: 503
        assert held.result() == (200, "slept") and live.result() == (200, "slept"), (held.result(), live.result())
    assert until(engine, lambda got: got["ts_requests_in_flight"] == 0) == {
        "ts_queue_size": 0,
        "ts_requests_in_flight": 0,
    }
    assert pids(engine) == before


@pytest.mark.matrix
def test_a_worker_killed_holding_a_batch_leaves_no_request_counted(engine):
    status, body = engine.post("/predictions/slow", b"die", OCTETS, 30)
    assert status == 503 and "Worker died" in json.dumps(body), (status, body)
    assert until(engine, lambda got: got["ts_requests_in_flight"] == 0) == {
        "ts_queue_size": 0,
        "ts_requests_in_flight": 0,
    }
    waiting.until(
        lambda: engine.workers("slow")[0]["status"],
        lambda status: status == "READY",
        "the slow model's worker did not come back",
        engine.out,
        engine.alive,
        30,
    )
    assert engine.post("/predictions/slow", b"1", OCTETS, 30) == (200, "slept")
