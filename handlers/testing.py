"""Moved: ``LocalModel`` is ``serving.testing.LocalModel`` now, on tsctl's serving side, which no archive
carries. A test that ``tsctl init`` wrote before the move imports it from here; importing this module
says what to change instead of a bare ModuleNotFoundError. It imports nothing, so it costs an archive a
few hundred bytes and a worker nothing.
"""

raise ImportError(
    "handlers.testing moved to serving.testing: change the import to 'from serving.testing import LocalModel'"
)
