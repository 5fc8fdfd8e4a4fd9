"""TorchServe itself, started as ``torchserve --start`` with its addresses moved to free ports through
TorchServe's ``TS_*`` environment variables (``start``), and waited for until every model has a READY worker,
failing as soon as its logs say why it will not come (``wait_ready``; archiver/torchserve_log.py). The runtime
``tsctl serve --engine torchserve`` runs is archiver/engines/torchserve.py; what every runtime shares
(``Server``, ``spawn``, ``stop``, free ports) is archiver/server.py."""

import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

from ..addresses import LOOPBACK, bind_address, client_address
from ..errors import ServerFailure, UserError
from ..output import quiet
from ..patience import Patience
from ..properties import config_metrics, read_properties
from ..server import (
    READY,
    Server,
    States,
    check_home,
    group_alive,
    logs_of,
    model_state,
    output_written,
    pick_ports,
    recorded,
    snapshot_models,
    spawn,
    with_port_retry,
)
from ..torchserve_log import failing_model, registration_failure, startup_problem, startup_states, worker_failure


def torchserve_command(python: Optional[str] = None) -> List[str]:
    python = python or sys.executable
    script = Path(python).parent / "torchserve"
    if not script.exists():
        raise UserError(f"no torchserve next to {python}: install it with 'pip install torchserve==0.12.0'")
    return [python, str(script)]


def start(
    config="config/config.properties",
    model_store="model-store",
    home=".tsctl",
    timeout: float = 180,
    python: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    install_deps: bool = False,
    kserve_args: bool = False,
    progress: Callable[[str], None] = quiet,
    host: str = LOOPBACK,
    port: Optional[int] = None,
) -> Server:
    """Start TorchServe detached and wait until every snapshot model has a READY worker (``progress``
    hears of each model's state as it changes: ``wait_ready``).

    ``install_deps`` turns TorchServe's per-model install on (``TS_INSTALL_PY_DEP_PER_MODEL=true``), as
    in the config ``tsctl export kserve`` writes: each archive's requirements.txt goes into its model
    directory. By default it is off, whatever the config says: the environment has the packages.
    ``kserve_args`` starts it with exactly the arguments of KServe's TorchServe runtime (no
    ``--foreground``): the launcher exits and the server lives on in its process group. Either way it saves
    its config snapshots (no ``--ncs``) in ``home``/logs/config, for ``tsctl serve --last-snapshot``.
    TorchServe runs in ``home``: the config's ``metrics_config`` is given to it as read from the current
    directory (``TS_METRICS_CONFIG``, absolute), as TorchServe started here would read it. Its listeners
    bind ``host``, the inference API ``port`` (``tsctl serve --host/--port``; default: free ports on
    127.0.0.1)."""
    config, model_store, home = Path(config).resolve(), Path(model_store).resolve(), Path(home).resolve()
    properties = read_properties(config)
    models = snapshot_models(properties, config, model_store)
    metrics = config_metrics(config)
    if metrics:
        env = {"TS_METRICS_CONFIG": metrics, **(env or {})}
    if properties.get("enable_envvars_config", "false").lower() != "true":
        raise UserError(
            f"{config}: enable_envvars_config must be true so tsctl can bind 127.0.0.1 ports; "
            "regenerate the file with 'tsctl config'"
        )
    if install_deps:
        check_pip(python or sys.executable)
    temp = check_home(home)
    options = (install_deps, kserve_args, models, progress, host, port)
    return with_port_retry(lambda: _launch(config, model_store, home, temp, timeout, python, env, *options))


