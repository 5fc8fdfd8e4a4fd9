"""tritonclient's gRPC client, run in a process of its own: its protos and kserve's (imported by the
kserve client tests) declare the same ``inference`` package, which one Python process cannot hold.

    python tests/helpers/grpc_client.py HOST:PORT MODEL [--unload] [--contents] < inputs.json  ->  JSON on stdout

stdin: a JSON list of base64 strings, each one element of a BYTES input ``input-0``. stdout:
``server_ready``, ``model_ready``, ``answers`` (the BYTES output ``output-0``'s elements as text),
and with ``--unload`` the error the server gave for ``unload_model`` and ``ready_after``.
``--contents`` sends the elements in the message's ``contents.bytes_contents`` instead of
``raw_input_contents`` (tritonclient's way), through the service stub itself.
"""

import base64
import json
import subprocess
import sys


def call(address: str, model: str, elements=(), unload=False, contents=False, timeout: float = 120) -> dict:
    """Run this file as a process and return what it printed (for the tests)."""
    command = [sys.executable, __file__, address, model] + (["--unload"] if unload else [])
    command += ["--contents"] if contents else []
    payload = json.dumps([base64.b64encode(e).decode() for e in elements])
    done = subprocess.run(command, input=payload, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def split_bytes(raw: bytes) -> list:
    """A v2 BYTES tensor's raw contents: each element a 4-byte little-endian length, then its bytes."""
    items, at = [], 0
    while at < len(raw):
        size = int.from_bytes(raw[at : at + 4], "little")
        items.append(raw[at + 4 : at + 4 + size])
        at += 4 + size
    return items


def main():
    import numpy as np
    import tritonclient.grpc as triton_grpc

    address, model = sys.argv[1], sys.argv[2]
    elements = [base64.b64decode(e) for e in json.loads(sys.stdin.read() or "[]")]
    client = triton_grpc.InferenceServerClient(address)
    out = {"server_ready": client.is_server_ready(), "model_ready": client.is_model_ready(model)}
    if elements and "--contents" in sys.argv:
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        tensor = service_pb2.ModelInferRequest().InferInputTensor(
            name="input-0", datatype="BYTES", shape=[len(elements)]
        )
        tensor.contents.bytes_contents.extend(elements)
        request = service_pb2.ModelInferRequest(model_name=model, inputs=[tensor])
        stub = service_pb2_grpc.GRPCInferenceServiceStub(client._channel)
        response = stub.ModelInfer(request, timeout=120)
    elif elements:
        tensor = triton_grpc.InferInput("input-0", [len(elements)], "BYTES")
        tensor.set_data_from_numpy(np.array(elements, dtype=np.object_))
        response = client.infer(model, [tensor]).get_response()
    if elements:
        # tritonclient's as_numpy of BYTES fails under numpy 2 (copy=False): read the message itself
        raw = response.raw_output_contents
        answers = split_bytes(raw[0]) if raw else list(response.outputs[0].contents.bytes_contents)
        out["answers"] = [a.decode("utf-8") for a in answers]
    if "--unload" in sys.argv:
        try:
            client.unload_model(model)
            out["unload_error"] = None
        except Exception as exc:  # noqa: BLE001 - the error is the answer
            out["unload_error"] = str(exc)
        out["ready_after"] = client.is_model_ready(model)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
