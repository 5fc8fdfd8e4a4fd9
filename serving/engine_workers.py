"""The tsctl engine's workers: TorchServe's own Python worker processes, driven as its frontend drives them.

Each worker is ``ts/model_service_worker.py`` (the file TorchServe's Java frontend starts), run the
way the frontend runs it: in the unpacked archive's directory, with that directory on
``PYTHONPATH``, ``TS_DECODE_INPUT_REQUEST`` from the config, listening on a Unix socket of its own.
The engine connects, sends the load command (model name and directory, handler, batch size, gpu,
envelope, limitMaxImagePixels) and then one inference command per batch, in the frontend's binary
protocol (``encode_load``, ``encode_batch``); the reply is read back as the frontend reads it
(``read_reply``: per request the status, content type, headers and body the handler set). So an
archive runs in its own process with its own imports, exactly as on TorchServe: no module swapping,
and one model's crash is that worker's alone.

``ModelWorkers`` is one model version on the engine: a bounded job queue (``job_queue_size``; a
full queue answers 503), batches gathered as TorchServe gathers them (up to ``batchSize`` within
``maxBatchDelay`` ms of the first request), and ``minWorkers`` workers each taking the next batch.

- **A worker that dies** (killed, out of memory, a handler calling ``sys.exit``) fails only the
  batch it held, as soon as its process ends (its socket shut down, even while a child it forked
  holds it): each of its requests gets 503 with the cause; a batch gathered but not yet sent goes
  back to the queue for the next free worker. Each worker runs in a process group of its own and is
  killed with it (``kill_group``): what it forked dies with it. A reply that does not parse
  (``BrokenReply``: a handler wrote to the worker's socket) fails its batch with 500 and the worker
  is killed, so the next requests meet a clean stream; any other error in a batch too (logged): the
  serve loop never ends before the engine, and a model whose loop has ended is not ready. The
  worker is started again, after 0, 1, 1, 2, 3, 5... seconds as TorchServe backs off.
- **responseTimeout** is enforced per batch: a worker that has not answered in time is killed, its
  requests get 503 naming the timeout, and it is started again.
- **max_response_size** is enforced per answer as the worker's reply is read (``Stream.reply``),
  its headers, content type and reason phrase counted with its body: an answer above it gets 500
  with TorchServe's message, its bytes dropped as they come; the worker and the batch's other
  answers are kept. An answer to a request id the batch does not hold is dropped as it comes.
- **Threads.** Each worker gets ``OMP_NUM_THREADS`` = the cores divided among the model's workers
  (unless the environment sets it), as the toolkit handlers divide them on TorchServe.
- **Metrics.** The worker is started through ``serving/worker_launch.py``, which sends the records
  of TorchServe's metrics logger (``ts.metrics.caching_metric``: ``HandlerTime``, ``PredictionTime``,
  a handler's own ``context.metrics``) to a pipe of their own, one record a line, and then runs
  ``model_service_worker.py`` unchanged. Those lines are handed to ``on_metric``; what the worker
  writes on stdout and stderr is only log text for the ``tsctl.worker`` log, even a line starting
  with ``[METRICS]`` (a handler printing a request's data cannot forge a metric).
- **Output volume.** A worker's log lines are logged up to ``WORKER_LOG_RATE`` bytes a second (after
  a burst of ``WORKER_LOG_BURST``); the rest is dropped and counted in one line once logging resumes,
  so that a handler printing without end cannot fill the disk or spend the engine's CPU on logging.
"""

import asyncio
import collections
import json
import logging
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Deque, Dict, List, Optional

import ts

from handlers.archives import printable

from .ts_config import Frontend, ModelSpec
from .ts_wire import (
    BrokenReply,
    Request,
    Response,
    Stream,
    WorkerDied,
    batch_error,
    cause_of,
    encode_batch,
    encode_load,
)

logger = logging.getLogger("tsctl.engine")
worker_log = logging.getLogger("tsctl.worker")

