"""Signed archives: checking an archive's OpenSSF model-signing signature before it is served.

``tsctl package --sign-key KEY`` (archiver/signing.py) signs every file of the archive, MANIFEST.json
included, with the ``model-signing`` package (a sigstore bundle over each file's sha256, made with a
private EC key) and keeps the signature in the archive as ``MAR-INF/model.sig``. Unpacked, the
archive verifies with model-signing's own CLI::

    model_signing verify key DIR --signature DIR/MAR-INF/model.sig --public_key PUB

``verify(model_dir, public_key)`` checks an unpacked archive against a public key and raises
``SignatureError`` with one sentence naming the first file that differs (changed, added, missing),
a missing signature, or another key. MANIFEST.json is signed, so the model name and version it gives
are signed too: ``verify`` returns them and, given what is expected (the engine's model_snapshot, or
the file's name and ``--expect-version``), refuses another (``check_identity``: an older archive signed
with the same key copied over the current one). ``read_key`` is the one place a key file is read: a
private key where a public one is wanted, or anything else, is one line naming the file (exit 2).
``fingerprint`` names a key as model-signing's signature does: sha256 of its PEM SubjectPublicKeyInfo
(``openssl pkey -in KEY -pubout | sha256sum``), so ``tsctl inspect`` can say who signed an archive.

Where it runs is decided outside the archive, because a switch inside it (model-config.yaml) is what
an attacker would rewrite: the tsctl engine's ``--public_key``, ``LocalModel(public_key=...)`` /
``tsctl run --public-key``, and, for toolkit handlers on TorchServe, ``TSCTL_PUBLIC_KEY`` in the
worker's environment (TorchServe runs an archive's handler before anyone can check it, so there only
toolkit handlers check themselves, and only the directory TorchServe unpacked: a zip whose hidden
entries TorchServe would unpack is refused where tsctl reads the archive, ``archives.check_zip``).
"""

import hashlib
import os
import re
from pathlib import Path
from typing import Optional, Tuple, Union

from . import archives

SIGNATURE = "MAR-INF/model.sig"
ENVIRONMENT = "TSCTL_PUBLIC_KEY"
MAX_KEY_BYTES = 64 << 10
MAX_SIGNATURE_BYTES = 1 << 20
CURVES = ("secp256r1", "secp384r1", "secp521r1")  # what model-signing signs with
ANOTHER_KEY = "it was signed with another key than the one given"


class SignatureError(RuntimeError):
    """An archive whose signature is missing, does not match its files, or was made with another key."""

    exit_code = 1


class KeyFileError(SignatureError):
    """A key file that is not the kind of key asked for: the user's mistake."""

    exit_code = 2


def read_key(path: Union[str, Path], private: bool = False):
    """The EC key in the PEM file ``path`` (public, or private when ``private``); a KeyFileError naming
    the file and what it should be otherwise."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = Path(path)
    wanted = "PEM EC private key" if private else "PEM public key the archive was signed for"
    if not path.exists():
        raise KeyFileError(f"{path} does not exist: give the {wanted}")
    try:
        data = archives.read_regular(path, MAX_KEY_BYTES)
    except archives.NotARegularFile:
        raise KeyFileError(f"{path} is not a regular file (a directory, device or pipe): give the {wanted}") from None
    except OSError as exc:
        raise KeyFileError(f"{path} cannot be read ({exc.strerror}): give the {wanted}") from None
    try:
        key = serialization.load_pem_private_key(data, None) if private else serialization.load_pem_public_key(data)
    except TypeError:  # a private key with a password
        raise KeyFileError(f"{path} is encrypted: give an unencrypted {wanted}") from None
    except Exception:  # noqa: BLE001 - ValueError, UnsupportedAlgorithm: not that kind of key
        if not private and b"PRIVATE KEY-----" in data:
            raise KeyFileError(
                f"{path} is a private key: give its public half (openssl pkey -in {path} -pubout)"
            ) from None
        if private and b"PUBLIC KEY-----" in data:
            raise KeyFileError(f"{path} is a public key: signing needs its private half") from None
        raise KeyFileError(f"{path} is not a {wanted.split(' the ')[0]}: give the {wanted}") from None
    public = key.public_key() if private else key
    if not isinstance(public, ec.EllipticCurvePublicKey) or public.curve.name not in CURVES:
        raise KeyFileError(f"{path} is not an EC P-256, P-384 or P-521 key, which model-signing needs: give one")
    return key


def fingerprint(key) -> str:
    """``sha256:HEX`` of a key's public half as PEM SubjectPublicKeyInfo: what model-signing records in
    the signature (its key hint) and ``openssl pkey -in KEY -pubout | sha256sum`` prints."""
    from cryptography.hazmat.primitives import serialization

    public = key.public_key() if hasattr(key, "public_key") else key
    pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(pem).hexdigest()


def signature_of(archive: archives.ArchiveLike) -> dict:
    """Whether ``archive`` holds a signature and the fingerprint of the key it names (not checked:
    only ``verify`` with the public key checks it): ``{"signed": bool, "key_fingerprint": str|None}``.
    An Archive's is read once; a path is opened for the call."""
    with archives.opened(archive) as opened:
        return opened.cached(SIGNATURE, lambda: _signature(opened.read(SIGNATURE, MAX_SIGNATURE_BYTES)))


