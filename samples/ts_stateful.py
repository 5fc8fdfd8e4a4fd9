"""Stateful archives (sequence batching), packaged with torch-model-archiver as pytorch/serve's
examples/stateful/sequence_batching README packages its example:

- ``stateful``: the example's handler (a running sum per sequence in an LRU cache) on its CNN,
  ``samples/ts_examples/stateful/stateful_handler.py`` a stand-in written for this project; with
  ``TSCTL_PYTORCH_SERVE`` set, the checkout's own handler, model file and weights (it imports the
  ``lru`` package, ``lru-dict`` on PyPI);
- ``running_sum``: this project's own (``samples/ts_examples/stateful/running_sum.py``): the sums,
  counts and the sequence headers each request met, a worker killing itself on ``die``.

Both with the example's model-config.yaml (``sequenceBatching: true``, 2 workers, ``batchSize`` 4,
``maxNumSequence`` 4, ``maxSequenceJobQueueSize`` 10) and the idle time given.

    python -m samples.ts_stateful samples/build/stateful        # both archives into that store
"""

import sys
from pathlib import Path
from typing import Dict, Optional

from samples import ts_examples
from samples.ts_examples import Example

STAND_INS = Path(__file__).resolve().parent / "ts_examples" / "stateful"
EXAMPLE_CONFIG = """\
minWorkers: {workers}
maxWorkers: {workers}
batchSize: {batch}
maxNumSequence: {sequences}
sequenceMaxIdleMSec: {idle_ms}
maxSequenceJobQueueSize: {queue}
sequenceBatching: true

handler:
  cache:
    capacity: 4
  load_seconds: {load_seconds}
"""


def config(
    out: Path,
    idle_ms: int,
    workers: int = 2,
    batch: int = 4,
    sequences: int = 4,
    queue: int = 10,
    load_seconds: float = 0,
) -> Path:
    """The example's model-config.yaml; ``load_seconds``: running_sum's load takes that long (a worker
    starting again stays STARTING a while)."""
    path = out / f"model-config-{idle_ms}-{workers}-{batch}-{sequences}-{queue}-{load_seconds}.yaml"
    path.write_text(
        EXAMPLE_CONFIG.format(
            idle_ms=idle_ms, workers=workers, batch=batch, sequences=sequences, queue=queue, load_seconds=load_seconds
        )
    )
    return path


def examples(out: Path, idle_ms: int = 5000, serve: Optional[Path] = None, **settings) -> Dict[str, Example]:
    """The two cases, their files in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    model_config = config(out, idle_ms, **settings)
    if serve:
        folder = serve / "examples" / "stateful"
        handler, model_file = folder / "sequence_batching" / "stateful_handler.py", folder / "model.py"
        weights, extra = folder / "model_cnn.pt", []
    else:
        handler, model_file = STAND_INS / "stateful_handler.py", ts_examples.STAND_INS / "mnist" / "mnist.py"
        weights = ts_examples.mnist_weights(model_file, out / "model_cnn.pt")
        extra = [STAND_INS / "lru.py"]  # the example's ``from lru import LRU``
    source = "pytorch/serve" if serve else "stand-in"
    return {
        "stateful": Example(
            "stateful",
            str(handler),
            [],
            serialized_file=weights,
            model_file=model_file,
            extra_files=extra,
            config_file=model_config,
            source=source,
        ),
        "running_sum": Example("running_sum", str(STAND_INS / "running_sum.py"), [], config_file=model_config),
    }


def running_sum(store: Path, name: str, idle_ms: int, packager: str = "torch-model-archiver", **settings) -> Path:
    """The running-sum handler alone, as ``name``, with its own sequence settings."""
    files = store.parent / f"{store.name}-{name}"
    files.mkdir(parents=True, exist_ok=True)
    case = Example(name, str(STAND_INS / "running_sum.py"), [], config_file=config(files, idle_ms, **settings))
    return ts_examples.package(case, packager, store)


def build(store: Path, idle_ms: int = 5000, packager: str = "torch-model-archiver", **settings) -> Dict[str, Path]:
    """Both archives in ``store``, by name."""
    cases = examples(store.parent / f"{store.name}-files", idle_ms, ts_examples.checkout(), **settings)
    return {name: ts_examples.package(case, packager, store) for name, case in cases.items()}


if __name__ == "__main__":
    for built in build(Path(sys.argv[1])).values():
        print(built)
