"""A toolkit handler's decode/preprocess and postprocess as a KServe custom transformer.

    python -m handlers.kserve_transformer --model_name resnet18 --archive /mnt/models/transformer/resnet18.mar \\
        --predictor_host resnet18-predictor.default --predictor_protocol v1

The transformer loads the archive's handler without its weights. A request (KServe v1 instances or
v2 BYTES inputs) is decoded and preprocessed into one batch tensor, sent to the predictor (a
``--handler tensor`` archive serving the same weights under the same model name), and the
predictor's raw outputs are postprocessed into the handler's answers. Needs ``pip install tsctl[kserve]``.
"""

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

import torch
import ts
import yaml
from kserve import InferInput, InferOutput, InferRequest, InferResponse, Model, ModelServer, model_server
from kserve.errors import InvalidInput
from ts.context import Context

from . import identity
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


def main():
    parser = argparse.ArgumentParser(parents=[model_server.parser])
    parser.add_argument("--archive", required=True, help="The toolkit .mar whose pre/post-processing to run.")
    args, _ = parser.parse_known_args()
    if not Path(args.archive).exists():
        parser.error(f"--archive {args.archive} does not exist")
    ModelServer().start([ToolkitTransformer(args.model_name, args.archive)])


if __name__ == "__main__":
    main()
