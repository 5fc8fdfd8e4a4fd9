"""Signed archives: checking an archive's OpenSSF model-signing signature before it is served.

``tsctl package --sign-key KEY`` (archiver/signing.py) signs every file of the archive, MANIFEST.json
included, with the ``model-signing`` package (a sigstore bundle over each file's sha256, made with a
private EC key) and keeps the signature in the archive as ``MAR-INF/model.sig``. Unpacked, the
archive verifies with model-signing's own CLI::

    model_signing verify key DIR --signature DIR/MAR-INF/model.sig --public_key PUB

``verify(model_dir, public_key)`` checks an unpacked archive against a public key and raises
``SignatureError`` with one sentence naming the first file that differs (changed, added, missing),
a missing signature, or another key. Where it runs is decided outside the archive, because a
switch inside it (model-config.yaml) is what an attacker would rewrite: the tsctl engine's
``--public_key``, ``LocalModel(public_key=...)`` / ``tsctl run --public-key``, and, for toolkit
handlers on TorchServe, ``TSCTL_PUBLIC_KEY`` in the worker's environment (TorchServe runs an
archive's handler before anyone can check it, so there only toolkit handlers check themselves).
"""

import os
import re
from pathlib import Path
from typing import Optional, Union

SIGNATURE = "MAR-INF/model.sig"
ENVIRONMENT = "TSCTL_PUBLIC_KEY"


class SignatureError(RuntimeError):
    """An archive whose signature is missing, does not match its files, or was made with another key."""

    exit_code = 1


def hashing_config(model_dir: Path):
    """What is signed: every file of the unpacked archive but the signature itself."""
    from model_signing import hashing

    return hashing.Config().set_ignored_paths(paths=[model_dir / SIGNATURE], ignore_git_paths=False)


def verify(model_dir: Union[str, Path], public_key: Union[str, Path], name: Optional[str] = None):
    """Check the unpacked archive ``model_dir`` against ``public_key`` (a PEM file); SignatureError
    otherwise, naming ``name`` (the archive) and the first file that differs."""
    model_dir = Path(model_dir).resolve()
    name = name or model_dir.name
    if not (model_dir / SIGNATURE).is_file():
        raise SignatureError(f"{name} is not signed (no {SIGNATURE}): package it with 'tsctl package --sign-key'")
    try:
        from model_signing import verifying
    except ImportError as exc:
        raise SignatureError(
            f"checking {name}'s signature needs the model-signing package ({exc}): pip install model-signing"
        ) from None
    config = verifying.Config().use_elliptic_key_verifier(public_key=Path(public_key))
    try:
        config.set_hashing_config(hashing_config(model_dir)).verify(model_dir, model_dir / SIGNATURE)
    except Exception as exc:  # noqa: BLE001 - model-signing raises ValueError and others; each is a refusal
        raise SignatureError(f"{name}: {difference(str(exc))}") from None


def difference(message: str) -> str:
    """model-signing's mismatch message as one sentence naming the first file."""
    for pattern, words in (
        # model-signing's message may come as the repr of a list of them, its quotes escaped (\\')
        (r"Hash mismatch for \\?'([^'\\]+)\\?'", "{} differs from what was signed"),
        (r"Extra files found in model '[^']*': ([^\"'\]]+)", "{} was not signed (added after signing)"),
        (r"Missing files in model '[^']*': ([^\"'\]]+)", "{} was signed but is missing"),
    ):
        found = re.search(pattern, message)
        if found:
            first = found.group(1).split(",")[0].strip()
            return words.format(first) + ": the archive is not the one that was signed"
    if "Key mismatch" in message or "public key" in message.lower():
        return "it was signed with another key than the one given"
    return f"its signature does not verify ({message.splitlines()[0][:200]})"


def required_key() -> Optional[str]:
    """The public key toolkit handlers check their archive against (``TSCTL_PUBLIC_KEY``), or None."""
    return os.environ.get(ENVIRONMENT) or None
