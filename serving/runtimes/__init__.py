"""The runtimes that serve an archive inside another server: MLServer's custom runtime
(``mlserver_runtime.py``, started by ``mlserver_start.py``), the KServe custom transformer
(``kserve_transformer.py``) and Seldon Core 1's units (``seldon_components.py``), with a toolkit handler
run apart from its model (``split.py``) and KServe v2 requests for handlers that are not the toolkit's
(``v2_requests.py``).
"""
