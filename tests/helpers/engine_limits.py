"""The tsctl engine inside a memory cgroup of its own, serving a handler that sleeps, streams, answers big
or sums a v2 binary tensor; typed gRPC calls to it."""

import contextlib
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

from helpers.cgroups import MemoryLimit
from helpers.engine import BIN, Engine, snapshot_entry
from serving.engine import ts_protos as ts_pb

MAX_REQUEST = 64 << 20

MAX_RESPONSE = 64 << 20

HANDLER = '''\
import json, os, time

import numpy as np
from ts.handler_utils.utils import send_intermediate_predict_response


def handle(data, context):
    """'sleep S': answers after S s; 'big N': N bytes; 'stream N SIZE PAUSE': N chunks of SIZE bytes,
    PAUSE s apart; a v2 binary request: the sum of its FP32 tensor and the body's size."""
    if data is None:
        return None
    answers = []
    for index, row in enumerate(data):
        body = row.get("body") if row.get("body") is not None else row.get("data")
        headers = {k.lower(): v for k, v in context.request_processor[index].get_request_properties().items()}
        if "inference-header-content-length" in headers:
            length = int(headers["inference-header-content-length"])
            header = json.loads(bytes(body[:length]))
            values = np.frombuffer(bytes(body[length:]), dtype=np.float32)
            outputs = [{"name": "sum", "shape": [1], "datatype": "FP64", "data": [float(values.sum(dtype=np.float64))]},
                       {"name": "size", "shape": [1], "datatype": "INT64", "data": [len(body)]},
                       {"name": "inputs", "shape": [1], "datatype": "BYTES", "data": [json.dumps(header["inputs"])]}]
            answers.append({"model_name": header["model_name"], "id": header["id"], "outputs": outputs})
            continue
        words = (bytes(body).decode() if isinstance(body, (bytes, bytearray)) else str(body)).split()
        if words[0] == "sleep":
            time.sleep(float(words[1]))
            answers.append({"slept": float(words[1]), "pid": os.getpid()})
        elif words[0] == "big":
            answers.append(b"x" * int(words[1]))
        elif words[0] == "stream":
            count, size, pause = int(words[1]), int(words[2]), float(words[3])
            for part in range(count - 1):
                send_intermediate_predict_response([b"%d" % part * size], context.request_ids, "", 200, context)
                time.sleep(pause)
            answers.append(b"%d" % (count - 1) * size)
        else:
            answers.append({"echo": words, "pid": os.getpid()})
    return answers
'''


def write_config(path: Path, models: dict, max_request: int = MAX_REQUEST, max_response: int = MAX_RESPONSE) -> Path:
    snapshot = {"name": "startup.cfg", "modelCount": len(models), "models": models}
    path.write_text(
        f"max_request_size={max_request}\nmax_response_size={max_response}\ndisable_token_authorization=true\n"
        f"model_snapshot={json.dumps(snapshot)}\n"
    )
    return path


def archive_handler(handler: Path, names, store: Path):
    """``handler`` archived by torch-model-archiver under each of ``names`` into ``store``."""
    for name in names:
        command = [
            str(BIN / "torch-model-archiver"),
            "--model-name",
            name,
            "--version",
            "1.0",
            "--handler",
            str(handler),
            "--export-path",
            str(store),
        ]
        subprocess.run(command, check=True, capture_output=True, env=dict(os.environ, TMPDIR=str(store.parent)))


def limits_tree(root: Path, workers: dict, max_request: int = MAX_REQUEST) -> Path:
    """``root`` as the engine serves it: model-store/ with HANDLER archived under each name of ``workers``
    (name: its worker count; batch 1, responseTimeout 60 s) and config/config.properties."""
    store = root / "model-store"
    store.mkdir()
    handler = root / "limits.py"
    handler.write_text(HANDLER)
    archive_handler(handler, tuple(workers), store)
    (root / "config").mkdir()
    models = {name: snapshot_entry(f"{name}.mar", count, 1, 0, 60) for name, count in workers.items()}
    write_config(root / "config" / "config.properties", models, max_request)
    return root


