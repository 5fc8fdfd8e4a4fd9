"""TorchServe's KServe envelopes, and why toolkit handlers step around them.

KServe starts TorchServe with ``TS_SERVICE_ENVELOPE=kserve`` (v1) or ``kservev2`` (v2). The envelope
wraps the handler: it turns KServe bodies into plain inputs and the answers back into one KServe
body. Measured on TorchServe 0.12.0 (batchSize 4, 8 concurrent requests, see tests/test_kserve.py):

- both envelopes read only the *first* request of a batch and return one response, so TorchServe
  answers every request of a batch of two or more with 503 "number of batch response mismatched",
  TorchServe's own handlers included;
- the v2 envelope passes only the first element of a BYTES input, so a request holding several
  instances gets one answer.

Toolkit handlers read KServe v1/v2 bodies themselves, per request (requests.py), and answer each
request in its own protocol. So when TorchServe wraps a toolkit handler in an envelope, the
envelope hands the rows through untouched; handlers of any other kind keep the stock envelope.
"""

from ts.torch_handler.request_envelope.base import BaseEnvelope

_stock_handle = BaseEnvelope.handle


def step_aside_for(is_toolkit_entry):
    """Make every TorchServe envelope pass rows straight to entry points ``is_toolkit_entry`` accepts."""

    def handle(self, data, context):
        if is_toolkit_entry(self._handle_fn):
            self.context = context
            return self._handle_fn(data, context)
        return _stock_handle(self, data, context)

    BaseEnvelope.handle = handle
