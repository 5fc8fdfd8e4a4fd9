"""P3: packaging as users run it, `tsctl package` vs `torch-model-archiver`, whole processes.

    .venv/bin/python benchmarks/p3_packaging.py

Every figure is a whole process (interpreter start, imports, work, exit) with its bytecode already
cached, as on a user's machine after the first run; each command runs once first to warm that
cache and the page cache. Sides alternate, three rounds each; a figure is the median wall time.
Sizes: the sample resnet18 (47 MB state_dict + model.py + labels, the small model) and random
weights files of 200 MB and 500 MB. Also: `tsctl --help`, a first run with no bytecode at all
(an empty PYTHONPYCACHEPREFIX: what an install without --compile-bytecode costs once), and the
import log of `tsctl package` (`python -X importtime`), which must hold no torch.
Goal: >= 5x torch-model-archiver at 200 and 500 MB; the small model in under 1 s.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, alternate, bar_plot, median, write_section

BIN = Path(sys.executable).parent
SAMPLE = ROOT / "samples" / "build" / "resnet18"
SIZES_MB = (200, 500)
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
MODEL_LIBRARIES = ("torch", "torchvision", "transformers", "ts", "numpy")


def timed(command, env=None) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env or ENV)
    return round(time.perf_counter() - start, 3)


def package_flags(model: dict, export_path: Path) -> list:
    flags = ["--model-name", "m", "--version", "1.0", "--serialized-file", str(model["weights"])]
    flags += ["--handler", "image_classifier", "--export-path", str(export_path), "--force"]
    if model.get("model_file"):
        flags += ["--model-file", str(model["model_file"])]
    return flags + ["--extra-files", str(model["labels"])]


def sides(model: dict, tmp: Path) -> dict:
    (tmp / "tsctl").mkdir(exist_ok=True)
    (tmp / "tma").mkdir(exist_ok=True)
    tsctl = [str(BIN / "tsctl"), "package"] + package_flags(model, tmp / "tsctl")
    tma = [str(BIN / "torch-model-archiver")] + package_flags(model, tmp / "tma")
    return {"tsctl package": lambda: timed(tsctl), "torch-model-archiver": lambda: timed(tma)}


def import_log(model: dict, tmp: Path):
    """The modules a fresh `tsctl package` imports, and whether any model library is among them."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "archiver.cli", "package"] + package_flags(model, tmp / "log"),
        cwd=ROOT,
        env=dict(ENV, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        check=True,
    )
    names = [line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    heavy = sorted({n.split(".")[0] for n in names} & set(MODEL_LIBRARIES))
    return len(names), heavy


def main():
    tmp = Path(tempfile.mkdtemp(prefix="p3-", dir="/var/tmp"))
    try:
        if not (SAMPLE / "resnet18.pt").exists():
            subprocess.run([sys.executable, "-m", "samples.image_model", str(SAMPLE)], cwd=ROOT, check=True)
        models = {
            "resnet18 (47 MB)": {
                "weights": SAMPLE / "resnet18.pt",
                "model_file": SAMPLE / "model.py",
                "labels": SAMPLE / "index_to_name.json",
            }
        }
        (tmp / "index_to_name.json").write_text('{"0": "a"}')
        for size in SIZES_MB:
            weights = tmp / f"weights-{size}.pt"
            with open(weights, "wb") as f:  # random bytes: weights do not compress
                for _ in range(size):
                    f.write(os.urandom(1 << 20))
            models[f"{size} MB weights"] = {"weights": weights, "labels": tmp / "index_to_name.json"}

        help_command = [str(BIN / "tsctl"), "--help"]
        timed(help_command)
        help_s = median([timed(help_command) for _ in range(5)])
        small = models["resnet18 (47 MB)"]
        cold_cache = tmp / "no-bytecode"
        cold_s = timed(
            [str(BIN / "tsctl"), "package"] + package_flags(small, tmp / "cold"),
            env=dict(ENV, PYTHONPYCACHEPREFIX=str(cold_cache)),
        )
        modules, heavy = import_log(small, tmp)

        rows, plot_labels, plot_values = [], [], []
        for label, model in models.items():
            run = sides(model, tmp)
            for side in run.values():
                side()  # warm bytecode and page cache
            times = alternate(run)
            ours, theirs = median(times["tsctl package"]), median(times["torch-model-archiver"])
            digest = hashlib.sha256((tmp / "tsctl" / "m.mar").read_bytes()).hexdigest()
            run["tsctl package"]()
            same = digest == hashlib.sha256((tmp / "tsctl" / "m.mar").read_bytes()).hexdigest()
            size = {s: (tmp / s / "m.mar").stat().st_size / 1e6 for s in ("tsctl", "tma")}
            rows.append((label, ours, times["tsctl package"], theirs, times["torch-model-archiver"], size, same))
            plot_labels += [f"tsctl\n{label.split(' (')[0]}", f"tma\n{label.split(' (')[0]}"]
            plot_values += [ours, theirs]

        plot = bar_plot("p3_packaging", "P3: packaging, whole process (median s)", plot_labels, plot_values, "s")
        table = "\n".join(
            f"| {label} | {ours:.2f} | {our_rounds} | {theirs:.2f} | {their_rounds} | **{theirs / ours:.1f}x** "
            f"| {size['tsctl']:.0f} / {size['tma']:.0f} | {'yes' if same else 'NO'} |"
            for label, ours, our_rounds, theirs, their_rounds, size, same in rows
        )
        goal_lines = []
        for label, ours, _, theirs, _, _, _ in rows:
            if label.startswith("resnet18"):
                goal_lines.append(f"- small model in {ours:.2f} s (goal < 1 s: {'met' if ours < 1 else 'missed'})")
            else:
                goal_lines.append(
                    f"- {label}: {theirs / ours:.1f}x (goal >= 5x: {'met' if theirs / ours >= 5 else 'missed'})"
                )
        goals = "\n".join(goal_lines)
        write_section(
            "P3",
            f"""
## P3 packaging: `tsctl package` vs `torch-model-archiver`, whole processes

Each figure is a **whole process** (`tsctl package ...` / `torch-model-archiver ...` run as commands:
interpreter start, imports, work, exit), bytecode cached, after one warm-up run; median of three
alternating rounds. Same flags on both sides (`--handler image_classifier`, default archive format).

| model | tsctl s | rounds | torch-model-archiver s | rounds | ratio | archive MB (tsctl / tma) | tsctl rebuild byte-identical |
|---|---|---|---|---|---|---|---|
{table}

{goals}
- `tsctl --help`: {help_s * 1000:.0f} ms (median of 5 whole processes).
- `python -X importtime` of `tsctl package`: {modules} modules, model libraries among them:
  {", ".join(heavy) if heavy else "none (no torch, torchvision, transformers, ts or numpy)"}. A toolkit handler
  named by `--handler` is described by `handlers/catalogue.py` and its settings checked by
  `handlers/settings.py`, neither of which imports torch; a `--handler` file of your own is imported
  as TorchServe will import it, so what it imports loads.
- First run with no bytecode at all (an empty `PYTHONPYCACHEPREFIX`, as after an install without
  `--compile-bytecode`): {cold_s:.2f} s for the resnet18 archive. `make venv` installs with
  `uv pip install --compile-bytecode`.

torch-model-archiver imports torch, copies every input to a temporary directory, then deflates it
(weights do not compress); tsctl streams inputs straight into the zip and stores weights.

{plot}

Reproduce: `.venv/bin/python benchmarks/p3_packaging.py`
""",
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
