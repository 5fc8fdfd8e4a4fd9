"""GPUs as TorchServe 0.12's frontend finds them and hands them to workers, for every tsctl runtime.

What TorchServe does, read from pytorch/serve v0.12.0's frontend (``frontend/server/src/main/java/org/
pytorch/serve/``), and where it is done here:

- **How many GPUs** (``util/ConfigManager.java``, ``getAvailableGpu`` lines 934-1007, and lines 270-275):
  the entries of ``CUDA_VISIBLE_DEVICES`` when it is set and not empty (ids are then relative to that set:
  the worker's ``cuda:N`` is the N-th visible device), else the GPUs the driver lists (``nvidia-smi
  --query-gpu=index``; NVML here, the same list); ``number_of_gpu`` in config.properties caps that count,
  and is that count when absent. ``count_gpus``, ``number_of_gpu``.
- **Default workers** (``ConfigManager.getDefaultWorkers``, lines 564-577): ``default_workers_per_model``,
  else the number of GPUs, else the CPUs. ``default_workers``.
- **A model's devices** (``wlm/Model.java``, lines 52-55, 100-160): ``deviceType`` from its model-config.yaml
  (``gpu`` only where there is a GPU: else the CPU; no ``deviceType``: GPU when there is one); ``deviceIds``
  kept only if every id is below the GPU count, else the list is ignored with a warning; the GPUs a model
  spreads over (``numCores``) are its ``deviceIds``, else all of them, none on the CPU. ``ModelDevices``.
- **Each worker's GPU** (``wlm/WorkLoadManager.java``, ``addThreads`` lines 206-227): -1 on the CPU; a model
  with ``deviceIds`` takes the next id of its own counter over its list, any other the next of one counter
  shared by every model, which is incremented before
  it is read (``++prev % n``: with two GPUs the first worker gets GPU 1). The id goes to the worker in the
  load command (``gpu``, ``ts_wire.encode_load``), which hands it to the handler as
  ``context.system_properties["gpu_id"]``; a worker started again keeps its id (``WorkerThread.gpuId``).
  ``Placement.next_gpu``.
- **Parallelism** (``parallelType`` with ``parallelLevel`` or ``torchrun``): TorchServe 0.12 starts one worker
  (``ModelManager``: minWorkers and maxWorkers set to 1) over ``parallelLevel`` contiguous GPUs, under torchrun
  for pp/tp/pptp (``WorkerLifeCycle.java``), and connects to ``parallelLevel`` sockets, one per rank, which for
  ``custom`` the handler must open itself. tsctl's runtimes start no ranks: ``model_devices`` refuses such a
  model in one line naming the key (TorchServe 0.12 itself fails tp with a NullPointerException on a machine
  without the GPUs, and waits for custom's ranks).

Where tsctl differs: a ``CUDA_VISIBLE_DEVICES`` entry that is not a number (a GPU's UUID, a MIG instance)
counts as a device, where TorchServe's ``Integer.parseInt`` stops it from starting.

No torch here: the frontend processes (the engine, MLServer's runtime) never import it. NVML comes from
``nvidia-ml-py`` (``pynvml``) and the driver's ``libnvidia-ml.so``; where either is missing there are no
GPUs.
"""

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional

logger = logging.getLogger("tsctl.gpus")

CPU = -1  # the load command's gpu for a worker on the CPU


class PlacementError(ValueError):
    """A model's device settings tsctl cannot honour: one sentence naming the key and the fix."""


