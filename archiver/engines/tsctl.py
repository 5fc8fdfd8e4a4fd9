"""The tsctl engine as a runtime (``python -m serving.engine``): ``tsctl serve --engine tsctl``.

TorchServe's model store and config.properties served in Python, no Java. ``--engine kserve`` is an
older name of it (archiver/engines/__init__.py: ALIASES): it serves KServe's protocols, but it is tsctl's own.
"""

import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from ..errors import ServerFailure, UserError
from ..output import quiet
from .base import Launch, Runtime, snapshot_dir

if TYPE_CHECKING:  # pragma: no cover
    from serving.frontend_settings import Frontend
    from serving.ts_config import ModelSpec

    from ..server import Server

ENGINE_OUT = "engine.out"
ENGINE_LINE = re.compile(r"^tsctl engine: (.+)$")  # what the engine prints before it exits
OWN_CLASS = re.compile(r"^(?:serving|handlers|archiver)\.[\w.]+: ")  # tsctl's own refusals are one sentence already
PYTHON_ERROR = re.compile(r"^(?:ERROR:[\w.]+:)?\s*([A-Za-z_.]*(?:Error|Exception)\b:.*)$")
# A worker's own error, as the engine logs its output: "... tsctl.worker: [MODEL VERSION wN] XError: ..."
WORKER_ERROR = re.compile(r"tsctl\.worker: \[[^\]]*\]\s+([A-Za-z_][\w.]*(?:Error|Exception)\b:.*)$")
# A traceback through the engine's own imports (a line of its own: a worker's lines carry their prefix).
ENGINE_IMPORT = re.compile(r'^\s*File ".*[/\\]serving[/\\]engine[/\\]\w+\.py", line \d+, in <module>$')
MISSING_MODULE = re.compile(r"^ModuleNotFoundError: No module named '([\w.]+)'")


