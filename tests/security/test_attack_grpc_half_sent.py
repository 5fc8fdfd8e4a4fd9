"""Issue #43, an outsider's attack on the bounds: gRPC messages begun and never finished.

REST bodies count in flight as they arrive (``BodyLimit``). gRPC receives a unary call's message whole
before its handler runs, and opens the stream's window to the size the message announces. A client
speaking HTTP/2 itself (``helpers/h2_raw.HalfSent``) opens calls whose messages announce 60 MiB (under
``max_request_size``, 64 MiB here) and sends 50 MiB of each as fast as the windows allow, then nothing
more. Before (2 GiB group, 128 MiB ``--max_inflight_bytes``): 8 calls to TorchServe's ``Predictions``
+484-509 MiB, to ``ModelInfer`` +385 MiB, counted nowhere while the client kept the connection; 30 of
them would take the group's 2 GiB and the engine with it.

Now (serving/engine/grpc_reading.py) every method reads its messages itself, ``max_request_size`` taken in its
client's share of the bodies in flight before each is asked for, and gRPC's bandwidth probe is off (a
stream not read yet holds 64 KiB). ``max_request_size`` being half the budget here, a read takes the
client's share (32 MiB): 3 calls of the 8 read (while a quarter stays free), 5 end UNAVAILABLE, the
engine grows by what the 3 hold, and another client's calls are answered.

The engine has token authorization on: a call without the key is refused before its message is read
(``grpc_reading.refusal``; the token check's unary handler read it whole first: +403 MiB for 8 calls).
"""

import time

import grpc
import pytest

from helpers.engine_limits import engine_in_cgroup, engine_rss, limits_tree, ts_predicts
from helpers.h2_raw import HalfSent
from serving.engine import ts_protos as pb
from serving.engine.body_limit import CLIENT_SHARE

GROUP_LIMIT = 2 << 30  # the engine's cgroup, workers included
BOUND = 128 << 20  # --max_inflight_bytes
CALLS = 8  # half-sent calls of one client
DECLARED, SENT = 60 << 20, 50 << 20  # each message's announced size, and what of it is sent
SLACK = 128 << 20  # what the engine may grow by beside its bodies in flight (gRPC's buffers, copies)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """The engine with token authorization on (TorchServe 0.12's default): the calls with the key read
    their messages, those without are refused."""
    root = tmp_path_factory.mktemp("half-sent")
    limits_tree(root, {"other": 1})
    config = root / "config" / "config.properties"
    text = config.read_text()
    config.write_text(text.replace("disable_token_authorization=true", "disable_token_authorization=false"))
    with engine_in_cgroup(root, GROUP_LIMIT, "--max_inflight_bytes", str(BOUND)) as running:
        yield running


def key(engine) -> tuple:
    """The inference key as a call's metadata."""
    return (("authorization", engine.headers("inference")["Authorization"]),)


@pytest.mark.parametrize("method", ["Predictions", "StreamPredictions2", "ModelInfer"])
def test_half_sent_grpc_messages_stay_within_the_bodies_in_flight(engine, method):
    port, path = {
        "Predictions": (engine.ts_grpc, f"/{pb.INFERENCE_SERVICE}/Predictions"),
        "StreamPredictions2": (engine.ts_grpc, f"/{pb.INFERENCE_SERVICE}/StreamPredictions2"),
        "ModelInfer": (engine.grpc, "/inference.GRPCInferenceService/ModelInfer"),
    }[method]
    workers = [w["pid"] for w in engine.workers("other")]
    before = engine_rss(engine)
    attack = HalfSent(port, path, CALLS, DECLARED, SENT, source="127.0.0.2", metadata=key(engine))
    try:
        attack.pump(20)
        time.sleep(1)
        grown = engine_rss(engine) - before
        refused = len(attack.reset)
        sent = sum(SENT - len(attack.left[stream]) for stream in attack.left)
        print(
            f"{method}: {CALLS} half-sent calls, {refused} refused, {sent:,} bytes sent, "
            f"engine +{grown >> 20} MiB (bound {BOUND >> 20} MiB)"
        )
        status, _ = engine.post("/predictions/other", b"echo", timeout=30)
        assert status == 200
        assert ts_predicts(engine, metadata=key(engine)) == (None, "echo")  # another client's, meanwhile
    finally:
        attack.close()
    assert engine.alive() and [w["pid"] for w in engine.workers("other")] == workers
    reading = CALLS - refused  # the calls whose messages the engine asked for: each holds what was sent of it
    assert grown < reading * SENT + SLACK, f"+{grown >> 20} MiB for {CALLS} half-sent messages, {refused} refused"
    assert refused >= CALLS - (CLIENT_SHARE - 1), refused  # a read takes a share at most


@pytest.mark.parametrize("method", ["Predictions", "ModelInfer"])
def test_half_sent_messages_without_the_key_are_refused_unread(engine, method):
    """A call without the inference key is refused before its message is read: the token check answered
    with a unary handler, which gRPC calls only once the message is whole, so a client holding no key
    held 8 x 50 MiB in the engine."""
    port, path = {
        "Predictions": (engine.ts_grpc, f"/{pb.INFERENCE_SERVICE}/Predictions"),
        "ModelInfer": (engine.grpc, "/inference.GRPCInferenceService/ModelInfer"),
    }[method]
    workers = [w["pid"] for w in engine.workers("other")]
    before = engine_rss(engine)
    attack = HalfSent(port, path, CALLS, DECLARED, SENT, source="127.0.0.2")
    try:
        attack.pump(20)
        time.sleep(1)
        grown = engine_rss(engine) - before
        refused = len(attack.reset)
        status, _ = engine.post("/predictions/other", b"echo", timeout=30)
    finally:
        attack.close()
    print(f"{method} without the key: {CALLS} half-sent calls, {refused} refused, engine +{grown >> 20} MiB")
    with pytest.raises(grpc.RpcError) as denied:  # a whole call without the key: TorchServe's answer
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            channel.unary_unary(path)(b"", timeout=30)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED, denied.value
    assert status == 200 and engine.alive() and [w["pid"] for w in engine.workers("other")] == workers
    assert refused == CALLS and grown < SLACK, (refused, grown >> 20)
