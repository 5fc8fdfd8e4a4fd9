"""A Seldon Core 1 graph run here, as its cluster runs it, without the cluster: each unit of an exported
SeldonDeployment under the real Python wrapper (``seldon-core-microservice`` of seldon-core 1.17.1, from
samples/runtime_env.py's venv) on a port of its own, with its container's env and its unit's typed parameters
(``PREDICTIVE_UNIT_PARAMETERS``, as the operator sets them: operator/controllers/seldondeployment_controller.go
``addModelEnvs``), the claim's mount read from OUT; and ``Executor``, a small stand-in for Core 1's executor
walking the graph by its rules (executor/predictor/predictor_process.go at v1.17.1, cited at each step)."""

import json
import os
import random
import signal
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from archiver.server import free_ports
from helpers import waiting
from helpers.paths import ROOT
from helpers.processes import kill, session_members

MOUNT = "/var/models"  # archiver/export/seldon/core1.py: where each container sees the claim


def post(url: str, body: bytes, headers: Optional[Dict[str, str]] = None, timeout: float = 120) -> Tuple[int, bytes]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def get_status(url: str, timeout: float = 5) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def units_of(graph: dict) -> Dict[str, dict]:
    """Every unit of a graph by name."""
    found, stack = {}, [graph]
    while stack:
        unit = stack.pop()
        found[unit["name"]] = unit
        stack += unit.get("children", [])
    return found


@dataclass
class Unit:
    name: str
    port: int
    process: subprocess.Popen
    log: Path


