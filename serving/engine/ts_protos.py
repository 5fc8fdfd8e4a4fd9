"""TorchServe's gRPC messages (pytorch/serve's ``inference.proto`` and ``management.proto``, vendored in
``serving/engine/protos/``), built from their compiled descriptors at import: no code generated for one
protobuf release, so any protobuf 4+ runtime (the engine's, its image's) loads them.

    python -m serving.engine.ts_protos --write  # recompile DESCRIPTORS from serving/engine/protos (grpcio-tools)

``DESCRIPTORS`` is the serialized ``FileDescriptorSet`` of ``google/rpc/status.proto``,
``inference.proto`` and ``management.proto`` as protoc compiles them (``compiled``; the well-known
types they import, ``empty.proto`` and ``any.proto``, come with protobuf itself). A file already in
the default pool (another package's ``google.rpc.status_pb2``) is left as it is.
"""

import sys
from pathlib import Path

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, empty_pb2  # noqa: F401 - their files, in the pool

PROTOS = Path(__file__).resolve().parent / "protos"
FILES = ("google/rpc/status.proto", "inference.proto", "management.proto")
INFERENCE_SERVICE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"
MANAGEMENT_SERVICE = "org.pytorch.serve.grpc.management.ManagementAPIsService"

# fmt: off
DESCRIPTORS = (
    b"\x0a\xf8\x01\x0a\x17google/rpc/status.proto\x12\x0agoogle.rpc\x1a\x19google/protobuf/any.proto\x22N"
    b"\x0a\x06Status\x12\x0c\x0a\x04code\x18\x01 \x01(\x05\x12\x0f\x0a\x07message\x18\x02 \x01(\x09\x12%"
    b"\x0a\x07details\x18\x03 \x03(\x0b2\x14.google.protobuf.AnyB^\x0a\x0ecom.google.rpcB\x0bStatusProtoP"
    b"\x01Z7google.golang.org/genproto/googleapis/rpc/status;status\xa2\x02\x03RPCb\x06proto3\x0a\x97\x08"
    b"\x0a\x0finference.proto\x12 org.pytorch.serve.grpc.inference\x1a\x1bgoogle/protobuf/empty.proto\x1a"
    b"\x17google/rpc/status.proto\x22\xe7\x01\x0a\x12PredictionsRequest\x12\x12\x0a\x0amodel_name\x18\x01 "
    b"\x01(\x09\x12\x15\x0a\x0dmodel_version\x18\x02 \x01(\x09\x12N\x0a\x05input\x18\x03 \x03(\x0b2?.org.p"
    b"ytorch.serve.grpc.inference.PredictionsRequest.InputEntry\x12\x18\x0a\x0bsequence_id\x18\x04 \x01("
    b"\x09H\x00\x88\x01\x01\x1a,\x0a\x0aInputEntry\x12\x0b\x0a\x03key\x18\x01 \x01(\x09\x12\x0d\x0a\x05val"
    b"ue\x18\x02 \x01(\x0c:\x028\x01B\x0e\x0a\x0c_sequence_id\x22\x86\x01\x0a\x12PredictionResponse\x12"
    b"\x12\x0a\x0aprediction\x18\x01 \x01(\x0c\x12\x18\x0a\x0bsequence_id\x18\x02 \x01(\x09H\x00\x88\x01"
    b"\x01\x12'\x0a\x06status\x18\x03 \x01(\x0b2\x12.google.rpc.StatusH\x01\x88\x01\x01B\x0e\x0a\x0c_seque"
    b"nce_idB\x09\x0a\x07_status\x22*\x0a\x18TorchServeHealthResponse\x12\x0e\x0a\x06health\x18\x01 \x01("
    b"\x092\x80\x04\x0a\x14InferenceAPIsService\x12\x5c\x0a\x04Ping\x12\x16.google.protobuf.Empty\x1a:.org"
    b".pytorch.serve.grpc.inference.TorchServeHealthResponse\x22\x00\x12{\x0a\x0bPredictions\x124.org.pyto"
    b"rch.serve.grpc.inference.PredictionsRequest\x1a4.org.pytorch.serve.grpc.inference.PredictionResponse"
    b"\x22\x00\x12\x83\x01\x0a\x11StreamPredictions\x124.org.pytorch.serve.grpc.inference.PredictionsReque"
    b"st\x1a4.org.pytorch.serve.grpc.inference.PredictionResponse\x22\x000\x01\x12\x86\x01\x0a\x12StreamPr"
    b"edictions2\x124.org.pytorch.serve.grpc.inference.PredictionsRequest\x1a4.org.pytorch.serve.grpc.infe"
    b"rence.PredictionResponse\x22\x00(\x010\x01B\x02P\x01b\x06proto3\x0a\xc2\x0c\x0a\x10management.proto"
    b"\x12!org.pytorch.serve.grpc.management\x22!\x0a\x12ManagementResponse\x12\x0b\x0a\x03msg\x18\x01 "
    b"\x01(\x09\x22U\x0a\x14DescribeModelRequest\x12\x12\x0a\x0amodel_name\x18\x01 \x01(\x09\x12\x15\x0a"
    b"\x0dmodel_version\x18\x02 \x01(\x09\x12\x12\x0a\x0acustomized\x18\x03 \x01(\x08\x22;\x0a\x11ListMode"
    b"lsRequest\x12\x0d\x0a\x05limit\x18\x01 \x01(\x05\x12\x17\x0a\x0fnext_page_token\x18\x02 \x01(\x05"
    b"\x22\xfb\x01\x0a\x14RegisterModelRequest\x12\x12\x0a\x0abatch_size\x18\x01 \x01(\x05\x12\x0f\x0a\x07"
    b"handler\x18\x02 \x01(\x09\x12\x17\x0a\x0finitial_workers\x18\x03 \x01(\x05\x12\x17\x0a\x0fmax_batch_"
    b"delay\x18\x04 \x01(\x05\x12\x12\x0a\x0amodel_name\x18\x05 \x01(\x09\x12\x18\x0a\x10response_timeout"
    b"\x18\x06 \x01(\x05\x12\x0f\x0a\x07runtime\x18\x07 \x01(\x09\x12\x13\x0a\x0bsynchronous\x18\x08 \x01("
    b"\x08\x12\x0b\x0a\x03url\x18\x09 \x01(\x09\x12\x12\x0a\x0as3_sse_kms\x18\x0a \x01(\x08\x12\x17\x0a"
    b"\x0fstartup_timeout\x18\x0b \x01(\x05\x22\xa1\x01\x0a\x12ScaleWorkerRequest\x12\x12\x0a\x0amodel_nam"
    b"e\x18\x01 \x01(\x09\x12\x15\x0a\x0dmodel_version\x18\x02 \x01(\x09\x12\x12\x0a\x0amax_worker\x18\x03"
    b" \x01(\x05\x12\x12\x0a\x0amin_worker\x18\x04 \x01(\x05\x12\x12\x0a\x0anumber_gpu\x18\x05 \x01(\x05"
    b"\x12\x13\x0a\x0bsynchronous\x18\x06 \x01(\x08\x12\x0f\x0a\x07timeout\x18\x07 \x01(\x05\x22>\x0a\x11S"
    b"etDefaultRequest\x12\x12\x0a\x0amodel_name\x18\x01 \x01(\x09\x12\x15\x0a\x0dmodel_version\x18\x02 "
    b"\x01(\x09\x22C\x0a\x16UnregisterModelRequest\x12\x12\x0a\x0amodel_name\x18\x01 \x01(\x09\x12\x15\x0a"
    b"\x0dmodel_version\x18\x02 \x01(\x092\xa0\x06\x0a\x15ManagementAPIsService\x12\x81\x01\x0a\x0dDescrib"
    b"eModel\x127.org.pytorch.serve.grpc.management.DescribeModelRequest\x1a5.org.pytorch.serve.grpc.manag"
    b"ement.ManagementResponse\x22\x00\x12{\x0a\x0aListModels\x124.org.pytorch.serve.grpc.management.ListM"
    b"odelsRequest\x1a5.org.pytorch.serve.grpc.management.ManagementResponse\x22\x00\x12\x81\x01\x0a\x0dRe"
    b"gisterModel\x127.org.pytorch.serve.grpc.management.RegisterModelRequest\x1a5.org.pytorch.serve.grpc."
    b"management.ManagementResponse\x22\x00\x12}\x0a\x0bScaleWorker\x125.org.pytorch.serve.grpc.management"
    b".ScaleWorkerRequest\x1a5.org.pytorch.serve.grpc.management.ManagementResponse\x22\x00\x12{\x0a\x0aSe"
    b"tDefault\x124.org.pytorch.serve.grpc.management.SetDefaultRequest\x1a5.org.pytorch.serve.grpc.manage"
    b"ment.ManagementResponse\x22\x00\x12\x85\x01\x0a\x0fUnregisterModel\x129.org.pytorch.serve.grpc.manag"
    b"ement.UnregisterModelRequest\x1a5.org.pytorch.serve.grpc.management.ManagementResponse\x22\x00B\x02P"
    b"\x01b\x06proto3"
)  # END GENERATED
# fmt: on


