"""One TorchServe worker process, started and driven as TorchServe's frontend does it.

Each worker is ``ts/model_service_worker.py`` (the file TorchServe's Java frontend starts), run the
way the frontend runs it: in the unpacked archive's directory, with that directory on
``PYTHONPATH``, ``TS_DECODE_INPUT_REQUEST`` from the config, listening on a Unix socket of its own.
``start_worker`` connects, sends the load command (model name and directory, handler, batch size,
the GPU serving/gpus.py placed it on, envelope, limitMaxImagePixels) and ``WorkerProcess.predict`` then one
inference command per batch, in the frontend's binary protocol (``ts_wire.encode_load``, ``encode_batch``); the reply is
read back as the frontend reads it (per request the status, content type, headers and body the
handler set). So an archive runs in its own process with its own imports, exactly as on
TorchServe: no module swapping, and one model's crash is that worker's alone.

- **Descendants.** Each worker runs in a process group of its own and is a child subreaper
  (``worker_launch.py``); it is killed with its group and everything below it (``kill_worker``,
  ``process_tree.end_tree``): what it forked dies with it, a double-forked daemon in a session of its
  own too.
- **max_response_size** is enforced per answer as the worker's reply is read (``Stream.reply``),
  its headers, content type and reason phrase counted with its body: an answer above it gets 500
  with TorchServe's message, its bytes dropped as they come; the worker and the batch's other
  answers are kept. An answer to a request id the batch does not hold is dropped as it comes.
- **Metrics.** The worker is started through ``serving/worker/worker_launch.py``, which sends the records
  of TorchServe's metrics logger (``ts.metrics.caching_metric``: ``HandlerTime``, ``PredictionTime``,
  a handler's own ``context.metrics``) to a pipe of their own, one record a line, and then runs
  ``model_service_worker.py`` unchanged. Those lines are handed to ``on_metric``; what the worker
  writes on stdout and stderr is only log text, even a line starting with ``[METRICS]`` (a handler
  printing a request's data cannot forge a metric).
- **Output volume.** A worker's log lines are handed on up to ``WORKER_LOG_RATE`` bytes a second
  (after a burst of ``WORKER_LOG_BURST``); the rest is dropped and counted in one line once logging
  resumes, so that a handler printing without end cannot fill the disk or spend the engine's CPU on
  logging.
"""

import collections
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
from http import HTTPStatus
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, Union

import ts

from handlers.archives import printable

from ..frontend_settings import Frontend
from ..ts_config import ModelSpec
from . import sockets
from .fork_server import ForkedProcess, ForkServer
from .process_tree import end_tree
from .ts_wire import RequestInput, Response, Stream, WorkerDied, batch_error, cause_of, encode_batch, encode_load

WORKER_SCRIPT = os.path.join(os.path.dirname(ts.__file__), "model_service_worker.py")
LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_launch.py")
METRICS_YAML = os.path.join(os.path.dirname(ts.__file__), "configs", "metrics.yaml")
LOAD_TIMEOUT = 300.0  # s for a worker to start and load its model
MAX_LINE = 64 << 10  # bytes of one worker output line kept; the rest of a longer line is dropped
WORKER_LOG_RATE = 1 << 20  # bytes a second of one worker's output logged, once WORKER_LOG_BURST is spent
WORKER_LOG_BURST = 4 << 20  # bytes of one worker's output logged at once
CAUSE_WAIT = 1.0  # s a batch's failure waits for the handler's error to be read from the worker's log
MAX_CAUSE = 500  # characters of the handler's error put after "Prediction failed"
FAILED = "Prediction failed"  # ts/service.py's message for a batch its handler's entry point raised on
PYTHON_ERROR = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception)\b:.*")


OnPart = Callable[[int, Response], None]  # (index of the request in the batch, a part of its streamed answer)


class NotSent(Exception):
    """The batch never reached the worker (its process had already ended): it may go to another."""


