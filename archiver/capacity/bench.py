"""Load generation against a running TorchServe: ``tsctl bench``.

Bounded in count and time: a run stops after ``requests`` requests or ``duration`` seconds, whichever
is given (both: whichever comes first), and never later than ``MAX_BENCH_SECONDS``: a request still
unanswered then is cut, whatever the server drips, and not counted (``LoadResult.cut``), as a load
generator leaves out what is in flight at its end. A request unanswered after ``timeout``, or whose
answer passes http_client's ``MAX_ANSWER_BYTES`` (answers are read and dropped), is an error, its cause
kept (``LoadResult.problems``). Each of ``concurrency`` threads keeps one HTTP keep-alive connection
(http_client's ``Connection``, a deadline per call) and sends the inputs in turn. A sweep
re-registers the model with each batchSize/maxBatchDelay through the management API (the server needs
the model API on: ``tsctl serve --enable-model-api``) and recommends the setting with the best
throughput. The concurrency sweep of ``bench --capacity`` is archiver/capacity/sweep.py.
"""

import http.client
import itertools
import statistics
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from handlers.requests import content_type

from ..choices import MAX_BENCH_SECONDS
from ..errors import ServerFailure, UserError
from ..http_client import AnswerError, Connection, late, read_body
from ..server import request


@dataclass
class LoadResult:
    seconds: float
    latencies_ms: List[float] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)
    problems: Counter = field(default_factory=Counter)  # why requests had no answer (status 0), where known
    cut: Counter = field(default_factory=Counter)  # requests in flight when the run ended: not counted, by why

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    @property
    def errors(self) -> int:
        return self.requests - self.statuses.get(200, 0)

    @property
    def throughput(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def percentile(self, p: int) -> float:
        """The ``p``th percentile (1 to 99) of the latencies: linear interpolation between the two nearest
        of the sorted values (``statistics.quantiles``' inclusive method, numpy's and Excel's default
        percentile); NaN without any."""
        if not self.latencies_ms:
            return float("nan")
        if len(self.latencies_ms) == 1:  # quantiles wants two values before Python 3.13
            return self.latencies_ms[0]
        return statistics.quantiles(self.latencies_ms, n=100, method="inclusive")[p - 1]

    def summary(self) -> dict:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
            "throughput_rps": round(self.throughput, 2),
            "latency_ms": {
                "p50": round(self.percentile(50), 2),
                "p90": round(self.percentile(90), 2),
                "p99": round(self.percentile(99), 2),
                "mean": round(statistics.fmean(self.latencies_ms), 2) if self.latencies_ms else None,
            },
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
        }


def summary_line(summary: dict) -> str:
    """``Result.summary()`` as tsctl bench prints it; the statuses of the requests that failed."""
    head = f"{summary['requests']} requests in {summary['seconds']:.1f}s: {summary['throughput_rps']:.1f} req/s"
    failed = {status: n for status, n in summary["statuses"].items() if status != "200"}
    errors = f"{summary['errors']} errors" + (
        " (" + ", ".join(f"{n} answered {status}" for status, n in failed.items()) + ")" if failed else ""
    )
    lat = summary["latency_ms"]
    if lat["p50"] != lat["p50"] or lat["p50"] is None:  # nothing answered 200: no latency to report
        return f"{head}, {errors}: none answered 200"
    return f"{head}, p50 {lat['p50']:.1f} ms, p90 {lat['p90']:.1f} ms, p99 {lat['p99']:.1f} ms, {errors}"


def read_inputs(paths: Sequence[str]) -> List[Tuple[bytes, str]]:
    inputs = []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise UserError(f"--input {path} does not exist")
        inputs.append((p.read_bytes(), content_type(p)))
    return inputs


def run_load(
    url: str,
    inputs: Sequence[Tuple[bytes, str]],
    concurrency: int,
    requests: Optional[int] = None,
    duration: Optional[float] = None,
    headers: Optional[Dict[str, str]] = None,
    timeout: float = 60,
) -> LoadResult:
    """POST ``inputs`` round-robin to ``url`` from ``concurrency`` threads until the bound is reached
    (``requests`` and ``duration`` both given: the first reached)."""
    if requests is None and duration is None:
        raise UserError("give --requests, --duration or both: a benchmark must be bounded")
    if concurrency < 1 or (requests is not None and requests < 1) or (duration is not None and duration <= 0):
        raise UserError("--concurrency, --requests and --duration must be positive")
    parsed = urllib.parse.urlsplit(url)
    deadline = time.monotonic() + min(duration or MAX_BENCH_SECONDS, MAX_BENCH_SECONDS)
    ends = f"--duration {duration:g} s" if duration else f"the run's {MAX_BENCH_SECONDS} s"
    counter = itertools.count()
    lock = threading.Lock()
    result = LoadResult(seconds=0.0)

    def worker():
        connection = Connection(parsed.hostname, parsed.port)
        try:
            while time.monotonic() < deadline:
                index = next(counter)
                if requests is not None and index >= requests:
                    return
                body, content_type = inputs[index % len(inputs)]
                started = time.perf_counter()
                sent = (parsed.path, body, {"Content-Type": content_type, **(headers or {})})
                status, problem = send(connection, url, sent, timeout, deadline, ends)
                elapsed = (time.perf_counter() - started) * 1000
                if not status:  # no whole answer: the connection starts again
                    connection.close()
                with lock:
                    if status is None:
                        result.cut[problem] += 1
                        continue
                    result.statuses[status] += 1
                    if problem:
                        result.problems[problem] += 1
                    if status == 200:
                        result.latencies_ms.append(elapsed)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(MAX_BENCH_SECONDS + timeout)
    result.seconds = time.perf_counter() - started
    return result


