"""Where a handler runs (written for tsctl's conformance suite): TorchServe 0.12 starts each worker
with the unpacked model directory as its working directory, and handlers rely on it: pytorch/serve's
Transformer_handler_generalized.py decides whether the archive holds a tokenizer with
``os.path.isfile(name)`` on bare file names. This function entry point answers, per request, whether
the working directory is the model directory and whether a bare relative path finds the archive's
own ``notes.txt``."""

import os

_model_dir = None


def handle(data, context):
    global _model_dir
    if data is None:
        _model_dir = os.path.realpath(context.system_properties["model_dir"])
        return None
    answer = {
        "cwd_is_model_dir": os.path.realpath(os.getcwd()) == _model_dir,
        "relative_path_finds_archive_file": os.path.isfile("notes.txt"),
    }
    return [answer for _ in data]
