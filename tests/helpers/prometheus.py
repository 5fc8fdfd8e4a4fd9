"""A real Prometheus (Debian's package: ``apt-get install -y prometheus``) scraping given targets every
second, each target labelled as the Prometheus Operator labels a pod's series (``namespace``, ``pod``),
on a free port with its config and storage in a temp directory; and a query through its HTTP API.
"""

import os
import shutil
import urllib.parse
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Optional

import yaml

from archiver.server import free_port, request

from .detached import detached
from .paths import short_tmp

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def prometheus_available() -> bool:
    return Path(PROMETHEUS).is_file() and os.access(PROMETHEUS, os.X_OK)


@contextmanager
def prometheus(targets: Dict[str, Dict[str, str]], interval: str = "1s", timeout: float = 30):
    """Prometheus scraping ``targets`` (``host:port`` -> its labels) at ``interval``; yields its base URL.
    Stopped by its own process group, its directory removed."""
    root = short_tmp("prom-")
    port = free_port()
    groups = [{"targets": [address], "labels": labels} for address, labels in targets.items()]
    scrape = {"job_name": "pods", "scrape_interval": interval, "metrics_path": "/metrics", "static_configs": groups}
    config = root / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": interval}, "scrape_configs": [scrape]}))
    argv = [
        PROMETHEUS,
        f"--config.file={config}",
        f"--storage.tsdb.path={root / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with detached(argv, root, f"http://127.0.0.1:{port}/-/ready", "prometheus", "output.log", timeout):
        yield f"http://127.0.0.1:{port}"


def query(url: str, promql: str) -> Optional[float]:
    """The value of an instant query with one series (None: no series), through /api/v1/query."""
    status, body = request(f"{url}/api/v1/query?query={urllib.parse.quote(promql)}", timeout=10)
    data = body if isinstance(body, dict) else {"status": "unreadable", "body": body}
    if status != 200 or data.get("status") != "success":
        raise RuntimeError(f"prometheus refused {promql!r}: {status} {body!r}")
    result = data["data"]["result"]
    if not result:
        return None
    assert len(result) == 1, result
    return float(result[0]["value"][1])