WORKER_SCRIPT = os.path.join(os.path.dirname(ts.__file__), "model_service_worker.py")
LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_launch.py")
METRICS_YAML = os.path.join(os.path.dirname(ts.__file__), "configs", "metrics.yaml")
BACKOFF = (0, 1, 1, 2, 3, 5, 8, 13, 21, 34)  # seconds before each restart, as TorchServe's
LOAD_TIMEOUT = 300.0  # s for a worker to start and load its model
MAX_LINE = 64 << 10  # bytes of one worker output line kept; the rest of a longer line is dropped
WORKER_LOG_RATE = 1 << 20  # bytes a second of one worker's output logged, once WORKER_LOG_BURST is spent
WORKER_LOG_BURST = 4 << 20  # bytes of one worker's output logged at once
PYTHON_ERROR = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception)\b:.*")


class NotSent(Exception):
    """The batch never reached the worker (its process had already ended): it may go to another."""


# ---- One worker process -------------------------------------------------------------------------
class WorkerProcess:
    """One running ``model_service_worker.py`` with the model loaded, and its socket."""

    def __init__(self, process: subprocess.Popen, sock: socket.socket, stream: Stream, started: float,
                 max_response_size: int = 6553500):  # fmt: skip
        self.process, self.sock, self.stream, self.started = process, sock, stream, started
        self.max_response_size = max_response_size
        self.readers: List[threading.Thread] = []  # the threads reading its output and metrics (start_worker)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def predict(self, requests: List[Request]) -> List[Response]:
        """One batch, blocking: NotSent if it never reached the worker, WorkerDied if the worker
        ended while it held the batch."""
        ids = [str(uuid.uuid4()) for _ in requests]
        pieces = encode_batch(requests, ids)
        if not self.alive():
            raise NotSent()
        try:
            for piece in pieces:  # a batch cut short is not one the worker can run: not sent either
                self.sock.sendall(piece)
        except OSError:
            raise NotSent() from None
        answers: Dict[str, Response] = {}
        parts: Dict[str, List[bytes]] = {}  # a streamed answer's chunks, joined once at its end
        sizes: Dict[str, int] = {}  # each answer's bytes so far, against max_response_size (Stream.reply)
        try:
            while True:  # a streaming handler (ts_stream_next) answers in several replies
                code, message, got = self.stream.reply(self.max_response_size, sizes, ids)
                if code != 200:
                    return batch_error(code, message, len(ids))
                for request_id, response in got.items():
                    if request_id not in answers or sizes[request_id] < 0:  # its first chunk, or too large
                        answers[request_id], parts[request_id] = response, [response.body or b""]
                    else:
                        answers[request_id].headers.update(response.headers)
                        parts[request_id].append(response.body or b"")
                if all(i in answers and answers[i].headers.get("ts_stream_next") != "true" for i in ids):
                    break
        except (OSError, struct.error) as exc:
            raise WorkerDied(str(exc)) from None
        for request_id, chunks in parts.items():
            if len(chunks) > 1:
                answers[request_id].body = b"".join(chunks)
        return [answers[i] for i in ids]

    def kill(self):
        """End the worker and whatever it forked (its process group, ``start_worker``), and shut its socket
        down so that a predict blocked on it returns at once, even while a forked child still holds it."""
        kill_group(self.process)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            pass


