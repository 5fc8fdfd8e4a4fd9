"""The tsctl engine's start: ``python -m serving.engine`` (``__main__.py``) runs ``main``.

It reads the command line (arguments.py), checks the pinned tree (``--tree_digest``, serving/tree_digests.py)
before anything of the tree is read, reads config.properties and the model store as TorchServe does
(serving/ts_config.py), opens every model version (versions.py) and serves them (``serve``): the HTTP
listeners of app.py where listeners.py puts them, KServe's v2 gRPC (kserve_grpc.py) and TorchServe's own gRPC
APIs (ts_grpc.py), until SIGTERM or SIGINT. A model that cannot load, a port that cannot be bound, a changed
tree: one line on stderr, exit 1 or 2.
"""

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Optional

from handlers import identity, signing
from handlers.archives import ArchiveError

from .. import config_properties, ts_config
from ..tree_digests import Tree, TreeChanged
from . import http_server, listeners, snapshots
from .app import Engine, build_app
from .arguments import parse_args
from .token_auth import Tokens

logger = logging.getLogger("tsctl.engine")


def pinned_tree(args) -> Optional[Tree]:
    """With ``--tree_digest``: the tree above the model store (export kserve's), every file of it checked, and
    served from that tree alone: --model_store is its model-store/ and --ts_config its config/config.properties,
    as given (a link among the tree's folders is refused by the check, not followed around it)."""
    if not args.tree_digest:
        return None
    store = os.path.abspath(args.model_store)
    root = os.path.dirname(store)
    if os.path.basename(store) != "model-store":
        raise TreeChanged(
            f"--model_store {args.model_store} is not a tree's model-store/ folder: a pinned tree is served from "
            "ROOT/model-store"
        )
    config = os.path.join(root, "config", "config.properties")
    if args.ts_config and os.path.abspath(args.ts_config) != config:
        raise TreeChanged(
            f"--ts_config {args.ts_config} is not the pinned tree's config/config.properties: serve the tree's own "
            f"config ({config})"
        )
    tree = Tree.pinned(root, args.tree_digest)
    tree.check_all()
    logger.info("the tree %s is the one %s pins: %d files checked", root, args.tree_digest, len(tree.files))
    return tree


def load_specs(args):
    store = Path(args.model_store)
    config = Path(args.ts_config) if args.ts_config else ts_config.default_config(store)
    specs, frontend = ts_config.models(config, store, skip_unreadable=True)  # without a config, as TorchServe does
    for spec in specs:
        if args.batch_size:
            spec.batch_size = args.batch_size
        if args.max_batch_delay is not None:
            spec.max_batch_delay = args.max_batch_delay
    if args.metrics_config:
        frontend.metrics_config = str(Path(args.metrics_config).resolve())
    if args.max_inflight_bytes:
        frontend.max_inflight_bytes = args.max_inflight_bytes
    frontend.body_idle_timeout = args.body_idle_timeout
    frontend.public_key = args.public_key
    if args.enable_model_api is not None:
        frontend.enable_model_api = args.enable_model_api == "true"
    if args.disable_token_auth:
        frontend.token_authorization = False
    # Without a config, a toolkit archive reads raw bodies (tsctl config's decode_input_request=false).
    decode = None if config else (lambda model_dir: identity.read(model_dir) is None)
    return specs, frontend, config, decode


def load_kserve_grpc():
    """KServe's v2 gRPC service (kserve_grpc.py): its protocol types take seconds to import, so it is
    imported off the event loop, once ``enable_grpc`` asks for it."""
    from . import kserve_grpc

    return kserve_grpc


def load_ts_grpc():
    """TorchServe's gRPC APIs (ts_grpc.py), imported off the event loop as load_kserve_grpc is."""
    from . import ts_grpc

    return ts_grpc


