"""tsctl's serving side: what answers requests for archives, never shipped inside one.

The engine (``engine/``: TorchServe's and KServe's APIs over HTTP and gRPC, in front of TorchServe's
own workers), the worker process it drives (``worker/``), the runtimes that serve an archive inside other
servers (``runtimes/``: MLServer, the KServe transformer, Seldon Core 1) and ``LocalModel``. Everything here imports
the toolkit (``handlers``) as a worker would; nothing in ``handlers`` imports this package.
"""