def kill_group(process: subprocess.Popen):
    """SIGKILL to a worker's process group: the worker and every process it forked, even once it has
    ended (TorchServe's frontend kills the worker process alone: a forked child would outlive it holding
    its socket and pipes)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:  # the group is gone: the worker and all its children have ended
        pass


def start_worker(
    spec: ModelSpec,
    model_dir: Path,
    handler: str,
    frontend: Frontend,
    socket_path: str,
    env: dict,
    on_line: Callable[[str], None],
    on_spawn: Callable[[subprocess.Popen], None] = lambda process: None,
    on_metric: Optional[Callable[[str], None]] = None,
) -> WorkerProcess:
    """Start a worker process and load the model in it, as the frontend does, within
    ``LOAD_TIMEOUT``; raises RuntimeError with the worker's own last error when it cannot load.
    ``on_line`` gets its log lines (within ``WORKER_LOG_RATE``), ``on_metric`` the lines of its
    metrics logger (None: they are log lines too); ``on_spawn`` gets the process as soon as it runs
    (so that a stopping engine can end a load)."""
    try:
        os.unlink(socket_path)
    except FileNotFoundError:
        pass
    metrics = frontend.metrics_config or METRICS_YAML
    metric_read, metric_write = os.pipe()
    command = [sys.executable, LAUNCHER, str(metric_write), WORKER_SCRIPT, "--sock-type", "unix"]
    command += ["--sock-name", socket_path, "--metrics-config", metrics]
    started = time.time()
    try:
        process = subprocess.Popen(
            command,
            cwd=model_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(metric_write,),
            process_group=0,  # its own group, the engine's session: kill_group ends what it forks with it
        )
    except BaseException:
        os.close(metric_read)
        raise
    finally:
        os.close(metric_write)
    on_spawn(process)
    lines: Deque[str] = collections.deque(maxlen=200)
    budget = OutputBudget(WORKER_LOG_RATE, WORKER_LOG_BURST)

    def log_line(line: str):
        lines.append(line)
        if budget.take(len(line)):
            if budget.dropped:
                on_line(budget.dropped_note())
            on_line(line)

    readers = [
        threading.Thread(target=read_lines, args=(process.stdout, log_line), name=f"out-{spec.name}-{process.pid}"),
        threading.Thread(
            target=read_lines,
            args=(os.fdopen(metric_read, "rb"), on_metric or log_line),
            name=f"metrics-{spec.name}-{process.pid}",
        ),
    ]
    for reader in readers:
        reader.daemon = True
        reader.start()
    deadline = time.monotonic() + LOAD_TIMEOUT
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        while True:  # the worker binds its socket once its imports are done
            if process.poll() is not None:
                raise WorkerDied(f"the worker exited with code {process.returncode}")
            try:
                sock.connect(socket_path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the worker did not listen within {LOAD_TIMEOUT:.0f}s") from None
                time.sleep(0.05)
        sock.settimeout(max(1.0, deadline - time.monotonic()))  # the load, too, within LOAD_TIMEOUT
        sock.sendall(
            encode_load(
                spec.name, model_dir, handler, spec.batch_size, frontend.envelope, frontend.limit_max_image_pixels
            )
        )
        stream = Stream(sock)
        code, message = stream.int(), stream.field().decode("utf-8", errors="replace")
        stream.int()  # the empty prediction list
        if code != 200:
            raise WorkerDied(f"{code} {message}")
        sock.settimeout(None)
    except BaseException as exc:
        sock.close()
        if not isinstance(exc, WorkerDied):
            kill_group(process)
        try:
            process.wait(5)  # a worker whose load failed exits by itself, its traceback written
        except subprocess.TimeoutExpired:
            kill_group(process)
            process.wait()
        kill_group(process)  # what it forked
        readers[0].join(5)  # every line it wrote read: its own error is among them
        if isinstance(exc, WorkerDied):
            raise RuntimeError(_last_error(lines) or str(exc)) from None
        if isinstance(exc, socket.timeout):
            raise RuntimeError(f"the worker did not load the model within {LOAD_TIMEOUT:.0f}s") from None
        if isinstance(exc, OSError):
            raise RuntimeError(f"the worker could not be started: {exc}") from None
        raise
    worker = WorkerProcess(process, sock, stream, started, frontend.max_response_size)
    worker.readers = readers
    return worker


def read_lines(stream, handle: Callable[[str], None]):
    """Each line of ``stream`` (a worker's pipe) to ``handle``, until it closes; of a line longer than
    ``MAX_LINE`` only the beginning."""
    with stream:
        cut = False  # inside the rest of a line longer than MAX_LINE
        while True:
            raw = stream.readline(MAX_LINE)
            if not raw:
                return
            if not cut:
                handle(raw.decode("utf-8", errors="replace").rstrip("\n"))
            cut = not raw.endswith(b"\n")


class OutputBudget:
    """How much of a worker's output is logged: ``rate`` bytes a second after a burst of ``burst``
    (a token bucket); ``take`` says whether a line is, and counts those that are not."""

    def __init__(self, rate: float, burst: float):
        self.rate, self.burst, self.tokens, self.at = rate, burst, burst, time.monotonic()
        self.dropped = self.dropped_bytes = 0
        self.lock = threading.Lock()  # a worker's stdout and (without on_metric) its metrics reader share it

    def take(self, size: int) -> bool:
        with self.lock:
            now = time.monotonic()
            self.tokens, self.at = min(self.burst, self.tokens + (now - self.at) * self.rate), now
            if size <= self.tokens:
                self.tokens -= size
                return True
            self.dropped += 1
            self.dropped_bytes += size
            return False

    def dropped_note(self) -> str:
        """The line logged in place of the lines dropped since the last (and the count reset)."""
        note = (
            f"[tsctl] {self.dropped:,} lines ({self.dropped_bytes:,} bytes) of this worker's output were not logged: "
            f"above {WORKER_LOG_RATE:,} bytes a second (WORKER_LOG_RATE)"
        )
        self.dropped = self.dropped_bytes = 0
        return note


def worker_log_line(worker, line: str):
    """A worker's output line, in the ``tsctl.worker`` log under its model and index (but the line
    TorchServe's worker writes for every request), its control characters escaped (``printable``: a
    handler's ESC, CR or NUL cannot restyle or rewrite the line, nor make it read as the engine's)."""
    if "Backend received inference at" in line:
        return
    worker_log.info("[%s w%d] %s", printable(worker.owner.label), worker.index, printable(line))


def _last_error(lines) -> Optional[str]:
    """The worker's own last Python error line (``ts_wire.cause_of``), escaped as its log line is."""
    error = cause_of([line.strip() for line in lines if PYTHON_ERROR.match(line)])
    return None if error is None else printable(error)


