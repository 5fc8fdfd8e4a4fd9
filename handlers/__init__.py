"""tsctl's TorchServe handlers. A .mar built with a toolkit handler carries this package.

``TOOLKIT_HANDLERS`` maps the names users pass to ``tsctl package --handler`` to the entry point
written into MANIFEST.json (``module:function``, which TorchServe imports from the unpacked MAR).
"""

TOOLKIT_HANDLERS = {
    "image_classifier": "handlers.image:handle",
    "text_classifier": "handlers.text_classification:handle",
    "token_classifier": "handlers.token_classification:handle",
    "text_embedder": "handlers.embeddings:handle",
    "tensor": "handlers.tensor:handle",
}
