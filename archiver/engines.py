"""The engines that serve a model store, behind one interface: ``tsctl serve/predict/bench/verify/stop``
and ``tsctl export kserve`` ask the engine object, never compare names.

    ENGINES = {"torchserve": TorchServeEngine(), "kserve": KServeEngine(), "mlserver": MLServerEngine()}

An ``Engine`` knows how to

- **serve locally**: ``start(model_store, config, home, timeout, ...)`` launches it detached on free
  127.0.0.1 ports (``server.spawn``), records a ``Server`` (server.json: the engine's name, its
  ``inference``/``management``/``metrics`` base addresses and ``grpc`` HOST:PORT) and returns once
  ``wait_ready`` says every model can answer (telling ``progress`` each model's state as it changes:
  starting, extracting, loading, READY); ``predict_url`` is where one request for a model goes;
  ``addresses`` is what ``serve`` prints; ``output``/``handler_log`` are where its own and the
  handlers' lines go; ``stop`` ends its process group. ``serve_flags`` are the optional ``serve``
  flags it honours, ``model_api`` whether its management API can re-register models (``bench
  --sweep-batch``), ``needs_config`` whether it can run without a config.properties, ``protocol`` what
  it answers natively (``verify --served``'s default: ``ts``, MLServer ``v2``);
- **export for KServe**: ``check_export``, ``check_properties``, ``prepare`` (the archives' locked
  requirements, the exported config's changes), ``predictor`` (the InferenceService's predictor),
  ``manifests`` (more manifests beside it), ``write_files`` (more files in the export) and
  ``deploy_steps``/``apply_lines`` (DEPLOY.md). ``export_flags`` are the export options it takes.

Another engine is a subclass with these methods and one line in ``ENGINES`` (MLServer was added so); the
command line builds ``--engine``'s choices from the registry and needs no change. ``request_body`` is how
``predict`` and ``bench`` send a file where the engine takes only one protocol (MLServer: KServe v2).

This module imports nothing heavy at import time (``tsctl --help`` builds its choices from it): what
serving or exporting needs is imported inside the methods.
"""

import json
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from .errors import ServerError, UserError
from .output import quiet

if TYPE_CHECKING:  # pragma: no cover
    from .kserve import ExportOptions
    from .server import Server

DEFAULT_CONFIG = "config/config.properties"  # tsctl config's output: what serve reads unless told

# The optional flags of ``tsctl serve`` and ``tsctl export kserve`` that not every engine takes:
# option name -> the flag as typed. An engine lists those it takes in serve_flags/export_flags.
SERVE_FLAGS = {"install_deps": "--install-deps", "enable_model_api": "--enable-model-api"}
EXPORT_FLAGS = {"image": "--image", "runtime_kind": "--runtime-kind", "offline": "--offline"}


