"""Loading a model's weights from an unpacked MAR, by kind.

| serialized file              | model file | what is loaded                                           |
|------------------------------|------------|----------------------------------------------------------|
| ``*.pt2``                    | -          | ``torch.export.load(...).module()``                      |
| ``*.onnx``                   | -          | ONNX Runtime session (``onnx_runtime.OnnxModel``)        |
| ``*.safetensors``            | required   | model class from the model file + safetensors state_dict |
| ``*.pt`` / ``*.pth`` / other | given      | model class + ``torch.load(weights_only=True)`` state_dict |
| ``*.pt`` / ``*.pth`` / other | -          | TorchScript, ``torch.jit.load``                          |

Pickled whole models (``torch.save(model)``) run arbitrary code on load; they load only when the
handler setting ``allow_pickle: true`` says the MAR's author is trusted.
"""

import importlib.util
import inspect
import os
import sys
from typing import Optional

import torch

from . import cpu_limit


class ModelLoadError(RuntimeError):
    """The MAR's files do not make a model; the message names the file and the fix."""


PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}  # handler.precision


def with_precision(model, precision: str):
    """``model`` with its floating-point weights in ``precision`` (``handler.precision``: fp32 leaves it as
    loaded). An ONNX model or an exported program keeps its own: a ModelLoadError says so."""
    if precision == "fp32":
        return model
    if not isinstance(model, torch.nn.Module) or isinstance(model, torch.fx.GraphModule):
        raise ModelLoadError(
            f"handler.precision {precision} needs a torch module (eager or TorchScript); this model is "
            f"{type(model).__name__}: export it in that precision, or set precision: fp32"
        )
    return model.to(PRECISIONS[precision])


def to_device(tensor: torch.Tensor, device: torch.device, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``tensor`` on ``device``, floating-point values in ``dtype`` when given. To a GPU the copy goes through
    pinned host memory without blocking, so the host goes on (decoding, tokenizing) while it runs; the cast
    happens on the device, after the copy."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        tensor = tensor.pin_memory().to(device, non_blocking=True)
    else:
        tensor = tensor.to(device)
    return tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor


def release_memory(device: Optional[torch.device]):
    """After an out-of-memory error on a GPU: the cached blocks of the failed batch back to the driver, so the
    next batch (or the same requests alone) starts from an empty cache."""
    if device is not None and device.type == "cuda":
        torch.cuda.empty_cache()


def load_model(model_dir: str, manifest_model: dict, device: torch.device, allow_pickle: bool = False):
    serialized = manifest_model.get("serializedFile")
    model_file = manifest_model.get("modelFile")
    if not serialized:
        raise ModelLoadError("the MAR has no serialized file: package it with --serialized-file")
    path = os.path.join(model_dir, serialized)
    if not os.path.exists(path):
        raise ModelLoadError(f"{serialized} is named in MANIFEST.json but missing from the MAR")
    suffix = os.path.splitext(serialized)[1].lower()

    if suffix == ".onnx":
        from .onnx_runtime import OnnxModel

        return OnnxModel(path)
    if suffix == ".pt2":
        # An exported program is already in inference form; its module refuses .eval() and .to().
        program = load_exported(path, allow_pickle)
        if device.type != "cpu":
            program = torch.export.passes.move_to_device_pass(program, device)
        return program.module()
    if suffix == ".safetensors":
        if not model_file:
            raise ModelLoadError(f"{serialized} holds only weights: package the model class with --model-file")
        from safetensors.torch import load_file

        model = model_class(model_dir, model_file)()
        model.load_state_dict(load_file(path, device=str(device)))
    elif model_file:
        model = _load_eager(path, model_dir, model_file, device, allow_pickle)
    else:
        model = _load_torchscript(path, device)

    return model.to(device).eval()


def _load_eager(path: str, model_dir: str, model_file: str, device, allow_pickle: bool):
    name = os.path.basename(path)
    try:
        state = torch.load(path, map_location=device, weights_only=not allow_pickle)
    except Exception as exc:  # torch raises UnpicklingError or RuntimeError depending on the file
        if not allow_pickle and "weights_only" in str(exc):
            raise ModelLoadError(
                f"{name} is not a plain state_dict (torch.load with weights_only=True refused it): save "
                "model.state_dict(), or set 'handler.allow_pickle: true' in model-config.yaml if you trust it"
            ) from exc
        raise ModelLoadError(f"{name} could not be read by torch.load: {exc}") from exc
    if isinstance(state, torch.nn.Module):
        return state
    if not isinstance(state, dict):
        raise ModelLoadError(f"{name} holds a {type(state).__name__}, not a state_dict")
    model = model_class(model_dir, model_file)()
    model.load_state_dict(state)
    return model


def _load_torchscript(path: str, device):
    name = os.path.basename(path)
    try:
        return torch.jit.load(path, map_location=device)
    except RuntimeError as exc:
        raise ModelLoadError(
            f"{name} is not TorchScript; for an eager state_dict package the model class with --model-file"
        ) from exc


def model_class(model_dir: str, model_file: str):
    """The one ``nn.Module`` subclass defined in ``model_file`` (as TorchServe requires)."""
    path = os.path.join(model_dir, model_file)
    module_name = os.path.splitext(os.path.basename(model_file))[0]
    module = sys.modules.get(module_name)
    if module is None or os.path.abspath(getattr(module, "__file__", "") or "") != os.path.abspath(path):
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    classes = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, torch.nn.Module) and obj.__module__ == module.__name__
    ]
    if len(classes) != 1:
        found = ", ".join(c.__name__ for c in classes) or "none"
        raise ModelLoadError(f"{model_file} must define exactly one torch.nn.Module class, found: {found}")
    return classes[0]


