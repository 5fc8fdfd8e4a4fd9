"""Where the tsctl engine listens: config.properties' addresses, as TorchServe 0.12 binds them, and the
engine's command line, which wins over them.

- HTTP (TorchServe's inference API, KServe v1/v2 REST, ``/metrics``): ``--http_port`` (on ``--host``, else
  every interface: the port KServe's runtime gives the engine, where KServe's wrapper listened), else
  ``inference_address``, else 0.0.0.0:8080.
- TorchServe's management API: ``--management_port``, else ``management_address`` on a listener of its own
  when it is not ``inference_address`` (TorchServe's ``Connector.equals``), else on the HTTP listener. Without
  the key, on the HTTP listener (TorchServe's default 127.0.0.1:8081 is KServe's gRPC port).
- ``/metrics``: always on the HTTP listener (what the engine documents and KServe's runtime scrapes), and,
  as TorchServe serves it, on a listener of its own at ``metrics_address`` (``--metrics_port``) when that
  is not ``inference_address`` and ``enable_metrics_api`` is not false.
- KServe's v2 gRPC: ``--grpc_port``, else 8081, or, when a listener above takes 8081, the next port none of
  them takes (a note says so: only a direct run has no ``--grpc_port``; the KServe export passes 8081).
- TorchServe's gRPC APIs: ``--grpc_{inference,management}_{address,port}``, else the config's
  ``grpc_*_address``/``grpc_*_port``, else 127.0.0.1:7070 and 7071.

``--host`` given, every REST and KServe gRPC listener binds it. Two listeners on one port are refused in
one line naming what gave each (``ConfigError``), before anything is bound: ``tsctl export kserve --engine
tsctl`` runs the same check on the runtime's arguments. A port another process holds is refused in one line
naming the address, the key and the fix (``check_free``), before any worker starts. No starlette, no grpc:
the export imports it.
"""

import errno
import re
import socket
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..config_properties import ConfigError

DEFAULT_HOST = "0.0.0.0"  # the engine's, when nothing names one (KServe's containers need every interface)
DEFAULT_HTTP_PORT = 8080
DEFAULT_GRPC_PORT = 8081  # KServe's v2 gRPC port, as KServe's ModelServer and the export
# TorchServe's ConfigManager.ADDRESS_PATTERN (a unix: socket refused: the engine listens on TCP)
ADDRESS = re.compile(r"(https?)://([^:/]+)(?::([0-9]+))?/?", re.IGNORECASE)
# The port TorchServe's Connector.parse gives an address that names none
NO_PORT = {"inference_address": 80, "management_address": 8081, "metrics_address": 8082}
ANY = ("0.0.0.0", "", "::", "*")


@dataclass
class Listener:
    role: str  # both, inference, management, metrics, grpc, ts_inference, ts_management
    host: str
    port: int
    source: str  # what named it, for messages: "--grpc_port 8081", "management_address=http://..."

    @property
    def setting(self) -> str:
        """The config key or argument that sets its port, for messages."""
        first = self.source.split(" ")[0]
        if first.startswith(("--", "grpc_")) or "=" in first:
            return first.split("=")[0]
        return "--grpc_port" if self.role == "grpc" else "inference_address (or --http_port)"


@dataclass
class Bindings:
    rest: List[Listener]  # the HTTP listener first (inference, or both with management)
    grpc: Optional[Listener] = None
    ts_grpc: List[Listener] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    @property
    def http(self) -> Listener:
        return self.rest[0]


def address(addresses: Dict[str, str], key: str, path) -> Optional[Tuple[str, int]]:
    """(host, port) of a config address as TorchServe's Connector.parse reads it; None when absent."""
    value = addresses.get(key)
    if value is None:
        return None
    found = ADDRESS.fullmatch(value.strip())
    if not found:
        raise ConfigError(f"{path}: {key}={value!r} is not an address the engine can bind: give http://HOST:PORT")
    if found.group(1).lower() == "https":
        raise ConfigError(
            f"{path}: {key} is https, which the tsctl engine does not serve (TLS: terminate it "
            "in front of the engine): give http://HOST:PORT"
        )
    port = int(found.group(3)) if found.group(3) else NO_PORT[key]
    if not 0 < port < 65536:
        raise ConfigError(f"{path}: {key}={value!r}: {port} is not a TCP port")
    return found.group(2), port


def plan(frontend, args, path="config.properties") -> Bindings:
    """Every listener the engine will bind (``args``: the engine's parsed command line, None where not
    given; ``frontend``: frontend_settings.Frontend, its ``addresses`` as the config wrote them). ConfigError in one
    line when two take one port."""
    given = {key: address(frontend.addresses, key, path) for key in NO_PORT}
    host = getattr(args, "host", None)
    http = _http(given["inference_address"], host, getattr(args, "http_port", None), frontend)
    found = Bindings(rest=[http])
    for role, key in (("management", "management_address"), ("metrics", "metrics_address")):
        apart = _apart(role, key, given, frontend, args, http, path)
        if apart is not None:
            found.rest.append(apart)
    if all(listener.role != "management" for listener in found.rest):
        http.role = "both"  # management on the HTTP listener
    if getattr(args, "enable_grpc", "true") == "true":
        found.grpc = _grpc(found, getattr(args, "grpc_port", None), http.host)
        for api, port in (("inference", 7070), ("management", 7071)):
            where = getattr(args, f"grpc_{api}_address", None) or getattr(frontend, f"grpc_{api}_address")
            number = getattr(args, f"grpc_{api}_port", None)
            source = f"--grpc_{api}_port {number}" if number is not None else f"grpc_{api}_port"
            number = number if number is not None else getattr(frontend, f"grpc_{api}_port")
            found.ts_grpc.append(Listener(f"ts_{api}", where, number, f"{source} (TorchServe's gRPC {api} API)"))
    check(found)
    return found


