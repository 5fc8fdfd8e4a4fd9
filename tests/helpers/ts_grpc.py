"""TorchServe's gRPC API from a client's side, each client a process of its own with stubs generated
from pytorch/serve's protos as its README generates them (``grpc_tools.protoc``).

    python tests/helpers/ts_grpc.py calls STUBS INFERENCE MANAGEMENT < calls.json   ->  results, JSON
    python tests/helpers/ts_grpc.py example STUBS INFERENCE MANAGEMENT SCRIPT ARGS...

``calls``: each call ``{"rpc", "request", "metadata", "requests"}`` (``request`` the message's fields,
bytes as base64 under ``input``; ``requests`` a list of them for StreamPredictions2) made with the
generated stubs; each result ``{"code", "details", "messages"}`` (each message as JSON, bytes as
text where they are UTF-8, else base64 under a ``b64:`` prefix). ``example``: pytorch/serve's
``ts_scripts/torchserve_grpc_client.py`` (or its stand-in, ``samples/ts_grpc_client.py``) run as it is,
its fixed ``localhost:7070`` and ``localhost:7071`` channels pointed at the server's ports (the one
change: ``grpc.insecure_channel`` redirected before the script runs).
"""

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENDORED = ROOT / "serving" / "engine" / "protos"
SERVE_ENV = "TSCTL_PYTORCH_SERVE"
PROTO_PATH = "frontend/server/src/main/resources/proto"


def checkout():
    """pytorch/serve's checkout (``TSCTL_PYTORCH_SERVE``), or None."""
    path = os.environ.get(SERVE_ENV)
    return Path(path) if path and (Path(path) / PROTO_PATH).is_dir() else None


def protos() -> Path:
    """Where inference.proto and management.proto are: the checkout's, else the repository's copies."""
    found = checkout()
    return found / PROTO_PATH if found else VENDORED


def example_script() -> Path:
    found = checkout()
    script = found / "ts_scripts" / "torchserve_grpc_client.py" if found else None
    return script if script and script.is_file() else ROOT / "samples" / "ts_grpc_client.py"


def generate(out: Path) -> Path:
    """The Python stubs of inference.proto and management.proto (and google/rpc/status.proto, which
    inference.proto imports and grpcio-tools does not ship) in ``out``."""
    from grpc_tools import protoc

    out.mkdir(parents=True, exist_ok=True)
    source = protos()
    arguments = [
        "protoc",
        f"-I{source}",
        f"-I{VENDORED}",
        f"-I{Path(protoc.__file__).parent / '_proto'}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
    ]
    files = [str(source / name) for name in ("inference.proto", "management.proto")]
    files.append(str(VENDORED / "google/rpc/status.proto"))
    assert protoc.main(arguments + files) == 0, "protoc failed"
    return out


def calls(stubs: Path, inference: str, management: str, wanted: list, timeout: float = 180) -> list:
    """Run ``wanted`` (this module's docstring) in a client process; their results."""
    command = [sys.executable, __file__, "calls", str(stubs), inference, management]
    done = subprocess.run(command, input=json.dumps(wanted), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def example(stubs: Path, inference: str, management: str, *args: str, timeout: float = 180):
    """The example client run as a process (this module's docstring): (exit code, stdout, stderr)."""
    command = [sys.executable, __file__, "example", str(stubs), inference, management, str(example_script()), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr


def call(rpc: str, metadata=(), timeout: float = 120, **request) -> dict:
    """One call for ``calls``: ``input`` values as bytes; ``timeout`` its deadline (s)."""
    if "input" in request:
        request["input"] = {k: base64.b64encode(v).decode() for k, v in request["input"].items()}
    return {"rpc": rpc, "request": request, "metadata": list(metadata), "timeout": timeout}


def stream2(requests: list, metadata=()) -> dict:
    return {
        "rpc": "StreamPredictions2",
        "requests": [call("", **r)["request"] for r in requests],
        "metadata": list(metadata),
    }


# ---- the client process ---------------------------------------------------------------------------------
def as_json(message) -> dict:
    out = {}
    for field, value in message.ListFields():
        if field.name == "status":
            value = {
                "code": value.code,
                "message": value.message,
                "details": [(d.type_url, base64.b64encode(d.value).decode()) for d in value.details],
            }
        elif isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                value = "b64:" + base64.b64encode(value).decode()
        out[field.name] = value
    return out


def run_calls(inference: str, management: str):
    import grpc
    import inference_pb2
    import inference_pb2_grpc
    import management_pb2
    import management_pb2_grpc
    from google.protobuf import empty_pb2

    stubs = {
        "inference": inference_pb2_grpc.InferenceAPIsServiceStub(grpc.insecure_channel(inference)),
        "management": management_pb2_grpc.ManagementAPIsServiceStub(grpc.insecure_channel(management)),
    }
    management_types = {
        "DescribeModel": "DescribeModelRequest",
        "ListModels": "ListModelsRequest",
        "RegisterModel": "RegisterModelRequest",
        "ScaleWorker": "ScaleWorkerRequest",
        "SetDefault": "SetDefaultRequest",
        "UnregisterModel": "UnregisterModelRequest",
    }

    def prediction_request(fields):
        fields = dict(fields)
        fields["input"] = {k: base64.b64decode(v) for k, v in fields.get("input", {}).items()}
        return inference_pb2.PredictionsRequest(**fields)

    results = []
    for wanted in json.loads(sys.stdin.read()):
        rpc, metadata, messages = wanted["rpc"], [tuple(m) for m in wanted.get("metadata", [])], []
        timeout = wanted.get("timeout", 120)
        try:
            if rpc == "Ping":
                messages.append(stubs["inference"].Ping(empty_pb2.Empty(), metadata=metadata, timeout=timeout))
            elif rpc in ("Predictions", "StreamPredictions"):
                answer = getattr(stubs["inference"], rpc)(
                    prediction_request(wanted["request"]), metadata=metadata, timeout=timeout
                )
                messages.extend([answer] if rpc == "Predictions" else answer)
            elif rpc == "StreamPredictions2":
                requests = iter([prediction_request(r) for r in wanted["requests"]])
                messages.extend(stubs["inference"].StreamPredictions2(requests, metadata=metadata, timeout=timeout))
            else:
                request = getattr(management_pb2, management_types[rpc])(**wanted["request"])
                messages.append(getattr(stubs["management"], rpc)(request, metadata=metadata, timeout=timeout))
            code, details = "OK", None
        except grpc.RpcError as exc:
            code, details = exc.code().name, exc.details()
        results.append({"code": code, "details": details, "messages": [as_json(m) for m in messages]})
    print(json.dumps(results))


def run_example(inference: str, management: str, script: str, args: list):
    import runpy

    import grpc

    addresses = {"localhost:7070": inference, "localhost:7071": management}
    insecure_channel = grpc.insecure_channel
    grpc.insecure_channel = lambda target, *a, **k: insecure_channel(addresses.get(target, target), *a, **k)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    mode, stubs_dir, inference_address, management_address = sys.argv[1:5]
    sys.path.insert(0, stubs_dir)
    if mode == "calls":
        run_calls(inference_address, management_address)
    else:
        run_example(inference_address, management_address, sys.argv[5], sys.argv[6:])
