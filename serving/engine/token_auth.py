"""TorchServe 0.12's token authorization, for the tsctl engine: the same keys, file, header and answers.

On unless config.properties says ``disable_token_authorization=true`` (``frontend_settings.management_of``), as
TorchServe 0.12 has it since 0.11. At start the engine writes ``key_file.json`` in its working
directory, where TorchServe writes it (``user.dir``), in TorchServe's format: a management key and an
inference key, each with its ``expiration time`` (``token_expiration_min`` minutes from when it was
made, 60 by default), and the ``API`` key, which never expires and only regenerates the other two. Keys
are TorchServe's: 6 random bytes, base64url (8 characters). The file is made readable by its owner
alone before a key is written into it (TorchServe writes it, then narrows its mode), and replaced
whole (a reader never sees half a file); it is removed when the engine stops.

A request carries ``Authorization: Bearer KEY`` (``Bearer`` as written, then whitespace, then the key,
as TorchServe's pattern reads it); a gRPC call the same as its ``authorization`` metadata. Which key:

- the inference listener (``/ping``, ``/predictions``, KServe v1/v2 REST, every path but
  ``/metrics``) and gRPC: the inference key. ``/metrics`` needs none: TorchServe serves it on its
  metrics listener, which checks no token.
- the management listener (``/models``...): the management key; ``/token?type=management|inference``
  takes the API key and makes a new key of that type (new expiry too), answering 200 with an empty
  JSON body, as TorchServe.
- one listener for both (``management_address`` = ``inference_address``): each path its own key.
  TorchServe 0.12 runs both checks on every request there, so no key opens its management API on
  such a port (every management call is 400): a difference, on purpose.

A missing, malformed, wrong or expired key is TorchServe's 400 ``InvalidKeyException`` with its
message (``MESSAGE``; ``/token``'s says "Authentication"), checked before anything else of the
request: an unknown path without a key is 400, not 404. A path of the other API's (``/predictions`` on the
management listener, ``/models`` on the inference one) gets, after that message, which API this listener
serves and where the other is (``listeners.other_api``). gRPC: ``PERMISSION_DENIED`` with the same
message. Keys are compared in constant time.
"""

import base64
import hmac
import json
import logging
import os
import re
import secrets
import time
from http import HTTPStatus
from pathlib import Path
from typing import Callable, Dict, Optional
from urllib.parse import parse_qs

from handlers.errors import frontend_error

logger = logging.getLogger("tsctl.engine")

KEY_FILE = "key_file.json"
MESSAGE = "Token Authorization failed. Token either incorrect, expired, or not provided correctly"
TOKEN_API_MESSAGE = "Token Authentication failed. Token either incorrect, expired, or not provided correctly"
# TorchServe's "^Bearer\\s+(\\S+)$", with Java's whitespace (ASCII only).
BEARER = re.compile(r"Bearer[ \t\n\x0b\f\r]+([^ \t\n\x0b\f\r]+)")
INFERENCE, MANAGEMENT, API = "inference", "management", "API"
MANAGEMENT_PATHS = ("/models", "/token")  # and what is below /models/: the management API's paths


def new_key() -> str:
    """A key as TorchServe makes one: 6 random bytes, base64url."""
    return base64.urlsafe_b64encode(secrets.token_bytes(6)).decode("ascii")


def instant(seconds_ns: int) -> str:
    """A time as Java's ``Instant.toString`` writes it (UTC, the fraction in 3, 6 or 9 digits as needed)."""
    seconds, nanos = divmod(seconds_ns, 1_000_000_000)
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    if nanos:
        digits = f"{nanos:09d}"
        text += "." + (digits[:3] if nanos % 1_000_000 == 0 else digits[:6] if nanos % 1000 == 0 else digits)
    return text + "Z"


