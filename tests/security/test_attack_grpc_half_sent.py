"""Issue #43, an outsider's attack on the bounds: gRPC messages begun and never finished.

REST bodies count in flight as they arrive (``BodyLimit``); a gRPC call's message counts only once
gRPC has received it whole and the handler runs (``engine_ts_grpc.Inference.admit``,
``engine_grpc.ModelInfer``). A client speaking HTTP/2 itself (``helpers/h2_raw.HalfSent``) opens calls
whose messages announce 60 MiB (under ``max_request_size``, 64 MiB here) and sends 50 MiB of each,
as fast as gRPC's windows allow (gRPC opens a stream's window to its message's announced size), then
nothing more: gRPC core holds every partial message, counted nowhere, for as long as the client
keeps the connection (no deadline, no idle bound on a call). Measured (2 GiB group, 128 MiB
``--max_inflight_bytes``): 8 calls to TorchServe's ``Predictions`` +509 MiB in 4 s; 30 of them
would take the group's 2 GiB and the engine with it.

Fix (not small, so marked ``xfail(strict=True)``): serve the raw methods as client-streaming
handlers (the wire is the same), which run before gRPC reads the message: count
``max_request_size`` in the client's share of the bodies in flight before asking for it (given
back when the call ends, whatever ends it) and refuse UNAVAILABLE past it; and bound what gRPC core
buffers unasked (``grpc.http2.lookahead_bytes`` with ``grpc.http2.bdp_probe`` off, and
``grpc.max_concurrent_streams``), since a stream nobody reads still gets its 4 MiB initial window
(64 such streams: +200 MB in a bare grpc.aio server).
"""

import time

import pytest

from helpers.engine_limits import engine_in_cgroup, limits_tree
from helpers.h2_raw import HalfSent
from serving import ts_protos as pb

GROUP_LIMIT = 2 << 30  # the engine's cgroup, workers included
BOUND = 128 << 20  # --max_inflight_bytes
CALLS = 8  # half-sent calls of one client
DECLARED, SENT = 60 << 20, 50 << 20  # each message's announced size, and what of it is sent
SLACK = 128 << 20  # what the engine may grow by beside its bodies in flight (gRPC's buffers, copies)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("half-sent")
    limits_tree(root, {"other": 1})
    with engine_in_cgroup(root, GROUP_LIMIT, "--max_inflight_bytes", str(BOUND)) as running:
        yield running


def usage(engine) -> int:
    return int((engine.cgroup / "memory.usage_in_bytes").read_text())


@pytest.mark.matrix
@pytest.mark.xfail(strict=True, reason="a gRPC message counts in flight only once received whole: 8 half-sent "
                   "50 MiB Predictions messages grow the engine by ~509 MiB past its 128 MiB bound")  # fmt: skip
@pytest.mark.parametrize("api", ["torchserve", "kserve"])
def test_half_sent_grpc_messages_stay_within_the_bodies_in_flight(engine, api):
    port, path = {
        "torchserve": (engine.ts_grpc, f"/{pb.INFERENCE_SERVICE}/Predictions"),
        "kserve": (engine.grpc, "/inference.GRPCInferenceService/ModelInfer"),
    }[api]
    workers = [w["pid"] for w in engine.workers("other")]
    before = usage(engine)
    attack = HalfSent(port, path, CALLS, DECLARED, SENT)
    try:
        left = attack.pump(60)
        time.sleep(1)
        grown = usage(engine) - before
        refused = len(attack.reset)
        print(f"{api}: {CALLS} half-sent calls, {refused} refused, {CALLS * SENT - left:,} bytes sent, "
              f"engine +{grown >> 20} MiB (bound {BOUND >> 20} MiB)")  # fmt: skip
        status, _ = engine.post("/predictions/other", b"echo", timeout=30)
        assert status == 200
    finally:
        attack.close()
    assert engine.alive() and [w["pid"] for w in engine.workers("other")] == workers
    assert grown < BOUND + SLACK, f"+{grown >> 20} MiB for {CALLS} half-sent messages, {refused} refused"
