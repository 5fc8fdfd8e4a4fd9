"""P6: streamed answers, time to first chunk, TorchServe 0.12 vs the tsctl engine.

    .venv/bin/python benchmarks/p6_streaming.py [--requests 30] [--rounds 3]

The same store on both (samples/ts_streaming.py): the gpt_fast-shaped stand-in generating 50 tokens,
each taking 20 ms (``token_seconds``) and sent as it comes, and the probe streaming 100 parts of 16
bytes with no pause (the servers' own cost per part). One client at a time, over HTTP (chunked
``/predictions``, read off a raw socket) and gRPC (``StreamPredictions``, one Python client for both);
time to first chunk (from the request's last byte to the first part's bytes) and to the last, each
side in turn for ``--rounds`` rounds (common.alternate), medians and 90th percentiles of all requests.
"""

import argparse
import statistics
import tempfile
from pathlib import Path

from common import alternate, percentile, write_section

from archiver import properties, server  # noqa: E402
from archiver.engines import torchserve_launch  # noqa: E402
from helpers import streams  # noqa: E402
from helpers.engine import Engine  # noqa: E402
from helpers.paths import short_tmp  # noqa: E402
from samples import ts_streaming  # noqa: E402

WORKLOADS = {  # name: (model, body, parts)
    "stand-in, 50 tokens of 20 ms": ("streaming", ts_streaming.PROMPT, 51),
    "probe, 100 parts, no pause": ("probe", b"stream 100 16 0", 100),
}


def grpc_stream(address: str, model: str, body: bytes):
    import grpc

    from serving.engine import ts_protos as pb

    with grpc.insecure_channel(address) as channel:
        method = channel.unary_stream(
            f"/{pb.INFERENCE_SERVICE}/StreamPredictions", response_deserializer=pb.PredictionResponse.FromString
        )
        request = pb.PredictionsRequest(model_name=model, input={"data": body}).SerializeToString()
        messages, times, error = streams.grpc_stream(lambda r, timeout: method(r, timeout=timeout), request)
    assert error is None, error
    return messages, times


def measure(side: dict, protocol: str, model: str, body: bytes, parts: int, count: int):
    """``count`` requests one after another: (first chunk times, last chunk times), ms."""
    firsts, lasts = [], []
    for _ in range(count):
        if protocol == "HTTP":
            answer = streams.post(side["http"], f"/predictions/{model}", body)
            assert answer.complete and answer.status == 200, answer.status
            times = answer.times
        else:
            _, times = grpc_stream(side["grpc"], model, body)
        assert len(times) >= parts - 1, len(times)  # an empty last part is no chunk over HTTP
        firsts.append(times[0] * 1000)
        lasts.append(times[-1] * 1000)
    return firsts, lasts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="p6-"))
    store = root / "model-store"
    ts_streaming.build(store, token_seconds=0.02, max_new_tokens=50)
    config = properties.write_config(store, root / "config" / "config.properties")
    home = short_tmp("p6-")
    ts_server = torchserve_launch.start(config, store, home, timeout=300)
    engine = Engine(root).wait_ready()
    sides = {
        "TorchServe 0.12": {"http": int(ts_server.inference.rsplit(":", 1)[1]), "grpc": ts_server.ts_grpc_inference},
        "tsctl engine": {"http": engine.http, "grpc": f"127.0.0.1:{engine.ts_grpc}"},
    }
    rows = []
    try:
        for workload, (model, body, parts) in WORKLOADS.items():
            for protocol in ("HTTP", "gRPC"):
                for side in sides.values():  # warm both up
                    measure(side, protocol, model, body, parts, 3)
                found = {name: ([], []) for name in sides}

                def run_side(name):
                    def run():
                        firsts, lasts = measure(sides[name], protocol, model, body, parts, args.requests)
                        found[name][0].extend(firsts)
                        found[name][1].extend(lasts)
                        return round(statistics.median(firsts), 1)

                    return run

                alternate({name: run_side(name) for name in sides}, args.rounds)
                for name, (firsts, lasts) in found.items():
                    rows.append(
                        (
                            workload,
                            protocol,
                            name,
                            statistics.median(firsts),
                            percentile(firsts, 0.9),
                            statistics.median(lasts),
                        )
                    )
    finally:
        server.stop(ts_server)
        engine.stop()
    table = "\n".join(f"| {w} | {p} | {n} | {f:.1f} | {f90:.1f} | {last:.1f} |" for w, p, n, f, f90, last in rows)
    write_section(
        "P6",
        f"""
## P6 streamed answers: time to first chunk

`benchmarks/p6_streaming.py`: {args.requests} requests a round, {args.rounds} rounds, one client at a time;
milliseconds from the request's last byte to the first part's bytes (median, 90th percentile) and to
the last part's (median). The stand-in is shaped as pytorch/serve's gpt_fast handler (50 tokens, 20 ms
each: the first token comes 20 ms after the request reaches the handler); the probe sends 100 parts of
16 bytes with no pause (what each server costs per part).

| workload | protocol | server | first chunk (median) | first chunk (p90) | last chunk (median) |
|---|---|---|---|---|---|
{table}
""",
    )


if __name__ == "__main__":
    main()