# ---- A model version's queue and workers ---------------------------------------------------------
class Job:
    __slots__ = ("request", "done", "arrived")

    def __init__(self, request: Request, done: asyncio.Future):
        self.request, self.done, self.arrived = request, done, time.perf_counter()


class JobQueue:
    """Requests waiting for a worker, in arrival order; ``batch`` gathers the next batch."""

    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self.items: Deque[Job] = collections.deque()
        self.changed = asyncio.Condition()

    def __len__(self):
        return len(self.items)

    async def put(self, job: Job) -> bool:
        if len(self.items) >= self.limit:
            return False
        self.items.append(job)
        async with self.changed:
            self.changed.notify()
        return True

    async def put_back(self, jobs: List[Job]):
        self.items.extendleft(reversed(jobs))
        async with self.changed:
            self.changed.notify(len(jobs))

    async def batch(self, size: int, delay: float) -> List[Job]:
        """Up to ``size`` jobs: the first to come, and those arriving within ``delay`` s of it."""
        taken: List[Job] = []
        try:
            async with self.changed:
                await self.changed.wait_for(lambda: self.items)
                taken.append(self.items.popleft())
                deadline = asyncio.get_running_loop().time() + delay
                while len(taken) < size:
                    if self.items:
                        taken.append(self.items.popleft())
                        continue
                    wait = deadline - asyncio.get_running_loop().time()
                    if wait <= 0:
                        break
                    try:
                        await asyncio.wait_for(self.changed.wait_for(lambda: self.items), wait)
                    except asyncio.TimeoutError:
                        break
        except asyncio.CancelledError:
            self.items.extendleft(reversed(taken))  # nothing taken is lost
            raise
        return [job for job in taken if not job.done.done()]  # clients that gave up are skipped


def unavailable(message: str, status: int = 503) -> Response:
    """The frontend's answer for a request no worker could answer."""
    body = json.dumps({"code": status, "type": "ServiceUnavailableException", "message": message}, indent=2)
    return Response(status, body.encode(), "application/json")


