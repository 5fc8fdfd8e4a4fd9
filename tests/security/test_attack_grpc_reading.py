"""Issue #43, an outsider's attack on serving/engine/grpc_reading.py: every gRPC method reads its own messages,
``min(max_request_size, a client's share)`` reserved before each message is asked for, given back once it
is read.

The engine here: 64 MiB ``max_request_size``, 64 MiB ``--max_inflight_bytes``, ``--body_idle_timeout`` 5 s,
in a 2 GiB memory cgroup;
the reads' own budget (``body_limit.reads_budget``) is 32 MiB, a client's share of it 8 MiB (each read
reserves 8 MiB). Attackers come from 127.0.0.2 and above, neighbours from 127.0.0.1.

- A call that opens and sends nothing holds its read's reservation (gRPC's Python API reads a whole
  message or nothing). When the reads reserved from the bodies in flight, one such call from each of
  ``CLIENT_SHARE`` addresses (4 calls, 0 bytes of any message) held the whole budget, and every other
  client's REST request got 503 and its gRPC call UNAVAILABLE. Now the reads have a budget of their
  own: REST is answered; other clients' gRPC reads still wait for the idle calls to go (a unary
  call's message must arrive whole within twice ``--body_idle_timeout``): xfail strict until gRPC bytes are
  counted as they arrive.
- A ``StreamPredictions2`` stream waiting for its next request holds a reservation too: one client
  keeps 3 streams open (``MAX_OPEN_STREAMS`` promises 512), the 4th gets UNAVAILABLE: xfail strict.
- What held: a cancelled read gives its reservation back; a gzip message inflating past
  ``max_request_size`` is refused (RESOURCE_EXHAUSTED, "Decompressed message larger than max"), though gRPC
  core inflates it up to the limit first (the engine +63 MiB for 70 KiB sent, 16 MiB reserved then);
  a unary call of two messages, or of none, and an unreadable management message end the call as gRPC
  would.
"""

import json
import threading
import time

import grpc
import pytest

from helpers.engine_limits import engine_in_cgroup, engine_rss, limits_tree, ts_predicts
from helpers.h2_raw import HalfSent
from serving.engine import ts_protos as pb
from serving.engine.body_limit import CLIENT_SHARE

GROUP_LIMIT = 2 << 30
BOUND = 64 << 20  # --max_inflight_bytes; max_request_size is 64 MiB (limits_tree)
SHARE = BOUND // CLIENT_SHARE  # of the bodies in flight
IDLE = 5  # --body_idle_timeout: a unary gRPC call's message must arrive whole within twice that
PREDICTIONS = f"/{pb.INFERENCE_SERVICE}/Predictions"
STREAM2 = f"/{pb.INFERENCE_SERVICE}/StreamPredictions2"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpc-reading")
    limits_tree(root, {"other": 1})
    with engine_in_cgroup(
        root, GROUP_LIMIT, "--max_inflight_bytes", str(BOUND), "--body_idle_timeout", str(IDLE)
    ) as running:
        yield running


def whole_budget(engine) -> int:
    """A REST request whose body needs all but 1 MiB of what one client may hold (three quarters of the
    budget): 200 only when the engine holds (almost) nothing in flight, else 503."""
    body = b"big 1" + b" " * (BOUND - SHARE - (1 << 20) - 5)
    status, _ = engine.post("/predictions/other", body, timeout=60)
    return status


def idle_calls(engine, port: int, path: str, sources) -> list:
    """One call from each of ``sources`` that sends its message's 5-byte prefix and nothing more."""
    calls = [HalfSent(port, path, 1, 1 << 20, 0, source=source) for source in sources]
    for call in calls:
        call.pump(0.5)
    time.sleep(2)  # the engine's handlers start (a busy machine)
    for call in calls:
        call.read(0.1)
    return calls


def test_a_cancelled_read_gives_its_reservation_back(engine):
    """3 calls of one client read 10 of 15 MiB each and stop: the reads' budget (32 MiB, a client 8 and
    more while 8 stay free) holds their 24 MiB, so that client's next call is refused; once they are
    cancelled (the connection closed) its calls are answered again. REST's bodies never wait for them."""
    workers = [w["pid"] for w in engine.workers("other")]
    attack = HalfSent(engine.ts_grpc, PREDICTIONS, 3, 15 << 20, 10 << 20)  # from 127.0.0.1, as ts_predicts()
    try:
        attack.pump(20)
        time.sleep(0.5)
        during, rest = ts_predicts(engine), whole_budget(engine)
    finally:
        attack.close()
    time.sleep(1)
    after = ts_predicts(engine)
    print(
        f"3 half-read calls (10 of 15 MiB): the client's next call {during} while they hold, {after} once "
        f"they are gone; a {(BOUND - SHARE) >> 20} MiB REST body meanwhile {rest}"
    )
    assert during[0] == grpc.StatusCode.UNAVAILABLE  # the reads' reservations were held (the check has teeth)
    assert after == (None, "echo") and rest == 200  # all given back when the client went away
    assert engine.alive() and [w["pid"] for w in engine.workers("other")] == workers


@pytest.mark.matrix  # 8 s: 70 MiB made and gzipped by the client
def test_a_gzip_message_inflating_past_max_request_size_is_refused(engine):
    before = engine_rss(engine)
    code, details = ts_predicts(engine, bytes(70 << 20), compression=grpc.Compression.Gzip, timeout=60)
    grown = engine_rss(engine) - before
    print(f"70 MiB of zeros gzipped (~70 KiB sent): {code} {details!r}, engine +{grown >> 20} MiB")
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
    assert ts_predicts(engine) == (None, "echo")
    assert whole_budget(engine) == 200