class Tokens:
    """The engine's three keys and their key file (``directory``/key_file.json)."""

    def __init__(self, expiration_min: float, directory: str = "."):
        self.lifetime_ns = int(expiration_min * 60 * 1_000_000_000)
        self.path = Path(directory).resolve() / KEY_FILE
        self.keys: Dict[str, str] = {API: new_key()}
        self.expires: Dict[str, int] = {}
        for kind in (MANAGEMENT, INFERENCE):
            self._new(kind)
        self.write()
        logger.info(
            "token authorization is on (TorchServe's, disable_token_authorization=true turns it off): "
            "the keys are in %s",
            self.path,
        )

    def _new(self, kind: str):
        self.keys[kind] = new_key()
        self.expires[kind] = time.time_ns() + self.lifetime_ns

    def regenerate(self, kind: str):
        """A new key of ``kind`` (management or inference) with a new expiry, written to the key file."""
        self._new(kind)
        self.write()

    def write(self):
        """The key file in TorchServe's format, replaced whole; its owner alone may read it."""
        document = {
            kind: {"key": self.keys[kind], "expiration time": instant(self.expires[kind])}
            for kind in (MANAGEMENT, INFERENCE)
        }
        document[API] = {"key": self.keys[API]}
        partial = self.path.with_name(f".{KEY_FILE}.{os.getpid()}")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "w") as out:
            os.fchmod(out.fileno(), 0o600)
            out.write(json.dumps(document, indent=2))
        os.replace(partial, self.path)

    def remove(self):
        try:
            self.path.unlink()
        except OSError:
            pass

    def check(self, kind: str, header: Optional[str]) -> bool:
        """Whether an ``Authorization`` value (None: absent) holds the current key of ``kind``, unexpired."""
        found = BEARER.fullmatch(header or "")
        if found is None:
            return False
        if kind != API and time.time_ns() >= self.expires[kind]:
            return False
        return hmac.compare_digest(found.group(1).encode("utf-8", "replace"), self.keys[kind].encode("ascii"))


def refusal(message: str = MESSAGE) -> bytes:
    return frontend_error(HTTPStatus.BAD_REQUEST, "InvalidKeyException", message)


def is_management(path: str) -> bool:
    return path in MANAGEMENT_PATHS or path.startswith("/models/")


class TokenCheck:
    """ASGI middleware: every request to a listener checked for its key before anything else
    (``listener``: ``inference``, ``management`` or ``both``); ``/token`` answered here."""

    def __init__(self, app, tokens: Tokens, listener: str, other_api: Callable[[str], str] = lambda path: ""):
        self.app, self.tokens, self.listener = app, tokens, listener
        self.other_api = other_api  # a path of the other API's: where that API is (listeners.other_api)

    def kind(self, path: str) -> Optional[str]:
        """The key a path needs on this listener (None: none)."""
        if self.listener == MANAGEMENT or (self.listener == "both" and is_management(path)):
            return API if path == "/token" else MANAGEMENT
        return None if path == "/metrics" else INFERENCE

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        kind = self.kind(scope["path"])
        if kind is None:
            return await self.app(scope, receive, send)
        header = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                header = value.decode("latin-1").strip(" \t")  # HTTP's whitespace around a value, as Netty's
                break
        if not self.tokens.check(kind, header):
            message = TOKEN_API_MESSAGE if kind == API else MESSAGE + self.other_api(scope["path"])
            return await answer(send, HTTPStatus.BAD_REQUEST, refusal(message))
        if kind != API:
            return await self.app(scope, receive, send)
        wanted = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("type", [""])[0]
        if wanted not in (MANAGEMENT, INFERENCE):
            return await answer(send, HTTPStatus.BAD_REQUEST, refusal(TOKEN_API_MESSAGE))
        self.tokens.regenerate(wanted)
        logger.info("token authorization: a new %s key (key file %s)", wanted, self.tokens.path)
        return await answer(send, HTTPStatus.OK, b"\n")


async def answer(send, status: int, body: bytes):
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": int(status), "headers": headers})
    await send({"type": "http.response.body", "body": body})