# ---- One worker process -------------------------------------------------------------------------
class WorkerProcess:
    """One running ``model_service_worker.py`` with the model loaded, and its socket."""

    def __init__(
        self,
        process: subprocess.Popen,
        sock: socket.socket,
        stream: Stream,
        started: float,
        max_response_size: int = 6553500,
    ):
        self.process, self.sock, self.stream, self.started = process, sock, stream, started
        self.max_response_size = max_response_size
        self.readers: List[threading.Thread] = []  # the threads reading its output and metrics (start_worker)
        self.output: Optional[Output] = None  # its log lines as read (start_worker)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def predict(self, requests: List[RequestInput], on_part: Optional[OnPart] = None) -> List[Response]:
        """One batch, blocking: NotSent if it never reached the worker, WorkerDied if the worker
        ended while it held the batch. A streamed answer (a handler calling
        ``send_intermediate_predict_response``: parts with ``ts_stream_next: true``, then the last)
        goes to ``on_part(index, part)`` part by part as the worker sends them, but its last part,
        which is returned; an answer passing ``max_response_size`` there is one part of its own
        (``too_large``, ``error``), and what the handler sends after it is dropped. Without
        ``on_part`` the parts are joined into one answer."""
        ids = [str(uuid.uuid4()) for _ in requests]
        seen = self.output.logged if self.output else 0
        self.send(requests, ids)
        reading = Replies(ids, on_part)
        try:
            while not reading.complete():  # a streaming handler (ts_stream_next) answers in several replies
                code, message, got = self.stream.reply(self.max_response_size, reading.sizes, ids)
                if code != 200:
                    return batch_error(code, self.with_cause(message, seen, len(ids)), len(ids))
                reading.take(got)
        except (OSError, struct.error) as exc:
            raise WorkerDied(str(exc)) from None
        return reading.answers()

    def with_cause(self, message: str, seen: int, clients: int) -> str:
        """TorchServe's "Prediction failed" (ts/service.py: the handler raised for the whole batch) with the
        handler's error after it, the last Python error the worker logged since its ``seen``-th line (the
        worker logs it before it replies; its output is read by a thread, so it is waited for, up to
        ``CAUSE_WAIT`` s). A batch of several requests gets the error's name alone: its message may quote
        another client's input. Any other message (a PredictionException's own, "Out of resources") as it is."""
        if message != FAILED or self.output is None:
            return message
        cause = self.output.error_since(seen, CAUSE_WAIT)
        if not cause:
            return message
        if clients > 1:
            name = cause.split(":")[0]
            return f"{message}: {name} (in a batch of {clients} requests: the engine's log has its message)"
        return f"{message}: {cause[:MAX_CAUSE]}"

    def send(self, requests: List[RequestInput], ids: List[str]):
        """The inference command for a batch, on the worker's socket; NotSent when it did not get there
        whole (a batch cut short is not one the worker can run: not sent either)."""
        pieces = encode_batch(requests, ids)
        if not self.alive():
            raise NotSent()
        try:
            for piece in pieces:
                self.sock.sendall(piece)
        except OSError:
            raise NotSent() from None

    def step(self, requests: List[RequestInput], ids: List[str], sizes: Dict[str, int]) -> List[Response]:
        """One step of a continuous batch (TorchServe's ContinuousBatching), blocking: the requests under
        ``ids`` (the ids they keep from step to step; one in the handler's cache already sent with no
        parameters), and the worker's one reply, each answer with its ``ts_stream_next`` (more steps to
        come) or without (its last). ``sizes``: each answer's bytes so far, against ``max_response_size``.
        NotSent and WorkerDied as ``predict``."""
        seen = self.output.logged if self.output else 0
        self.send(requests, ids)
        try:
            code, message, got = self.stream.reply(self.max_response_size, sizes, ids)
        except (OSError, struct.error) as exc:
            raise WorkerDied(str(exc)) from None
        if code != 200:
            return batch_error(code, self.with_cause(message, seen, len(ids)), len(ids))
        unanswered = "the handler gave this request no answer in its batch"
        missing = batch_error(HTTPStatus.INTERNAL_SERVER_ERROR, unanswered, 1)[0]
        return [got.get(request_id, missing) for request_id in ids]

    def steps(self, requests: List[RequestInput]) -> List[Response]:
        """A continuous batch run to its end, blocking (``LocalModel``: ``tsctl run``, in-process ``verify``):
        ``step`` after ``step``, each request sent again (no parameters, as ``continuous.step``)
        while its answer says ``ts_stream_next``, its parts joined into one answer as ``predict`` joins
        them. NotSent and WorkerDied as ``predict``."""
        ids = [str(uuid.uuid4()) for _ in requests]
        reading, sent = Replies(ids, None), set()
        while not reading.complete():
            left = [request_id for request_id in ids if request_id not in reading.last]
            batch = [
                RequestInput(b"", requests[reading.index[i]].headers, inputs=[])
                if i in sent
                else requests[reading.index[i]]
                for i in left
            ]
            sent.update(left)
            reading.take(dict(zip(left, self.step(batch, left, reading.sizes))))
        return reading.answers()

    def kill(self):
        """End the worker and whatever it forked (its process group, ``start_worker``), and shut its socket
        down so that a predict blocked on it returns at once, even while a forked child still holds it."""
        kill_worker(self.process)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            pass


