"""What a Seldon Core 1 unit (serving/runtimes/seldon_components.py) holds of one message, bounded by its own
container's memory as well as by its handler's limits: the export gives the router 256 MiB
(archiver/export/seldon/core1.py ``ROUTER_RESOURCES``), and a 63 MiB ``strData`` (the Model's ``max_body_bytes``
is 64 MiB) took it past them.

- **the budget**: the memory the unit may use (``body_limit.memory_limit``: its container's cgroup) less
  ``RESERVE``, what the wrapper's processes hold before a message, shared by the requests the wrapper serves at
  once (``GUNICORN_WORKERS`` x ``GUNICORN_THREADS``, its settings; 1 x 1 as the export runs it). Half of it is
  for the body's bytes, half for its values.
- **max_body_bytes**: the handler's, at most half the budget over ``BODY_COPIES`` (the copies a JSON body has in
  memory at once as the wrapper reads and answers it). 413 by Content-Length before the body is read (the
  guard, seldon_components.py).
- **max_json_values**: the handler's, at most half the budget over ``VALUE_BYTES`` (handlers/limits.py): counted
  in the body's text before Flask parses it (``limits.json_values``; 8 MiB of ``[],`` is 2.8 million lists,
  180 MiB parsed). 413.
- **meta** (every unit answers the request's): nested at most ``max_json_depth``, holding at most
  ``max_json_values`` (``limits.check_json``), at most ``max_body_bytes`` as the answer writes it, and no NaN or
  Infinity, which Flask's ``jsonify`` writes as they are: not JSON (Go's executor cannot read it; seldon-core's
  own proto path turns them into the strings ``"NaN"``; the unit refuses them, as ``tensor_of`` does in data).
  400 for NaN, 413 past a limit.

A refusal names the limit and what set it: ``handler.SETTING`` or the memory that affords it.
"""

import json
import os
from dataclasses import dataclass, replace
from typing import Any

from handlers.errors import ClientError, too_large
from handlers.limits import VALUE_BYTES, Limits, check_json, json_values

RESERVE = 96 << 20  # the wrapper's processes before a message: 88 MiB measured for the router (gunicorn's master
# and worker, the metrics server's manager)
UNCOUNTED = 1 << 62
BODY_COPIES = 4  # the body's bytes, its text, the value parsed, the answer: a 32 MiB strData took 111 MiB


@dataclass(frozen=True)
class Bounds:
    """A unit's limits on one message (``limits``) and the memory they were derived from, when it set any."""

    limits: Limits
    memory: int
    handler: Limits

    @classmethod
    def of(cls, handler: Limits, memory: int = 0) -> "Bounds":
        """``handler``'s limits, each at most what ``memory`` (default: the unit's, ``memory_limit``) affords."""
        from ..engine.body_limit import memory_limit

        memory = memory or memory_limit()[0]
        at_once = max(1, _setting("GUNICORN_WORKERS")) * max(1, _setting("GUNICORN_THREADS"))
        share = max(0, memory - RESERVE) // at_once // 2
        limits = replace(
            handler,
            max_body_bytes=max(1, min(handler.max_body_bytes, share // BODY_COPIES)),
            max_json_values=max(1, min(handler.max_json_values, share // VALUE_BYTES)),
        )
        return cls(limits, memory, handler)

    def within(self, subject: str, amount: int, unit: str, setting: str):
        """413 when ``amount`` passes the limit ``setting``, naming what set it."""
        limit = getattr(self.limits, setting)
        if amount <= limit:
            return
        why = ""  # the handler's setting
        if limit < getattr(self.handler, setting):
            why = f"what the unit's {self.memory / 2**20:g} MiB of memory affords; give its container more"
        raise too_large(subject, amount, unit, setting, limit, why)

    def check_text(self, body: bytes):
        """The values of a JSON body counted in its text, before it is parsed."""
        self.within(
            "the message holds", json_values(body.decode("utf-8", "replace"), self.limits), "values", "max_json_values"
        )

    def check_meta(self, meta: Any):
        """A message's ``meta``: its depth and values (``check_json``), no NaN or Infinity, its size as answered."""
        # its depth (413, handler.max_json_depth); its values were bounded in the body's text: counted, then named
        count = check_json(meta, replace(self.limits, max_json_values=UNCOUNTED))
        self.within("the message's meta holds", count, "values", "max_json_values")
        try:
            size = len(json.dumps(meta, separators=(",", ":"), allow_nan=False))  # as jsonify writes it
        except ValueError:
            raise ClientError(
                "the message's meta holds NaN or Infinity, which JSON cannot carry: send finite numbers or strings"
            ) from None
        self.within("the message's meta is", size, "bytes as answered", "max_body_bytes")


def _setting(name: str) -> int:
    text = os.environ.get(name, "").strip()
    return int(text) if text.isdigit() else 1
