"""P3: packaging a 500 MB weights file, `tsctl package` vs `torch-model-archiver` (default format).

    .venv/bin/python benchmarks/p3_packaging.py

Both sides build the same inputs, alternating, three rounds each; the figure is the ratio of median
wall times. Two tsctl builds of the same inputs must be byte-identical (sha256 printed).
Goal: >= 5x faster.
"""

import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import alternate, bar_plot, median, write_section

from archiver import mar  # noqa: E402  (common puts the repo on sys.path)

SIZE_MB = 500


def main():
    tmp = Path(tempfile.mkdtemp(prefix="p3-", dir="/var/tmp"))
    try:
        weights = tmp / "weights.pt"
        torch.manual_seed(0)
        torch.save({"w": torch.randn(SIZE_MB * 1024 * 1024 // 4)}, weights)
        (tmp / "index_to_name.json").write_text('{"0": "a"}')
        archiver = Path(sys.executable).parent / "torch-model-archiver"

        def tsctl(out="tsctl"):
            start = time.perf_counter()
            mar.package(
                mar.PackageOptions(
                    model_name="big",
                    handler="image_classifier",
                    serialized_file=str(weights),
                    extra_files=[str(tmp / "index_to_name.json")],
                    export_path=str(tmp / out),
                    force=True,
                )
            )
            return round(time.perf_counter() - start, 2)

        def tma():
            (tmp / "tma").mkdir(exist_ok=True)
            start = time.perf_counter()
            subprocess.run(
                [
                    str(archiver),
                    "--model-name",
                    "big",
                    "--version",
                    "1.0",
                    "--serialized-file",
                    str(weights),
                    "--handler",
                    "image_classifier",
                    "--extra-files",
                    str(tmp / "index_to_name.json"),
                    "--export-path",
                    str(tmp / "tma"),
                    "--force",
                ],
                check=True,
            )
            return round(time.perf_counter() - start, 2)

        times = alternate({"tsctl package": tsctl, "torch-model-archiver": tma})
        first = hashlib.sha256((tmp / "tsctl" / "big.mar").read_bytes()).hexdigest()
        tsctl("tsctl-again")
        second = hashlib.sha256((tmp / "tsctl-again" / "big.mar").read_bytes()).hexdigest()
        ratio = median(times["torch-model-archiver"]) / median(times["tsctl package"])
        sizes = {name: (tmp / d / "big.mar").stat().st_size / 1e6 for name, d in (("tsctl", "tsctl"), ("tma", "tma"))}
        plot = bar_plot(
            "p3_packaging",
            "P3: packaging 500 MB (median s, lower is better)",
            list(times),
            [median(v) for v in times.values()],
            "seconds",
        )
        write_section(
            "P3",
            f"""
## P3 packaging: a {SIZE_MB} MB weights file

| | median s | rounds (s) | archive MB |
|---|---|---|---|
| `tsctl package` | {median(times["tsctl package"]):.2f} | {times["tsctl package"]} | {sizes["tsctl"]:.0f} |
| `torch-model-archiver` (default format) | {median(times["torch-model-archiver"]):.2f} | {times["torch-model-archiver"]} | {sizes["tma"]:.0f} |

**{ratio:.1f}x faster** (goal: >= 5x: {"met" if ratio >= 5 else "missed"}). Two tsctl builds of the same inputs:
`{first[:16]}…` and `{second[:16]}…`: {"byte-identical" if first == second else "DIFFERENT"}.
torch-model-archiver copies every input to a temporary directory, then deflates it (weights do not
compress: 500 MB in, ~{sizes["tma"]:.0f} MB out); tsctl streams inputs straight into the zip and stores weights.

{plot}

Reproduce: `.venv/bin/python benchmarks/p3_packaging.py`
""",
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
