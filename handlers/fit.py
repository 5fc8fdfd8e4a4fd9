"""Can a toolkit handler run this model? Read from the model's files alone, without torch.

``tsctl package`` asks ``problem`` before it writes anything, so a handler that cannot fit its model
is refused with one sentence naming the file and the handler to use, instead of failing when served
(or, worse, answering: a text classifier on a directory without a classification head loads a
random head and answers random labels). The handlers ask the same questions when they load
(``sentence_modules_problem``), so an archive built another way fails its start with the same words.
"""

import json
import os
import zipfile
from typing import List, Optional

from .catalogue import HANDLERS, ONNX_FILE, ModelFiles
from .settings import POOLINGS

HEADS = {name: handler.head for name, handler in HANDLERS.items() if handler.head}  # catalogue.Handler.head
PLAIN_MODULES = ("Transformer", "Pooling", "Normalize")  # what the handler computes without sentence-transformers
TORCHTEXT_HINT = (
    "; for TorchServe's own torchtext text_classifier (a model file and source_vocab.pt), pass "
    "--handler ts.torch_handler.text_classifier"
)


class Unreadable(ValueError):
    """A model file that is there but cannot be read as what it must be; the message names it."""


def problem(handler: str, serialized: Optional[str], model_file: Optional[str]) -> Optional[str]:
    """Why toolkit handler ``handler`` cannot run the model in ``serialized`` (and ``model_file``), in
    one sentence naming the file and the fix; None when it can (or when its files cannot tell)."""
    entry = HANDLERS.get(handler)
    if not serialized or entry is None:
        return None
    try:
        if entry.model is ModelFiles.PRETRAINED_DIRECTORY:
            return _text_problem(handler, serialized, model_file)
        if entry.model is ModelFiles.WEIGHTS_FILE:
            return _weights_problem(handler, serialized, model_file)
    except Unreadable as exc:
        return str(exc)
    return None


def _text_problem(handler: str, serialized: str, model_file: Optional[str]) -> Optional[str]:
    hint = TORCHTEXT_HINT if handler == "text_classifier" else ""
    if model_file:
        return (
            f"--handler {handler} runs a Hugging Face directory (save_pretrained's) given as --serialized-file, "
            f"and takes no --model-file ({model_file}){hint}"
        )
    if not os.path.isdir(serialized):
        return (
            f"--serialized-file {serialized} is a file, but --handler {handler} takes the directory "
            f"save_pretrained wrote (config.json, weights, tokenizer){hint}"
        )
    config = read_object(os.path.join(serialized, "config.json"))
    if config is None:
        return (
            f"{serialized} has no config.json: --handler {handler} takes the directory save_pretrained wrote "
            "(config.json, weights, tokenizer)"
        )
    architectures = architectures_of(config)
    head = HEADS.get(handler)
    if head and architectures and not any(a.endswith(head) for a in architectures):
        return (
            f"{serialized}/config.json names {', '.join(architectures)}, which has no {head[3:]} head: "
            f"--handler {handler} would load an untrained head and answer at random; "
            f"{_suggest(architectures, handler)}"
        )
    if handler == "text_embedder" and os.path.isfile(os.path.join(serialized, ONNX_FILE)):
        why = sentence_modules_problem(serialized)
        if why:
            return (
                f"{serialized} holds {ONNX_FILE} beside modules.json, but {why} needs sentence-transformers, "
                f"which runs the torch weights only: remove {ONNX_FILE} to serve it in torch, or export the "
                "directory without that module"
            )
    return None


def _weights_problem(handler: str, serialized: str, model_file: Optional[str]) -> Optional[str]:
    if os.path.isdir(serialized):
        config = read_object(os.path.join(serialized, "config.json"))
        if config is not None:
            architectures = architectures_of(config)
            return (
                f"--serialized-file {serialized} is a Hugging Face directory "
                f"({', '.join(architectures) or 'config.json'}): --handler {handler} takes a weights file; "
                f"{_suggest(architectures, handler)}"
            )
        return f"--serialized-file {serialized} is a directory: --handler {handler} takes one weights file"
    suffix = os.path.splitext(serialized)[1].lower()
    if suffix in (".onnx", ".pt2"):
        return None
    if suffix == ".safetensors":
        if not is_safetensors(serialized):
            return f"--serialized-file {serialized} is not a safetensors file: save it with safetensors.torch.save_file"
        if model_file:
            return None
        return f"--serialized-file {serialized} holds only weights: pass --model-file model.py defining the model class"
    if model_file:
        if is_torch_save(serialized) or is_torchscript(serialized):
            return None
        return (
            f"--serialized-file {serialized} is not weights torch.save wrote (a state_dict), which --model-file "
            f"{model_file} needs: save the model's state_dict with torch.save"
        )
    if not is_torchscript(serialized):
        return (
            f"--serialized-file {serialized} is not TorchScript (a state_dict or a pickled model): pass "
            "--model-file model.py defining the model class, or save the model with torch.jit.script or trace"
        )
    return None


def _suggest(architectures: List[str], handler: str) -> str:
    """Which handler fits a Hugging Face directory of these architectures."""
    for name, head in HEADS.items():
        if any(a.endswith(head) for a in architectures) and name != handler:
            return f"use --handler {name}"
    if handler != "text_embedder" and architectures and all(a.endswith("Model") for a in architectures):
        return "use --handler text_embedder for its embeddings"
    return "save a model with that head (AutoModelFor...) or pick the handler of its task"


