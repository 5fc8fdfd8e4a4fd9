"""Run pytorch/serve's kserve_wrapper as the torchserve-kfs image runs it, on ports of our own.

The image (its Dockerfile and dockerd-entrypoint.sh) generates ``inference_pb2*.py`` and
``management_pb2*.py`` with grpcio-tools into the wrapper's directory, starts TorchServe, then runs
``python kserve_wrapper/__main__.py``. That script reads ``CONFIG_PATH`` (config.properties: the
TorchServe addresses and ``model_snapshot``), waits for each model's READY worker, and starts
kserve's ModelServer with ``http_port=8080, grpc_port=8081``, which kserve 0.13 binds on 0.0.0.0
and [::].

Here the wrapper is read in place (never copied), the protos are generated into a directory of
their own, and both are put on ``PYTHONPATH``. This module's ``main`` is the only thing between the
interpreter and ``__main__.py``: it wraps ``uvicorn.Config.__init__`` and
``grpc.aio.Server.add_insecure_port`` so the two servers listen on the given loopback ports instead,
then runs ``__main__.py`` with ``runpy`` as ``__main__``, with ``sys.argv`` and ``sys.path[0]`` as
``python kserve_wrapper/__main__.py`` would have them. Nothing else is changed::

    RUNTIME_PYTHON samples/kserve_wrapper_launcher.py WRAPPER_DIR --http-port N --grpc-port M

``generate_protos``, ``start`` and ``stop`` are the caller's side (any Python >= 3.9, stdlib only):
``start`` runs the launcher detached in its own process group and waits for its HTTP port;
``stop`` ends that process group.
"""

import argparse
import os
import runpy
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

WRAPPER_HTTP_PORT, WRAPPER_GRPC_PORT = 8080, 8081  # what __main__.py hard-codes


# ---- inside the wrapper's process -----------------------------------------------------------------
def bind(host: str, http_port: int, grpc_port: int):
    """Make kserve's servers listen on ``host`` at the given ports (each change is printed)."""
    import grpc.aio._server
    import uvicorn

    config_init = uvicorn.Config.__init__

    def uvicorn_config(self, *args, **kwargs):
        print(
            f"launcher: uvicorn {kwargs.get('host')}:{kwargs.get('port')} -> {host}:{http_port}",
            file=sys.stderr,
            flush=True,
        )
        kwargs["host"], kwargs["port"] = host, http_port
        config_init(self, *args, **kwargs)

    add_port = grpc.aio._server.Server.add_insecure_port

    def add_insecure_port(self, address):
        print(f"launcher: grpc {address} -> {host}:{grpc_port}", file=sys.stderr, flush=True)
        return add_port(self, f"{host}:{grpc_port}")

    uvicorn.Config.__init__ = uvicorn_config
    grpc.aio._server.Server.add_insecure_port = add_insecure_port


def main(argv: Optional[List[str]] = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wrapper", help="pytorch/serve's kserve_wrapper directory (holding __main__.py)")
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    script = os.path.join(os.path.abspath(args.wrapper), "__main__.py")
    bind(args.host, args.http_port, args.grpc_port)
    # As `python kserve_wrapper/__main__.py` starts: kserve's own argparse reads sys.argv on import.
    sys.argv = [script]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


# ---- the caller's side ----------------------------------------------------------------------------
def generate_protos(python: str, proto_dir: Path, out: Path) -> Path:
    """``python -m grpc_tools.protoc`` as the Dockerfile runs it, into ``out``.

    inference.proto imports ``google/rpc/status.proto``: the Dockerfile finds it with
    ``-I third_party/google/rpc`` (pytorch/serve's googleapis checkout); here it is the copy
    googleapis-common-protos installs beside its ``google.rpc`` package, in ``python``'s environment.
    Both run isolated (``-I``): ``google`` and ``google.rpc`` are namespace packages, so a ``google/rpc/``
    in the current directory or on ``PYTHONPATH`` (stubs a user generated there) would come first in
    ``google.rpc.__path__`` and hide the environment's copy."""
    out.mkdir(parents=True, exist_ok=True)
    python = os.path.abspath(python) if os.sep in python else python
    find = "import os, google.rpc; print(os.path.dirname(os.path.dirname(list(google.rpc.__path__)[0])))"
    found = subprocess.run([python, "-I", "-c", find], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if found.returncode != 0 or not (Path(found.stdout.strip()) / "google" / "rpc" / "status.proto").exists():
        raise RuntimeError(f"no google/rpc/status.proto in the environment of {python}: {found.stderr.strip()}")
    command = [python, "-I", "-m", "grpc_tools.protoc", "-I", found.stdout.strip(), f"--proto_path={proto_dir}"]
    command += [f"--python_out={out}", f"--grpc_python_out={out}", "inference.proto", "management.proto"]
    done = subprocess.run(command, cwd=proto_dir, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"grpc_tools.protoc failed ({done.returncode}): {done.stderr.strip()}")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Wrapper:
    pid: int
    url: str  # http://127.0.0.1:PORT
    grpc_port: int
    log: Path
    process: subprocess.Popen

    def log_text(self, tail: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-tail:] if self.log.exists() else ""


def start(
    python: str,
    wrapper_dir: Path,
    proto_out: Path,
    config: Path,
    log: Path,
    models: List[str],
    env: Optional[Dict[str, str]] = None,
    timeout: float = 120,
) -> Wrapper:
    """Start the wrapper detached (own process group, stdin from /dev/null, output to ``log``) and
    wait until its HTTP port answers and every model in ``models`` says ready."""
    http_port, grpc_port = free_port(), free_port()
    run_env = dict(os.environ)
    run_env.pop("PYTHONHOME", None)
    run_env.update(
        {
            "CONFIG_PATH": str(config),
            "PYTHONPATH": os.pathsep.join([str(proto_out), str(wrapper_dir)]),
            "PYTHONUNBUFFERED": "1",
        }
    )
    run_env.update(env or {})
    command = [python, str(Path(__file__).resolve()), str(wrapper_dir)]
    command += ["--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command,
            cwd=log.parent,
            env=run_env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    wrapper = Wrapper(process.pid, f"http://127.0.0.1:{http_port}", grpc_port, log, process)
    try:
        wait_ready(wrapper, models, timeout)
    except BaseException:
        stop(wrapper)
        raise
    return wrapper


def wait_ready(wrapper: Wrapper, models: List[str], timeout: float):
    deadline = time.monotonic() + timeout
    pending = list(models)
    while pending:
        if wrapper.process.poll() is not None:
            raise RuntimeError(f"the wrapper exited with {wrapper.process.returncode}:\n{wrapper.log_text()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the wrapper did not serve {pending} within {timeout:.0f}s:\n{wrapper.log_text()}")
        try:
            with urllib.request.urlopen(f"{wrapper.url}/v1/models/{pending[0]}", timeout=5) as response:
                if response.status == 200:
                    pending.pop(0)
                    continue
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.3)


def stop(wrapper: Wrapper, grace: float = 15):
    """End the wrapper's own process group: SIGTERM, then SIGKILL after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
        try:
            os.killpg(wrapper.pid, sig)
        except ProcessLookupError:
            break
        try:
            wrapper.process.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # anything the wrapper left in its group
        os.killpg(wrapper.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    main()
