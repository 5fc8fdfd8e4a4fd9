"""Run a .mar (or an unpacked model directory) in-process, the way a TorchServe worker would.

    from handlers.testing import LocalModel

    with LocalModel("model-store/resnet18.mar") as model:
        [answer] = model.predict([open("kitten.jpg", "rb").read()])
        assert answer.status == 200, answer.json()

The handler is loaded with TorchServe's own model loader (``ts.model_loader``), so the context,
the ``module:function`` entry point, model-config.yaml and envelopes are exactly a worker's.
No Java, no HTTP. Each input becomes one request row: ``bytes`` as a raw body, ``str`` as a text
body, ``dict``/``list`` as an already-parsed JSON body, as TorchServe's frontend delivers them.
"""

import json
import os
import shutil
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from ts.context import RequestProcessor
from ts.model_loader import TsModelLoader

from .archives import check_inside, read_manifest, unpack


@dataclass
class Response:
    status: int
    body: Any
    content_type: Optional[str] = None
    headers: dict = field(default_factory=dict)

    def json(self):
        body = self.body
        if isinstance(body, (bytes, bytearray)):
            body = body.decode("utf-8")
        return json.loads(body) if isinstance(body, str) else body


class LocalModel:
    """An archive loaded as a worker loads it. The archive is checked first (names, sizes, manifest
    paths inside it: ``handlers/archives.py``); whatever fails, nothing is left behind."""

    def __init__(
        self,
        archive: Union[str, Path],
        batch_size: int = 8,
        envelope: Optional[str] = None,
        gpu: Optional[int] = None,
    ):
        archive = Path(archive)
        self._tmp = None
        self.model_dir = None
        try:
            self.manifest = read_manifest(archive)
            if archive.is_dir():
                self.model_dir = archive.resolve()
            else:
                self._tmp = tempfile.mkdtemp(prefix="tsctl-run-")
                self.model_dir = unpack(archive, self._tmp).resolve()
            check_inside(self.model_dir, self.manifest)
            model = self.manifest["model"]
            self.model_name = model["modelName"]
            self._forget_modules_outside(model)
            sys.path.insert(0, str(self.model_dir))
            self.service = TsModelLoader().load(
                self.model_name, str(self.model_dir), model["handler"], gpu, batch_size, envelope
            )
        except BaseException:
            self.close()
            raise

    def _forget_modules_outside(self, model: dict):
        """Drop cached user modules (handler.py, model.py) that another model directory loaded."""
        for entry in (model.get("handler", ""), model.get("modelFile", "")):
            name = os.path.splitext(entry.split(":", 1)[0].split("/")[-1])[0]
            module = sys.modules.get(name)
            path = getattr(module, "__file__", None) or ""
            if module is not None and "." not in name and not path.startswith(str(self.model_dir)):
                del sys.modules[name]

    @property
    def handler(self):
        """The toolkit handler instance serving this model (None for a handler of another kind)."""
        instances = getattr(self.service._entry_point, "instances", None)
        return instances.get(str(self.model_dir)) if instances else None

    def predict_rows(self, rows: List[dict], headers: Optional[List[Dict[str, str]]] = None) -> List[Response]:
        """Run one batch of TorchServe request rows, each with its HTTP ``headers`` if given; one
        Response per row (its status, body, content type and headers)."""
        context = self.service.context
        context.request_ids = {i: str(uuid.uuid4()) for i in range(len(rows))}
        context.request_processor = [RequestProcessor(dict(h)) for h in (headers or [{} for _ in rows])]
        bodies = self.service._entry_point(rows, context)
        if not isinstance(bodies, list) or len(bodies) != len(rows):
            raise RuntimeError(f"handler returned {type(bodies).__name__} for a batch of {len(rows)}")
        return [
            Response(
                context.get_response_status(i)[0],
                body,
                context.get_response_content_type(i),
                dict(context.get_response_headers(i)),
            )
            for i, body in enumerate(bodies)
        ]

    def predict(self, inputs: Sequence[Any]) -> List[Response]:
        """Run one batch: each input (bytes, str, dict, list or a Path to read) is one request."""
        return self.predict_rows([as_row(i) for i in inputs])

    def close(self):
        if self.model_dir is not None and str(self.model_dir) in sys.path:
            sys.path.remove(str(self.model_dir))
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def as_row(value: Any) -> dict:
    if isinstance(value, Path):
        value = value.read_bytes()
    return {"body": value}