def _launch(
    config, model_store, home, temp, timeout, python, env, install_deps, kserve_args, models, progress, host, port
) -> Server:
    """Start TorchServe once (on ``host``, the inference API on ``port``, the rest free ports) and wait for it."""
    for old in logs_of(home).glob("*.log"):
        old.unlink()
    names = ("inference", "management", "metrics", "grpc_i", "grpc_m")
    ports = dict(zip(names, pick_ports(len(names), port)))
    run_env = dict(os.environ)
    run_env.update(
        {
            "TEMP": str(temp),
            "LOG_LOCATION": str(logs_of(home)),
            "METRICS_LOCATION": str(logs_of(home)),
            "TS_INFERENCE_ADDRESS": f"http://{bind_address(host, ports['inference'])}",
            "TS_MANAGEMENT_ADDRESS": f"http://{bind_address(host, ports['management'])}",
            "TS_METRICS_ADDRESS": f"http://{bind_address(host, ports['metrics'])}",
            "TS_GRPC_INFERENCE_ADDRESS": host,
            "TS_GRPC_MANAGEMENT_ADDRESS": host,
            "TS_GRPC_INFERENCE_PORT": str(ports["grpc_i"]),
            "TS_GRPC_MANAGEMENT_PORT": str(ports["grpc_m"]),
            # Workers talk to the frontend over /tmp/.ts.sock.<port>: a base of our own avoids clashes.
            "TS_INITIAL_WORKER_PORT": str(random.randrange(20000, 60000, 100)),
        }
    )
    run_env["TS_INSTALL_PY_DEP_PER_MODEL"] = "true" if install_deps else "false"
    run_env.update(env or {})
    if kserve_args:
        arguments = ["--start", f"--model-store={model_store}", f"--ts-config={config}"]
    else:
        arguments = ["--start", "--foreground", "--model-store", str(model_store), "--ts-config", str(config)]
    process = spawn(torchserve_command(python) + arguments, home, run_env, "torchserve.out")
    server = Server(
        pid=process.pid,
        home=str(home),
        inference=f"http://{client_address(host, ports['inference'])}",
        management=f"http://{client_address(host, ports['management'])}",
        metrics=f"http://{client_address(host, ports['metrics'])}",
        models=models,
        grpc=client_address(host, ports["grpc_i"]),
        log_writer=process.log_writer.pid,
        ts_grpc_inference=client_address(host, ports["grpc_i"]),
        ts_grpc_management=client_address(host, ports["grpc_m"]),
    )
    registering = "extracting, installing its requirements" if install_deps else "extracting"
    return recorded(
        server, lambda: wait_ready(server, timeout, None if kserve_args else process, progress, registering)
    )


def check_pip(python: str):
    """TorchServe installs per-model requirements with ``python -m pip``: refuse to start without it."""
    found = subprocess.run([python, "-m", "pip", "--version"], capture_output=True)
    if found.returncode != 0:
        raise UserError(
            f"--install-deps needs pip in the environment of {python}, which has none "
            "(uv makes venvs without it): run 'uv pip install --python "
            f"{python} pip', or serve without --install-deps"
        )


def wait_ready(
    server: Server,
    timeout: float,
    process: Optional[subprocess.Popen] = None,
    progress: Callable[[str], None] = quiet,
    registering: str = "extracting",
):
    """Poll the management API until each model has a READY worker. Fail as soon as the logs say why
    it will not happen (a model TorchServe could not register, a crash-looping worker, TorchServe
    exiting), with that reason, or once nothing moved for ``timeout`` seconds (``Patience``: no model
    changed state, its logs did not grow). ``progress`` hears of each model's state when it changes
    (``model_state``; ``registering`` names what a model not registered yet is going through)."""
    patience = Patience(timeout, [server.logs / "model_log.log"])  # the workers' output (ts_log logs each poll)
    pending = list(server.models)
    report = States(progress)
    while pending:
        if process is not None and process.poll() is not None:
            output_written(process)
            raise ServerFailure(f"TorchServe exited with code {process.returncode}: {startup_problem(server)}")
        if process is None and not group_alive(server.pid):  # started detached: the launcher has exited
            raise ServerFailure(f"TorchServe exited: {startup_problem(server)}")
        patience.note(tuple(sorted(report.seen.items())))
        if patience.expired():
            raise ServerFailure(f"models {', '.join(pending)} not READY, {patience.said()}: {startup_problem(server)}")
        refused = registration_failure(server)
        if refused:
            raise ServerFailure(
                f"TorchServe could not register a model: {refused} (full log: {server.logs / 'ts_log.log'})"
            )
        failure = worker_failure(server)
        if failure:
            whose = failing_model(server)
            raise ServerFailure(
                f"{f'model {whose}: ' if whose else ''}a model worker failed to start: {failure} "
                f"(full log: {server.logs / 'model_log.log'})"
            )
        states = {name: model_state(server, name, registering) for name in pending}
        if None in states.values():  # its APIs do not answer yet: they bind once the snapshot is registered
            early = startup_states(server, registering)
            if not early:
                report("TorchServe", "starting")
            for name, state in early.items():
                report(name, state)
        else:
            for name, state in states.items():
                report(name, state)
        pending = [name for name, state in states.items() if state != READY]
        if pending:
            time.sleep(0.5)
