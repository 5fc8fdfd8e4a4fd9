"""What every runtime ``tsctl serve --engine NAME`` starts does: ``Runtime``, the interface
``tsctl serve/stop/predict/bench/verify --served`` ask, never comparing names.

A runtime **serves locally**: ``start(model_store, config, home, timeout, ...)`` launches it detached on
free 127.0.0.1 ports (``server.spawn``), records a ``Server`` (server.json: the runtime's name, its
``inference``/``management``/``metrics`` base addresses and ``grpc`` HOST:PORT) and returns once
``wait_ready`` says every model can answer (telling ``progress`` each model's state as it changes:
starting, extracting, loading, READY); ``predict_url`` is where one request for a model goes;
``addresses`` is what ``serve`` prints; ``output``/``handler_log`` are where its own and the handlers'
lines go; ``stop`` ends its process group. ``serve_flags`` are the optional ``serve`` flags it honours,
``model_api`` whether its management API can re-register models (``bench --sweep-batch``),
``needs_config`` whether it can run without a config.properties, ``protocol`` what it answers natively
(``verify --served``'s default: ``ts``, MLServer ``v2``). ``request_body`` is how ``predict`` and
``bench`` send a file where the runtime takes only one protocol (MLServer: KServe v2).

Writing a deployment is not a runtime's business: ``tsctl export`` has targets (archiver/export/).
Nothing heavy is imported at import time (``tsctl --help`` builds ``--engine``'s choices from the
registry): what serving needs is imported inside the methods.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Optional, Tuple

from ..addresses import LOOPBACK, client_address
from ..errors import UserError
from ..output import quiet

if TYPE_CHECKING:  # pragma: no cover
    from ..server import Server

DEFAULT_CONFIG = "config/config.properties"  # tsctl config's output: what serve reads unless told


def snapshot_dir(home) -> Path:
    """Where a server ``tsctl serve`` starts in ``home`` keeps its config snapshots: TorchServe's own place,
    ``LOG_LOCATION/config`` (serving/engine/snapshots.py)."""
    from ..server import logs_of

    return logs_of(home) / "config"


# The optional flags of ``tsctl serve`` that not every runtime takes: option name -> the flag as typed.
SERVE_FLAGS = {
    "install_deps": "--install-deps",
    "enable_model_api": "--enable-model-api",
    "disable_token_auth": "--disable-token-auth",
}


@dataclass
class Launch:
    """What every runtime is started with (``Runtime.start``'s arguments, as given): the store, the config
    (None: the runtime's default), the state directory, how long to wait, the Python that runs it (None:
    this one), more environment variables, and who hears of each model's state."""

    model_store: str
    config: Optional[str]
    home: str
    timeout: float
    python: Optional[str]
    env: Optional[Dict[str, str]]
    progress: Callable[[str], None]
    host: str = LOOPBACK  # the address every listener binds (tsctl serve --host)
    port: Optional[int] = None  # the inference API's port (tsctl serve --port); None: a free one

    def ports(self, count: int) -> List[int]:
        """``count`` different ports: the inference API's first (``port``, else a free one), the rest free."""
        from .. import server as servers

        return servers.pick_ports(count, self.port)

    def address(self, port: int) -> str:
        """HOST:PORT of one of its listeners as a client on this machine reaches it."""
        return client_address(self.host, port)


class Runtime:
    """One way to serve a model store locally; see the module docstring. Subclasses set the class
    attributes and implement ``launch``, ``wait_ready``, ``output`` and ``handler_log``."""

    name = ""  # the --engine value and server.json's "engine"
    title = ""  # what messages call it: "TorchServe ready", "TorchServe stopped"
    help = ""  # one line for --engine's help
    needs_config = True  # False: serves a model store without config.properties (each archive's model-config.yaml)
    model_api = False  # its management API can (re)register models: bench --sweep-batch
    protocol = "ts"  # what it natively answers, as verify --protocol names it: ts (/predictions/MODEL), v1, v2
    serve_flags: Tuple[str, ...] = ()  # keys of SERVE_FLAGS it honours
    snapshots = False  # it writes TorchServe's config snapshots in snapshot_dir(home): serve --last-snapshot

    def start(
        self,
        model_store="model-store",
        config=None,
        home=".tsctl",
        timeout: float = 180,
        python: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        progress: Callable[[str], None] = quiet,
        host: str = LOOPBACK,
        port: Optional[int] = None,
        **options,
    ) -> "Server":
        """Start serving ``model_store`` and return once every model is ready, its listeners on ``host``
        (the inference API's on ``port``, else a free one: one UserError when another process holds it);
        ``options`` are the runtime's own (``launch``'s keyword arguments)."""
        if port is not None or host != LOOPBACK:
            check_free(host, port or 0)
        return self.launch(Launch(model_store, config, home, timeout, python, env, progress, host, port), **options)

    def launch(self, run: Launch, **options) -> "Server":
        raise NotImplementedError

    def wait_ready(self, server: "Server", timeout: float, process=None, progress: Callable[[str], None] = quiet):
        raise NotImplementedError

    def predict_url(self, server: "Server", model: str) -> str:
        return f"{server.inference}/predictions/{model}"

    def request_body(self, data: bytes, content_type: str, as_request: bool = True) -> Tuple[bytes, str]:
        """One file as the body ``predict_url`` takes, and its content type: the file itself here
        (``as_request``: whether a JSON file may be a request of the runtime's own protocol, MLServer's)."""
        return data, content_type

    def addresses(self, server: "Server") -> List[Tuple[str, str]]:
        """(label, address) lines for ``tsctl serve`` to print, each gRPC address labelled with its API
        (server.json's keys: ``Server``); ``serve --json`` adds the former ``grpc``."""
        lines = [("inference", server.inference)]
        if server.management:
            lines.append(("management", server.management))
        if server.metrics:
            lines.append(("metrics", server.metrics_url))
        for label in ("kserve_v2_grpc", "ts_grpc_inference", "ts_grpc_management"):
            if getattr(server, label):
                lines.append((label, getattr(server, label)))
        return lines + [("logs", str(self.output(server)))]

    def key_file(self, server: "Server") -> Optional[Path]:
        """Where the keys are when the server asks for TorchServe's tokens (its management API refuses a call
        without one: ``InvalidKeyException``), else None: key_file.json in its home, where it runs."""
        from .. import server as servers

        if not server.management:
            return None
        try:
            status, body = servers.request(f"{server.management}/models?limit=1", timeout=10)
        except OSError:
            return None
        refused = status == 400 and isinstance(body, dict) and body.get("type") == "InvalidKeyException"
        return Path(server.home) / "key_file.json" if refused else None

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
        from .. import server as servers

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
        from .. import server as servers

        return servers.stop(server, grace=grace)


def refuse(name: str, title: str, taken: Iterable[str], given: dict, flags: Dict[str, str], owners, command: str):
    """A UserError for the first flag in ``given`` (option name -> value) that ``--engine name`` does not
    take (``taken``), naming one that does (``owners(option)``: the names of those that take it)."""
    for key, value in given.items():
        if value is not None and value is not False and value != "" and key not in taken:  # 0 is given
            others = owners(key)
            flag = flags[key]
            instead = f", or {command} with --engine {others[0]}" if others else ""
            raise UserError(f"{flag} is not an option of --engine {name} ({title}): drop {flag}{instead}")


def check_free(host: str, port: int):
    """One UserError when ``tsctl serve --host HOST --port PORT`` cannot be bound: another process holds
    it, or HOST is no address of this machine (the tsctl engine's own check: serving/engine/listeners.py)."""
    from serving.engine import listeners

    problem = listeners.bind_problem(host, port)
    if problem == listeners.NOT_HERE:
        raise UserError(f"--host {host} {problem}: give one of its addresses (127.0.0.1, 0.0.0.0 for every one)")
    if problem:
        raise UserError(f"--port {port}: {host}:{port} {problem}: stop that process, or give --port another port")