def unloaded_state_dict(model_dir: str, model: dict) -> Optional[str]:
    """Why an archive's handler failed to load, when its weights tell: a ``.pt`` state_dict
    (``torch.save(model.state_dict())``) without a model file, which TorchServe's BaseHandler loads as
    TorchScript (``torch.jit.load``, base_handler.py ``initialize``: no ``modelFile``, a ``.pt``), and torch
    then calls the checkpoint corrupted. None otherwise. ``model``: its MANIFEST.json's ``model``."""
    serialized = model.get("serializedFile")
    if model.get("modelFile") or not isinstance(serialized, str) or not serialized.endswith(".pt"):
        return None
    path = os.path.join(model_dir, serialized)
    if not os.path.isfile(path) or is_torchscript(path) or not is_torch_save(path):
        return None
    return (
        f"{os.path.basename(serialized)} is a state_dict (torch.save(model.state_dict())), not TorchScript, and the "
        "archive has no model file, so the handler cannot build the model: package it with --model-file model.py "
        "defining the model class, as torch-model-archiver's eager mode needs (or save the model with "
        "torch.jit.script)"
    )


def is_torchscript(path: str) -> bool:
    """True for a TorchScript file (``torch.jit.save``: a zip holding ``code/`` and ``constants.pkl``);
    ``torch.save`` writes a zip with ``data.pkl`` and no code, or a bare pickle."""
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except Exception:  # noqa: BLE001 - not a zip, or one zipfile cannot read: not TorchScript either way
        return False
    return any("/code/" in n or n.endswith("/constants.pkl") for n in names)


def is_torch_save(path: str) -> bool:
    """True for what ``torch.save`` writes: a zip holding ``data.pkl``, or (before torch 1.6, or with
    ``_use_new_zipfile_serialization=False``) a pickle, which starts with the PROTO opcode."""
    try:
        with zipfile.ZipFile(path) as z:
            return any(n == "data.pkl" or n.endswith("/data.pkl") for n in z.namelist())
    except Exception:  # noqa: BLE001 - not a zip: maybe the older pickle format
        pass
    try:
        with open(path, "rb") as f:
            return f.read(1) == b"\x80"
    except OSError:
        return False


def is_safetensors(path: str) -> bool:
    """True when the file starts as safetensors does: an 8-byte little-endian header length, then a JSON
    object that fits in the file."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") <= size - 8


def sentence_modules_problem(directory: str) -> Optional[str]:
    """What in a sentence-transformers directory (modules.json) the handler cannot compute without
    sentence-transformers ("a Dense module", "weightedmean pooling", ...), or None. A settings file
    of the wrong shape raises Unreadable."""
    modules = read_json(os.path.join(directory, "modules.json"))
    if modules is not None and not (isinstance(modules, list) and all(isinstance(m, dict) for m in modules)):
        raise Unreadable(f"{directory}/modules.json is not a list of modules: save the directory again")
    for module in modules or []:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind not in PLAIN_MODULES:
            return f"a {kind} module"
        if kind == "Transformer" and str(module.get("path", "")).strip("/."):
            return f"its transformer in {module['path']}/"
    modes = pooling_modes(read_object(os.path.join(directory, "1_Pooling", "config.json")) or {})
    if len(modes) > 1 or not modes <= set(POOLINGS):
        return f"{' + '.join(sorted(modes))} pooling"
    if (read_object(os.path.join(directory, "sentence_bert_config.json")) or {}).get("do_lower_case"):
        return "do_lower_case"
    config = read_object(os.path.join(directory, "config_sentence_transformers.json")) or {}
    prompts, default = config.get("prompts"), config.get("default_prompt_name")
    if isinstance(prompts, dict) and isinstance(default, str) and prompts.get(default):
        return "a default prompt"
    return None


def pooling_modes(config: dict) -> set:
    """A 1_Pooling/config.json's modes, whichever release wrote it: ``pooling_mode: weightedmean``
    (or a list) or ``pooling_mode_mean_tokens: true`` flags; names without ``_token(s)``."""
    mode = config.get("pooling_mode")
    modes = (
        [mode] if isinstance(mode, str) else [m for m in mode if isinstance(m, str)] if isinstance(mode, list) else []
    )
    flags = [key for key, value in config.items() if str(key).startswith("pooling_mode_") and value is True]
    modes += [key[len("pooling_mode_") :] for key in flags]
    return {m.replace("_tokens", "").replace("_token", "") for m in modes}


def architectures_of(config: dict) -> List[str]:
    """config.json's ``architectures`` (a list of class names; a lone string read as one)."""
    value = config.get("architectures")
    value = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    return [a for a in value if isinstance(a, str)]


def read_object(path: str) -> Optional[dict]:
    """A JSON file that must hold an object: its content, None when absent, Unreadable otherwise."""
    value = read_json(path)
    if value is not None and not isinstance(value, dict):
        raise Unreadable(f"{path} holds {type(value).__name__}, not a JSON object: save the directory again")
    return value


def read_json(path: str):
    """A JSON file's content, None when it is absent; Unreadable when it is not JSON."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise Unreadable(f"{path} is not valid JSON ({type(exc).__name__}): save the directory again") from None
