"""P4: cold start, `torchserve --start` to READY, toolkit handler vs TorchServe's built-in.

    .venv/bin/python benchmarks/p4_cold_start.py

The same TorchScript resnet18 packaged twice (tsctl with the toolkit image_classifier,
torch-model-archiver with the built-in one); each is started alone in a fresh TorchServe, alternating,
three rounds; the time is from spawning `torchserve --start` to the model's worker being READY.
"""

import tempfile
import time
from pathlib import Path

from common import alternate, bar_plot, median, write_section

from archiver import mar, properties, server  # noqa: E402
from archiver.engines import torchserve_launch  # noqa: E402
from helpers.paths import short_tmp  # noqa: E402
from samples import image_model  # noqa: E402


def main():
    tmp = Path(tempfile.mkdtemp(prefix="p4-"))
    torchscript = image_model.torchscript_resnet18(tmp / "resnet18.pt")
    stores = {name: tmp / name for name in ("toolkit", "built-in")}
    mar.package(
        mar.PackageOptions(
            model_name="resnet18",
            handler="image_classifier",
            serialized_file=str(torchscript),
            export_path=str(stores["toolkit"]),
        )
    )
    image_model.package_builtin(torchscript, stores["built-in"], "resnet18")

    def cold_start(name):
        def run():
            home = short_tmp("p4-")
            config = properties.write_config(stores[name], home / "config.properties")
            start = time.perf_counter()
            srv = torchserve_launch.start(config, stores[name], home, timeout=300)
            elapsed = time.perf_counter() - start
            server.stop(srv)
            return round(elapsed, 2)

        return run

    results = alternate({"toolkit": cold_start("toolkit"), "built-in": cold_start("built-in")})
    t, b = median(results["toolkit"]), median(results["built-in"])
    plot = bar_plot(
        "p4_cold_start",
        "P4: torchserve --start to READY (s, lower is better)",
        ["toolkit", "built-in"],
        [t, b],
        "seconds",
    )
    write_section(
        "P4",
        f"""
## P4 cold start: `torchserve --start` to READY

**Whole process**: `torchserve --start` of a fresh TorchServe, timed until the model is READY.
Same TorchScript resnet18, one model per fresh TorchServe, three alternating rounds.

| handler | median s | rounds (s) |
|---|---|---|
| toolkit `image_classifier` | {t:.2f} | {results["toolkit"]} |
| TorchServe built-in `image_classifier` | {b:.2f} | {results["built-in"]} |

Ratio built-in / toolkit: **{b / t:.2f}x** ({"toolkit faster" if t < b else "built-in faster"}). Most of either
figure is the JVM and the worker importing torch; the toolkit also freezes the TorchScript graph at load.

{plot}

Reproduce: `.venv/bin/python benchmarks/p4_cold_start.py`
""",
    )


if __name__ == "__main__":
    main()