def test_unary_calls_with_two_messages_or_none_and_unreadable_management_messages(engine):
    with grpc.insecure_channel(f"127.0.0.1:{engine.ts_grpc}") as channel:
        two = channel.stream_unary(PREDICTIONS, response_deserializer=pb.PredictionResponse.FromString)
        message = pb.PredictionsRequest(model_name="other", input={"data": b"echo"}).SerializeToString()
        answer = two(iter([message, message]), timeout=30)  # gRPC's unary handlers read the first message
        assert json.loads(answer.prediction)["echo"] == ["echo"]
        with pytest.raises(grpc.RpcError) as none:
            two(iter([]), timeout=30)
        assert none.value.code() == grpc.StatusCode.INTERNAL, none.value
    with grpc.insecure_channel(f"127.0.0.1:{engine.ts_grpc_management}") as channel:
        describe = channel.unary_unary(f"/{pb.MANAGEMENT_SERVICE}/DescribeModel")
        with pytest.raises(grpc.RpcError) as unreadable:
            describe(b"\xff\xff\xff", timeout=30)
        assert unreadable.value.code() == grpc.StatusCode.INTERNAL, unreadable.value
    assert whole_budget(engine) == 200


def during_idle_calls(engine):
    """(REST's answer to a neighbour, gRPC's) while 4 calls from 4 addresses send nothing."""
    sources = [f"127.0.0.{2 + index}" for index in range(CLIENT_SHARE)]
    calls = idle_calls(engine, engine.ts_grpc, PREDICTIONS, sources)
    try:
        started = time.monotonic()
        status, _ = engine.post("/predictions/other", b"echo", timeout=30)
        rest = (status, round(time.monotonic() - started, 2))
        grpc_answer = ts_predicts(engine)
        print(
            f"{len(calls)} idle calls ({sum(len(c.reset) for c in calls)} refused): neighbour REST {rest}, "
            f"gRPC {grpc_answer}"
        )
    finally:
        for call in calls:
            call.close()
    return rest, grpc_answer


def test_idle_grpc_calls_leave_rest_its_bodies(engine):
    """The reads reserve from a budget of their own: REST's bodies are not refused for them (before: 503)."""
    rest, _ = during_idle_calls(engine)
    assert rest[0] == 200 and whole_budget(engine) == 200, rest


@pytest.mark.xfail(
    strict=True,
    reason="#43: a gRPC read's reservation is held by a call that sends nothing "
    "(up to twice --body_idle_timeout): 4 idle calls from 4 addresses hold the reads",
)
def test_idle_grpc_calls_do_not_starve_other_clients(engine):
    _, grpc_answer = during_idle_calls(engine)
    assert grpc_answer == (None, "echo"), grpc_answer


def test_a_message_that_does_not_arrive_whole_in_time_ends_its_call(engine):
    """A unary call's message must arrive whole within twice --body_idle_timeout (5 s here) of being asked
    for: a call that sent half of its message ends then, and its reservation is given back."""
    attack = HalfSent(engine.ts_grpc, PREDICTIONS, 1, 1 << 20, 1 << 19, source="127.0.0.9")
    started = time.monotonic()
    try:
        while not attack.reset and time.monotonic() - started < 60:
            attack.pump(0.5)
            attack.read(0.5)  # the server's frames: its answer ends the call
        took = time.monotonic() - started
    finally:
        attack.close()
    print(f"half of a 1 MiB message, then nothing: the call ended after {took:.1f} s")
    assert attack.reset and 2 * IDLE - 1 <= took < 2 * IDLE + 30, took
    assert ts_predicts(engine) == (None, "echo")


@pytest.mark.xfail(
    strict=True,
    reason="#43: a StreamPredictions2 stream waiting for its next request holds a "
    "read's reservation: a client keeps 3 streams open, not its share of MAX_OPEN_STREAMS",
)
def test_streams_waiting_for_their_next_request_are_not_capped_by_the_read_reservation(engine):
    channel = grpc.insecure_channel(f"127.0.0.1:{engine.ts_grpc}")
    stream = channel.stream_stream(
        STREAM2,
        request_serializer=pb.PredictionsRequest.SerializeToString,
        response_deserializer=pb.PredictionResponse.FromString,
    )
    request = pb.PredictionsRequest(model_name="other", sequence_id="s", input={"data": b"echo"})
    opened, outcomes, done = [], [], threading.Event()
    try:
        for _ in range(CLIENT_SHARE + 2):
            call = stream(_waiting(request, done), timeout=60)
            opened.append(call)
            try:
                answer = next(call)
                outcomes.append("answered" if not answer.status.code else answer.status.message)
            except grpc.RpcError as exc:
                outcomes.append(exc.code().name)
        print(f"{len(opened)} StreamPredictions2 streams from one client, each waiting after one answer: {outcomes}")
    finally:
        done.set()
        for call in opened:
            call.cancel()
        channel.close()
    assert outcomes == ["answered"] * len(opened), outcomes


def _waiting(request, done: threading.Event):
    """One request, then a stream that stays open until ``done`` (the test's end)."""
    yield request
    done.wait(60)
