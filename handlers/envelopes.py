"""TorchServe's KServe envelopes, and why toolkit handlers step around them.

KServe starts TorchServe with ``TS_SERVICE_ENVELOPE=kserve`` (v1) or ``kservev2`` (v2). The envelope
wraps the handler: it turns KServe bodies into plain inputs and the answers back into one KServe
body. Measured on TorchServe 0.12.0 (batchSize 4, 8 concurrent requests: benchmarks/kserve_envelopes.py;
tests/conformance/test_kserve_serving.py serves toolkit and stock handlers under both envelopes):

- both envelopes read only the *first* request of a batch and return one response, so TorchServe
  answers every request of a batch of two or more with 503 "number of batch response mismatched",
  TorchServe's own handlers included;
- the v2 envelope passes only the first element of a BYTES input, so a request holding several
  instances gets one answer.

Toolkit handlers read KServe v1/v2 bodies themselves, per request, and answer each request in its
own protocol (answers.py: JSON or v2's binary tensor extension). So when TorchServe wraps a toolkit
handler in an envelope, the envelope hands the rows through untouched; handlers of any other kind
keep the stock envelope.

It is installed when handlers/base.py is imported: TorchServe imports the handler module before it
wraps the entry point in the envelope, and the envelope's ``handle`` is looked up at that moment.
``in_place()`` is the self-check each handler logs at ``initialize``.
"""

import os

from ts.torch_handler.request_envelope.base import BaseEnvelope

MARKER = "tsctl_steps_aside"  # set on the installed BaseEnvelope.handle
_stock_handle = BaseEnvelope.handle


def step_aside_for(is_toolkit_entry):
    """Make every TorchServe envelope pass rows straight to entry points ``is_toolkit_entry`` accepts."""
    if in_place():
        return

    def handle(self, data, context):
        if is_toolkit_entry(self._handle_fn):
            self.context = context
            return self._handle_fn(data, context)
        return _stock_handle(self, data, context)

    setattr(handle, MARKER, True)
    BaseEnvelope.handle = handle


def in_place() -> bool:
    return getattr(BaseEnvelope.handle, MARKER, False)


def report() -> str:
    """One line for the worker log: the envelope KServe asks for, and whether it steps aside. The worker
    inherits TS_SERVICE_ENVELOPE whether or not its frontend applied it: TorchServe 0.12 (and tsctl's engine)
    read it only with config.properties' enable_envvars_config=true, and the worker cannot tell which."""
    envelope = os.environ.get("TS_SERVICE_ENVELOPE")
    if not envelope:
        return "no KServe envelope asked for (TS_SERVICE_ENVELOPE unset)"
    where = f"TS_SERVICE_ENVELOPE={envelope}, applied where config.properties says enable_envvars_config=true"
    if in_place():
        return f"{where}: TorchServe's {envelope} envelope hands rows straight to this handler"
    return f"{where}: TorchServe's {envelope} envelope is NOT stepping aside: batches of several requests will fail"