class Engine:
    """One way to serve a model store; see the module docstring. Subclasses set the class attributes
    and implement ``start``, ``wait_ready``, ``predict_url`` and the export methods."""

    name = ""  # the --engine value and server.json's "engine"
    title = ""  # what messages call it: "TorchServe ready", "TorchServe stopped"
    help = ""  # one line for --engine's help
    needs_config = True  # False: serves a model store without config.properties (each archive's model-config.yaml)
    model_api = False  # its management API can (re)register models: bench --sweep-batch
    protocol = "ts"  # what it natively answers, as verify --protocol names it: ts (/predictions/MODEL), v1, v2
    serve_flags: Tuple[str, ...] = ()  # keys of SERVE_FLAGS it honours
    export_flags: Tuple[str, ...] = ()  # keys of EXPORT_FLAGS it takes

    # ---- serving locally ----
    def start(
        self,
        model_store="model-store",
        config=None,
        home=".tsctl",
        timeout: float = 180,
        python: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        progress: Callable[[str], None] = quiet,
        **options,
    ) -> "Server":
        raise NotImplementedError

    def wait_ready(self, server: "Server", timeout: float, process=None, progress: Callable[[str], None] = quiet):
        raise NotImplementedError

    def predict_url(self, server: "Server", model: str) -> str:
        return f"{server.inference}/predictions/{model}"

    def request_body(self, data: bytes, content_type: str) -> Tuple[bytes, str]:
        """One file as the body ``predict_url`` takes, and its content type: the file itself here."""
        return data, content_type

    def addresses(self, server: "Server") -> List[Tuple[str, str]]:
        """(label, address) lines for ``tsctl serve`` to print."""
        lines = [("inference", server.inference)]
        if server.management:
            lines.append(("management", server.management))
        if server.metrics:
            lines.append(("metrics", server.metrics_url))
        if server.grpc:
            lines.append(("grpc", server.grpc))
        return lines + [("logs", str(self.output(server)))]

    def served_models(self, server: "Server") -> List[str]:
        """The models the running server serves now (``list_models``); the models server.json recorded
        when it does not answer, or not with a list."""
        try:
            listed = self.list_models(server)
        except OSError:
            listed = None
        return list(server.models) if listed is None else listed

    def list_models(self, server: "Server") -> Optional[List[str]]:
        """The management API's model list (TorchServe's and the tsctl engine's); None for another answer."""
        from . import server as servers

        status, body = servers.request(
            f"{server.management}/models?limit=1000", headers=server.headers("management"), timeout=10
        )
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("models"), list):
            return None
        return [m["modelName"] for m in body["models"] if isinstance(m, dict) and "modelName" in m]

    def output(self, server: "Server") -> Path:
        """Where the server's own output goes."""
        raise NotImplementedError

    def handler_log(self, server: "Server") -> Path:
        """The file the handlers' log lines (``logger.info`` in a handler) end up in."""
        raise NotImplementedError

    def stop(self, server: "Server", grace: float = 20) -> bool:
        from . import server as servers

        return servers.stop(server, grace=grace)

    def check_serve_flags(self, **given):
        """Refuse a ``serve`` flag this engine does not honour, naming the engines that do."""
        refuse(self, {k: v for k, v in given.items() if k in SERVE_FLAGS}, SERVE_FLAGS, "serve_flags", "serve")

    # ---- exporting for KServe ----
    def check_export(self, options: "ExportOptions"):
        given = {key: getattr(options, key) for key in EXPORT_FLAGS}
        refuse(self, given, EXPORT_FLAGS, "export_flags", "export")

    def check_properties(self, properties: Dict[str, str], path: Path):
        """What the exported config must say for this engine under KServe (UserError naming the key)."""
        expected = {"disable_token_authorization": ("true", "KServe's requests carry no TorchServe token")}
        check_values(properties, path, expected)

    def envelope_batches(self) -> bool:
        """True when archives of handlers that are not the toolkit's run inside TorchServe's KServe
        envelope, which answers every request of a batch of several with 503 (export sets batchSize 1)."""
        return False

    def prepare(self, options, properties: Dict[str, str], archives: List[Path], notes: List[str], scratch: Path):
        """Change the exported config for this engine; return {archive: its requirements.txt for the
        image} for the archives to rewrite with locked requirements (the others are copied as they are)."""
        return {}

    def export_notice(self, options: "ExportOptions") -> Optional[str]:
        """A line to print before a slow export (resolving requirements), if any."""
        return None

    def predictor(self, options: "ExportOptions", resources: dict) -> dict:
        """The InferenceService's ``spec.predictor`` entries serving the storage URI's tree."""
        raise NotImplementedError

    def manifests(self, options: "ExportOptions", resources: dict) -> Dict[str, dict]:
        """More manifests to write beside inferenceservice.yaml, by file name (validated first)."""
        return {}

    def write_files(self, out: Path, options: "ExportOptions", archives: List[Path]) -> List[Path]:
        """More files for the export (an image's build context)."""
        return []

    def deploy_steps(self, options: "ExportOptions") -> List[str]:
        """DEPLOY.md lines before the claim (step 0: building an image)."""
        return []

    def apply_lines(self, options: "ExportOptions") -> List[str]:
        """DEPLOY.md's commands of step 3 before the InferenceService is applied."""
        return []


