"""The tsctl engine: TorchServe's and KServe's APIs over HTTP and gRPC, in front of TorchServe's own workers.

``python -m serving.engine`` runs ``main.py``. The HTTP routes are ``app.py``'s (TorchServe's inference API,
KServe v1/v2, ``/metrics``) and ``management.py``'s; the gRPC services ``kserve_grpc.py`` (KServe v2) and
``ts_grpc.py`` (TorchServe's). Each model version's workers and queue are ``workers.py`` and ``job_queue.py``,
opened by ``versions.py``; the bounds on what clients send are ``body_limit.py``, ``http_server.py`` and
``grpc_reading.py``.
"""
