"""Signing an archive: ``tsctl package --sign-key KEY`` (handlers/signing.py says what is signed,
and checks it)."""

from pathlib import Path

from handlers import signing

from .errors import UserError

SIGNATURE = signing.SIGNATURE


def sign(model_dir: Path, private_key: str) -> bytes:
    """The signature of every file under ``model_dir`` (an unpacked archive, as it will be written),
    made with the PEM EC private key ``private_key``: the bytes of ``MAR-INF/model.sig``."""
    try:
        from model_signing import signing as model_signing
    except ImportError as exc:
        raise UserError(f"--sign-key needs the model-signing package ({exc}): pip install 'tsctl[sign]'") from None
    key = Path(private_key)
    if not key.is_file():
        raise UserError(f"--sign-key {private_key} does not exist: give a PEM private key (EC P-256/384)")
    target = model_dir / signing.SIGNATURE
    try:
        model_signing.Config().use_elliptic_key_signer(private_key=key).set_hashing_config(
            signing.hashing_config(model_dir)
        ).sign(model_dir, target)
    except (ValueError, TypeError) as exc:
        raise UserError(
            f"--sign-key {private_key} could not sign: {exc}: give an unencrypted PEM EC private key"
        ) from None
    data = target.read_bytes()
    target.unlink()
    return data


def verify_archive(archive, public_key: str):
    """Check ``archive`` (a .mar, .tar.gz or directory) against ``public_key``: unpacked aside, as a
    worker would see it; SignatureError (exit 1) naming the first file that differs."""
    import tempfile

    from handlers import archives

    archive = Path(archive)
    if not Path(public_key).is_file():
        raise UserError(f"--public-key {public_key} does not exist: give the PEM public key the archive was signed for")
    if archive.is_dir():
        return signing.verify(archive, public_key, archive.name)
    with tempfile.TemporaryDirectory(prefix="tsctl-verify-") as tmp:
        signing.verify(archives.unpack(archive, tmp), public_key, archive.name)