def refuse(engine: Engine, given: dict, flags: Dict[str, str], attribute: str, command: str):
    """A UserError for the first flag in ``given`` that ``engine`` does not list in ``attribute``
    (serve_flags, export_flags), naming an engine that takes it."""
    for key, value in given.items():
        if value and key not in getattr(engine, attribute):
            owners = [other.name for other in ENGINES.values() if key in getattr(other, attribute)]
            flag = flags[key]
            instead = f", or {command} with --engine {owners[0]}" if owners else ""
            raise UserError(f"{flag} is not an option of --engine {engine.name} ({engine.title}): drop {flag}{instead}")


def check_values(properties: Dict[str, str], path: Path, expected: Dict[str, Tuple[str, str]]):
    for key, (value, why) in expected.items():
        if properties.get(key, "").lower() != value:
            raise UserError(f"{path}: {key} must be {value} ({why}); regenerate it with 'tsctl config'")


# ---- TorchServe ---------------------------------------------------------------------------------------
class TorchServeEngine(Engine):
    """TorchServe 0.12 (Java frontend, Python workers), as KServe's TorchServe runtime runs it."""

    name = "torchserve"
    title = "TorchServe"
    help = "torchserve: TorchServe itself (Java 17)."
    model_api = True
    serve_flags = ("install_deps", "enable_model_api")
    export_flags = ("offline",)

    def start(
        self,
        model_store="model-store",
        config=None,
        home=".tsctl",
        timeout: float = 180,
        python: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        install_deps: bool = False,
        enable_model_api: bool = False,
        kserve_args: bool = False,
        progress: Callable[[str], None] = quiet,
    ) -> "Server":
        from . import server

        if enable_model_api:
            env = {**(env or {}), "TS_ENABLE_MODEL_API": "true"}
        return server.start(
            config or DEFAULT_CONFIG, model_store, home, timeout, python, env, install_deps, kserve_args, progress
        )

    def wait_ready(self, server: "Server", timeout: float, process=None, progress: Callable[[str], None] = quiet):
        from . import server as servers

        servers.wait_ready(server, timeout, process, progress)

    def output(self, server: "Server") -> Path:
        return server.logs

    def handler_log(self, server: "Server") -> Path:
        return server.logs / "model_log.log"

    # ---- export: KServe's own TorchServe runtime (modelFormat pytorch) ----
    def check_properties(self, properties: Dict[str, str], path: Path):
        super().check_properties(properties, path)
        check_values(
            properties, path, {"enable_envvars_config": ("true", "KServe's TS_SERVICE_ENVELOPE is ignored without it")}
        )
        if properties.get("enable_model_api", "").lower() not in ("true", "false"):
            raise UserError(
                f"{path}: set enable_model_api explicitly (TorchServe 0.11+ turns it off by default); "
                "regenerate it with 'tsctl config'"
            )

    def envelope_batches(self) -> bool:
        return True

    def export_notice(self, options: "ExportOptions") -> Optional[str]:
        what = "resolving and downloading" if options.offline else "resolving"
        return f"{what} each archive's requirements for {options.runtime} ..."

    def prepare(self, options, properties, archives, notes, scratch):
        from . import kserve, runtimes

        # tsctl config leaves TorchServe's per-model install off (the local environment has the packages);
        # KServe's image has not: the exported config turns it on, for the requirements locked here.
        properties["install_py_dep_per_model"] = "true"
        runtime = runtimes.runtime_named(options.runtime)
        notes.extend(kserve.runtime_notes(runtime))
        return runtimes.for_runtime(archives, runtime, options.offline, scratch, notes, options.progress)

    def predictor(self, options: "ExportOptions", resources: dict) -> dict:
        return {"model": storage_model(options, resources)}