class TsctlRuntime(Runtime):
    """The tsctl engine (``python -m serving.engine``): TorchServe's model store and config.properties
    served in Python, no Java, TorchServe's inference API, KServe v1/v2 REST and Prometheus metrics on
    one HTTP port, TorchServe's management API on another, KServe's v2 gRPC on a third, TorchServe's gRPC
    inference and management APIs on two more."""

    name = "tsctl"
    title = "tsctl engine"
    help = (
        "tsctl: the tsctl engine (no Java; kserve is an alias): TorchServe's inference API, KServe v1/v2 and gRPC, "
        "from the same config and model store."
    )
    needs_config = False
    model_api = True  # TorchServe's management API, with --enable-model-api (bench --sweep-batch)
    serve_flags = ("enable_model_api", "disable_token_auth")
    snapshots = True  # --snapshot_dir HOME/logs/config, as TorchServe's
    extra = "kserve"  # the optional dependencies (pyproject.toml) the engine imports

    def launch(
        self,
        run: Launch,
        batch_size: Optional[int] = None,
        max_batch_delay: Optional[int] = None,
        metrics_config: Optional[str] = None,
        enable_grpc: bool = True,
        enable_model_api: bool = False,
        disable_token_auth: bool = False,
    ) -> "Server":
        """Serve ``model_store`` as ``config`` says (None: the engine's default, config/config.properties
        beside the store when there is one, else every archive with its model-config.yaml) on free ports of
        ``run.host`` (127.0.0.1; the inference API on ``run.port`` when given); return once every model's
        workers are up. ``batch_size``/``max_batch_delay`` override every model's; ``metrics_config`` is
        TorchServe's property of that name (None: the config's, a relative path read from the current
        directory: ``properties.config_metrics``); ``enable_model_api`` lets its management API register,
        unregister and scale; ``disable_token_auth`` turns token authorization off whatever the config says.
        As ``tsctl serve`` starts TorchServe, the management API gets a port of its own; token authorization
        is as the config says (its keys in ``home``/key_file.json, where the engine runs), off for a store
        with no config file at all, as in the file ``tsctl config`` would write."""
        import os

        from serving import ts_config
        from serving.worker import sockets

        from .. import server as servers
        from ..properties import config_metrics

        model_store, home = Path(run.model_store).resolve(), Path(run.home).resolve()
        config = Path(run.config).resolve() if run.config is not None else None
        specs = model_specs(model_store, config)
        models = list(dict.fromkeys(spec.name for spec in specs))
        metrics_config = metrics_config or config_metrics(config)  # the engine runs in home, not here
        temp = servers.check_home(home, sockets.socket_below(sockets.ENGINE, sockets.engine_port(len(specs))))
        arguments = engine_arguments(
            model_store, config, run.host, snapshot_dir(home), batch_size, max_batch_delay, metrics_config
        )
        if disable_token_auth or (config is None and ts_config.default_config(model_store) is None):
            arguments += ["--disable_token_auth"]  # no config at all: as the one tsctl config writes
        if not enable_grpc:
            arguments += ["--enable_grpc", "false"]
        if enable_model_api:
            arguments += ["--enable_model_api", "true"]
        run_env = dict(os.environ, TEMP=str(temp))
        run_env.update(run.env or {})

        def launch() -> "Server":
            http, grpc, management, ts_inference, ts_management = run.ports(5)
            command = [run.python or sys.executable, *arguments]
            ports = {"--http_port": http, "--grpc_port": grpc, "--management_port": management, "--metrics_port": http}
            for flag, port in ports.items():
                command += [flag, str(port)]
            for api, port in (("inference", ts_inference), ("management", ts_management)):  # TorchServe's gRPC
                command += [f"--grpc_{api}_address", run.host, f"--grpc_{api}_port", str(port)]
            process = servers.spawn(command, home, run_env, ENGINE_OUT)
            address = f"http://{run.address(http)}"
            server = servers.Server(
                pid=process.pid,
                home=str(home),
                inference=address,
                management=f"http://{run.address(management)}",
                metrics=address,
                models=models,
                engine=self.name,
                grpc=run.address(grpc) if enable_grpc else None,
                log_writer=process.log_writer.pid,
                ts_grpc_inference=run.address(ts_inference) if enable_grpc else None,
                ts_grpc_management=run.address(ts_management) if enable_grpc else None,
                kserve_v2_grpc=run.address(grpc) if enable_grpc else None,
            )
            return servers.recorded(server, lambda: self.wait_ready(server, run.timeout, process, run.progress))

        return servers.with_port_retry(launch)

    @staticmethod
    def models(model_store: Path, config: Optional[Path]) -> List[str]:
        """The models the engine will serve, checked as it will check them (one UserError otherwise)."""
        return list(dict.fromkeys(spec.name for spec in model_specs(model_store, config)))

    def wait_ready(self, server: "Server", timeout: float, process=None, progress: Callable[[str], None] = quiet):
        """Poll ``/v2/health/ready`` until 200 (every model's workers up), telling ``progress`` each
        model's state as it changes (``model_states``). Fail as soon as the engine exits, with the last
        error it printed; once nothing moved for ``timeout`` seconds (``Patience``: no model changed state,
        its output did not grow), name the models that are not ready."""
        from .. import server as servers
        from ..patience import Patience

        patience = Patience(timeout, [self.output(server)])
        report = servers.States(progress)
        while True:
            if process is not None and process.poll() is not None:
                servers.output_written(process)
                self.check_extra(server)
                how = "stopped" if process.returncode == 0 else f"exited with code {process.returncode}"
                raise ServerFailure(f"the {self.title} {how}: {self.problem(server)}")
            if process is None and not servers.group_alive(server.pid):
                self.check_extra(server)
                raise ServerFailure(f"the {self.title} exited: {self.problem(server)}")
            ready = self.is_ready(server)
            states = {name: servers.READY for name in server.models} if ready else self.model_states(server)
            if states is None:
                report(self.title, "starting")
            for name, state in (states or {}).items():
                report(name, state)
            if ready:
                return
            patience.note(tuple(sorted(report.seen.items())))
            if patience.expired():
                pending = ", ".join(self.not_ready(server)) or "(none answered)"
                raise ServerFailure(f"models {pending} not ready, {patience.said()}: {self.problem(server)}")
            time.sleep(0.5)

    def is_ready(self, server: "Server") -> bool:
        from .. import server as servers

        try:
            status, _ = servers.request(
                f"{server.inference}/v2/health/ready", headers=server.headers("inference"), timeout=5
            )
        except OSError:
            return False
        return status == 200

    def model_states(self, server: "Server") -> Optional[Dict[str, str]]:
        """Each model's state as its management API describes it (``server.model_state``: unpacking,
        loading, READY); None while the engine does not answer yet."""
        from .. import server as servers

        states = {name: servers.model_state(server, name, "unpacking") for name in server.models}
        return None if None in states.values() else states

    @staticmethod
    def not_ready(server: "Server") -> List[str]:
        from .. import server as servers

        pending = []
        for name in server.models:
            try:
                status, _ = servers.request(
                    f"{server.inference}/v2/models/{name}/ready", headers=server.headers("inference"), timeout=5
                )
            except OSError:
                status = None
            if status != 200:
                pending.append(name)
        return pending

    def check_extra(self, server: "Server"):
        """The engine could not import what it runs on (starlette, uvicorn, kserve and its fastapi: the
        kserve extra): one UserError saying what to install, not the ModuleNotFoundError."""
        if not self.extra:
            return
        out = self.output(server)
        lines = out.read_text(errors="replace").splitlines() if out.exists() else []
        if not any(map(ENGINE_IMPORT.match, lines)):  # the engine's own imports, not a handler's or a worker's
            return
        missing = [m.group(1) for m in map(MISSING_MODULE.match, lines) if m]
        if missing:
            raise UserError(
                f"the {self.name} engine needs the {self.extra} extra (its Python has no module {missing[-1]!r}): "
                f"pip install 'tsctl[{self.extra}]' (or uv sync --extra {self.extra})"
            )

    def problem(self, server: "Server") -> str:
        """The engine's last word: its own fatal line (a model that could not load, a config it refuses)
        with the worker's own last error when the line does not carry it, else a port already taken,
        else the last Python error it printed, else where to look."""
        from serving.worker.ts_wire import FALLBACK, RERAISE

        out = self.output(server)
        lines = out.read_text(errors="replace").splitlines() if out.exists() else []
        fatal = [m.group(1).strip() for m in map(ENGINE_LINE.match, lines) if m]
        worker = [m.group(1).strip() for m in map(WORKER_ERROR.search, lines) if m]
        worker = [error for error in worker if not RERAISE.search(error) and not FALLBACK.search(error)]
        if fatal:
            cause = worker[-1] if worker and worker[-1] not in fatal[-1] else None
            return f"{fatal[-1]} (the worker's last error: {cause})" if cause else fatal[-1]
        bind = [line.strip() for line in lines if "address already in use" in line.lower() or "failed to bind" in line]
        errors = [OWN_CLASS.sub("", m.group(1).strip()) for m in map(PYTHON_ERROR.match, lines) if m]
        return (bind or errors or worker or [f"no error in the output; see {out}"])[-1]

    def output(self, server: "Server") -> Path:
        return Path(server.home) / ENGINE_OUT

    def handler_log(self, server: "Server") -> Path:
        return Path(server.home) / ENGINE_OUT  # the workers' lines, through the engine's log