class Replies:
    """A batch's answers as the worker's replies bring them: each request's, whole or part by part."""

    def __init__(self, ids: List[str], on_part: Optional[OnPart]):
        self.ids, self.on_part = ids, on_part
        self.index = {request_id: index for index, request_id in enumerate(ids)}
        self.last: Dict[str, Response] = {}  # each request's last part (or whole answer)
        self.joined: Dict[str, Tuple[Response, List[bytes]]] = {}  # without on_part: a stream's parts so far
        self.failed: Dict[str, Response] = {}  # a stream past max_response_size: its one error part
        self.sizes: Dict[str, int] = {}  # each answer's bytes so far, against max_response_size (Stream.reply)

    def complete(self) -> bool:
        return len(self.last) == len(self.ids)

    def take(self, got: Dict[str, Response]):
        for request_id, response in got.items():
            if request_id in self.last:
                continue  # an answer already ended: nothing the worker sends for it now is kept
            if response.error and request_id not in self.failed:  # past max_response_size, just now
                self.failed[request_id] = response
                self.joined.pop(request_id, None)
                if response.streams and self.on_part is not None:
                    self.on_part(self.index[request_id], response)
            if not response.streams:
                self.last[request_id] = self.failed.get(request_id, response)
            elif request_id in self.failed:
                continue  # the rest of a stream that failed: dropped as it comes
            elif self.on_part is not None:
                self.on_part(self.index[request_id], response)
            else:
                self.join(request_id, response)

    def join(self, request_id: str, response: Response):
        first = self.joined.setdefault(request_id, (response, []))[0]
        if first is not response:
            first.headers.update(response.headers)
        self.joined[request_id][1].append(response.body or b"")

    def answers(self) -> List[Response]:
        for request_id, (first, chunks) in self.joined.items():
            last = self.last[request_id]
            if last.error:
                continue
            first.headers.update(last.headers)
            first.body = b"".join([*chunks, last.body or b""])
            self.last[request_id] = first
        return [self.last[i] for i in self.ids]


def kill_worker(process: subprocess.Popen):
    """SIGKILL to a worker and every process below it (``end_tree``, while it runs: once it has ended, what it
    left went to its fork server, which ends it), and to its process group, even once it has ended
    (TorchServe's frontend kills the worker process alone: a forked child would outlive it holding its
    socket and pipes)."""
    if process.poll() is None:
        end_tree(process.pid)
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
    fork_server: Optional[ForkServer] = None,
    gpu: int = -1,
) -> WorkerProcess:
    """Start a worker process and load the model in it, as the frontend does, on GPU ``gpu`` (-1: the CPU;
    serving/gpus.py places it), within its ``startupTimeout`` (``LOAD_TIMEOUT`` when it gives none);
    raises RuntimeError with the worker's own last error when it cannot load
    (``sockets.SocketPathError``, before anything starts, when ``socket_path`` is too long for a socket).
    ``on_line`` gets its log lines (within ``WORKER_LOG_RATE``), ``on_metric`` the lines of its
    metrics logger (None: they are log lines too); ``on_spawn`` gets the process as soon as it runs
    (so that a stopping engine can end a load). With ``fork_server`` the worker is forked from it
    (``serving/worker/fork_server.py``) unless the archive shadows a module it has imported."""
    sockets.check(socket_path)  # "AF_UNIX path too long" said in one line, before a process starts
    try:
        os.unlink(socket_path)
    except FileNotFoundError:
        pass
    started = time.time()
    timeout = spec.startup_timeout or LOAD_TIMEOUT
    process, metric_read = spawn(model_dir, frontend.metrics_config or METRICS_YAML, socket_path, env, fork_server)
    on_spawn(process)
    lines, readers = read_output(spec.name, process, metric_read, on_line, on_metric)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        load = encode_load(
            spec.name, model_dir, handler, spec.batch_size, frontend.envelope, frontend.limit_max_image_pixels, gpu
        )
        stream = connect_and_load(process, sock, socket_path, load, timeout)
    except BaseException as exc:
        sock.close()
        end_failed_load(process, readers[0], killed=not isinstance(exc, WorkerDied))
        if isinstance(exc, WorkerDied):
            raise RuntimeError(_last_error(lines) or str(exc)) from None
        if isinstance(exc, socket.timeout):
            raise RuntimeError(f"the worker did not load the model within {timeout:.0f}s (startupTimeout)") from None
        if isinstance(exc, OSError):
            raise RuntimeError(f"the worker could not be started: {exc}") from None
        raise
    worker = WorkerProcess(process, sock, stream, started, frontend.max_response_size)
    worker.readers, worker.output = readers, lines
    return worker