def storage_model(options: "ExportOptions", resources: dict, runtime: Optional[str] = None) -> dict:
    """``predictor.model`` for the PVC tree: KServe picks the runtime for modelFormat pytorch (its
    TorchServe runtime) unless ``runtime`` names one."""
    model = {"modelFormat": {"name": "pytorch"}}
    if runtime:
        model["runtime"] = runtime
    model.update({"protocolVersion": options.protocol, "storageUri": options.storage_uri, "resources": resources})
    return model


# ---- the tsctl engine (serving/engine.py) ------------------------------------------------------------
ENGINE_OUT = "engine.out"
ENGINE_LINE = re.compile(r"^tsctl engine: (.+)$")  # what the engine prints before it exits
PYTHON_ERROR = re.compile(r"^(?:ERROR:[\w.]+:)?\s*([A-Za-z_.]*(?:Error|Exception)\b:.*)$")
# A worker's own error, as the engine logs its output: "... tsctl.worker: [MODEL VERSION wN] XError: ..."
WORKER_ERROR = re.compile(r"tsctl\.worker: \[[^\]]*\]\s+([A-Za-z_][\w.]*(?:Error|Exception)\b:.*)$")
# A traceback through the engine's own imports (a line of its own: a worker's lines carry their prefix).
ENGINE_IMPORT = re.compile(r'^\s*File ".*[/\\]handlers[/\\]engine\w*\.py", line \d+, in <module>$')
MISSING_MODULE = re.compile(r"^ModuleNotFoundError: No module named '([\w.]+)'")