def _http(inference: Optional[Tuple[str, int]], host: Optional[str], port: Optional[int], frontend) -> Listener:
    if port is not None:
        return Listener("inference", host or DEFAULT_HOST, port, f"--http_port {port}")
    if inference is not None:
        source = f"inference_address={frontend.addresses['inference_address']}"
        return Listener("inference", host or inference[0], inference[1], source)
    return Listener("inference", host or DEFAULT_HOST, DEFAULT_HTTP_PORT, f"the default HTTP port {DEFAULT_HTTP_PORT}")


def _apart(role: str, key: str, given, frontend, args, http: Listener, path) -> Optional[Listener]:
    """The management or metrics listener when it has one of its own, else None (on the HTTP listener)."""
    port = getattr(args, f"{role}_port", None)
    mine = given[key]
    if port is not None:
        source = f"--{role}_port {port}"
    elif mine is None or (role == "metrics" and not frontend.enable_metrics_api):
        return None
    elif given["inference_address"] is not None and _same(mine, given["inference_address"]):
        return None
    else:
        port, source = mine[1], f"{key}={frontend.addresses[key]}"
    if port == http.port:
        return None  # the HTTP listener's own port: served there
    host = getattr(args, "host", None) or (mine[0] if mine is not None else http.host)
    return Listener(role, host, port, source)


def _same(one: Tuple[str, int], other: Tuple[str, int]) -> bool:
    return one[1] == other[1] and one[0].lower() == other[0].lower()


def _grpc(found: Bindings, port: Optional[int], host: str) -> Listener:
    if port is not None:
        return Listener("grpc", host, port, f"--grpc_port {port} (KServe's v2 gRPC)")
    taken = {listener.port: listener for listener in found.rest}
    port = DEFAULT_GRPC_PORT
    while port in taken:
        port += 1
    if port != DEFAULT_GRPC_PORT:
        found.notes.append(
            f"KServe's v2 gRPC listens on {port}, not its default {DEFAULT_GRPC_PORT}: "
            f"{taken[DEFAULT_GRPC_PORT].source} takes {DEFAULT_GRPC_PORT} (give --grpc_port to choose)"
        )
    return Listener("grpc", host, port, f"KServe's v2 gRPC port {port}")


def check(found: Bindings):
    """ConfigError naming both when two listeners would bind one port (not 0: any free one) on overlapping
    addresses."""
    listeners = found.rest + ([found.grpc] if found.grpc else []) + found.ts_grpc
    for index, one in enumerate(listeners):
        for other in listeners[index + 1 :]:
            if one.port == other.port != 0 and (one.host in ANY or other.host in ANY or one.host == other.host):
                raise ConfigError(
                    f"{other.source} and {one.source} both take port {one.port}: give one of them another port"
                )


def check_free(found: Bindings):
    """ConfigError in one line for a listener another process holds (or that cannot be bound here), naming
    the address, the key that set it and the fix: checked before any worker starts, where binding it after
    the models loaded failed in a traceback from uvicorn, each worker and asyncio (14 s with four workers)."""
    for it in found.rest + ([found.grpc] if found.grpc else []) + found.ts_grpc:
        problem = bind_problem(it.host, it.port)
        if problem == NOT_HERE:
            raise ConfigError(f"{it.source}: {it.host} {problem}: give {it.setting} one it has")
        if problem:
            fix = "stop that process, or give" if problem == HELD else "give"
            raise ConfigError(f"{it.host}:{it.port} ({it.source}) {problem}: {fix} {it.setting} a free port")


HELD = "is in use by another process"
NOT_HERE = "is not an address of this machine"


def bind_problem(host: str, port: int) -> Optional[str]:
    """Why ``host``:``port`` cannot be bound now (HELD, NOT_HERE, or the system's words), as uvicorn and grpc
    bind it (SO_REUSEADDR); None when it can (port 0: any free one of ``host``)."""
    try:
        named = None if host in ("", "*") else host
        found = socket.getaddrinfo(named, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, where = found[0]
    except socket.gaierror:
        return NOT_HERE
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(where)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return HELD
            return NOT_HERE if exc.errno == errno.EADDRNOTAVAIL else f"cannot be bound ({exc.strerror})"
    return None


def other_api(found: Bindings, role: str, management_path: bool) -> str:
    """What a request to the wrong listener is told after TorchServe's message (its status kept): on the
    management listener a path of the inference API, or on the inference listener one of the management API
    (``management_path``), `` (this is the management API; the inference API is at http://HOST:PORT)``; else
    "" (a listener serving both, or the path's own)."""
    wanted = "management" if management_path else "inference"
    if role not in ("inference", "management") or role == wanted:
        return ""
    other = next((it for it in found.rest if it.role in (wanted, "both")), None)
    if other is None:
        return ""
    return f" (this is the {role} API; the {wanted} API is at http://{other.host}:{other.port})"
