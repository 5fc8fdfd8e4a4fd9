"""Signing an archive: ``tsctl package --sign-key KEY`` (handlers/signing.py says what is signed,
and checks it)."""

import tempfile
from pathlib import Path
from typing import Optional

from handlers import archives, signing

from .errors import UserError

SIGNATURE = signing.SIGNATURE


def sign(model_dir: Path, private_key: str) -> bytes:
    """The signature of every file under ``model_dir`` (an unpacked archive, as it will be written),
    made with the PEM EC private key ``private_key``: the bytes of ``MAR-INF/model.sig``."""
    try:
        from model_signing import signing as model_signing
    except ImportError as exc:
        raise UserError(f"--sign-key needs the model-signing package ({exc}): pip install 'tsctl[sign]'") from None
    signing.read_key(private_key, private=True)
    target = model_dir / signing.SIGNATURE
    try:
        model_signing.Config().use_elliptic_key_signer(private_key=Path(private_key)).set_hashing_config(
            signing.hashing_config(model_dir)
        ).sign(model_dir, target)
    except (ValueError, TypeError) as exc:
        raise UserError(
            f"--sign-key {private_key} could not sign: {exc}: give an unencrypted PEM EC private key"
        ) from None
    data = target.read_bytes()
    target.unlink()
    return data


def stem(archive: Path) -> str:
    """The model name an archive's file name gives: NAME.mar, NAME.tar.gz, NAME/."""
    name = archive.resolve().name if archive.is_dir() else archive.name
    for suffix in (".mar", ".tar.gz", ".tgz"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def verify_archive(
    archive: archives.ArchiveLike,
    public_key: str,
    expect_name: Optional[str] = None,
    expect_version: Optional[str] = None,
):
    """Check ``archive`` (a .mar, .tar.gz or directory, or an open Archive) against ``public_key``:
    unpacked aside, as a worker would see it, and signed as ``expect_name`` (default: its file name) and
    ``expect_version`` (when given); SignatureError (exit 1) naming the first file that differs or what
    it is signed as. Returns (name, version, key fingerprint) as signed."""
    key = signing.read_key(public_key)  # a wrong key file is named before anything is unpacked
    with archives.opened(archive) as opened, tempfile.TemporaryDirectory(prefix="tsctl-verify-") as tmp:
        named = expect_name or stem(opened.path)
        model_dir = opened.path if opened.kind == "dir" else opened.unpack(tmp)
        try:
            name, version = signing.verify(model_dir, public_key, opened.path.name, named, expect_version)
        except signing.IdentityError as exc:
            if expect_name or exc.signed[0] == named:
                raise
            # the name expected came from the file's: say how to check an archive that was renamed
            raise signing.IdentityError(f"{exc} (renamed? give --expect-name {exc.signed[0]})", exc.signed) from None
    return name, version, signing.fingerprint(key)