class KServeEngine(Engine):
    """The tsctl engine (``python -m serving.engine``): TorchServe's model store and config.properties
    served in Python, no Java, TorchServe's inference and read-only management APIs, KServe v1/v2 REST
    and v2 gRPC, Prometheus metrics, all on one HTTP port (and gRPC on another)."""

    name = "kserve"
    title = "tsctl engine"
    help = (
        "kserve: the tsctl engine (no Java): TorchServe's inference API, KServe v1/v2 and gRPC, from the same "
        "config and model store."
    )
    needs_config = False
    export_flags = ("image", "runtime_kind")
    extra = "kserve"  # the optional dependencies (pyproject.toml) the engine imports

    def start(
        self,
        model_store="model-store",
        config=None,
        home=".tsctl",
        timeout: float = 180,
        python: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        batch_size: Optional[int] = None,
        max_batch_delay: Optional[int] = None,
        metrics_config: Optional[str] = None,
        enable_grpc: bool = True,
        progress: Callable[[str], None] = quiet,
    ) -> "Server":
        """Serve ``model_store`` as ``config`` says (None: the engine's default, config/config.properties
        beside the store when there is one, else every archive with its model-config.yaml) on free
        127.0.0.1 ports; return once every model's workers are up. ``batch_size``/``max_batch_delay``
        override every model's; ``metrics_config`` is TorchServe's property of that name."""
        import os

        from . import server as servers

        model_store, home = Path(model_store).resolve(), Path(home).resolve()
        config = Path(config).resolve() if config is not None else None
        models = self.models(model_store, config)
        temp = servers.check_home(home)
        arguments = ["-m", "serving.engine", "--model_store", str(model_store), "--host", "127.0.0.1"]
        if config is not None:
            arguments += ["--ts_config", str(config)]
        if not enable_grpc:
            arguments += ["--enable_grpc", "false"]
        if batch_size:
            arguments += ["--batch_size", str(batch_size)]
        if max_batch_delay is not None:
            arguments += ["--max_batch_delay", str(max_batch_delay)]
        if metrics_config:
            arguments += ["--metrics_config", str(Path(metrics_config).resolve())]
        run_env = dict(os.environ, TEMP=str(temp))
        run_env.update(env or {})

        def launch() -> "Server":
            http, grpc = servers.free_port(), servers.free_port()
            command = [python or sys.executable, *arguments, "--http_port", str(http), "--grpc_port", str(grpc)]
            process = servers.spawn(command, home, run_env, ENGINE_OUT)
            address = f"http://127.0.0.1:{http}"
            server = servers.Server(
                pid=process.pid,
                home=str(home),
                inference=address,
                management=address,
                metrics=address,
                models=models,
                engine=self.name,
                grpc=f"127.0.0.1:{grpc}" if enable_grpc else None,
                log_writer=process.log_writer.pid,
            )
            return servers.recorded(server, lambda: self.wait_ready(server, timeout, process, progress))

        return servers.with_port_retry(launch)

    @staticmethod
    def models(model_store: Path, config: Optional[Path]) -> List[str]:
        """The models the engine will serve, checked as it will check them (one UserError otherwise): a
        config's model_snapshot (each archive it names in the store, as for TorchServe), or without one
        every archive in the store."""
        from serving import ts_config

        from . import server as servers
        from .properties import read_properties

        try:
            if config is None:
                specs, _ = ts_config.models(ts_config.default_config(model_store), model_store)
            else:
                properties = read_properties(config)
                servers.snapshot_models(properties, config, model_store)  # as TorchServe's start checks it
                specs, _ = ts_config.from_properties(properties, config, model_store)
        except ts_config.ConfigError as exc:
            raise UserError(str(exc)) from None
        return list(dict.fromkeys(spec.name for spec in specs))

    def wait_ready(self, server: "Server", timeout: float, process=None, progress: Callable[[str], None] = quiet):
        """Poll ``/v2/health/ready`` until 200 (every model's workers up), telling ``progress`` each
        model's state as it changes (``model_states``). Fail as soon as the engine exits, with the last
        error it printed; on timeout, name the models that are not ready."""
        from . import server as servers

        deadline = time.monotonic() + timeout
        report = servers.States(progress)
        while True:
            if process is not None and process.poll() is not None:
                servers.output_written(process)
                self.check_extra(server)
                raise ServerError(f"the {self.title} exited with code {process.returncode}: {self.problem(server)}")
            if process is None and not servers.group_alive(server.pid):
                self.check_extra(server)
                raise ServerError(f"the {self.title} exited: {self.problem(server)}")
            ready = self.is_ready(server)
            states = {name: servers.READY for name in server.models} if ready else self.model_states(server)
            if states is None:
                report(self.title, "starting")
            for name, state in (states or {}).items():
                report(name, state)
            if ready:
                return
            if time.monotonic() > deadline:
                pending = ", ".join(self.not_ready(server)) or "(none answered)"
                raise ServerError(f"models {pending} not ready after {timeout:.0f}s: {self.problem(server)}")
            time.sleep(0.5)

    def is_ready(self, server: "Server") -> bool:
        from . import server as servers

        try:
            status, _ = servers.request(f"{server.inference}/v2/health/ready", timeout=5)
        except OSError:
            return False
        return status == 200

    def model_states(self, server: "Server") -> Optional[Dict[str, str]]:
        """Each model's state as its management API describes it (``server.model_state``: unpacking,
        loading, READY); None while the engine does not answer yet."""
        from . import server as servers

        states = {name: servers.model_state(server, name, "unpacking") for name in server.models}
        return None if None in states.values() else states

    @staticmethod
    def not_ready(server: "Server") -> List[str]:
        from . import server as servers

        pending = []
        for name in server.models:
            try:
                status, _ = servers.request(f"{server.inference}/v2/models/{name}/ready", timeout=5)
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
        from serving.ts_wire import FALLBACK, RERAISE

        out = self.output(server)
        lines = out.read_text(errors="replace").splitlines() if out.exists() else []
        fatal = [m.group(1).strip() for m in map(ENGINE_LINE.match, lines) if m]
        worker = [m.group(1).strip() for m in map(WORKER_ERROR.search, lines) if m]
        worker = [error for error in worker if not RERAISE.search(error) and not FALLBACK.search(error)]
        if fatal:
            cause = worker[-1] if worker and worker[-1] not in fatal[-1] else None
            return f"{fatal[-1]} (the worker's last error: {cause})" if cause else fatal[-1]
        bind = [line.strip() for line in lines if "address already in use" in line.lower() or "failed to bind" in line]
        errors = [m.group(1).strip() for m in map(PYTHON_ERROR.match, lines) if m]
        return (bind or errors or worker or [f"no error in the output; see {out}"])[-1]

    def output(self, server: "Server") -> Path:
        return Path(server.home) / ENGINE_OUT

    def handler_log(self, server: "Server") -> Path:
        return Path(server.home) / ENGINE_OUT  # the workers' lines, through the engine's log

    # ---- export: a ServingRuntime for the engine's image, and an InferenceService naming it ----
    def check_export(self, options: "ExportOptions"):
        super().check_export(options)
        if not options.image:
            raise UserError(
                f"--engine {self.name} needs --image REGISTRY/NAME:TAG: the image you build from the export"
            )
        from . import kserve_engine

        kserve_engine.check_runtime_kind(options.runtime_kind)

    def prepare(self, options, properties, archives, notes, scratch):
        from . import kserve_engine

        kserve_engine.requirements(archives)  # every archive's requirement lines checked before anything is written
        return {}

    def predictor(self, options: "ExportOptions", resources: dict) -> dict:
        from . import kserve_engine

        return {"model": storage_model(options, resources, kserve_engine.runtime_name(options))}

    def manifests(self, options: "ExportOptions", resources: dict) -> Dict[str, dict]:
        from . import kserve_engine

        return {kserve_engine.RUNTIME_FILE: kserve_engine.serving_runtime(options, resources)}

    def write_files(self, out: Path, options: "ExportOptions", archives: List[Path]) -> List[Path]:
        from . import kserve_engine

        return kserve_engine.write_image_context(out, options.image, archives)

    def deploy_steps(self, options: "ExportOptions") -> List[str]:
        from . import kserve_engine

        return kserve_engine.build_steps(options)

    def apply_lines(self, options: "ExportOptions") -> List[str]:
        from . import kserve_engine

        return kserve_engine.apply_lines(options)