def model_specs(model_store: Path, config: Optional[Path]) -> List["ModelSpec"]:
    """The model versions the engine (and MLServer's runtime) will serve, checked as the engine checks them
    (one UserError otherwise): a config's model_snapshot (each archive it names in the store, as for
    TorchServe), or without one every archive in the store with its model-config.yaml (one that cannot be
    read left out, as the engine leaves it out with a line in its log)."""
    return served(model_store, config)[0]


def served(model_store: Path, config: Optional[Path]) -> "Tuple[List[ModelSpec], Frontend]":
    """``model_specs``, and the frontend settings the config gives (``serving/frontend_settings.py``: Frontend)."""
    from serving import config_properties, ts_config

    from .. import server as servers
    from ..properties import check_keys, read_properties

    try:
        if config is None:
            return ts_config.models(ts_config.default_config(model_store), model_store, skip_unreadable=True)
        properties = read_properties(config)
        if properties.get("model_snapshot"):
            servers.snapshot_models(properties, config, model_store)  # as TorchServe's start checks it
        else:  # load_models (ts_config.from_load_models), its keys checked as a snapshot's are
            check_keys(properties, config)
        return ts_config.from_properties(config_properties.with_environment(properties), config, model_store)
    except config_properties.ConfigError as exc:
        raise UserError(str(exc)) from None


def engine_arguments(
    model_store: Path,
    config: Optional[Path],
    host: str,
    snapshots: Path,
    batch_size: Optional[int],
    max_batch_delay: Optional[int],
    metrics_config: Optional[str],
) -> List[str]:
    """``python -m serving.engine``'s arguments for a store, its config and the models' overrides."""
    arguments = ["-m", "serving.engine", "--model_store", str(model_store), "--host", host]
    arguments += ["--snapshot_dir", str(snapshots)]
    if config is not None:
        arguments += ["--ts_config", str(config)]
    if batch_size:
        arguments += ["--batch_size", str(batch_size)]
    if max_batch_delay is not None:
        arguments += ["--max_batch_delay", str(max_batch_delay)]
    if metrics_config:
        arguments += ["--metrics_config", str(Path(metrics_config).resolve())]
    return arguments