class Worker:
    """One worker slot of a model version: its process, restarted when it dies."""

    def __init__(self, owner: "ModelWorkers", index: int):
        self.owner, self.index = owner, index
        self.process: Optional[WorkerProcess] = None
        self.spawned: Optional[subprocess.Popen] = None  # the process while it loads
        self.status = "STARTING"  # READY, BUSY, STARTING (TorchServe: WORKER_STARTED / MODEL_LOADED ...)
        self.thread = ThreadPoolExecutor(1, thread_name_prefix=f"w-{owner.spec.name}-{index}")
        self.failures = 0
        self.task: Optional[asyncio.Task] = None
        self.died = asyncio.Event()
        self.load_seconds: Optional[float] = None

    @property
    def id(self) -> int:
        """TorchServe's worker id (its port, here the suffix of its socket's name)."""
        return self.owner.first_port + self.index

    @property
    def socket_path(self) -> str:
        return os.path.join(self.owner.run_dir, f".ts.sock.{self.id}")

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.status = "STARTING"
        self.died = asyncio.Event()
        died = self.died

        def on_line(line: str):
            self.owner.on_line(self, line)

        on_metric = None
        if self.owner.on_metric is not None:

            def on_metric(line: str):
                self.owner.on_metric(self, line)

        self.process = await loop.run_in_executor(
            self.thread,
            start_worker,
            self.owner.spec,
            self.owner.model_dir,
            self.owner.handler,
            self.owner.frontend,
            self.socket_path,
            self.owner.env,
            on_line,
            self._spawned,
            on_metric,
        )
        if self.owner.stopping:  # the engine began to stop while this worker loaded
            self.process.kill()
            raise asyncio.CancelledError()
        self.load_seconds = time.time() - self.process.started
        process = self.process.process
        threading.Thread(target=self._watch, args=(process, loop, died), daemon=True).start()
        self.status = "READY"
        self.failures = 0
        logger.info("%s worker %d ready (pid %d)", self.owner.label, self.index, self.process.pid)

    def _spawned(self, process: subprocess.Popen):
        self.spawned = process

    @staticmethod
    def _watch(process: subprocess.Popen, loop, died: asyncio.Event):
        """Tell the worker's loop when its process ends (while idle too)."""
        process.wait()
        try:
            loop.call_soon_threadsafe(died.set)
        except RuntimeError:  # the loop is closed: the engine has stopped
            pass

    async def serve(self):
        """Take batches off the queue and run them, for as long as the engine runs. Whatever goes wrong
        in one turn is logged and that worker replaced: the loop itself never ends before the engine."""
        while not self.owner.stopping:
            try:
                await self.serve_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - logged; the worker is replaced and the loop goes on
                logger.exception("%s worker %d: unexpected error; the worker is replaced", self.owner.label,
                                 self.index)  # fmt: skip
                if self.process is not None:
                    self.process.kill()
                await asyncio.sleep(1)

    async def serve_once(self):
        """Restart the worker if it is gone, else run the next batch on it."""
        owner = self.owner
        if self.process is None or not self.process.alive():
            await self._restart()
            return
        getting = asyncio.ensure_future(owner.queue.batch(owner.spec.batch_size, owner.spec.max_batch_delay / 1000))
        dying = asyncio.ensure_future(self.died.wait())
        await asyncio.wait({getting, dying}, return_when=asyncio.FIRST_COMPLETED)
        dying.cancel()
        if not getting.done():
            getting.cancel()
            try:
                await getting
            except asyncio.CancelledError:
                pass
            return  # died while idle: restarted next turn, nothing lost
        jobs = getting.result()
        if not jobs:
            return
        self.status = "BUSY"
        sent = time.perf_counter()
        try:
            responses = await self.run(jobs)
        except NotSent:
            await owner.queue.put_back(jobs)
            return
        except Exception as exc:  # noqa: BLE001 - whatever it was, this batch is answered and the worker replaced
            logger.exception("%s worker %d (pid %d): unexpected error in a batch: killed", owner.label, self.index,
                             self.process.pid)  # fmt: skip
            self.process.kill()
            message = f"the worker's batch failed ({type(exc).__name__}: {exc}); the worker was restarted"
            responses = batch_error(500, message, len(jobs))
        finally:
            self.status = "READY" if self.process is not None and self.process.alive() else "STARTING"
        owner.finished(jobs, responses, sent)

    async def run(self, jobs: List[Job]) -> List[Response]:
        """One batch on the worker: its answers, or what each request gets when the worker's process ends
        (at once: its socket shut down, whatever it forked killed), when it passes responseTimeout, or
        when its reply cannot be read (``BrokenReply``); in each case the worker is killed (serve
        restarts it). NotSent when the batch never reached it."""
        owner, process, loop = self.owner, self.process, asyncio.get_running_loop()
        timeout = owner.spec.response_timeout
        predicting = loop.run_in_executor(self.thread, process.predict, [j.request for j in jobs])
        dying = asyncio.ensure_future(self.died.wait())
        try:
            await asyncio.wait({predicting, dying}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            dying.cancel()
        if not predicting.done():
            died = self.died.is_set()
            process.kill()  # a predict blocked on the socket returns: the next load does not queue behind it
            await asyncio.wait({predicting}, timeout=5)
            if not died:
                logger.error("%s worker %d (pid %d) did not answer within %ds: killed", owner.label, self.index,
                             process.pid, timeout)  # fmt: skip
                message = f"the worker did not answer within responseTimeout ({timeout}s) and was restarted"
                return [unavailable(message)] * len(jobs)
            return self.died_with(jobs, "its process ended")
        try:
            return predicting.result()
        except WorkerDied as exc:
            try:  # the socket closed: the process ends with it, or is ended
                await asyncio.wait_for(self.died.wait(), 2)
            except asyncio.TimeoutError:
                pass
            process.kill()
            return self.died_with(jobs, str(exc))
        except BrokenReply as exc:
            logger.error("%s worker %d (pid %d): its reply could not be read (%s): killed", owner.label, self.index,
                         process.pid, exc)  # fmt: skip
            process.kill()
            message = f"the worker's reply could not be read ({exc}); the worker was restarted"
            return batch_error(500, message, len(jobs))

    def died_with(self, jobs: List[Job], detail: str) -> List[Response]:
        """503 for each request of a worker that died holding them, with the cause."""
        code = self.process.process.poll()
        if code is None:
            cause = "its socket closed"
        else:
            cause = f"signal {-code}" if code < 0 else f"exit code {code}"
        logger.error("%s worker %d (pid %d) died (%s): %s", self.owner.label, self.index, self.process.pid, cause,
                     detail)  # fmt: skip
        return [unavailable(f"Worker died ({cause}) while it held this request.")] * len(jobs)

    async def _restart(self):
        self.status = "STARTING"
        if self.process is not None:
            self.process.kill()
            self.process = None
        self.thread.shutdown(wait=False)  # a fresh thread for the next process: nothing of the last queues ahead
        self.thread = ThreadPoolExecutor(1, thread_name_prefix=f"w-{self.owner.spec.name}-{self.index}")
        wait = BACKOFF[min(self.failures, len(BACKOFF) - 1)]
        self.failures += 1
        if wait:
            await asyncio.sleep(wait)
        if self.owner.stopping:
            return
        try:
            await self.start()
        except Exception as exc:  # noqa: BLE001 - whatever stopped it, the next attempt comes after the backoff
            logger.error("%s worker %d could not start: %s: %s", self.owner.label, self.index, type(exc).__name__, exc)

    def stop(self):
        if self.task is not None:
            self.task.cancel()
        if self.process is not None:
            self.process.kill()
        if self.spawned is not None and self.spawned.poll() is None:  # still loading
            kill_group(self.spawned)
        self.thread.shutdown(wait=False)


class ModelWorkers:
    """One model version: its queue, its workers, and what it counts for /metrics and describe."""

    def __init__(self, spec: ModelSpec, model_dir: Path, handler: str, frontend: Frontend, run_dir: str,
                 first_port: int, env: dict, on_line: Callable, on_metric: Optional[Callable] = None):  # fmt: skip
        self.spec, self.model_dir, self.handler, self.frontend = spec, model_dir, handler, frontend
        self.run_dir, self.first_port, self.env, self.on_line = run_dir, first_port, env, on_line
        self.on_metric = on_metric  # (worker, line) for each line of its metrics logger; None: logged
        self.label = f"{spec.name} {spec.version}"
        self.queue = JobQueue(frontend.job_queue_size)
        self.workers = [Worker(self, i) for i in range(spec.min_workers)]
        self.observe: Callable = lambda jobs, responses, sent, done: None  # metrics hook
        self.stopping = False

    async def start(self):
        """Start every worker and wait until each has loaded the model; RuntimeError if one cannot."""
        await asyncio.gather(*(w.start() for w in self.workers))
        for worker in self.workers:
            worker.task = asyncio.ensure_future(worker.serve())

    @property
    def ready(self) -> bool:
        """Every worker up and its serve loop running (a loop that ended would leave requests waiting)."""
        return all(w.status in ("READY", "BUSY") and (w.task is None or not w.task.done()) for w in self.workers)

    async def submit(self, request: Request) -> Response:
        if self.stopping:
            return unavailable("the engine is stopping: retry on another replica")
        done = asyncio.get_running_loop().create_future()
        if not await self.queue.put(Job(request, done)):
            return unavailable(
                f"model {self.spec.name} version {self.spec.version}: its job queue is full "
                f"({self.queue.limit} requests, job_queue_size): retry later"
            )
        return await done

    def finished(self, jobs: List[Job], responses: List[Response], sent: float):
        done_at = time.perf_counter()
        for job, response in zip(jobs, responses):
            if not job.done.done():
                job.done.set_result(response)
        self.observe(jobs, responses, sent, done_at)

    def begin_stop(self):
        """No worker starts again; every request still queued is answered 503 now (a batch a worker
        holds is answered as usual)."""
        self.stopping = True
        while self.queue.items:
            job = self.queue.items.popleft()
            if not job.done.done():
                job.done.set_result(unavailable("the engine is stopping: retry on another replica"))

    def stop(self):
        self.begin_stop()
        for worker in self.workers:
            worker.stop()


def open_model(
    spec: ModelSpec,
    frontend: Frontend,
    unpack_dir: str,
    first_port: int,
    decode_default=None,
    on_line=None,
    on_metric=None,
) -> ModelWorkers:
    """One model version ready to start: its archive unpacked into ``unpack_dir`` and checked (the
    signature first when ``frontend.public_key`` asks, before any of its code can run), its workers'
    environment made as TorchServe's frontend makes it. ``decode_default(model_dir)``: whether its
    requests are decoded (None: the config's ``decode_input_request``); ``on_line(worker, line)`` gets
    the lines a worker prints (default: the ``tsctl.worker`` log), ``on_metric(worker, line)`` those of
    its metrics logger (default: logged as the others)."""
    from handlers import signing
    from handlers.archives import check_inside, read_manifest, unpack

    model_dir = unpack(spec.archive, unpack_dir).resolve()
    if frontend.public_key:  # before any of the archive's code can run; signed as the snapshot's name and version
        signing.verify(model_dir, frontend.public_key, spec.archive.name, spec.name, spec.version)
    manifest = read_manifest(model_dir)
    check_inside(model_dir, manifest)
    model = manifest["model"]
    if model.get("modelName") != spec.name:
        logger.info("%s: served as %s (its manifest says %s)", spec.archive, spec.name, model["modelName"])
    decode = frontend.decode_input_request if decode_default is None else decode_default(model_dir)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(model_dir), os.environ.get("PYTHONPATH")) if p)
    env["TS_DECODE_INPUT_REQUEST"] = "true" if decode else "false"
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // spec.min_workers)))
    run_dir = str(Path(unpack_dir).parent)
    return ModelWorkers(
        spec, model_dir, model["handler"], frontend, run_dir, first_port, env, on_line or worker_log_line, on_metric
    )
