"""TorchServe itself as a runtime: ``tsctl serve --engine torchserve`` (its launch and readiness:
archiver/engines/torchserve_launch.py, imported when it starts one)."""

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..output import quiet
from .base import DEFAULT_CONFIG, Launch, Runtime

if TYPE_CHECKING:  # pragma: no cover
    from ..server import Server


class TorchServeRuntime(Runtime):
    """TorchServe 0.12 (Java frontend, Python workers), as KServe's TorchServe runtime runs it."""

    name = "torchserve"
    title = "TorchServe"
    help = "torchserve: TorchServe itself (Java 17)."
    model_api = True
    serve_flags = ("install_deps", "enable_model_api", "disable_token_auth")
    snapshots = True  # TorchServe's own, in LOG_LOCATION/config (HOME/logs/config)

    def launch(
        self,
        run: Launch,
        install_deps: bool = False,
        enable_model_api: bool = False,
        disable_token_auth: bool = False,
        kserve_args: bool = False,
    ) -> "Server":
        """TorchServe on ``run``'s store (``start``); ``kserve_args``: with exactly
        the arguments of KServe's TorchServe runtime. ``enable_model_api`` and ``disable_token_auth`` are
        torchserve's flags of those names, given as the TS_ variables its ConfigManager reads."""
        from .torchserve_launch import start

        env = dict(run.env or {})
        if enable_model_api:
            env["TS_ENABLE_MODEL_API"] = "true"
        if disable_token_auth:
            env["TS_DISABLE_TOKEN_AUTHORIZATION"] = "true"
        config = run.config or DEFAULT_CONFIG
        return start(
            config,
            run.model_store,
            run.home,
            run.timeout,
            run.python,
            env,
            install_deps,
            kserve_args,
            run.progress,
            run.host,
            run.port,
        )

    def wait_ready(self, server: "Server", timeout: float, process=None, progress: Callable[[str], None] = quiet):
        from .torchserve_launch import wait_ready

        wait_ready(server, timeout, process, progress)

    def output(self, server: "Server") -> Path:
        return server.logs

    def handler_log(self, server: "Server") -> Path:
        return server.logs / "model_log.log"