@dataclass
class Graph:
    """The units of one predictor, started."""

    manifest: dict
    units: Dict[str, Unit] = field(default_factory=dict)

    @property
    def predictor(self) -> dict:
        return self.manifest["spec"]["predictors"][0]

    def ports(self) -> Dict[str, int]:
        return {name: unit.port for name, unit in self.units.items()}

    def stop(self):
        for unit in self.units.values():
            if unit.process.poll() is None:
                os.killpg(unit.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for unit in self.units.values():
            try:
                unit.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            kill(session_members(unit.process.pid))  # gunicorn's worker, the metrics server, the archive's workers
            unit.process.wait(10)


def start(
    manifest: dict, out: Path, python: Path, logs: Path, timeout: float = 300, only: Optional[List[str]] = None
) -> Graph:
    """Each container of the manifest's first predictor (or those named in ``only``) under
    seldon-core-microservice, as its image's CMD starts it (``$MODEL_NAME --service-type $SERVICE_TYPE``), on
    free ports, the claim's mount mapped to OUT; returned once each answers /health/status 200."""
    graph = Graph(manifest)
    units = units_of(graph.predictor["graph"])
    logs.mkdir(parents=True, exist_ok=True)
    try:
        for container in graph.predictor["componentSpecs"][0]["spec"]["containers"]:
            name = container["name"]
            if only is not None and name not in only:
                continue
            env = {e["name"]: e["value"] for e in container.get("env", [])}
            parameters = [dict(p, value=p["value"].replace(MOUNT, str(out))) for p in units[name].get("parameters", [])]
            graph.units[name] = start_unit(name, env, parameters, python, logs)
        for unit in graph.units.values():
            wait_ready(unit, timeout)
    except BaseException:
        graph.stop()
        raise
    return graph


def start_unit(
    name: str,
    env: Dict[str, str],
    parameters: List[dict],
    python: Path,
    logs: Path,
    join: Optional[Callable[[], None]] = None,
) -> Unit:
    """One unit under seldon-core-microservice, as its image's CMD starts it (``$MODEL_NAME --service-type
    $SERVICE_TYPE``), on a free port, its log LOGS/NAME.log; ``join``: run in the child before it starts (a memory
    cgroup's ``MemoryLimit.join``). Not waited for."""
    env = dict(env, PREDICTIVE_UNIT_PARAMETERS=json.dumps(parameters))
    port, metrics = free_ports(2)
    binary = Path(python).parent / "seldon-core-microservice"
    command = [
        str(binary),
        env["MODEL_NAME"],
        "--service-type",
        env["SERVICE_TYPE"],
        "--http-port",
        str(port),
        "--metrics-port",
        str(metrics),
    ]
    log = logs / f"{name}.log"
    process = subprocess.Popen(
        command,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"},
        stdin=subprocess.DEVNULL,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=join,
        cwd=logs,
    )
    return Unit(name, port, process, log)


def wait_ready(unit: Unit, timeout: float = 300):
    """Until the unit answers /health/status 200, as long as it makes progress (helpers/waiting.py)."""
    waiting.until(
        lambda: get_status(f"http://127.0.0.1:{unit.port}/health/status"),
        lambda status: status == 200,
        f"unit {unit.name} did not become ready",
        unit.log,
        lambda: unit.process.poll() is None,
        timeout,
    )


class Executor:
    """Core 1's executor over REST and the Seldon protocol, for one predictor's graph. ``predict(body)`` is
    its ``/api/v1.0/predictions``: the status and body it answers."""

    def __init__(
        self, graph: dict, ports: Dict[str, int], rng: random.Random, routing_injection: bool, timeout: float = 60
    ):
        self.graph, self.ports, self.rng = graph, ports, rng
        self.routing_injection, self.timeout = routing_injection, timeout

    def call(self, unit: dict, path: str, body: bytes, headers: Dict[str, str]) -> Tuple[int, bytes]:
        # rest/client.go ``call``: POST to the unit's host and port, the path its method has under the Seldon
        # protocol (client.go: /predict, /transform-input, /transform-output, /route), the client's headers
        # passed on as meta (``addHeaders``)
        return post(f"http://127.0.0.1:{self.ports[unit['name']]}{path}", body, headers, self.timeout)

    def predict(self, body: bytes, headers: Optional[Dict[str, str]] = None) -> Tuple[int, bytes]:
        routing: Dict[str, int] = {}
        status, answer = self.walk(self.graph, body, dict(headers or {}), routing)
        return status, answer

    def walk(self, unit: dict, body: bytes, headers, routing) -> Tuple[int, bytes]:
        """``PredictorProcess.Predict``: transformInput, predictChildren, transformOutput; any unit's non-200
        ends the walk with that unit's status and body (rest/server.go ``respondWithError``)."""
        kind, methods = unit.get("type"), unit.get("methods") or []
        # transformInput: a MODEL's /predict, a TRANSFORMER's (or a TRANSFORM_INPUT unit's) /transform-input;
        # routing[unit] = -1 for a unit called
        if kind == "MODEL" or kind == "TRANSFORMER" or "TRANSFORM_INPUT" in methods:
            path = "/transform-input" if (kind == "TRANSFORMER" or "TRANSFORM_INPUT" in methods) else "/predict"
            routing[unit["name"]] = -1
            status, body = self.call(unit, path, body, headers)
            if status != 200:
                return status, body
        status, body = self.children(unit, body, headers, routing)
        if status != 200:
            return status, body
        # transformOutput: an OUTPUT_TRANSFORMER's (or a TRANSFORM_OUTPUT unit's) /transform-output
        if kind == "OUTPUT_TRANSFORMER" or "TRANSFORM_OUTPUT" in methods:
            status, body = self.call(unit, "/transform-output", body, headers)
            if status != 200:
                return status, body
        if self.routing_injection:  # utils.go InsertRouteToSeldonPredictPayload: into an object meta only, the
            message = json.loads(body)  # message written again by Go's json.Marshal (a map's keys sorted)
            if isinstance(message, dict) and isinstance(message.get("meta"), dict):
                message["meta"]["routing"] = dict(routing)
                body = json.dumps(message, sort_keys=True, separators=(",", ":")).encode()
        return 200, body

    def route(self, unit: dict, body: bytes, headers) -> Tuple[int, object]:
        """``PredictorProcess.route``: a ROUTER (or a ROUTE unit) is asked (/route; its answer's first value,
        util.go ``ExtractRouteFromSeldonJson``); RANDOM_ABTEST is the executor's own (components.go
        ``abTestRouter``): ratioA, when it is the unit's one parameter, parsed as a float32, else 0.5; the first
        child when a uniform draw is below it; anything else: every child (-1)."""
        if unit.get("type") == "ROUTER" or "ROUTE" in (unit.get("methods") or []):
            status, answer = self.call(unit, "/route", body, headers)
            if status != 200:
                return status, answer
            data = json.loads(answer)["data"]
            values = data["ndarray"] if "ndarray" in data else data["tensor"]["values"]
            first = values[0]
            return 200, int(first[0] if isinstance(first, list) else first)
        if unit.get("implementation") == "RANDOM_ABTEST":
            parameters = unit.get("parameters") or []
            ratio = 0.5
            if len(parameters) == 1 and parameters[0]["name"] == "ratioA":
                ratio = float(np.float32(parameters[0]["value"]))
            return 200, 0 if self.rng.random() < ratio else 1
        return 200, -1

    def children(self, unit: dict, body: bytes, headers, routing) -> Tuple[int, bytes]:
        """``predictChildren``: no children, the message as it is; else the route: -1 every child (at once;
        without a COMBINER the first child's answer), -2 none (the message as it is), N the child N;
        routing[unit] = the route."""
        children = unit.get("children") or []
        if not children:
            return 200, body
        status, route = self.route(unit, body, headers)
        if status != 200:
            return status, route
        routing[unit["name"]] = route
        if route == -2:
            return 200, body
        if route == -1:
            with ThreadPoolExecutor(len(children)) as pool:
                answers = list(pool.map(lambda child: self.walk(child, body, headers, routing), children))
            failed = [answer for answer in answers if answer[0] != 200]
            return failed[0] if failed else answers[0]
        return self.walk(children[route], body, headers, routing)
