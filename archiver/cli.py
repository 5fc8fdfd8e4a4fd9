"""The ``tsctl`` command line: the group, with each area's commands (archiver/commands/) added to it.

Each command is a thin click function over plain ones: it parses its flags, calls one function, prints,
and exits 0 on success, 2 for a user mistake (one sentence, no traceback), 1 when the server or model
fails. Each imports the module it calls when it runs, so ``tsctl --help`` loads click and little else,
and no command but ``run``, ``verify`` and ``package --golden`` (which run the model) loads torch.
"""

import logging

import click

from .commands import build, checks, export, serving

# TorchServe's BaseHandler logs optional-backend notices (OpenVINO, ONNX, TensorRT) on import.
logging.getLogger("ts.torch_handler.base_handler").setLevel(logging.ERROR)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tsctl")
def main():
    """Package, configure, serve and test PyTorch models on TorchServe and KServe."""


for command in (
    build.init,
    build.package,
    build.inspect,
    build.config,
    serving.serve,
    serving.stop,
    serving.predict,
    serving.bench,
    checks.verify,
    checks.shadow,
    checks.simulate,
    checks.run,
    checks.doctor,
    export.export,
):
    main.add_command(command)


if __name__ == "__main__":
    main()
