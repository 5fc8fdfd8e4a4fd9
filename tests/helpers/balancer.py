"""Real replicas behind a real load balancer, for checking the autoscaling simulator
(archiver/autoscaling/autoscale_sim.py) against what can run on one machine: k tsctl engine replicas, each in a
cgroup CPU quota of its own (archiver/capacity/cgroup_limits.py, as ``tsctl bench --capacity --cpu`` makes one),
behind nginx (Debian's package:
``apt-get install -y nginx-light``) on a free port, with its config, pid and logs in a temp directory.
"""

import os
import shutil
import subprocess
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import List, Sequence

from archiver import engines
from archiver.capacity.cgroup_limits import PodLimits
from archiver.server import free_port

from .detached import detached
from .paths import short_tmp

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"

CONFIG = """\
worker_processes 1;
daemon off;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    client_max_body_size 32m;
    client_body_buffer_size 1m;
    upstream replicas {{
        least_conn;
{servers}
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


def nginx_available() -> bool:
    return Path(NGINX).is_file() and os.access(NGINX, os.X_OK)


@contextmanager
def nginx(upstreams: Sequence[str], timeout: float = 10):
    """nginx balancing ``upstreams`` (``host:port``) with least_conn; yields its base URL. Stopped by its
    own process group (started in a session of its own), its directory removed."""
    root = short_tmp("ngx-")
    root.chmod(0o755)  # nginx's workers run as another user when it starts as root: they write its temp files
    port = free_port()
    servers = "\n".join(f"        server {u} max_fails=0;" for u in upstreams)
    conf = root / "nginx.conf"
    conf.write_text(CONFIG.format(root=root, servers=servers, port=port))
    argv = [NGINX, "-p", str(root), "-e", str(root / "error.log"), "-c", str(conf)]
    with detached(argv, root, f"http://127.0.0.1:{port}/ping", "nginx", "error.log", timeout):
        yield f"http://127.0.0.1:{port}"


@contextmanager
def capped_replicas(count: int, cpu: float, model_store: Path, config: Path, timeout: float = 300):
    """``count`` tsctl engine replicas of the store, each started inside a cgroup of its own limited to
    ``cpu`` cores (every process it forks is born inside); yields their servers. Each is stopped and its
    group removed after. Raises when no cgroup can be made here (the check would mean nothing)."""
    with ExitStack() as stack:
        servers: List = []
        for _ in range(count):
            limits = PodLimits.make(cpu, None)
            if limits.reason:
                raise RuntimeError(limits.describe())
            stack.callback(limits.release)
            home = short_tmp("rep-")
            stack.callback(shutil.rmtree, home, True)
            with limits.joined():
                srv = engines.serve("tsctl", str(config), str(model_store), str(home), timeout)
            stack.callback(engines.engine_of(srv).stop, srv)
            if not limits.holds(srv.pid):
                raise RuntimeError("a replica did not start inside its cgroup")
            servers.append(srv)
        yield servers


MODEL_CONFIG = "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 8\nmaxBatchDelay: 20\nresponseTimeout: 120\n"


def resnet_tree(root: Path, images: int = 8):
    """A store with resnet18 (eager, the toolkit's image_classifier; 1 worker, batchSize 8, maxBatchDelay
    20 ms), its config.properties and ``images`` 640x480 JPEGs to send: (store, config, input paths)."""
    from archiver import properties
    from samples import image_model

    from .models import package_resnet

    store = root / "model-store"
    package_resnet(image_model.build(root / "image"), store, config_text=MODEL_CONFIG)
    config = properties.write_config(store, root / "config" / "config.properties")
    (root / "inputs").mkdir()
    inputs = []
    for seed in range(images):
        path = root / "inputs" / f"{seed}.jpg"
        path.write_bytes(image_model.sample_jpeg(seed, (640, 480)))
        inputs.append(path)
    return store, config, inputs


def bench_capacity(store: Path, config: Path, inputs, out: Path, cpu: float, seconds: float, most: int = 16):
    """``tsctl bench resnet18 --capacity --cpu CPU`` on the engine started on the store (a process of its
    own, as a user runs it); the result file read back."""
    import sys

    from archiver.capacity import sweep

    tsctl = Path(sys.executable).parent / "tsctl"
    command = [
        str(tsctl),
        "bench",
        "resnet18",
        "--capacity",
        "--model-store",
        str(store),
        "--config",
        str(config),
        "--engine",
        "tsctl",
        "--cpu",
        str(cpu),
        "--max-concurrency",
        str(most),
        "--duration",
        str(seconds),
        "--requests",
        "100000",
        "--out",
        str(out),
    ]
    for path in inputs:
        command += ["--input", str(path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"tsctl bench --capacity exited {done.returncode}: {done.stdout}{done.stderr[-2000:]}")
    print(done.stdout, flush=True)
    return sweep.load(out)


@contextmanager
def balanced(count: int, cpu: float, store: Path, config: Path, model: str = "resnet18"):
    """``count`` replicas capped at ``cpu`` behind nginx; yields the URL of ``model``'s predictions
    through it (warmed up: a few requests from 2 x count clients first)."""
    import urllib.parse

    with capped_replicas(count, cpu, store, config) as servers:
        upstreams = [urllib.parse.urlsplit(srv.inference).netloc for srv in servers]
        path = urllib.parse.urlsplit(engines.predict_url(servers[0], model)).path
        with nginx(upstreams) as base:
            yield base + path


def step_at(url: str, inputs, count: int, clients: int, seconds: float, load=None) -> dict:
    """One bounded load step of ``clients`` through ``url`` (capacity.step), as a row."""
    from archiver.capacity import sweep

    bodies = [(Path(p).read_bytes(), "image/jpeg") for p in inputs]
    step = sweep.step(url, bodies, clients, 100000, seconds)
    print(f"{count} replicas, {clients} clients: {sweep.step_line(step)}, load {load}", flush=True)
    return {"replicas": count, "clients": clients, "load": load, **step}


def through_nginx(count: int, cpu: float, store: Path, config: Path, inputs, per_replica, seconds: float) -> list:
    """``count`` replicas capped at ``cpu`` behind nginx, measured at count x c clients for each c of
    ``per_replica``."""
    from archiver.capacity import sweep

    with balanced(count, cpu, store, config) as url:
        bodies = [(Path(p).read_bytes(), "image/jpeg") for p in inputs]
        sweep.step(url, bodies, 2 * count, 16 * count, seconds)  # warm-up, not counted
        return [step_at(url, inputs, count, count * per, seconds) for per in per_replica]
