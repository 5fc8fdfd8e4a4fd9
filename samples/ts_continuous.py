"""A continuous-batching archive (``continuousBatching: true``), packaged with torch-model-archiver:
``samples/ts_examples/continuous/token_handler.py`` (one token a step for each request of the batch), 1
worker, the batch size and step time given.

    python -m samples.ts_continuous samples/build/continuous        # the archive into that store
"""

import sys
from pathlib import Path

from samples import ts_examples
from samples.ts_examples import Example

HANDLER = Path(__file__).resolve().parent / "ts_examples" / "continuous" / "token_handler.py"
CONFIG = """\
minWorkers: 1
maxWorkers: 1
batchSize: {batch}
maxBatchDelay: {delay}
continuousBatching: {continuous}
handler:
  step_seconds: {step}
"""


def build(
    store: Path, name: str = "tokens", batch: int = 8, step: float = 0.02, delay: int = 10, continuous: bool = True
) -> Path:
    files = store.parent / f"{store.name}-{name}"
    files.mkdir(parents=True, exist_ok=True)
    config = files / "model-config.yaml"
    config.write_text(CONFIG.format(batch=batch, step=step, delay=delay, continuous=str(continuous).lower()))
    return ts_examples.package(Example(name, str(HANDLER), [], config_file=config), "torch-model-archiver", store)


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
