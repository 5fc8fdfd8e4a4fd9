"""A TorchServe worker process as TorchServe's frontend starts and drives it, for every tsctl runtime.

``worker_process.py`` starts one (``worker_launch.py`` runs TorchServe's ``model_service_worker.py`` in it, or
``fork_server.py`` forks it with torch imported) and speaks TorchServe's frontend-worker wire protocol
(``ts_wire.py``) over its Unix socket (``sockets.py``); ``process_tree.py`` keeps its descendants below it.
"""
