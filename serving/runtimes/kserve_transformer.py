"""A toolkit handler's decode/preprocess and postprocess as a KServe custom transformer.

    python -m serving.runtimes.kserve_transformer --model_name resnet18 \\
        --archive /mnt/models/transformer/resnet18.mar \\
        --predictor_host resnet18-predictor.default --predictor_protocol v1

The transformer loads the archive's handler without its weights. A request (KServe v1 instances or
v2 BYTES inputs) is decoded and preprocessed into one batch tensor, sent to the predictor (a
``--handler tensor`` archive serving the same weights under the same model name), and the
predictor's raw outputs are postprocessed into the handler's answers. The predictor's requests are
built and its answers read by handlers/kserve_client.py: v2 in the binary tensor extension (the
batch's float32 bytes as they are, the output's bytes back), v1 as JSON ``instances``. A request
refused here gets the status ``errors.STATUS`` gives it, as far as KServe's errors carry one (400 for every
refusal, 500 for every failure). Needs ``pip install tsctl[kserve]``.

``--verify_on_start`` (for an archive packaged with ``--golden``) first sends the golden inputs
through this transformer and its predictor and compares the answers with the golden ones: the
transformer refuses to start when they differ, and says which side differs (this side's libraries
against the archive's fingerprint; else the predictor: other weights or another model version).
"""

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Dict, Optional, Tuple

import numpy as np
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer, model_server
from kserve.errors import InferenceError as KServeInferenceError
from kserve.errors import InvalidInput

from handlers import golden, protocol
from handlers.base import Job
from handlers.protocol import ClientError, Request

from . import split


def kserve_error(exc: BaseException, stage: str = protocol.READ, what: str = "") -> Exception:
    """KServe's exception for a request's error (its status from ``protocol.STATUS``): InvalidInput for a
    refusal (KServe's ModelServer answers every one 400), KServe's InferenceError (500) for a failure."""
    error = protocol.error_for(exc, stage, what)
    return InvalidInput(error.message) if error.status < 500 else KServeInferenceError(error.message)


class Predictor:
    """The ``--handler tensor`` predictor behind the transformer: one batch tensor sent as kserve_client.py
    encodes it (v2: the binary tensor extension, the array's raw bytes, outputs asked for in binary;
    v1: ``instances``), its output read back as one float32 array."""

    def __init__(self, host: str, protocol_version, model: str, use_ssl: bool = False, timeout: float = 60):
        try:
            form = protocol.kserve_protocol(protocol_version)  # V1 or V2, or "v1"/"v2" as the command line says
        except ValueError:
            raise ValueError(
                f"--predictor_protocol {protocol_version!r}: the transformer calls its predictor over v1 or v2"
            ) from None
        scheme = "https" if use_ssl else "http"
        path = f"/v2/models/{model}/infer" if form is protocol.V2 else f"/v1/models/{model}:predict"
        self.url, self.protocol, self.timeout = f"{scheme}://{host}{path}", form, timeout
        self.verify = (os.environ.get("REQUESTS_CA_BUNDLE") or True) if use_ssl else True
        self.client = None  # an httpx.AsyncClient, made in the server's event loop

    def request(self, tensor: np.ndarray) -> Tuple[bytes, Dict[str, str]]:
        return protocol.encode_request(tensor, self.protocol, binary=self.protocol is protocol.V2)

    def output(self, status: int, body: bytes, headers) -> np.ndarray:
        if status != 200:
            try:
                message = json.loads(body).get("message") or body.decode("utf-8", errors="replace")
            except (ValueError, AttributeError):
                message = body.decode("utf-8", errors="replace")
            raise protocol.InferenceError(f"the predictor at {self.url} answered {status}: {message}")
        try:
            return np.asarray(protocol.decode_answers(body, headers), dtype=np.float32)
        except ValueError as exc:
            raise protocol.InferenceError(f"the predictor at {self.url}: {exc}") from None

    async def infer(self, tensor: np.ndarray, forwarded: Optional[Dict[str, str]] = None) -> np.ndarray:
        """The predictor's output for ``tensor``; ``forwarded``: the client's headers it gets too."""
        import httpx

        if self.client is None:
            self.client = httpx.AsyncClient(timeout=self.timeout, verify=self.verify)
        body, headers = self.request(tensor)
        response = await self.client.post(self.url, content=body, headers={**(forwarded or {}), **headers})
        return self.output(response.status_code, response.content, response.headers)

    def infer_now(self, tensor: np.ndarray) -> np.ndarray:
        """``infer`` outside the server's event loop (``--verify_on_start``)."""
        import httpx

        body, headers = self.request(tensor)
        response = httpx.post(self.url, content=body, headers=headers, timeout=self.timeout, verify=self.verify)
        return self.output(response.status_code, response.content, response.headers)


