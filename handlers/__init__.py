"""tsctl's TorchServe handlers. A .mar built with a toolkit handler carries this package.

``catalogue.HANDLERS`` names the toolkit's handlers (what ``tsctl package --handler`` and ``tsctl init
--from`` take) and says what each one is, without importing it.
"""