def nvml_count() -> int:
    """The GPUs the driver lists (NVML's count, what ``nvidia-smi --query-gpu=index`` lists); 0 without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no nvidia-ml-py, no driver library, no device: no GPU
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001
        return 0
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def nvml_driver() -> "tuple[Optional[str], str]":
    """(the NVIDIA driver's version, "") through NVML, or (None, why NVML could not tell)."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed in this Python"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return None, f"NVML: {exc}"
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return (version.decode() if isinstance(version, bytes) else str(version)), ""
    except Exception as exc:  # noqa: BLE001
        return None, f"NVML: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def count_gpus(environ: Optional[Mapping[str, str]] = None, listed: Callable[[], int] = nvml_count) -> int:
    """The GPUs TorchServe counts: the entries of CUDA_VISIBLE_DEVICES when it is set and not empty (an id
    is relative to that set), else those the driver lists (``listed``)."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return len([entry for entry in visible.split(",") if entry.strip()])
    return listed()


def number_of_gpu(properties: Mapping[str, str], found: int) -> int:
    """config.properties' ``number_of_gpu`` capped at the GPUs ``found`` (``found`` when it is absent), as
    TorchServe sets it at start."""
    configured = (properties.get("number_of_gpu") or "").strip()
    if not configured:
        return found
    try:
        return max(0, min(found, int(configured)))
    except ValueError:
        raise PlacementError(f"number_of_gpu={configured!r} is not a whole number: fix it or remove it") from None


def number_of_gpu_note(properties: Mapping[str, str], found: int, where: str) -> Optional[str]:
    """The line a ``number_of_gpu`` above the GPUs ``found`` gets (TorchServe 0.12 caps it without a word:
    ConfigManager, ``Integer.min``), logged by the engine at start and said by ``tsctl serve``; else None."""
    asked = (properties.get("number_of_gpu") or "").strip()
    if not asked.isdigit() or int(asked) <= found:
        return None
    used = f"{found} GPU(s) used" if found else "no GPU is visible (CUDA_VISIBLE_DEVICES, NVML): workers run on the CPU"
    return f"{where}: number_of_gpu={asked} but this machine has {found} visible GPU(s): {used}"


def default_workers(configured: int, gpus: int, cpus: int) -> int:
    """Workers per model without a model's own count: ``default_workers_per_model``, else the GPUs, else the
    CPUs (ConfigManager.getDefaultWorkers)."""
    return configured or gpus or cpus


@dataclass
class ModelDevices:
    """Where one model version's workers run: ``gpus`` is how many GPUs it spreads over (0: the CPU), ``ids``
    its ``deviceIds`` when it has a valid list (else ids 0..gpus-1 of the shared counter), ``notes`` what
    was asked and not given (a line each for the engine's log and ``tsctl serve``)."""

    gpus: int = 0
    ids: Optional[List[int]] = None
    notes: List[str] = field(default_factory=list)
    counter: int = 0  # the model's own counter over ``ids`` (TorchServe's Model.gpuCounter)

    @property
    def on_gpu(self) -> bool:
        return self.gpus > 0


def model_devices(config: Mapping, number_of_gpus: int, where: str = "model-config.yaml") -> ModelDevices:
    """A model version's devices from its model-config.yaml (``config``), as TorchServe's Model reads them."""
    level, kind = parallel_level(config), str(config.get("parallelType") or "").strip().lower()
    if level > 0 and kind in PARALLEL_TYPES:
        runner = "with torchrun " if kind != "custom" else ""
        raise PlacementError(
            f"{where}: parallelType {config.get('parallelType')!r} with parallelLevel {level} asks TorchServe to "
            f"start one worker {runner}over {level} GPUs with a process for each, which tsctl's runtimes do not "
            "do: remove parallelType, or serve this model with --engine torchserve"
        )
    devices = ModelDevices()
    kind = config.get("deviceType")
    asked = kind.strip().lower() if isinstance(kind, str) else ""
    if kind is not None and asked not in ("cpu", "gpu"):  # ModelConfig: a warning, the type left unset
        devices.notes.append(f"{where}: deviceType {kind!r} is not cpu or gpu: ignored, as TorchServe ignores it")
    if asked == "gpu" and number_of_gpus == 0:
        devices.notes.append(
            f"{where}: deviceType is gpu but this machine has no GPU (number_of_gpu 0): its workers run on the CPU"
        )
    if asked == "cpu" or number_of_gpus == 0:
        return devices
    ids = config.get("deviceIds")
    if isinstance(ids, list) and ids:
        if all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < number_of_gpus for i in ids):
            devices.ids = list(ids)
        else:
            devices.notes.append(
                f"{where}: deviceIds {ids} names a GPU this machine does not have ({number_of_gpus} visible): the "
                "list is ignored, as TorchServe ignores it"
            )
    devices.gpus = len(devices.ids) if devices.ids else number_of_gpus
    return devices


PARALLEL_TYPES = ("pp", "tp", "pptp", "custom")  # ModelConfig.ParallelType; any other value is NONE


def parallel_level(config: Mapping) -> int:
    """parallelLevel as ModelConfig reads it (an int), or torchrun's nproc-per-node, which sets it."""
    torchrun = config.get("torchrun")
    if isinstance(torchrun, dict) and isinstance(torchrun.get("nproc-per-node"), int):
        return torchrun["nproc-per-node"]
    level = config.get("parallelLevel")
    return level if isinstance(level, int) and not isinstance(level, bool) else 0


class Placement:
    """The GPU each new worker gets, across every model of one server (TorchServe's WorkLoadManager)."""

    def __init__(self, number_of_gpus: int):
        self.number_of_gpus = number_of_gpus
        self.shared = 0  # WorkLoadManager.gpuCounter, one for every model without deviceIds
        self.lock = threading.Lock()

    def next_gpu(self, devices: ModelDevices) -> int:
        """The next worker's GPU id for a model with ``devices`` (CPU: -1)."""
        if not devices.on_gpu:
            return CPU
        with self.lock:
            if devices.ids:
                index = devices.counter
                devices.counter = (devices.counter + 1) % devices.gpus
                return devices.ids[index]
            self.shared = (self.shared + 1) % devices.gpus
            return self.shared


_process_placement: Optional[Placement] = None


def process_placement(number_of_gpus: int) -> Placement:
    """This process's one ``Placement``, for a server that loads each model through its own entry point:
    MLServer opens every model in its process and reloads the runtime's module for each
    (mlserver/settings.py, ``_reload_module``), so a counter kept there would start again at every model."""
    global _process_placement
    if _process_placement is None:
        _process_placement = Placement(number_of_gpus)
    return _process_placement


def describe_usage(gpu: int, samples: Dict[int, "DeviceSample"]) -> str:
    """A worker's ``gpuUsage`` in the management API's describe, as TorchServe 0.12 writes it from
    ``nvidia-smi -i ID --query-gpu=utilization.gpu,utilization.memory,memory.used --format=csv``
    (WorkerThread.getGpuUsage): "N/A" on the CPU, else from ``samples`` (``sample_devices``: NVML)."""
    if gpu < 0:
        return "N/A"
    sample = samples.get(gpu)
    if sample is None:
        return "failed to obtained gpu usage"  # TorchServe's words
    return (
        f"gpuId::{gpu} utilization.gpu [%]::{sample.utilization} % utilization.memory [%]::"
        f"{sample.memory_utilization} % memory.used [MiB]::{sample.memory_used_mib} MiB"
    )


@dataclass
class DeviceSample:
    """One GPU as NVML reads it now."""

    index: int
    name: str
    utilization: int  # % of the last sample period a kernel ran
    memory_utilization: int  # % of the period memory was read or written (nvidia-smi's utilization.memory)
    memory_used_mib: int
    memory_total_mib: int

    @property
    def memory_used_percent(self) -> float:
        return 100.0 * self.memory_used_mib / self.memory_total_mib if self.memory_total_mib else 0.0


def sample_devices(environ: Optional[Mapping[str, str]] = None) -> Dict[int, DeviceSample]:
    """Each visible GPU, by the id a worker knows it by (its index in CUDA_VISIBLE_DEVICES when set), read
    through NVML; {} without NVML. A device NVML cannot read is left out."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001
        return {}
    try:
        handles = visible_handles(pynvml, os.environ if environ is None else environ)
        found = {}
        for index, handle in enumerate(handles):
            try:
                rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                name = pynvml.nvmlDeviceGetName(handle)
            except Exception:  # noqa: BLE001 - one device NVML cannot read
                continue
            found[index] = DeviceSample(
                index,
                name.decode() if isinstance(name, bytes) else str(name),
                rates.gpu,
                rates.memory,
                memory.used >> 20,
                memory.total >> 20,
            )
        return found
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def visible_handles(pynvml, environ: Mapping[str, str]) -> list:
    """NVML's handles of the visible GPUs in CUDA's order: CUDA_VISIBLE_DEVICES' entries (an index, a UUID
    or its prefix), else every device."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    count = pynvml.nvmlDeviceGetCount()
    if not visible:
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    handles = []
    for entry in (e.strip() for e in visible.split(",")):
        try:
            if entry.isdigit():
                handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(entry)))
            else:
                handles.append(pynvml.nvmlDeviceGetHandleByUUID(entry))
        except Exception:  # noqa: BLE001 - CUDA stops at the first device it cannot find
            break
    return handles