FORWARDED = ("x-request-id", "x-b3-traceid", "authorization")  # the client's headers the predictor gets, as KServe's


class ToolkitTransformer(Model):
    def __init__(self, name: str, archive: str, predictor: Predictor):
        super().__init__(name)
        self.handler = split.load_handler(archive)
        self.predictor = predictor
        self.ready = True

    def batch(self, job: Job) -> np.ndarray:
        """One request's items decoded and preprocessed as the handler would in a worker (same limits,
        same errors): the batch tensor, as an array."""
        try:
            return split.batch(self.handler, job)
        except ClientError as error:
            raise kserve_error(error) from None

    def preprocess(self, payload, headers=None):
        """The batch for the predictor, in a dict (what KServe's ``validate`` lets through)."""
        if isinstance(payload, InferRequest):
            items = list(payload.inputs[0].data)
            try:
                protocol.check_count(items, self.handler.limits)
            except ClientError as error:
                raise kserve_error(error) from None
            return {"tensor": self.batch(Job(Request(items, protocol.V2))), "v2": True, "id": payload.id}
        return {"tensor": self.batch(self.handler.read({"body": payload})), "v2": False}

    async def predict(self, payload, headers=None, response_headers=None):
        forwarded = {k: v for k, v in (headers or {}).items() if k.lower() in FORWARDED}
        try:
            output = await self.predictor.infer(payload["tensor"], forwarded)
        except ClientError as error:
            raise kserve_error(error) from None
        return {**payload, "tensor": None, "output": output}

    def answers(self, outputs: np.ndarray) -> list:
        try:
            return split.answers(self.handler, outputs)
        except ClientError as error:
            raise kserve_error(error) from None

    def postprocess(self, result, headers=None, response_headers=None):
        answers = self.answers(result["output"])
        if result["v2"]:
            output = InferOutput("output-0", [len(answers)], "BYTES", [json.dumps(a) for a in answers])
            return InferResponse(result["id"], self.name, [output])
        return {"predictions": answers}


def verify_predictor(transformer: "ToolkitTransformer", archive: str) -> list:
    """Golden inputs through this transformer and its predictor; the lines that differ, with which
    side differs. Refused inputs are skipped (the transformer answers them itself)."""
    recorded = golden.read(archive)
    if recorded is None:
        return [f"--verify_on_start: {archive} has no {golden.GOLDEN}: package it with --golden DIR"]
    problems = []
    for case in [c for c in recorded["cases"] if c["status"] == 200]:
        tensor = transformer.batch(transformer.handler.read({"body": golden.body(case)}))
        [answer] = transformer.answers(transformer.predictor.infer_now(tensor))
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
    if not args.predictor_host:
        parser.error("--predictor_host is required: the predictor serving the archive's model (--handler tensor)")
    try:
        protocol_version = protocol.kserve_protocol(args.predictor_protocol or protocol.V1)
    except ValueError:
        parser.error(
            f"--predictor_protocol {args.predictor_protocol}: the transformer calls its predictor over v1 or v2"
        )
    timeout = getattr(args, "predictor_request_timeout_seconds", None) or 600
    predictor = Predictor(
        args.predictor_host, protocol_version, args.model_name, getattr(args, "predictor_use_ssl", False), timeout
    )
    transformer = ToolkitTransformer(args.model_name, args.archive, predictor)
    if args.verify_on_start:
        problems = verify_predictor(transformer, args.archive)
        if problems:
            sys.exit("tsctl transformer: golden answers drifted through the predictor: " + "; ".join(problems))
        print(f"tsctl transformer: golden answers verified through {args.predictor_host}", flush=True)
    ModelServer().start([transformer])


if __name__ == "__main__":
    main()
