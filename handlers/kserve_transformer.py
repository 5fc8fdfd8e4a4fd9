"""A toolkit handler's decode/preprocess and postprocess as a KServe custom transformer.

    python -m handlers.kserve_transformer --model_name resnet18 --archive /mnt/models/transformer/resnet18.mar \\
        --predictor_host resnet18-predictor.default --predictor_protocol v1

The transformer loads the archive's handler without its weights. A request (KServe v1 instances or
v2 BYTES inputs) is decoded and preprocessed into one batch tensor, sent to the predictor (a
``--handler tensor`` archive serving the same weights under the same model name), and the
predictor's raw outputs are postprocessed into the handler's answers. Needs ``pip install tsctl[kserve]``.

``--verify_on_start`` (for an archive packaged with ``--golden``) first sends the golden inputs
through this transformer and its predictor and compares the answers with the golden ones: the
transformer refuses to start when they differ, and says which side differs (this side's libraries
against the archive's fingerprint; else the predictor: other weights or another model version).
"""

import argparse
import importlib
import json
import sys
import tempfile
import urllib.request
from pathlib import Path

import torch
import ts
import yaml
from kserve import InferInput, InferOutput, InferRequest, InferResponse, Model, ModelServer, model_server
from kserve.errors import InvalidInput
from ts.context import Context

from . import golden, identity
from .archives import ArchiveError, check_inside, read_manifest, unpack
from .base import Job
from .requests import V2, ClientError, Request, check_count


def load_handler(archive, with_model: bool = False):
    """The archive's toolkit handler, initialised like a worker's (weights only if ``with_model``)."""
    manifest = read_manifest(archive)
    record = identity.read(archive) or {}
    if not record.get("splits"):
        raise ArchiveError(
            f"{archive}: its handler ({record.get('class') or manifest['model']['handler']}) cannot run as a KServe "
            "transformer: its preprocess does not turn a request into one tensor (MAR-INF/tsctl.json 'splits')"
        )
    model_dir = unpack(archive, tempfile.mkdtemp(prefix="tsctl-transformer-"))
    check_inside(model_dir, manifest)
    model = manifest["model"]
    if str(model_dir) not in sys.path:  # a handler file of the user's own, as a worker imports it
        sys.path.insert(0, str(model_dir))
    handler_class = getattr(importlib.import_module(record["module"]), record["class"])
    config = yaml.safe_load((model_dir / model["configFile"]).read_text()) if model.get("configFile") else {}
    context = Context(model["modelName"], str(model_dir), manifest, 1, None, ts.__version__, model_yaml_config=config)
    handler = handler_class()
    handler.with_model = with_model
    handler.initialize(context)
    return handler


class ToolkitTransformer(Model):
    def __init__(self, name: str, archive: str):
        super().__init__(name)
        self.handler = load_handler(archive)
        self.ready = True

    def batch(self, job: Job) -> torch.Tensor:
        """One request's items decoded as the handler would in a worker (same limits, same errors)."""
        self.handler.decode_jobs([job])
        if job.error is not None:
            raise InvalidInput(job.error.message)
        with torch.inference_mode():
            return self.handler.preprocess(job.inputs).cpu()

    def preprocess(self, payload, headers=None):
        if isinstance(payload, InferRequest):
            items = list(payload.inputs[0].data)
            try:
                check_count(items, self.handler.limits)
            except ClientError as error:
                raise InvalidInput(error.message) from None
            tensor = self.batch(Job(Request(items, V2)))
            infer_input = InferInput("input-0", list(tensor.shape), "FP32", tensor.flatten().tolist())
            return InferRequest(self.name, [infer_input], request_id=payload.id)
        return {"instances": self.batch(self.handler.read({"body": payload})).tolist()}

    def answers(self, outputs) -> list:
        with torch.inference_mode():
            return self.handler.call_postprocess(torch.as_tensor(outputs, dtype=torch.float32), None)

    def postprocess(self, result, headers=None, response_headers=None):
        if isinstance(result, InferResponse):
            answers = self.answers(result.outputs[0].as_numpy())
            output = InferOutput("output-0", [len(answers)], "BYTES", [json.dumps(a) for a in answers])
            return InferResponse(result.id, self.name, [output])
        return {"predictions": self.answers(result["predictions"])}


def predict_remote(host: str, protocol: str, model: str, tensor: torch.Tensor, timeout: float = 60):
    """The predictor's raw output for ``tensor`` (KServe v1 or v2 JSON), as a float tensor."""
    if protocol == "v2":
        body = {"inputs": [{"name": "input-0", "shape": list(tensor.shape), "datatype": "FP32",
                            "data": tensor.flatten().tolist()}]}  # fmt: skip
        url = f"http://{host}/v2/models/{model}/infer"
    else:
        body, url = {"instances": tensor.tolist()}, f"http://{host}/v1/models/{model}:predict"
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer = json.loads(response.read())
    if protocol == "v2":
        output = answer["outputs"][0]
        return torch.tensor(output["data"], dtype=torch.float32).reshape(output["shape"])
    return torch.tensor(answer["predictions"], dtype=torch.float32)


def verify_predictor(transformer: "ToolkitTransformer", archive: str, host: str, protocol: str) -> list:
    """Golden inputs through this transformer and the predictor at ``host``; the lines that differ,
    with which side differs. Refused inputs are skipped (the transformer answers them itself)."""
    recorded = golden.read(archive)
    if recorded is None:
        return [f"--verify_on_start: {archive} has no {golden.GOLDEN}: package it with --golden DIR"]
    problems = []
    for case in [c for c in recorded["cases"] if c["status"] == 200]:
        tensor = transformer.batch(transformer.handler.read({"body": golden.body(case)}))
        output = predict_remote(host, protocol, transformer.name, tensor)
        [answer] = transformer.answers(output)
        problem = golden.check_case(case, 200, answer, transformer.handler.settings.verify_atol)
        if problem:
            problems.append(problem)
    if problems:
        moved = golden.version_changes(recorded)
        side = (
            f"this transformer's libraries differ: {', '.join(moved)}"
            if moved
            else "this transformer's libraries are as when packaged: the predictor differs (other weights or "
            "another model version)"
        )
        problems.append(side)
    return problems


def main():
    parser = argparse.ArgumentParser(parents=[model_server.parser])
    parser.add_argument("--archive", required=True, help="The toolkit .mar whose pre/post-processing to run.")
    parser.add_argument("--verify_on_start", action="store_true", help="Check the predictor with the golden answers.")
    args, _ = parser.parse_known_args()
    if not Path(args.archive).exists():
        parser.error(f"--archive {args.archive} does not exist")
    transformer = ToolkitTransformer(args.model_name, args.archive)
    if args.verify_on_start:
        problems = verify_predictor(transformer, args.archive, args.predictor_host, args.predictor_protocol or "v1")
        if problems:
            sys.exit("tsctl transformer: golden answers drifted through the predictor: " + "; ".join(problems))
        print(f"tsctl transformer: golden answers verified through {args.predictor_host}", flush=True)
    ModelServer().start([transformer])


if __name__ == "__main__":
    main()