# ---- Compiling (grpcio-tools): what DESCRIPTORS holds, and rewriting it -------------------------------
def compiled(protos: Path = PROTOS) -> bytes:
    """The FileDescriptorSet protoc makes of ``FILES`` in ``protos`` (imports included, the well-known
    types left out, the files in ``FILES``' order): what ``DESCRIPTORS`` must be."""
    import tempfile

    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "set.pb"
        include = Path(protoc.__file__).parent / "_proto"
        arguments = ["protoc", f"-I{protos}", f"-I{include}", f"--descriptor_set_out={out}", "--include_imports"]
        if protoc.main([*arguments, *(str(protos / name) for name in FILES)]) != 0:
            raise RuntimeError(f"protoc could not compile {', '.join(FILES)} in {protos}")
        found = {proto.name: proto for proto in descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file}
    for proto in found.values():  # as protoc's Python generator serializes a file: no json_name
        kinds = list(proto.message_type)
        while kinds:
            kind = kinds.pop()
            kinds.extend(kind.nested_type)
            for one in kind.field:
                one.ClearField("json_name")
    return descriptor_pb2.FileDescriptorSet(file=[found[name] for name in FILES]).SerializeToString()


def write(path: Path = Path(__file__)):
    """Rewrite ``DESCRIPTORS`` in this file with ``compiled()``, as byte literals of 100 characters at most."""
    text = path.read_text()
    begin = text.index("DESCRIPTORS = (\n") + len("DESCRIPTORS = (\n")
    end = text.index(")  # END GENERATED")
    lines, line = [], ""
    for byte in compiled():
        char = chr(byte) if 32 <= byte < 127 and chr(byte) not in '\\"' else f"\\x{byte:02x}"
        if len(line) + len(char) > 100:
            lines.append(f'    b"{line}"')
            line = ""
        line += char
    lines.append(f'    b"{line}"')
    path.write_text(text[:begin] + "\n".join(lines) + "\n" + text[end:])


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:  # before the messages are built from DESCRIPTORS
    write()
    sys.exit(0)


