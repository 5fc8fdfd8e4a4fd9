"""Where P1's toolkit worker spends its time: a py-spy profile under the P1 load, and each process's CPU.

.venv/bin/python benchmarks/p1_profile.py
"""

import tempfile
from pathlib import Path

from common import profile_tables, profile_worker, write_section
from p1_image import CONCURRENCY, TWO_WORKERS, package_toolkit, photo, toolkit_store

from archiver import properties, server  # noqa: E402
from archiver.engines import torchserve_launch  # noqa: E402
from helpers.paths import short_tmp  # noqa: E402

BUCKETS = (
    ("model forward", lambda f: "forward" in f or "inference (handlers/base.py" in f or "inference (base.py" in f),
    ("JPEG decode + resize (decode threads)", lambda f: "decode" in f and "image" in f),
    ("batch normalisation / stacking", lambda f: "preprocess" in f),
    ("TorchServe protocol (read/write)", lambda f: "_retrieve" in f or "create_predict_response" in f),
)


def main():
    tmp = Path(tempfile.mkdtemp(prefix="p1p-"))
    store, sample, torchscript = toolkit_store(tmp)
    (tmp / "two").mkdir()
    (tmp / "two" / "model-config.yaml").write_text(TWO_WORKERS)
    package_toolkit("toolkit2w", torchscript, sample, tmp / "two", store)
    home = short_tmp("p1p-")
    srv = torchserve_launch.start(properties.write_config(store, home / "config.properties"), store, home)
    try:
        inputs = [(photo(seed), "image/jpeg") for seed in range(16)]
        throughput, shares, cores = profile_worker(srv, "toolkit", inputs, CONCURRENCY, BUCKETS)
        throughput2, shares2, cores2 = profile_worker(srv, "toolkit2w", inputs, CONCURRENCY, BUCKETS)
    finally:
        server.stop(srv)
    write_section(
        "P1-PROFILE",
        f"""
### Where the toolkit worker's time goes in P1 (profile)

**Whole process**: py-spy samples of the served worker under P1's load.
Under the P1 load ({throughput:.1f} images/s during the profile), py-spy on the worker (all threads), and
the CPU each process takes:

{profile_tables(shares, cores)}

The model's forward pass is most of the worker's time, and the decode work left after draft decoding
runs on a second thread; the worker decodes a batch, then runs the model on 2 intra-op threads.

With 2 workers of 1 intra-op thread each ({throughput2:.1f} images/s during the profile), py-spy on one
of them, and the CPU of both together:

{profile_tables(shares2, cores2)}

The cores are about as busy as with one worker (compare the two process tables): the 2 workers do
more with them, because a forward pass on 1 thread spends nothing on splitting small convolutions
across threads, and one worker's decode runs while the other's model does. The work left is the
forward pass (three quarters) and the decode that must precede it, on cores that the workers and the
frontend (which receives ~440 kB per request) already fill; the built-in handler runs the same
TorchScript graph (the toolkit's frozen and optimised). Going further on this machine takes a
cheaper forward pass (ONNX Runtime, a smaller model) or more cores, not a better overlap.

Reproduce: `.venv/bin/python benchmarks/p1_profile.py`
""",
    )


if __name__ == "__main__":
    main()
