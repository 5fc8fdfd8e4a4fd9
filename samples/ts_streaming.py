"""Archives that stream their answers (``send_intermediate_predict_response``), packaged with
torch-model-archiver as pytorch/serve's READMEs package its streaming examples:

- ``streaming``: ``samples/ts_examples/streaming/stream_handler.py``, a stand-in in the shape of
  pytorch/serve's examples/large_models/gpt_fast/handler.py (a BaseHandler generating tokens, each
  sent as it comes), with its model-config.yaml's ``handler`` section;
- ``probe``: ``PROBE``, a function handler whose request says what to do (``stream N SIZE PAUSE``,
  ``sizes A,B,C``, ``die N``, ``fail``, ``status CODE``, ``sleep S``, ``big N``, ``pid``, else an echo
  of its input's names and words): the hostile and conformance cases of tests/conformance/test_ts_grpc_parity.py.

    python -m samples.ts_streaming samples/build/streaming       # both archives into that store
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

STAND_IN = Path(__file__).resolve().parent / "ts_examples" / "streaming" / "stream_handler.py"
BIN = Path(sys.executable).parent
PROMPT = b'{"prompt": "The capital of France", "max_new_tokens": 50}'  # gpt_fast's request.json

PROBE = """\
import json, os, time

from ts.handler_utils.utils import send_intermediate_predict_response


def handle(data, context):
    if data is None:
        return None
    answers = []
    for index, row in enumerate(data):
        body = row.get("body") if row.get("body") is not None else row.get("data")
        text = bytes(body).decode() if isinstance(body, (bytes, bytearray)) else str(body)
        words = text.split() or ["echo"]
        if words[0] == "fail":
            raise ValueError("the probe failed on purpose")
        if words[0] == "status":
            context.set_response_status(int(words[1]), "Probe Phrase")
            answers.append({"status": int(words[1])})
        elif words[0] == "stream":  # N parts of SIZE bytes, PAUSE s apart, the last the answer itself
            count, size, pause = int(words[1]), int(words[2]), float(words[3])
            context.set_response_content_type(index, "text/plain")
            for part in range(count - 1):
                send_intermediate_predict_response([b"%d" % (part % 10) * size], context.request_ids, "", 200,
                                                   context)
                time.sleep(pause)
            answers.append(b"%d" % ((count - 1) % 10) * size)
        elif words[0] == "sizes":  # parts of these sizes, the last the answer
            sizes = [int(size) for size in words[1].split(",")]
            for part, size in enumerate(sizes[:-1]):
                send_intermediate_predict_response([b"%d" % (part % 10) * size], context.request_ids, "", 200,
                                                   context)
            answers.append(b"e" * sizes[-1])
        elif words[0] == "die":  # N parts, then the worker's process ends
            for part in range(int(words[1])):
                send_intermediate_predict_response([b"part%d" % part], context.request_ids, "", 200, context)
            time.sleep(0.2)
            os._exit(3)
        elif words[0] == "sleep":
            time.sleep(float(words[1]))
            answers.append({"slept": float(words[1])})
        elif words[0] == "pid":
            answers.append({"pid": os.getpid()})
        elif words[0] == "big":
            answers.append(b"x" * int(words[1]))
        else:
            answers.append({"echo": words, "inputs": sorted(row)})
    return answers
"""


def archive(name: str, handler: Path, store: Path, config: Path = None) -> Path:
    """``handler`` archived by torch-model-archiver as ``name`` 1.0 into ``store``."""
    store.mkdir(parents=True, exist_ok=True)
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
        "--force",
    ]
    if config is not None:
        command += ["--config-file", str(config)]
    with tempfile.TemporaryDirectory(prefix="tss-") as scratch:  # its staging folder, private to this build
        subprocess.run(command, check=True, capture_output=True, env=dict(os.environ, TMPDIR=scratch))
    return store / f"{name}.mar"


def build(store: Path, token_seconds: float = 0.0, max_new_tokens: int = 50) -> dict:
    """Both archives in ``store``: {name: archive}. ``token_seconds``: the stand-in's time per token."""
    work = Path(tempfile.mkdtemp(prefix="tss-src-"))
    config = work / "model-config.yaml"
    config.write_text(
        "minWorkers: 1\nmaxWorkers: 1\nmaxBatchDelay: 200\nresponseTimeout: 300\nhandler:\n"
        f"    max_new_tokens: {max_new_tokens}\n    stream: true\n    token_seconds: {token_seconds}\n"
    )
    return {
        "streaming": archive("streaming", STAND_IN, store, config),
        "probe": archive("probe", write_probe(work), store),
    }


def write_probe(folder: Path) -> Path:
    """``PROBE`` as ``folder/probe.py``."""
    probe = folder / "probe.py"
    probe.write_text(PROBE)
    return probe


if __name__ == "__main__":
    for name, path in build(Path(sys.argv[1])).items():
        print(name, path)
