"""A stand-in for pytorch/serve's ts_scripts/torchserve_grpc_client.py, in its shape: the same command
line, the same fixed addresses (localhost:7070 for inference, localhost:7071 for management), the
same calls through stubs generated from TorchServe's protos (``inference_pb2`` ... importable), the
same printing and exit codes. Written for this project (the example's own file stays out of the
repository); with ``TSCTL_PYTORCH_SERVE`` the tests run the checkout's script instead.

    python samples/ts_grpc_client.py infer MODEL INPUT_FILE [--auth-token TOKEN]
    python samples/ts_grpc_client.py infer_stream MODEL INPUT_FILE
    python samples/ts_grpc_client.py infer_stream2 MODEL SEQUENCE_ID FILE[,FILE...]
    python samples/ts_grpc_client.py register MODEL [MAR,...]
    python samples/ts_grpc_client.py unregister MODEL
"""

import argparse
import sys

import grpc
import inference_pb2
import inference_pb2_grpc
import management_pb2
import management_pb2_grpc


def inference_stub():
    return inference_pb2_grpc.InferenceAPIsServiceStub(grpc.insecure_channel("localhost:7070"))


def management_stub():
    return management_pb2_grpc.ManagementAPIsServiceStub(grpc.insecure_channel("localhost:7071"))


def read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def infer(stub, model_name, model_input, metadata):
    request = inference_pb2.PredictionsRequest(model_name=model_name, input={"data": read(model_input)})
    response = stub.Predictions(request, metadata=metadata)
    print(response.prediction.decode("utf-8"))


def infer_stream(stub, model_name, model_input, metadata):
    request = inference_pb2.PredictionsRequest(model_name=model_name, input={"data": read(model_input)})
    try:
        for response in stub.StreamPredictions(request, metadata=metadata):
            print(response.prediction.decode("utf-8"))
    except grpc.RpcError:
        sys.exit(1)


def infer_stream2(stub, model_name, sequence_id, input_files, metadata):
    requests = [
        inference_pb2.PredictionsRequest(model_name=model_name, sequence_id=sequence_id, input={"data": read(f)})
        for f in (name.strip() for name in input_files.split(","))
    ]
    try:
        for response in stub.StreamPredictions2(iter(requests), metadata=metadata):
            print(str(response))
    except grpc.RpcError as exc:
        print("infer_stream2 received error", exc)
        sys.exit(1)
    print("Sequence completed!")


def register(stub, model_name, mar_set_str, metadata):
    mar_set = set(mar_set_str.split(",")) if mar_set_str else set()
    marfile = f"{model_name}.mar"
    print(f"## Check {marfile} in mar_set :", mar_set)
    if marfile not in mar_set:
        marfile = f"https://torchserve.s3.amazonaws.com/mar_files/{model_name}.mar"
    print(f"## Register marfile: {marfile}\n")
    params = {"url": marfile, "initial_workers": 1, "synchronous": True, "model_name": model_name}
    try:
        stub.RegisterModel(management_pb2.RegisterModelRequest(**params), metadata=metadata)
        print(f"Model {model_name} registered successfully")
    except grpc.RpcError as exc:
        print(f"Failed to register model {model_name}.")
        print(str(exc.details()))
        sys.exit(1)


def unregister(stub, model_name, metadata):
    try:
        stub.UnregisterModel(management_pb2.UnregisterModelRequest(model_name=model_name), metadata=metadata)
        print(f"Model {model_name} unregistered successfully")
    except grpc.RpcError as exc:
        print(f"Failed to unregister model {model_name}.")
        print(str(exc.details()))
        sys.exit(1)


def main():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("model_name")
    common.add_argument("--auth-token", dest="auth_token", default=None)
    parser = argparse.ArgumentParser(description="TorchServe gRPC client")
    actions = parser.add_subparsers(dest="action")
    for name in ("infer", "infer_stream"):
        actions.add_parser(name, parents=[common], add_help=False).add_argument("model_input")
    stream2 = actions.add_parser("infer_stream2", parents=[common], add_help=False)
    stream2.add_argument("sequence_id")
    stream2.add_argument("input_files")
    actions.add_parser("register", parents=[common], add_help=False).add_argument("mar_set", nargs="?")
    actions.add_parser("unregister", parents=[common], add_help=False)
    args = parser.parse_args()
    metadata = (("protocol", "gRPC"), ("session_id", "12345"))
    if args.auth_token:
        metadata += (("authorization", f"Bearer {args.auth_token}"),)
    if args.action == "infer":
        infer(inference_stub(), args.model_name, args.model_input, metadata)
    elif args.action == "infer_stream":
        infer_stream(inference_stub(), args.model_name, args.model_input, metadata)
    elif args.action == "infer_stream2":
        infer_stream2(inference_stub(), args.model_name, args.sequence_id, args.input_files, metadata)
    elif args.action == "register":
        register(management_stub(), args.model_name, args.mar_set, metadata)
    elif args.action == "unregister":
        unregister(management_stub(), args.model_name, metadata)


if __name__ == "__main__":
    main()
