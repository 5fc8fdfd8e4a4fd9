"""``mlserver start`` as tsctl runs it: MLServer 1.7 itself, two things of its REST app and its metrics writer changed.

    python -m serving.runtimes.mlserver_start [--read-only] start FOLDER       (MLServer's own CLI after the flag)

MLServer's model repository API (``POST /v2/repository/models/NAME/load|unload``, and the same calls
over gRPC) lets any client that reaches it unload a model, and MLServer has no setting to turn it off.
MLServer also reads a whole request body, however large, before anything can refuse it. So before
MLServer's CLI runs, this wraps the function its REST server builds its app with
(``mlserver.rest.server.create_app``):

- the app has no ``/v2/repository/models/NAME/load`` and ``/unload`` routes (404); the index
  (``POST /v2/repository/index``, read-only) stays. Seldon Core 2's agent loads and unloads models over
  gRPC only (its control plane), and its REST reverse proxy forwards any path to MLServer: so its image
  starts MLServer this way too;
- every request body is bounded as the tsctl engine bounds them (body_limit.py: 413 above
  ``max_request_size``, read from ``TSCTL_MAX_REQUEST_SIZE``, before the body is read whole; 503
  past the bodies in flight ``max_inflight_bytes`` allows).

Its ``/metrics`` (the metrics port) is written by ``metrics.exposition``: prometheus_client's
text format, as MLServer writes it, but for the workers' counters, which keep the names TorchServe gives
them (``Requests2XX``, not ``Requests2XX_total``, in their HELP and TYPE lines).

``--read-only`` (``tsctl serve --engine mlserver``) also refuses load and unload over gRPC: MLServer's
``ModelRepositoryHandlers``, which both its REST and gRPC servers call, is replaced by one whose
``load``/``unload`` answer 403. Not under Seldon, whose agent needs them. Nothing of MLServer is forked
or patched on disk; the rest runs as ``mlserver start`` runs it.
"""

import sys
from http import HTTPStatus
from typing import List

REPOSITORY_CHANGES = ("/v2/repository/models/{model_name}/load", "/v2/repository/models/{model_name}/unload")
REFUSAL = "this server's models are fixed at its start: the model repository's load and unload calls are off"


def bounded_app(create_app):
    """``create_app`` whose app has no repository load/unload routes and bounds request bodies."""
    from ..engine.body_limit import BodyLimit, InFlight, max_inflight_bytes, max_request_size_from_environment

    def create(*args, **kwargs):
        app = create_app(*args, **kwargs)
        app.router.routes = [r for r in app.router.routes if getattr(r, "path", None) not in REPOSITORY_CHANGES]
        limit = max_request_size_from_environment()
        app.add_middleware(BodyLimit, limit=limit, inflight=InFlight(max_inflight_bytes(limit)[0]))
        return app

    return create


def read_only_handlers():
    """MLServer's ModelRepositoryHandlers with load and unload refused (403), for REST and gRPC."""
    from mlserver.errors import MLServerError
    from mlserver.handlers import ModelRepositoryHandlers

    class ReadOnlyRepository(ModelRepositoryHandlers):
        async def load(self, name: str) -> bool:
            raise MLServerError(REFUSAL, HTTPStatus.FORBIDDEN.value)

        async def unload(self, name: str) -> bool:
            raise MLServerError(REFUSAL, HTTPStatus.FORBIDDEN.value)

    return ReadOnlyRepository


def main(argv: List[str]):
    import mlserver.metrics.prometheus
    import mlserver.rest.server
    import mlserver.server
    from mlserver.cli.main import main as mlserver_main

    from ..engine.metrics import exposition

    read_only = argv[:1] == ["--read-only"]
    mlserver.rest.server.create_app = bounded_app(mlserver.rest.server.create_app)
    mlserver.metrics.prometheus.generate_latest = exposition  # TorchServe's counters keep their names
    if read_only:
        mlserver.server.ModelRepositoryHandlers = read_only_handlers()
    sys.argv = ["mlserver", *argv[1 if read_only else 0 :]]
    mlserver_main()


if __name__ == "__main__":
    main(sys.argv[1:])
