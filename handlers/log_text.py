"""What the toolkit logs, written so that request data in it cannot be read as anything but log text.

A worker's stdout is also where TorchServe's Java frontend reads metrics: every line starting with
``[METRICS]`` is parsed as one. The toolkit logs what clients sent (a rejected request's message names
the JSON keys it found; a traceback carries an exception's message), so a key like
``"\\n[METRICS]HandlerTime.ms:999999|..."`` would otherwise print a line of its own and forge a metric.

``logger(name)`` is the toolkit modules' ``logging.getLogger``: each record of it (and of TorchServe's
``ts.service``, which logs a handler's exceptions) passes through ``OneRecord``, which writes its
message on one line, control characters escaped (``metadata.printable``: line breaks, ``\\r``,
terminal escapes, Unicode line separators as ``\\xNN``/``\\uNNNN``), and its traceback, if any, on
lines of its own, each escaped so and indented: no record starts a line of its own choosing. The
exception itself stays on the record as ``raised`` (``exc_info`` is cleared, or handlers would print it again).
"""

import logging
import traceback

from .metadata import printable

GUARDED = ("ts.service",)  # TorchServe's loggers that log the toolkit's exceptions (Service.predict)


class OneRecord(logging.Filter):
    """Rewrites a record as the text it would log, escaped (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = printable(record.getMessage())
        except Exception:  # noqa: BLE001 - arguments that do not fit the format: logged as they are
            text = printable(f"{record.msg} {record.args!r}")
        details = []
        if record.exc_info and record.exc_info[0] is not None:
            details.append("".join(traceback.format_exception(*record.exc_info)))
        if record.stack_info:
            details.append(record.stack_info)
        for detail in details:
            text += "".join(f"\n  {printable(line)}" for line in detail.rstrip("\n").split("\n"))
        record.msg = text
        record.raised = record.exc_info  # the exception itself, for who reads records (inprocess.handler_error)
        record.args, record.exc_info, record.exc_text, record.stack_info = None, None, None, None
        return True


ONE_RECORD = OneRecord()


def logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` whose records are written through ``OneRecord``; TorchServe's
    ``GUARDED`` loggers too."""
    for guarded in (name, *GUARDED):
        named = logging.getLogger(guarded)
        if ONE_RECORD not in named.filters:
            named.addFilter(ONE_RECORD)
    return logging.getLogger(name)