async def serve(engine: Engine, args, where: listeners.Bindings) -> int:
    """Listen, load every model, and serve until SIGTERM/SIGINT: 0, or 1 when a model cannot load or
    a port cannot be bound (the reason on stderr). Every listener as ``where`` says (serving/engine/listeners.py:
    the config's addresses, the command line's ports)."""
    loop = asyncio.get_running_loop()
    if engine.frontend.token_authorization and engine.tokens is None:
        engine.tokens = Tokens(engine.frontend.token_expiration_min)  # key_file.json where the engine runs
    rest = where.rest
    shared = http_server.Shared(http_server.max_connections())  # every listener's connections and heads, together
    servers = [
        http_server.server(
            build_app(engine, it.role, where), it.host, it.port, shared, send_timeout=engine.body_idle_timeout
        )
        for it in rest
    ]
    stopping = asyncio.Event()

    def stop():
        engine.begin_stop()
        for server in servers:
            server.should_exit = True
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    tasks = [asyncio.ensure_future(server.serve()) for server in servers]
    grpc_server, ts_grpc_servers, served = None, [], False
    try:
        starting = asyncio.ensure_future(engine.start())  # the workers first: they take longest
        if args.enable_grpc == "true":  # KServe's protocol types take seconds to import: off the loop
            grpc = await loop.run_in_executor(None, load_kserve_grpc)
            try:
                grpc_server = await grpc.start_grpc(engine, where.grpc.host, where.grpc.port)
            except RuntimeError as exc:  # grpc's own words end in advice about GRPC_VERBOSITY
                raise RuntimeError(
                    f"{where.grpc.source} on {where.grpc.host}: {str(exc).split(';')[0]} (in use?): "
                    "give --grpc_port a free port"
                ) from None
            ts_grpc = await loop.run_in_executor(None, load_ts_grpc)
            ts_grpc_servers = await ts_grpc.start(engine, args)
        waiting = asyncio.ensure_future(stopping.wait())
        await asyncio.wait({starting, waiting, *tasks}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        for it, task in zip(rest, tasks):
            if task.done():  # it could not bind
                starting.cancel()
                raise RuntimeError(f"the HTTP server on {it.host}:{it.port} ({it.source}) stopped: see the lines above")
        if not starting.done():  # stopped while loading
            starting.cancel()
            return 0
        starting.result()
        served = True
        if engine.snapshots is not None:
            engine.snapshots.save("startup")
        names = ", ".join(f"{m.label} ({len(m.workers)} workers)" for m in engine.all())
        bound = ", ".join(f"{it.role} {it.host}:{it.port}" for it in [*rest, *([where.grpc] if grpc_server else [])])
        logger.info("tsctl engine: serving %s on %s", names, bound)
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        return 0
    except (RuntimeError, SystemExit) as exc:
        message = str(exc) if isinstance(exc, RuntimeError) else f"the HTTP server on port {where.http.port} failed"
        print(f"tsctl engine: {message}", file=sys.stderr, flush=True)
        return 1
    finally:
        stop()
        if served and engine.snapshots is not None:
            engine.snapshots.save("shutdown")
        running = [task for task in tasks if not task.done()]
        if running:
            await asyncio.wait(running, timeout=5)
        for server in [grpc_server, *ts_grpc_servers]:
            if server is not None:
                await server.stop(1)


MMAP_THRESHOLD = 1 << 20  # bytes: buffers this large are mapped on their own, unmapped when freed


def return_freed_memory():
    """Fix glibc's mmap threshold (``mallopt(M_MMAP_THRESHOLD)``, as ``MALLOC_MMAP_THRESHOLD_`` would):
    every buffer of a MiB or more (bodies, answers, a connection's send buffer) is mapped alone and
    goes back to the system when freed. Left dynamic, the threshold rises to the largest buffer freed
    (32 MiB at most) and later ones stay in the heap: an aborted connection's 15 MB answer freed
    kept the engine's RSS up for as long as it ran. Not glibc: nothing to do."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def log_to_stderr():
    output = logging.StreamHandler()
    output.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("tsctl", "handlers"):
        named = logging.getLogger(name)
        named.setLevel(logging.INFO)
        named.addHandler(output)
        named.propagate = False


def main(argv=None):
    args = parse_args(argv)
    log_to_stderr()
    return_freed_memory()
    try:
        tree = pinned_tree(args)  # before anything of the tree is read
        specs, frontend, config, decode = load_specs(args)
        where = listeners.plan(frontend, args, config or "the engine's defaults")
        listeners.check_free(where)  # before any worker starts
        for note in frontend.notes + where.notes:  # a setting not applied, an archive not served, a port moved
            logger.warning("%s", note)
        engine = Engine(specs, frontend, decode, Path(args.model_store), tree)
        if args.snapshot_dir:
            properties = config_properties.read_properties(config) if config else {}
            engine.snapshots = snapshots.Snapshots(Path(args.snapshot_dir), properties, engine)
    except (config_properties.ConfigError, ArchiveError, TreeChanged) as exc:
        print(f"tsctl engine: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    except signing.SignatureError as exc:  # exit 2 for a key file that is no public key (KeyFileError)
        print(f"tsctl engine: {exc}", file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)
    try:
        code = asyncio.run(serve(engine, args, where))
    finally:
        engine.close()
    sys.exit(code)