# ---- MLServer (serving/mlserver_runtime.py) ----------------------------------------------------------
MLSERVER_OUT = "mlserver.out"


class MLServerEngine(KServeEngine):
    """MLServer (Seldon Core 2's server) with tsctl's runtime: every archive of the store served as the
    tsctl engine serves it (TorchServe's workers, the archive's batching), over the Open Inference
    Protocol only: REST ``/v2/models/NAME/infer`` and gRPC. Readiness and failures read as the tsctl
    engine's (``/v2/health/ready``, the last error it printed). Exported with ``tsctl export seldon``."""

    name = "mlserver"
    title = "MLServer"
    help = "mlserver: MLServer 1.7 with tsctl's runtime (Seldon Core 2's server): the Open Inference Protocol only."
    export_flags = ()
    protocol = "v2"
    extra = None  # MLServer runs from a Python of its own (--python), checked before it starts

    def start(
        self,
        model_store="model-store",
        config=None,
        home=".tsctl",
        timeout: float = 180,
        python: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        batch_size: Optional[int] = None,
        max_batch_delay: Optional[int] = None,
        progress: Callable[[str], None] = quiet,
    ) -> "Server":
        """Serve ``model_store`` (its config.properties' model_snapshot, or every archive with its
        model-config.yaml) with MLServer from ``python`` on free 127.0.0.1 ports."""
        from . import mlserver
        from . import server as servers

        model_store, home = Path(model_store).resolve(), Path(home).resolve()
        config = Path(config).resolve() if config is not None else None
        specs = self.specs(model_store, config)
        python = mlserver.find_python(python)  # before anything is written
        for spec in specs:
            spec.batch_size = batch_size or spec.batch_size
            spec.max_batch_delay = spec.max_batch_delay if max_batch_delay is None else max_batch_delay
        servers.check_home(home)
        folder = mlserver.write_repository(specs, home / "mlserver")
        models = list(dict.fromkeys(spec.name for spec in specs))
        return self.serve_repository(folder, models, home, timeout, python, env, progress)

    def serve_repository(
        self,
        folder: Path,
        models: List[str],
        home=".tsctl",
        timeout: float = 180,
        python=None,
        env=None,
        progress=quiet,
    ) -> "Server":
        """MLServer on a model repository as it is (``folder``: a folder of model folders, each with its
        model-settings.json, as ``export seldon`` writes them and Seldon's agent copies them), on free
        127.0.0.1 ports; returns once each of ``models`` is ready."""
        import os

        import handlers

        from . import mlserver
        from . import server as servers

        python = mlserver.find_python(python)
        home = Path(home).resolve()
        temp = servers.check_home(home)
        source = str(Path(handlers.__file__).resolve().parent.parent)  # the runtime: tsctl's handlers package
        run_env = dict(os.environ, TEMP=str(temp))
        run_env["PYTHONPATH"] = os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p)
        run_env.update(env or {})

        def launch() -> "Server":
            http, grpc, metrics = servers.free_port(), servers.free_port(), servers.free_port()
            settings = mlserver.server_settings("127.0.0.1", http, grpc, metrics)
            (folder / mlserver.SETTINGS).write_text(json.dumps(settings, indent=2) + "\n")
            process = servers.spawn(mlserver.command(python, folder), home, run_env, MLSERVER_OUT)
            server = servers.Server(
                pid=process.pid,
                home=str(home),
                inference=f"http://127.0.0.1:{http}",
                management="",
                metrics=f"http://127.0.0.1:{metrics}",
                models=models,
                engine=self.name,
                grpc=f"127.0.0.1:{grpc}",
                log_writer=process.log_writer.pid,
            )
            return servers.recorded(server, lambda: self.wait_ready(server, timeout, process, progress))

        return servers.with_port_retry(launch)

    @staticmethod
    def specs(model_store: Path, config: Optional[Path]):
        """The model versions to serve, read as the tsctl engine reads them (one UserError otherwise)."""
        from serving import ts_config

        from . import server as servers
        from .properties import read_properties

        try:
            if config is None:
                return ts_config.models(ts_config.default_config(model_store), model_store)[0]
            properties = read_properties(config)
            servers.snapshot_models(properties, config, model_store)
            return ts_config.from_properties(properties, config, model_store)[0]
        except ts_config.ConfigError as exc:
            raise UserError(str(exc)) from None

    def is_ready(self, server: "Server") -> bool:
        """Every model ready: MLServer's own readiness is true while it serves no model at all (one that
        failed its load is dropped before MLServer stops)."""
        return super().is_ready(server) and not self.not_ready(server)

    def model_states(self, server: "Server") -> Optional[Dict[str, str]]:
        """loading or READY per model, from ``/v2/models/NAME/ready`` (MLServer has no management API);
        None while it does not answer yet."""
        from . import server as servers

        if not super().is_ready(server):
            try:
                servers.request(f"{server.inference}/v2/health/live", timeout=5)
            except OSError:
                return None
        pending = set(self.not_ready(server))
        return {name: "loading" if name in pending else servers.READY for name in server.models}

    def predict_url(self, server: "Server", model: str) -> str:
        return f"{server.inference}/v2/models/{model}/infer"

    def list_models(self, server: "Server") -> Optional[List[str]]:
        """MLServer's repository index (it has no management API); None for another answer."""
        from . import server as servers

        status, body = servers.request(f"{server.inference}/v2/repository/index", b"{}", "POST", timeout=10)
        if status != 200 or not isinstance(body, list):
            return None
        return [m["name"] for m in body if isinstance(m, dict) and "name" in m]

    def request_body(self, data: bytes, content_type: str) -> Tuple[bytes, str]:
        """A file as one Open Inference Protocol request: a JSON file as it is (a request body), text
        as one BYTES element, anything else base64 in one."""
        from handlers import protocol

        if content_type == protocol.JSON_TYPE:
            return data, content_type
        item = data.decode("utf-8", errors="replace") if content_type.startswith("text/") else base64_text(data)
        body, headers = protocol.encode_request([item], protocol.V2)
        return body, headers["Content-Type"]

    def stop(self, server: "Server", grace: float = 20) -> bool:
        """MLServer first, alone: it stops its servers and its workers go with it (2 s). A TERM to the
        whole group ends the workers first and MLServer never answers it (10 s, then KILL)."""
        import os
        import signal

        from . import server as servers

        try:
            os.kill(server.pid, signal.SIGTERM)
        except ProcessLookupError:
            return servers.stop(server, grace=grace)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and servers.group_alive(server.pid):
            servers.reap(server.pid)
            time.sleep(0.1)
        servers.stop(server, grace=1)  # whatever is left of the group, and server.json
        # the unpacked archives (TEMP): MLServer unloads no model when it stops
        servers.remove_temp(Path(server.home))
        return True

    def output(self, server: "Server") -> Path:
        return Path(server.home) / MLSERVER_OUT

    def handler_log(self, server: "Server") -> Path:
        return Path(server.home) / MLSERVER_OUT

    def check_export(self, options: "ExportOptions"):
        raise UserError("--engine mlserver is exported for Seldon Core 2: run 'tsctl export seldon OUT' instead")


