"""What every benchmark script shares: the machine it ran on, alternating rounds, BENCHMARKS.md sections."""

import os
import platform
import re
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
PLOTS = ROOT / "benchmarks" / "plots"


def machine() -> str:
    packages = ", ".join(f"{p} {version(p)}" for p in ("torch", "torchvision", "torchserve", "transformers"))
    return f"{os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}, {packages}"


def alternate(sides: dict, rounds: int = 3) -> dict:
    """Run each side's function once per round, in turn, each round starting one side later
    (A B C, B C A, C A B): drift in the machine's speed falls on every side alike.
    Returns {side: [result per round]}."""
    results = {name: [] for name in sides}
    names = list(sides)
    for round_number in range(rounds):
        order = names[round_number % len(names) :] + names[: round_number % len(names)]
        for name in order:
            run = sides[name]
            value = run()
            results[name].append(value)
            print(f"round {round_number + 1} {name}: {value}", flush=True)
    return results


def median(values):
    return statistics.median(values)


def write_section(key: str, markdown: str):
    """Replace the section between <!-- KEY --> markers in BENCHMARKS.md (appending it if new)."""
    text = BENCHMARKS_MD.read_text() if BENCHMARKS_MD.exists() else "# Benchmarks\n"
    block = (
        f"<!-- {key} -->\n{markdown.strip()}\n\n_Measured {time.strftime('%Y-%m-%d')} on {machine()}._\n<!-- /{key} -->"
    )
    pattern = re.compile(rf"<!-- {key} -->.*?<!-- /{key} -->", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    BENCHMARKS_MD.write_text(text)
    print(block)


def bar_plot(name: str, title: str, labels, values, ylabel: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    PLOTS.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
    ax.bar(labels, values, color=["#4c72b0", "#dd8452", "#55a868", "#c44e52"][: len(values)])
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.1f}", ha="center", va="bottom")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    fig.tight_layout()
    path = PLOTS / f"{name}.png"
    fig.savefig(path)
    plt.close(fig)
    return f"![{title}](benchmarks/plots/{name}.png)"
