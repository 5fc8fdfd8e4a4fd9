"""Continuous batching (#44): time to first chunk and throughput with 1, 8 and 32 concurrent streams,
TorchServe 0.12 vs the tsctl engine.

    .venv/bin/python benchmarks/continuous_batching.py [--tokens 20] [--rounds 2]

The same archive on both (samples/ts_continuous.py: ``continuousBatching: true``, one worker, batchSize 8,
a step of 20 ms whatever the batch holds, one token a step for each request). C clients at once, each
asking ``--tokens`` tokens, over HTTP (chunked ``/predictions``) and gRPC (``StreamPredictions``); each
side in turn for ``--rounds`` rounds (common.alternate). Time to first chunk: from the request's last byte
to its first chunk (median, 90th percentile); throughput: tokens answered a second, from the first
request sent to the last chunk. A call that fails (its deadline, 20 s) is counted as failed.
"""

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from common import alternate, percentile, write_section

from archiver import properties  # noqa: E402
from helpers import side_by_side, streams  # noqa: E402
from samples import ts_continuous  # noqa: E402

CONCURRENCY = (1, 8, 32)


def grpc_call(address: str, body: bytes):
    import grpc

    from serving.engine import ts_protos as pb

    with grpc.insecure_channel(address) as channel:
        method = channel.unary_stream(
            f"/{pb.INFERENCE_SERVICE}/StreamPredictions", response_deserializer=pb.PredictionResponse.FromString
        )
        request = pb.PredictionsRequest(model_name="tokens", input={"data": body}).SerializeToString()
        messages, times, error = streams.grpc_stream(lambda r, timeout: method(r, timeout=timeout), request, 20)
    return len(messages), times, error


def burst(side: dict, protocol: str, clients: int, tokens: int) -> dict:
    """``clients`` requests at once: each one's first-chunk time (s), the tokens answered, failures, wall time."""
    results, body = [], json.dumps({"prompt": "word", "max_new_tokens": tokens}).encode()

    def one():
        if protocol == "HTTP":
            answer = streams.post(side["http"], "/predictions/tokens", body, "application/json", timeout=20)
            ok = answer.complete and answer.status == 200 and len(answer.chunks) == tokens
            results.append((answer.times[0] if answer.times else None, len(answer.chunks), ok))
        else:
            count, times, error = grpc_call(side["grpc"], body)
            results.append((times[0] if times else None, count, error is None and count == tokens))

    started = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(clients)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    wall = time.perf_counter() - started
    return {
        "first": [r[0] for r in results if r[0] is not None and r[2]],
        "tokens": sum(r[1] for r in results if r[2]),
        "failed": sum(not r[2] for r in results),
        "wall": wall,
    }


def compare(sides: dict, protocol: str, clients: int, args) -> list:
    """One table row per side: ``clients`` streams at once, the sides alternating for ``args.rounds`` rounds."""
    found = {name: [] for name in sides}

    def run_side(name):
        def run():
            found[name].append(burst(sides[name], protocol, clients, args.tokens))
            return found[name][-1]["failed"]

        return run

    alternate({name: run_side(name) for name in sides}, args.rounds)
    rows = []
    for name, runs in found.items():
        firsts = [f * 1000 for r in runs for f in r["first"]]
        rate = statistics.median(r["tokens"] / r["wall"] for r in runs)
        rows.append((protocol, clients, name, firsts, rate, sum(r["failed"] for r in runs), clients * len(runs)))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="cb-"))
    store = root / "model-store"
    ts_continuous.build(store, batch=8, step=0.02)
    properties.write_config(store, root / "config" / "config.properties", extra={"disable_token_authorization": "true"})
    rows = []
    with side_by_side.started(root, "cb-") as (torchserve, engine):
        sides = {
            "TorchServe 0.12": {"http": side_by_side.http_port(torchserve), "grpc": torchserve.ts_grpc_inference},
            "tsctl engine": {"http": engine.http, "grpc": f"127.0.0.1:{engine.ts_grpc}"},
        }
        for protocol in ("HTTP", "gRPC"):
            for clients in CONCURRENCY:
                rows.extend(compare(sides, protocol, clients, args))

    def cells(firsts, rate, failed, total):
        if not firsts:
            return f"- | - | - | {failed} of {total}"
        return f"{statistics.median(firsts):.0f} | {percentile(firsts, 0.9):.0f} | {rate:.0f} | {failed} of {total}"

    table = "\n".join(f"| {p} | {c} | {n} | {cells(f, r, fl, t)} |" for p, c, n, f, r, fl, t in rows)
    write_section(
        "CONTINUOUS",
        f"""
## Continuous batching: concurrent streams (issue #44)

`benchmarks/continuous_batching.py`: samples/ts_continuous.py's archive (`continuousBatching: true`, one
worker, batchSize 8, a step of 20 ms whatever the batch holds), C clients at once each asking {args.tokens}
tokens, {args.rounds} rounds alternating the servers. First chunk: ms from the request's last byte
(median, 90th percentile); tokens/s: tokens answered over the burst's wall time (median of rounds);
failed: calls that did not end whole within 20 s.

| protocol | streams | server | first chunk (median) | first chunk (p90) | tokens/s | failed |
|---|---|---|---|---|---|---|
{table}
""",
    )


if __name__ == "__main__":
    main()
