"""tsctl's serving side: what answers requests for archives, never shipped inside one.

The engine (``engine.py``: TorchServe's and KServe's APIs over HTTP and gRPC, in front of TorchServe's
own workers), the MLServer runtime, the KServe transformer and ``LocalModel``. Everything here imports
the toolkit (``handlers``) as a worker would; nothing in ``handlers`` imports this package.
"""