@contextlib.contextmanager
def engine_in_cgroup(tree: Path, limit: int, *extra: str):
    """The engine serving ``tree`` (``extra``: more of its arguments), started inside a memory cgroup of its
    own of ``limit`` bytes (joined at spawn, so that the bound on bodies in flight it computes at start is
    the group's), stopped after."""
    group = MemoryLimit(None, limit)
    if group.cgroup is None:
        pytest.skip("no memory cgroup can be made here")
    try:
        running = Engine(tree, *extra, preexec_fn=group.join).wait_ready()
        running.cgroup = group.cgroup
        try:
            yield running
        finally:
            assert running.stop() == 0
    finally:
        group.release()


def typed_request(model: str, values: np.ndarray) -> bytes:
    """A ModelInferRequest with ``values`` in ``contents.fp32_contents`` (as tritonclient and KServe's
    client send typed tensors), made from the packed field's wire bytes: no Python float per element."""
    data = values.astype("<f4").tobytes()
    field = pb.InferTensorContents.DESCRIPTOR.fields_by_name["fp32_contents"].number
    contents = pb.InferTensorContents.FromString(bytes([field << 3 | 2]) + varint(len(data)) + data)
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[len(values)], contents=contents)
    return pb.ModelInferRequest(model_name=model, id="typed", inputs=[tensor]).SerializeToString()


def varint(value: int) -> bytes:
    out = b""
    while True:
        out += bytes([value & 0x7F | (0x80 if value > 0x7F else 0)])
        value >>= 7
        if not value:
            return out


def grpc_infer(engine, model: str, values: np.ndarray, timeout: float = 60):
    """(None, {output: value}) or (status code, message) of one ModelInfer with typed contents."""
    with grpc.insecure_channel(f"127.0.0.1:{engine.grpc}", options=[("grpc.max_send_message_length", -1)]) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer", response_deserializer=pb.ModelInferResponse.FromString
        )
        try:
            response = call(typed_request(model, values), timeout=timeout)
        except grpc.RpcError as exc:
            return exc.code(), exc.details()
    answer = {}
    for index, output in enumerate(response.outputs):
        if response.raw_output_contents:
            raw = response.raw_output_contents[index]
            dtype = {"FP64": "<f8", "INT64": "<i8"}.get(output.datatype)
            answer[output.name] = np.frombuffer(raw, dtype)[0] if dtype else raw[4:].decode()
        else:
            contents = output.contents
            answer[output.name] = (
                list(contents.fp64_contents)
                or list(contents.int64_contents)
                or [b.decode() for b in contents.bytes_contents]
            )[0]
    return None, answer


def ts_predicts(engine, payload: bytes = b"echo", metadata: tuple = (), compression=None, timeout: float = 30):
    """TorchServe's gRPC Predictions to ``other`` from 127.0.0.1: (None, the echoed word) or (status code,
    details). ``metadata``: the call's (``authorization``)."""
    with grpc.insecure_channel(f"127.0.0.1:{engine.ts_grpc}") as channel:
        call = channel.unary_unary(
            f"/{ts_pb.INFERENCE_SERVICE}/Predictions",
            request_serializer=ts_pb.PredictionsRequest.SerializeToString,
            response_deserializer=ts_pb.PredictionResponse.FromString,
        )
        try:
            answer = call(
                ts_pb.PredictionsRequest(model_name="other", input={"data": payload}),
                timeout=timeout,
                metadata=metadata,
                compression=compression,
            )
        except grpc.RpcError as exc:
            return exc.code(), exc.details()
    return None, json.loads(answer.prediction)["echo"][0]


def engine_rss(engine) -> int:
    """The engine process's resident memory (its group's usage counts page cache too)."""
    return psutil.Process(engine.process.pid).memory_info().rss


class Neighbour:
    """A good request to ``neighbour`` every 0.2 s while the attack runs: each status and latency."""

    def __init__(self, engine, timeout: float = 30):
        self.engine, self.timeout, self.answers = engine, timeout, []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.done.is_set():
            started = time.monotonic()
            try:
                status, _ = self.engine.post("/predictions/neighbour", b"echo", timeout=self.timeout)
            except OSError as exc:
                status = repr(exc)
            self.answers.append((status, time.monotonic() - started))
            self.done.wait(0.2)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join(self.timeout + 5)

    def check(self, slowest: float = 5.0):
        assert self.answers, "no neighbour request was made"
        bad = [(s, round(t, 2)) for s, t in self.answers if s != 200 or t > slowest]
        assert not bad, f"neighbour requests failed or were slow during the attack: {bad[:10]}"
        return max(t for _, t in self.answers)