def base64_text(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode("ascii")


ENGINES: Dict[str, Engine] = {engine.name: engine for engine in (TorchServeEngine(), KServeEngine(), MLServerEngine())}


def named(name: str) -> Engine:
    """The engine called ``name``, else a UserError listing them."""
    engine = ENGINES.get(name)
    if engine is None:
        raise UserError(f"--engine {name!r} must be one of {', '.join(ENGINES)}")
    return engine


def engine_of(server: "Server") -> Engine:
    """The engine that runs ``server`` (server.json's "engine")."""
    return named(server.engine)


def require_model(server: "Server", model: str):
    """Refuse (one UserError) a model the running ``server`` does not serve, naming those it does."""
    chosen = engine_of(server)
    models = chosen.served_models(server)
    if model not in models:
        served = ", ".join(models) if models else "no model"
        raise UserError(f"{chosen.title} started from {server.home} serves no model {model!r}: it serves {served}")


def serve(
    engine: str = "torchserve",
    config: Optional[str] = None,
    model_store="model-store",
    home=".tsctl",
    timeout: float = 180,
    progress: Callable[[str], None] = quiet,
    notes: Callable[[str], None] = quiet,
    **flags,
) -> "Server":
    """``tsctl serve``: start ``engine`` on ``model_store`` with ``config`` (None: config/config.properties;
    an engine that can do without one serves every archive in the store when that file is absent);
    ``progress`` hears of each model's state as it changes, ``notes`` of each archive in the store the
    config's snapshot leaves out, before it starts (one the snapshot names but the store lacks is an error)."""
    from . import bounded_log
    from . import server as servers

    chosen = named(engine)
    chosen.check_serve_flags(**flags)
    bounded_log.limits()  # a bad TSCTL_LOG_* is refused before the last run's logs are cleared
    if config is None and (chosen.needs_config or Path(DEFAULT_CONFIG).exists()):
        config = DEFAULT_CONFIG
    if config is not None:
        for line in servers.unlisted_archives(config, model_store):
            notes(line)
    options = {k: v for k, v in flags.items() if v}
    return chosen.start(model_store, config, home, timeout, progress=progress, **options)
