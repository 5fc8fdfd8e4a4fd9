"""The runtimes ``tsctl serve --engine NAME`` starts, behind one interface (``Runtime``, engines/base.py):
``tsctl serve/stop/predict/bench/verify --served`` ask the runtime object, never compare names.

    ENGINES = {"torchserve": TorchServeRuntime(), "tsctl": TsctlRuntime(), "mlserver": MLServerRuntime()}

Another runtime is a subclass of ``Runtime`` and one line in ``ENGINES`` (MLServer was added so); the
command line builds ``--engine``'s choices from the registry and needs no change. ``--engine kserve`` is
the tsctl engine's older name, still accepted (``ALIASES``; the CLI notes it). What ``tsctl export``
writes for a runtime is a target's business (archiver/export/kserve/targets.py), not the runtime's.

This package imports nothing heavy at import time (``tsctl --help`` builds its choices from it): what
serving needs is imported inside the methods.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Optional, Tuple

from ..errors import UserError
from ..output import quiet
from .base import DEFAULT_CONFIG, SERVE_FLAGS, Runtime, refuse, snapshot_dir
from .mlserver import MLServerRuntime
from .torchserve import TorchServeRuntime
from .tsctl import ENGINE_OUT, TsctlRuntime

if TYPE_CHECKING:  # pragma: no cover
    from ..server import Server

__all__ = ["DEFAULT_CONFIG", "ENGINE_OUT", "SERVE_FLAGS", "Runtime", "ENGINES", "ALIASES"]

ENGINES: Dict[str, Runtime] = {
    runtime.name: runtime for runtime in (TorchServeRuntime(), TsctlRuntime(), MLServerRuntime())
}
ALIASES = {"kserve": "tsctl"}  # an older name -> the runtime's name (server.json files may still say kserve)


def named(name: str) -> Runtime:
    """The runtime called ``name`` (or by an alias of it), else a UserError listing them."""
    runtime = ENGINES.get(ALIASES.get(name, name))
    if runtime is None:
        raise UserError(f"--engine {name!r} must be one of {', '.join(ENGINES)}")
    return runtime


def engine_of(server: "Server") -> Runtime:
    """The runtime that runs ``server`` (server.json's "engine")."""
    return named(server.engine)


def check_serve_flags(runtime: Runtime, **given):
    """Refuse a ``serve`` flag ``runtime`` does not honour, naming the runtimes that do."""

    def owners(key):
        return [other.name for other in ENGINES.values() if key in other.serve_flags]

    flags = {k: v for k, v in given.items() if k in SERVE_FLAGS}
    refuse(runtime.name, runtime.title, runtime.serve_flags, flags, SERVE_FLAGS, owners, "serve")


def last_snapshot_config(runtime: Runtime, config: Optional[str], home) -> str:
    """The newest config snapshot a server of ``home`` saved (at its start, after each management call
    that changed its models, at its end): what `torchserve --start` without --ts-config serves. One
    UserError when the runtime keeps none, ``config`` names another, or there is none yet."""
    from serving.engine import snapshots

    if not runtime.snapshots:
        raise UserError(
            f"--last-snapshot: {runtime.title} keeps no config snapshot (it registers no model while it "
            "runs): serve with --config, or with --engine torchserve or tsctl"
        )
    if config is not None:
        raise UserError(f"--config {config} and --last-snapshot both say what to serve: give one of them")
    where = snapshot_dir(home)
    found = snapshots.latest(where)
    if found is None:
        raise UserError(
            f"--last-snapshot: {where} holds no config snapshot; a server 'tsctl serve --home {home}' "
            "starts writes one as it starts and after each change: serve with --config first"
        )
    return str(found)


def require_model(server: "Server", model: str):
    """Refuse (one UserError) a model the running ``server`` does not serve, naming those it does."""
    chosen = engine_of(server)
    models = chosen.served_models(server)
    if model not in models:
        served = ", ".join(models) if models else "no model"
        raise UserError(f"{chosen.title} started from {server.home} serves no model {model!r}: it serves {served}")


def predict_url(server: "Server", model: str) -> str:
    """Where one request for ``model`` goes, as the server's runtime says."""
    return engine_of(server).predict_url(server, model)


def predict(
    server: "Server", model: str, path: Path, timeout: float = 60, kind: Optional[str] = None
) -> Tuple[int, object]:
    """POST one file to the model (``predict_url``), as the runtime takes it (``request_body``), with the
    content type ``kind`` ('': none, as curl -T sends a file), else (None) the one its suffix says; the
    answer as JSON, text, or bytes (an image, a tensor file: not UTF-8)."""
    from handlers.requests import content_type

    from ..server import request

    path = Path(path)
    if not path.is_file():
        raise UserError(f"input {path} does not exist")
    given = kind is not None
    body, sent = engine_of(server).request_body(path.read_bytes(), kind if given else content_type(path), not given)
    headers = {**({"Content-Type": sent} if sent else {}), **server.headers("inference")}
    return request(predict_url(server, model), body, "POST", headers, timeout, binary=True)


def serve(
    engine: str = "torchserve",
    config: Optional[str] = None,
    model_store="model-store",
    home=".tsctl",
    timeout: float = 180,
    progress: Callable[[str], None] = quiet,
    notes: Callable[[str], None] = quiet,
    last_snapshot: bool = False,
    **flags,
) -> "Server":
    """``tsctl serve``: start ``engine`` on ``model_store`` with ``config`` (None: config/config.properties;
    a runtime that can do without one serves every archive in the store when that file is absent);
    ``progress`` hears of each model's state as it changes, ``notes`` of each archive in the store the
    config's snapshot leaves out and of each GPU asked for that this machine does not have, before it starts
    (an archive the snapshot names but the store lacks is an error). ``last_snapshot``: the config is the
    newest config snapshot a server of ``home`` saved (``last_snapshot_config``)."""
    from .. import bounded_log
    from .. import server as servers
    from ..device_notes import device_notes

    chosen = named(engine)
    check_serve_flags(chosen, **flags)
    bounded_log.limits()  # a bad TSCTL_LOG_* is refused before the last run's logs are cleared
    if last_snapshot:
        config = last_snapshot_config(chosen, config, home)
    if config is None and (chosen.needs_config or Path(DEFAULT_CONFIG).exists()):
        config = DEFAULT_CONFIG
    if config is not None:
        for line in servers.unlisted_archives(config, model_store):
            notes(line)
    for line in device_notes(config, model_store):  # a GPU asked for that this machine does not have
        notes(line)
    options = {k: v for k, v in flags.items() if v}
    return chosen.start(model_store, config, home, timeout, progress=progress, **options)