def _signature(data: Optional[bytes]) -> dict:
    import json

    if data is None:
        return {"signed": False, "key_fingerprint": None}
    try:
        hint = json.loads(data)["verificationMaterial"]["publicKey"]["hint"]
    except (ValueError, KeyError, TypeError):
        hint = None
    valid = isinstance(hint, str) and re.fullmatch(r"[0-9a-f]{64}", hint)
    return {"signed": True, "key_fingerprint": f"sha256:{hint}" if valid else None}


def identity(model_dir: Path) -> Tuple[str, str]:
    """(model name, version) of an unpacked archive's MANIFEST.json, the version "1.0" when it gives none
    (as TorchServe and tsctl config take it)."""
    with archives.Archive(model_dir) as unpacked:
        return unpacked.model_name, unpacked.version


class IdentityError(SignatureError):
    """An archive signed as another model or version than expected (``signed``: its (name, version))."""

    def __init__(self, message: str, signed: Tuple[str, str]):
        super().__init__(message)
        self.signed = signed


def check_identity(name: str, signed: Tuple[str, str], expect_name: Optional[str], expect_version: Optional[str]):
    """The one comparison of what an archive is signed as with what is expected of it."""
    if (expect_name or signed[0], expect_version or signed[1]) == signed:
        return
    if expect_name and expect_name != signed[0]:  # another model's archive, or one renamed
        raise IdentityError(
            f"{name} is signed as model {signed[0]}, expected {expect_name}: another model's archive under this name?",
            signed,
        )
    raise IdentityError(
        f"{name} is signed as {signed[0]} version {signed[1]}, expected {signed[0]} version {expect_version}: "
        "an older archive was copied over it?",
        signed,
    )


def hashing_config(model_dir: Path):
    """What is signed: every file of the unpacked archive but the signature itself."""
    from model_signing import hashing

    return hashing.Config().set_ignored_paths(paths=[model_dir / SIGNATURE], ignore_git_paths=False)


def verify(
    model_dir: Union[str, Path],
    public_key: Union[str, Path],
    name: Optional[str] = None,
    expect_name: Optional[str] = None,
    expect_version: Optional[str] = None,
) -> Tuple[str, str]:
    """Check the unpacked archive ``model_dir`` against ``public_key`` (a PEM file) and, when given,
    the model name and version it is signed as against ``expect_name``/``expect_version``; the
    signed (name, version), else SignatureError naming ``name`` (the archive) and the first file
    that differs, or what it is signed as."""
    model_dir = Path(model_dir).resolve()
    name = name or model_dir.name
    key = read_key(public_key)
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
        why = difference(str(exc))
        if why == ANOTHER_KEY:  # say which: the signature's key and the one given
            signer = signature_of(model_dir).get("key_fingerprint") or "a key it does not name"
            why += f" (signed by {signer}, given {fingerprint(key)})"
        raise SignatureError(f"{name}: {why}") from None
    signed = identity(model_dir)
    check_identity(name, signed, expect_name, expect_version)
    return signed


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
        return ANOTHER_KEY
    return f"its signature does not verify ({message.splitlines()[0][:200]})"


def required_key() -> Optional[str]:
    """The public key toolkit handlers check their archive against (``TSCTL_PUBLIC_KEY``), or None."""
    return os.environ.get(ENVIRONMENT) or None