def send(connection: Connection, url: str, sent: tuple, timeout: float, deadline: float, ends: str):
    """One POST of ``sent`` (path, body, headers) on ``connection``, ended by ``timeout`` or by the run's
    ``deadline`` (the bound ``ends`` names), whichever comes first; its answer read and dropped (within
    ``MAX_ANSWER_BYTES``). (status, None), else (0, why) for an answer past a bound, (0, None) for a server
    that could not be reached or did not speak HTTP, (None, why) for a request the run's end cut."""
    left = deadline - time.monotonic()
    connection.until(min(timeout, left))
    try:
        connection.request("POST", *sent)
        response = connection.getresponse()
        read_body(response, url, keep=False)
        return response.status, None
    except TimeoutError:
        if timeout < left:
            return 0, str(late(url, timeout))
        return None, f"{url} had not answered when {ends} ended"
    except AnswerError as exc:  # more than MAX_ANSWER_BYTES
        return 0, str(exc)
    except (OSError, http.client.HTTPException):
        return 0, None


def register(management: str, model: str, mar_url: str, batch_size: int, delay: int, headers=None, timeout=300):
    """Replace ``model`` with the same archive at another batchSize/maxBatchDelay; wait for a worker."""
    status, body = request(f"{management}/models/{model}", method="DELETE", headers=headers, timeout=timeout)
    if status == 405:  # TorchServe 0.11+ answers 405 to register/unregister while the model API is off
        raise UserError("the server's model API is off: start it with 'tsctl serve --enable-model-api' to sweep")
    if status not in (200, 404):
        raise ServerFailure(f"could not unregister {model}: {status} {body}")
    query = urllib.parse.urlencode(
        {
            "url": mar_url,
            "model_name": model,
            "batch_size": batch_size,
            "max_batch_delay": delay,
            "initial_workers": 1,
            "synchronous": "true",
        }
    )
    status, body = request(f"{management}/models?{query}", data=b"", method="POST", headers=headers, timeout=timeout)
    if status != 200:
        raise ServerFailure(f"could not register {model} with batchSize {batch_size}: {status} {body}")


def model_url(management: str, model: str, headers=None) -> str:
    status, body = request(f"{management}/models/{model}", headers=headers, timeout=30)
    if status != 200:
        raise UserError(f"model {model} is not registered on the server: {status} {body}")
    return body[0]["modelUrl"]


def sweep(
    inference: str,
    management: str,
    model: str,
    inputs,
    concurrency: int,
    batch_sizes: Sequence[int],
    delays: Sequence[int],
    requests: Optional[int] = None,
    duration: Optional[float] = None,
    headers=None,
    progress=lambda message: None,
    management_headers=None,
) -> List[dict]:
    """One load run per (batchSize, maxBatchDelay); rows sorted as measured, best marked. ``progress``
    hears of each setting as it starts (archiver.output.Progress). ``headers`` go with the requests,
    ``management_headers`` with the management calls (the two keys of a server with token authorization)."""
    admin = management_headers if management_headers is not None else headers
    mar_url = model_url(management, model, admin)
    rows = []
    settings = list(itertools.product(batch_sizes, delays))
    for number, (batch_size, delay) in enumerate(settings, 1):
        progress(f"{number}/{len(settings)}: batchSize {batch_size}, maxBatchDelay {delay} ms: registering, warming")
        register(management, model, mar_url, batch_size, delay, admin)
        url = f"{inference}/predictions/{model}"
        run_load(url, inputs, concurrency, requests=min(requests or 16, 16), headers=headers)  # warm-up
        result = run_load(url, inputs, concurrency, requests=requests, duration=duration, headers=headers)
        rows.append({"batchSize": batch_size, "maxBatchDelay": delay, **result.summary()})
    best = max((r for r in rows if r["errors"] == 0), key=lambda r: r["throughput_rps"], default=None)
    for row in rows:
        row["recommended"] = row is best
    if best is not None:  # leave the model running with the recommended setting
        register(management, model, mar_url, best["batchSize"], best["maxBatchDelay"], admin)
    return rows