DEFAULT_THREADS = torch.get_num_threads()  # torch's own choice for this process: its physical cores


def pick_threads(setting: int, workers) -> int:
    """Set this worker's intra-op threads (torch's, and ONNX Runtime's through ``OnnxModel``): the
    ``torch_threads`` setting, else OMP_NUM_THREADS when given, else torch's default divided among
    the model's ``minWorkers``, so that workers on one machine share its cores instead of each
    claiming all of them (TorchServe sets no thread count for CPU workers). Under a CPU quota (a pod's
    CPU limit: ``cpu_limit.cores``) the cores are the quota's, not the machine's."""
    if setting:
        threads = setting
    elif os.environ.get("OMP_NUM_THREADS"):
        threads = torch.get_num_threads()
    else:
        threads = max(1, min(DEFAULT_THREADS, cpu_limit.cores() or DEFAULT_THREADS) // max(1, int(workers or 1)))
    torch.set_num_threads(threads)
    return threads


def pick_device(gpu_id: Optional[int]) -> torch.device:
    """The worker's GPU when TorchServe assigned one and CUDA is there, else the CPU."""
    if gpu_id is not None and torch.cuda.is_available():
        return torch.device(f"cuda:{gpu_id}")
    return torch.device("cpu")


def load_exported(path: str, allow_pickle: bool):
    """``torch.export.load`` that unpickles nothing unless ``allow_pickle``: torch.export falls back
    to ``torch.load(weights_only=False)`` for weights and constants it cannot read safely and
    ``pickle.loads`` its custom and opaque objects, so a .pt2 could run code from the MAR. Without
    ``allow_pickle`` an archive holding such objects is refused, and every ``torch.load`` it makes is
    weights-only (torch's own ``TORCH_FORCE_WEIGHTS_ONLY_LOAD``, for the load's duration)."""
    if allow_pickle:
        return torch.export.load(path)
    import zipfile

    from torch.export.pt2_archive import constants

    prefixes = (constants.CUSTOM_OBJ_FILENAME_PREFIX, constants.OPAQUE_OBJ_FILENAME_PREFIX)
    with zipfile.ZipFile(path) as archive:
        pickled = [n for n in archive.namelist() if os.path.basename(n).startswith(prefixes)]
    if pickled:
        raise ModelLoadError(
            f"{os.path.basename(path)} holds pickled objects ({pickled[0]}), which run code when they load: "
            "export the model without custom objects, or set handler.allow_pickle: true if you trust the MAR"
        )
    saved = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        return torch.export.load(path)
    except Exception as exc:  # noqa: BLE001 - a weights-only refusal names what was pickled
        if "weights_only" in str(exc) or "Weights only load failed" in str(exc):
            raise ModelLoadError(
                f"{os.path.basename(path)} holds pickled data that runs code when it loads: set "
                "handler.allow_pickle: true if you trust the MAR"
            ) from None
        raise
    finally:
        if saved is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = saved