def spawn(
    model_dir: Path, metrics: str, socket_path: str, env: dict, fork_server: Optional[ForkServer] = None
) -> Tuple[Union[subprocess.Popen, ForkedProcess], int]:
    """The worker process, in a process group of its own, and the read end of its metrics pipe:
    forked from ``fork_server`` when there is one and it takes the worker (``ForkServer.spawn``: not
    when the worker's ``PYTHONPATH``, the archive's folder first, shadows one of its modules), else a
    new process."""
    metric_read, metric_write = os.pipe()
    args = [WORKER_SCRIPT, "--sock-type", "unix", "--sock-name", socket_path, "--metrics-config", metrics]
    try:
        if fork_server is not None:
            out_read, out_write = os.pipe()
            try:
                process = fork_server.spawn(args, str(model_dir), env, out_write, metric_write)
            except BaseException:
                os.close(out_read)
                raise
            finally:
                os.close(out_write)
            if process is not None:
                process.stdout = os.fdopen(out_read, "rb")
                return process, metric_read
            os.close(out_read)
        process = subprocess.Popen(
            [sys.executable, LAUNCHER, str(metric_write), *args],
            cwd=model_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(metric_write,),
            process_group=0,  # its own group, the engine's session: kill_worker ends what it forks with it
        )
    except BaseException:
        os.close(metric_read)
        raise
    finally:
        os.close(metric_write)
    return process, metric_read


def read_output(
    name: str,
    process: subprocess.Popen,
    metric_read: int,
    on_line: Callable[[str], None],
    on_metric: Optional[Callable[[str], None]],
) -> Tuple["Output", List[threading.Thread]]:
    """Threads reading the worker's output (to ``on_line``, within ``WORKER_LOG_RATE``) and its metrics
    pipe (to ``on_metric``, else as log lines): its last 200 lines, and the two readers (the output's first)."""
    lines = Output()
    budget = OutputBudget(WORKER_LOG_RATE, WORKER_LOG_BURST)

    def log_line(line: str):
        lines.add(line)
        if budget.take(len(line)):
            if budget.dropped:
                on_line(budget.dropped_note())
            on_line(line)

    readers = [
        threading.Thread(target=read_lines, args=(process.stdout, log_line), name=f"out-{name}-{process.pid}"),
        threading.Thread(
            target=read_lines,
            args=(os.fdopen(metric_read, "rb"), on_metric or log_line),
            name=f"metrics-{name}-{process.pid}",
        ),
    ]
    for reader in readers:
        reader.daemon = True
        reader.start()
    return lines, readers


def connect_and_load(
    process: subprocess.Popen, sock: socket.socket, socket_path: str, load: bytes, timeout: float = LOAD_TIMEOUT
) -> Stream:
    """Connect to the worker once it listens and send it the load command, all within ``timeout`` s: the
    stream its answers come on. WorkerDied when it exits or cannot load."""
    deadline = time.monotonic() + timeout
    while True:  # the worker binds its socket once its imports are done
        if process.poll() is not None:
            raise WorkerDied(f"the worker exited with code {process.returncode}")
        try:
            sock.connect(socket_path)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not listen within {timeout:.0f}s (startupTimeout)") from None
            time.sleep(0.05)
    sock.settimeout(max(1.0, deadline - time.monotonic()))  # the load, too, within the timeout
    sock.sendall(load)
    stream = Stream(sock)
    code, message = stream.int(), stream.field().decode("utf-8", errors="replace")
    stream.int()  # the empty prediction list
    if code != 200:
        raise WorkerDied(f"{code} {message}")
    sock.settimeout(None)
    return stream


def end_failed_load(process: subprocess.Popen, output: threading.Thread, killed: bool):
    """End a worker whose load failed, and what it forked, once it has written its error (``killed``:
    at once; a worker whose load failed exits by itself, its traceback written)."""
    if killed:
        kill_worker(process)
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        kill_worker(process)
        process.wait()
    kill_worker(process)  # what it forked
    output.join(5)  # every line it wrote read: its own error is among them


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


class Output(collections.deque):
    """A worker's last 200 log lines, and how many it has logged (``logged``)."""

    def __init__(self):
        super().__init__(maxlen=200)
        self.logged = 0

    def add(self, line: str):
        self.append(line)
        self.logged += 1

    def error_since(self, seen: int, wait: float) -> Optional[str]:
        """The last Python error among the lines logged after the ``seen``-th, once they stop coming (a
        chained exception logs several), waiting up to ``wait`` s for one."""
        deadline, before = time.monotonic() + wait, -1
        while True:
            new = list(self)[-(self.logged - seen) :] if self.logged > seen else []
            error = _last_error(new)
            if (error is not None and self.logged == before) or time.monotonic() > deadline:
                return error
            before = self.logged
            time.sleep(0.02)


def _last_error(lines) -> Optional[str]:
    """The worker's own last Python error line (``ts_wire.cause_of``), escaped as its log line is."""
    error = cause_of([line.strip() for line in lines if PYTHON_ERROR.match(line)])
    return None if error is None else printable(error)
