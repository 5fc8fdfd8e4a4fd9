"""The tsctl engine's command line (``python -m serving.engine``): TorchServe's flags as KServe's runtimes and
``tsctl serve`` pass them, and the engine's own; an argument it does not use is logged and ignored (KServe
passes ``--model_name`` and others)."""

import argparse
import logging
import os

from handlers import signing

from .. import tree_digests
from .body_limit import BODY_IDLE_TIMEOUT

logger = logging.getLogger("tsctl.engine")


def parse_args(argv=None):
    about = "The tsctl engine: TorchServe's workers behind TorchServe's and KServe's APIs."
    parser = argparse.ArgumentParser(prog="python -m serving.engine", description=about)
    parser.add_argument("--model_store", required=True, help="The model store (TorchServe's --model-store).")
    parser.add_argument("--ts_config", help="TorchServe's config.properties (default: config/ beside the store).")
    _listeners(parser)
    _models(parser)
    _trust(parser)
    _bounds(parser)
    args, unknown = parser.parse_known_args(argv)  # KServe passes --model_name and others it knows
    if unknown:
        logger.info("ignoring arguments the engine does not use: %s", " ".join(unknown))
    return args


def _listeners(parser: argparse.ArgumentParser):
    """Where the engine listens: REST, KServe's gRPC and TorchServe's two gRPC APIs."""
    group = parser.add_argument_group("listeners")
    group.add_argument(
        "--host",
        help="Address every REST and KServe gRPC listener binds (default: the config's "
        "addresses' hosts, else 0.0.0.0).",
    )
    group.add_argument(
        "--http_port",
        type=int,
        help="The HTTP port: TorchServe's inference API, KServe v1/v2, "
        "/metrics (default: config.properties' inference_address, else 8080).",
    )
    group.add_argument(
        "--grpc_port",
        type=int,
        help="KServe's v2 gRPC port (default: 8081, or the next port the config's addresses leave free).",
    )
    group.add_argument(
        "--enable_grpc",
        default="true",
        choices=["true", "false"],
        help="Serve gRPC: KServe's v2 on --grpc_port and TorchServe's own two APIs.",
    )
    for api, port in (("inference", 7070), ("management", 7071)):
        group.add_argument(
            f"--grpc_{api}_address",
            help=f"TorchServe's gRPC {api} API's address "
            f"(default: config.properties' grpc_{api}_address, else 127.0.0.1).",
        )
        group.add_argument(
            f"--grpc_{api}_port",
            type=int,
            help=f"TorchServe's gRPC {api} API's port (default: config.properties' grpc_{api}_port, else {port}).",
        )
    group.add_argument(
        "--management_port",
        type=int,
        help="TorchServe's management API on a listener of its own at this port (default: config.properties' "
        "management_address when it is not inference_address, else on --http_port).",
    )
    group.add_argument(
        "--metrics_port",
        type=int,
        help="/metrics on a listener of its own at this port too (default: config.properties' metrics_address "
        "when it is not inference_address; /metrics is always on --http_port).",
    )


def _models(parser: argparse.ArgumentParser):
    """What the management API may do and how the models run."""
    group = parser.add_argument_group("models")
    group.add_argument(
        "--enable_model_api",
        choices=["true", "false"],
        help="Let the management API register, unregister and scale models (default: config.properties' "
        "enable_model_api, else false).",
    )
    group.add_argument(
        "--disable_token_auth",
        action="store_true",
        help="No token authorization (TorchServe's --disable-token-auth; default: on unless config.properties "
        "says disable_token_authorization=true).",
    )
    group.add_argument("--metrics_config", help="The workers' metrics.yaml (TorchServe's metrics_config).")
    group.add_argument("--batch_size", type=int, help="Override every model's batchSize.")
    group.add_argument("--max_batch_delay", type=int, help="Override every model's maxBatchDelay (ms).")


def _trust(parser: argparse.ArgumentParser):
    """What the engine agrees to serve: signed archives, a pinned tree."""
    group = parser.add_argument_group("trust")
    group.add_argument(
        "--public_key",
        default=signing.required_key(),
        help="Serve only archives signed with this key's private half (tsctl package --sign-key); refuse the rest "
        f"(default: ${signing.ENVIRONMENT}, tsctl serve --public-key).",
    )
    group.add_argument(
        "--tree_digest",
        default=os.environ.get(tree_digests.ENVIRONMENT) or None,
        help="Serve only the tree 'tsctl export kserve' wrote, whose config/tree-digests.json has this sha256 "
        f"(sha256:HEX); refuse any other file, at start and at register (default: ${tree_digests.ENVIRONMENT}).",
    )


def _bounds(parser: argparse.ArgumentParser):
    """What a request and the engine's records may cost."""
    group = parser.add_argument_group("bounds and records")
    group.add_argument(
        "--snapshot_dir",
        help="Write TorchServe's config snapshots here, at start, after each management call that changes what "
        "is served, and at the end (default: none; tsctl serve gives HOME/logs/config).",
    )
    group.add_argument(
        "--max_inflight_bytes",
        type=int,
        help="Request bodies held at once, all requests together (default: a quarter of the memory limit).",
    )
    group.add_argument(
        "--body_idle_timeout",
        type=float,
        default=BODY_IDLE_TIMEOUT,
        help="Seconds a request body may pause while it arrives before the request ends with 408 "
        f"(default: {BODY_IDLE_TIMEOUT:g}).",
    )
