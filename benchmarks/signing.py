"""What a signature costs on a 500 MB archive: `tsctl package` with and without --sign-key, and
opening the archive to serve it (LocalModel: unpack, check, load) with and without a public key.
Alternating sides, whole processes for packaging; prints the medians and the ratios.

    .venv/bin/python benchmarks/signing.py [--mb 500] [--rounds 3]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

BIN = Path(sys.executable).parent
HANDLER = "def handle(data, context):\n    return None if data is None else [len(data)] * len(data)\n"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from serving.local_model import LocalModel

    with tempfile.TemporaryDirectory(prefix="tsctl-bench-sign-", dir="/tmp") as tmp:
        tmp = Path(tmp)
        weights = tmp / "weights.bin"
        with open(weights, "wb") as out:
            for _ in range(args.mb):
                out.write(os.urandom(1 << 20))
        (tmp / "handler.py").write_text(HANDLER)
        key = ec.generate_private_key(ec.SECP256R1())
        (tmp / "key.pem").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        (tmp / "pub.pem").write_bytes(
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        times = {"package": [], "package signed": [], "open": [], "open checked": []}
        for _ in range(args.rounds):
            for signed in (False, True):
                command = [
                    str(BIN / "tsctl"),
                    "package",
                    "--model-name",
                    "big",
                    "--handler",
                    str(tmp / "handler.py"),
                    "--serialized-file",
                    str(weights),
                    "--export-path",
                    str(tmp / "store"),
                    "--force",
                ]
                if signed:
                    command += ["--sign-key", str(tmp / "key.pem")]
                started = time.perf_counter()
                subprocess.run(command, check=True, capture_output=True)
                times["package signed" if signed else "package"].append(time.perf_counter() - started)
                started = time.perf_counter()
                with LocalModel(tmp / "store" / "big.mar", public_key=str(tmp / "pub.pem") if signed else None):
                    pass
                times["open checked" if signed else "open"].append(time.perf_counter() - started)
        median = {k: statistics.median(v) for k, v in times.items()}
        print(f"archive of {args.mb} MB, {args.rounds} rounds, medians:")
        for name in ("package", "open"):
            plain, checked = median[name], median[name + (" signed" if name == "package" else " checked")]
            print(f"  {name:8s} unsigned {plain:6.2f} s   signed {checked:6.2f} s   ratio {checked / plain:.2f}")


if __name__ == "__main__":
    main()
