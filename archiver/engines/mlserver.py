"""MLServer as a runtime (serving/runtimes/mlserver_runtime.py): ``tsctl serve --engine mlserver``; its model
repository and where to find it are archiver/mlserver.py."""

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from serving.worker import sockets

from ..addresses import LOOPBACK, client_address
from ..errors import UserError
from ..output import quiet
from .base import Launch
from .tsctl import TsctlRuntime, model_specs, served

if TYPE_CHECKING:  # pragma: no cover
    from ..server import Server

MLSERVER_OUT = "mlserver.out"
MLSERVER_SOCKET = sockets.socket_below(sockets.MLSERVER, sockets.engine_port(1))  # below TEMP (one run dir a model)


class MLServerRuntime(TsctlRuntime):
    """MLServer (Seldon Core 2's server) with tsctl's runtime: every archive of the store served as the
    tsctl engine serves it (TorchServe's workers, the archive's batching), over the Open Inference
    Protocol only: REST ``/v2/models/NAME/infer`` and gRPC. Readiness and failures read as the tsctl
    engine's (``/v2/health/ready``, the last error it printed). Exported with ``tsctl export seldon``."""

    name = "mlserver"
    title = "MLServer"
    help = "mlserver: MLServer 1.7 with tsctl's runtime (Seldon Core 2's server): the Open Inference Protocol only."
    protocol = "v2"
    model_api = False  # MLServer has no TorchServe management API
    serve_flags = ()
    snapshots = False  # no management API: nothing registered while it runs, no snapshot
    extra = None  # MLServer runs from a Python of its own (--python), checked before it starts

    def launch(self, run: Launch, batch_size: Optional[int] = None, max_batch_delay: Optional[int] = None) -> "Server":
        """Serve ``run``'s store (its config.properties' model_snapshot, or every archive with its
        model-config.yaml) with MLServer from ``run.python`` on free 127.0.0.1 ports."""
        from .. import mlserver
        from .. import server as servers

        model_store, home = Path(run.model_store).resolve(), Path(run.home).resolve()
        config = Path(run.config).resolve() if run.config is not None else None
        specs, frontend = served(model_store, config)
        if frontend.token_authorization_asked:
            raise UserError(
                f"{config}: disable_token_authorization=false asks for TorchServe's token authorization, which "
                "MLServer does not have: set it to true and put authorization in front, or serve with --engine tsctl"
            )
        extra = metrics_settings(frontend, config)
        python = mlserver.find_python(run.python)  # before anything is written
        for spec in specs:
            spec.batch_size = batch_size or spec.batch_size
            spec.max_batch_delay = spec.max_batch_delay if max_batch_delay is None else max_batch_delay
        servers.check_home(home, MLSERVER_SOCKET)
        folder = mlserver.write_repository(specs, home / "mlserver", extra)
        models = list(dict.fromkeys(spec.name for spec in specs))
        return self.serve_repository(
            folder, models, home, run.timeout, python, run.env, run.progress, run.host, run.port
        )

    def serve_repository(
        self,
        folder: Path,
        models: List[str],
        home=".tsctl",
        timeout: float = 180,
        python=None,
        env=None,
        progress=quiet,
        host: str = LOOPBACK,
        port: Optional[int] = None,
    ) -> "Server":
        """MLServer on a model repository as it is (``folder``: a folder of model folders, each with its
        model-settings.json, as ``export seldon`` writes them and Seldon's agent copies them), on ``host``,
        its inference API on ``port`` (default: free 127.0.0.1 ports); returns once each of ``models`` is ready."""
        import os

        import handlers

        from .. import mlserver
        from .. import server as servers

        python = mlserver.find_python(python)
        home = Path(home).resolve()
        temp = servers.check_home(home, MLSERVER_SOCKET)
        source = str(Path(handlers.__file__).resolve().parent.parent)  # the runtime: tsctl's handlers package
        run_env = dict(os.environ, TEMP=str(temp))
        run_env["PYTHONPATH"] = os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p)
        run_env.update(env or {})

        def launch() -> "Server":
            http, grpc, metrics = servers.pick_ports(3, port)
            settings = mlserver.server_settings(host, http, grpc, metrics)
            (folder / mlserver.SETTINGS).write_text(json.dumps(settings, indent=2) + "\n")
            process = servers.spawn(mlserver.command(python, folder), home, run_env, MLSERVER_OUT)
            server = servers.Server(
                pid=process.pid,
                home=str(home),
                inference=f"http://{client_address(host, http)}",
                management="",
                metrics=f"http://{client_address(host, metrics)}",
                models=models,
                engine=self.name,
                grpc=client_address(host, grpc),
                log_writer=process.log_writer.pid,
                kserve_v2_grpc=client_address(host, grpc),
            )
            return servers.recorded(server, lambda: self.wait_ready(server, timeout, process, progress))

        return servers.with_port_retry(launch)

    @staticmethod
    def specs(model_store: Path, config: Optional[Path]):
        """The model versions to serve, read as the tsctl engine reads them (one UserError otherwise)."""
        return model_specs(model_store, config)

    def is_ready(self, server: "Server") -> bool:
        """Every model ready: MLServer's own readiness is true while it serves no model at all (one that
        failed its load is dropped before MLServer stops)."""
        return super().is_ready(server) and not self.not_ready(server)

    def model_states(self, server: "Server") -> Optional[Dict[str, str]]:
        """loading or READY per model, from ``/v2/models/NAME/ready`` (MLServer has no management API);
        None while it does not answer yet."""
        from .. import server as servers

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
        from .. import server as servers

        status, body = servers.request(f"{server.inference}/v2/repository/index", b"{}", "POST", timeout=10)
        if status != 200 or not isinstance(body, list):
            return None
        return [m["name"] for m in body if isinstance(m, dict) and "name" in m]

    def request_body(self, data: bytes, content_type: str, as_request: bool = True) -> Tuple[bytes, str]:
        """A file as one Open Inference Protocol request: a JSON file as it is (a v2 request, when
        ``as_request``), anything else one BYTES element with ``content_type`` as its
        ``parameters.content_type``, which MLServer's runtime hands a handler that is not the toolkit's
        as TorchServe's worker would (serving/runtimes/v2_requests.py): the text for text/... and
        application/json, base64 for any other type, and base64 marked ``base64`` for text that is not
        UTF-8 (the handler gets the bytes, as TorchServe's worker gives bytes it cannot decode)."""
        from handlers import protocol
        from serving.runtimes.v2_requests import decodes_as_text

        media = content_type.split(";", 1)[0].strip()  # as TorchServe's frontend passes it on
        if as_request and media == protocol.JSON_TYPE:
            return data, media
        declared, item = media or "base64", None  # no type: the bytes, as TorchServe's worker hands them
        if media and decodes_as_text(media):
            try:
                item = data.decode("utf-8")
            except UnicodeDecodeError:
                declared = "base64"
        element = base64_text(data) if item is None else item
        tensor = {
            "name": "input-0",
            "shape": [1],
            "datatype": "BYTES",
            "data": [element],
            "parameters": {"content_type": declared},
        }
        return json.dumps({"inputs": [tensor]}).encode("utf-8"), protocol.JSON_TYPE

    def stop(self, server: "Server", grace: float = 20) -> bool:
        """MLServer first, alone: it stops its servers and its workers go with it (2 s). A TERM to the
        whole group ends the workers first and MLServer never answers it (10 s, then KILL)."""
        import os
        import signal

        from .. import server as servers

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


def metrics_settings(frontend, config=None) -> Dict[str, object]:
    """What of the frontend settings of ``config`` reaches each model's ``parameters.extra``: its
    ``metrics_config`` (the workers' metrics.yaml, a relative path read from the current directory, as
    TorchServe started there reads it: ``properties.metrics_yaml``) and ``model_metrics_auto_detect``."""
    from ..properties import metrics_yaml

    extra: Dict[str, object] = {}
    if frontend.metrics_config:
        where = f"metrics_config of {config}" if config else "metrics_config"
        extra["metricsConfig"] = metrics_yaml(frontend.metrics_config, where)
    if not frontend.metrics_auto_detect:
        extra["metricsAutoDetect"] = False
    return extra


def base64_text(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode("ascii")
