"""What some of tsctl's flags accept, apart from the modules that act on them.

cli.py imports a command's module only when that command runs, so that ``tsctl --help`` and each
command start without loading what others use (YAML, JSON Schema, HTTP, archives). The values
its option declarations need up front live here.
"""

ARCHIVE_FORMATS = {"default": ".mar", "zip-store": ".mar", "tgz": ".tar.gz", "no-archive": ""}  # -> suffix
ARCHIVE_RUNTIMES = ("python", "python3", "LSP")  # tsctl package --runtime: torch-model-archiver's (LSP refused)
KSERVE_PROTOCOLS = ("v1", "v2")  # tsctl export kserve --protocol
AUTOSCALE_MODES = ("knative", "keda", "hpa")  # tsctl export kserve --autoscale
SIMULATED_TRACES = ("ramp", "spike", "diurnal")  # tsctl simulate --trace (archiver/autoscaling/load_traces.py)
ENGINE_COLD_START_S = 5.06  # BENCHMARKS.md "Cold start": the tsctl engine, forked workers, launch to READY
MAX_BENCH_SECONDS = 600  # tsctl bench --duration, and how long any benchmark may run
# --engine's choices come from archiver.engines.ENGINES and its ALIASES (a light package too).
# KServe serving runtimes: --runtime-kind, the first its default.
RUNTIME_KINDS = ("ClusterServingRuntime", "ServingRuntime")