# ---- The messages --------------------------------------------------------------------------------------
def _message_class(descriptor):
    try:
        from google.protobuf.message_factory import GetMessageClass
    except ImportError:  # protobuf before 4.22
        from google.protobuf.message_factory import MessageFactory

        return MessageFactory().GetPrototype(descriptor)
    return GetMessageClass(descriptor)


def _load():
    pool = descriptor_pool.Default()
    for proto in descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTORS).file:
        try:
            pool.FindFileByName(proto.name)
        except KeyError:
            pool.Add(proto)
    return pool


_pool = _load()


def message(name: str):
    """The message class of a full protobuf name."""
    return _message_class(_pool.FindMessageTypeByName(name))


Empty = empty_pb2.Empty
Any = any_pb2.Any
Status = message("google.rpc.Status")
PredictionsRequest = message("org.pytorch.serve.grpc.inference.PredictionsRequest")
PredictionResponse = message("org.pytorch.serve.grpc.inference.PredictionResponse")
TorchServeHealthResponse = message("org.pytorch.serve.grpc.inference.TorchServeHealthResponse")
ManagementResponse = message("org.pytorch.serve.grpc.management.ManagementResponse")
DescribeModelRequest = message("org.pytorch.serve.grpc.management.DescribeModelRequest")
ListModelsRequest = message("org.pytorch.serve.grpc.management.ListModelsRequest")
RegisterModelRequest = message("org.pytorch.serve.grpc.management.RegisterModelRequest")
ScaleWorkerRequest = message("org.pytorch.serve.grpc.management.ScaleWorkerRequest")
SetDefaultRequest = message("org.pytorch.serve.grpc.management.SetDefaultRequest")
UnregisterModelRequest = message("org.pytorch.serve.grpc.management.UnregisterModelRequest")


def service(name: str):
    """A service's descriptor (its methods, their input and output types, which stream)."""
    return _pool.FindServiceByName(name)
