"""pytorch/serve's kserve_wrapper in front of TorchServe on an exported tree, as the torchserve-kfs image
runs them."""

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from archiver import server
from archiver.engines import torchserve_launch
from helpers.paths import ROOT, short_tmp
from samples import kserve_wrapper_launcher as launcher

KFS = "torchserve-kfs:0.9.0"

# shared/ lies beside the clone (as in CI); TSCTL_KSERVE_WRAPPER points elsewhere
WRAPPER = Path(os.environ.get("TSCTL_KSERVE_WRAPPER", ROOT.parent / "shared" / "kserve" / "wrapper"))

MODELS = ["minilm", "resnet18", "sentiment"]


@dataclass
class Stack:
    protocol: str  # the wrapper's PROTOCOL_VERSION: v1 or v2 (TorchServe's envelope kserve or kservev2)
    torchserve: server.Server
    wrapper: launcher.Wrapper
    grpc_port: int  # TorchServe's gRPC inference port, in the wrapper's config
    home: Path  # the wrapper's config and log

    @property
    def url(self) -> str:
        return self.wrapper.url

    def log(self) -> str:
        return f"\n---- wrapper log (tail)\n{self.wrapper.log_text()}"


def wrapper_config(exported: Path, srv: server.Server, grpc_port: int, target: Path) -> Path:
    """The exported config.properties with this TorchServe's addresses and the exported store; the rest,
    model_snapshot included (one line of JSON, as __main__.py's line parser needs), unchanged."""
    changes = {
        "inference_address": srv.inference,
        "management_address": srv.management,
        "grpc_inference_port": str(grpc_port),
        "model_store": str(exported / "model-store"),
    }
    lines = []
    for line in (exported / "config" / "config.properties").read_text().splitlines():
        key = line.split("=", 1)[0].strip()
        if not line.startswith("#") and key in changes:
            line = f"{key}={changes.pop(key)}"
        elif key == "model_snapshot":
            assert sorted(json.loads(line.split("=", 1)[1])["models"]) == MODELS
        lines.append(line)
    assert not changes, f"the exported config has no {sorted(changes)}"
    target.write_text("\n".join(lines) + "\n")
    return target


def start_stack(exported, protos, kfs_python, ts_python, protocol) -> Stack:
    grpc_port = server.free_port()
    srv = torchserve_launch.start(
        exported / "config" / "config.properties",
        exported / "model-store",
        short_tmp("wts-"),
        timeout=300,
        python=ts_python,
        kserve_args=True,
        env={
            "TS_SERVICE_ENVELOPE": "kservev2" if protocol == "v2" else "kserve",
            "TS_GRPC_INFERENCE_PORT": str(grpc_port),
        },
    )
    home = short_tmp("wrp-")
    try:
        config = wrapper_config(exported, srv, grpc_port, home / "config.properties")
        wrapper = launcher.start(
            str(kfs_python),
            WRAPPER / "kserve_wrapper",
            protos,
            config,
            home / "wrapper.log",
            srv.models,
            env={"PROTOCOL_VERSION": protocol, "MODEL_LOAD_DELAY": "1"},
            timeout=180,
        )
    except BaseException:
        server.stop(srv)
        shutil.rmtree(srv.home, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
        raise
    return Stack(protocol, srv, wrapper, grpc_port, home)


def stop_stack(stack: Stack):
    launcher.stop(stack.wrapper)
    server.stop(stack.torchserve)
    shutil.rmtree(stack.torchserve.home, ignore_errors=True)
    shutil.rmtree(stack.home, ignore_errors=True)
