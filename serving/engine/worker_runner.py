"""One worker slot of a model version on the tsctl engine (``Worker``): its TorchServe worker process
(worker_process.py), started (forked from the fork server for its environment), fed one batch at a time
from its model version's queue (workers.py: ``ModelWorkers``), stopped after ``responseTimeout`` without
an answer, and started again when it dies, after 0, 1, 1, 2, 3, 5... seconds as TorchServe backs off. A
worker that dies fails only the batch it held; a reply that does not parse fails its batch with 500 and
the worker is killed. Its output lines go to the ``tsctl.worker`` log (``worker_log_line``).
"""

import asyncio
import logging
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import Callable, Dict, List, Optional

from handlers.archives import printable
from handlers.errors import frontend_error

from ..gpus import CPU
from ..worker import fork_server, sockets
from ..worker.ts_wire import BrokenReply, Response, WorkerDied, batch_error
from ..worker.worker_process import NotSent, WorkerProcess, kill_worker, start_worker
from .continuous import step as continuous_step
from .job_queue import Job

logger = logging.getLogger("tsctl.engine")
worker_log = logging.getLogger("tsctl.worker")

BACKOFF = (0, 1, 1, 2, 3, 5, 8, 13, 21, 34)  # seconds before each restart, as TorchServe's


def worker_log_line(worker, line: str):
    """A worker's output line, in the ``tsctl.worker`` log under its model and index (but the line
    TorchServe's worker writes for every request), its control characters escaped (``printable``: a
    handler's ESC, CR or NUL cannot restyle or rewrite the line, nor make it read as the engine's)."""
    if "Backend received inference at" in line:
        return
    worker_log.info("[%s w%d] %s", printable(worker.owner.label), worker.index, printable(line))


def unavailable(message: str, status: int = HTTPStatus.SERVICE_UNAVAILABLE) -> Response:
    """The frontend's answer for a request no worker could answer."""
    body = frontend_error(status, "ServiceUnavailableException", message)
    return Response(status, body, "application/json", error=True)


class Worker:
    """One worker slot of a model version: its process, restarted when it dies, on GPU ``gpu`` (-1: the CPU),
    which it keeps when it is started again (TorchServe's WorkerThread.gpuId)."""

    def __init__(self, owner, index: int, gpu: int = CPU):  # owner: its ModelWorkers (workers.py)
        self.owner, self.index, self.gpu = owner, index, gpu
        self.process: Optional[WorkerProcess] = None
        self.spawned: Optional[subprocess.Popen] = None  # the process while it loads
        self.status = "STARTING"  # READY, BUSY, STARTING (TorchServe: WORKER_STARTED / MODEL_LOADED ...)
        self.thread = ThreadPoolExecutor(1, thread_name_prefix=f"w-{owner.spec.name}-{index}")
        self.failures = 0
        self.task: Optional[asyncio.Task] = None
        self.died = asyncio.Event()
        self.retiring = asyncio.Event()  # set: take no more batches, end after the one held (scaling down)
        self.counted = True  # counts for the model's readiness (a worker added by scaling: once it is up)
        self.load_seconds: Optional[float] = None
        self.loading: Optional[asyncio.Future] = None  # its process starting, in its thread
        self.running: Dict[str, Job] = {}  # a continuous batch's requests between steps, by request id
        self.sizes: Dict[str, int] = {}  # their answers' bytes so far (max_response_size)

    @property
    def holds_slot(self) -> bool:  # its index (socket path) may be in use: its start running, or its process alive
        return bool(self.loading and not self.loading.done()) or bool(self.process and self.process.alive())

    @property
    def id(self) -> int:
        """TorchServe's worker id (its port, here the suffix of its socket's name)."""
        return self.owner.first_port + self.index

    @property
    def socket_path(self) -> str:
        return sockets.socket_path(self.owner.run_dir, self.id)

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

        owner = self.owner
        loading = self.loading = loop.run_in_executor(
            self.thread,
            lambda: start_worker(
                owner.spec,
                owner.model_dir,
                owner.handler,
                owner.frontend,
                self.socket_path,
                owner.env,
                on_line,
                self._spawned,
                on_metric,
                fork_server.shared(owner.env, extras=True),
                self.gpu,
            ),
        )  # the fork server got in this thread: it may start one
        try:
            self.process = await asyncio.shield(loading)
        except asyncio.CancelledError:  # stopped while it loads: the process it will have is ended then
            loading.add_done_callback(self._abandoned)
            raise
        if self.owner.stopping or self.retiring.is_set():  # the engine (or this worker) began to stop meanwhile
            self.process.kill()
            raise asyncio.CancelledError()
        self.load_seconds = time.time() - self.process.started
        process = self.process.process
        threading.Thread(target=self._watch, args=(process, loop, died), daemon=True).start()
        self.status = "READY"
        self.counted = True
        self.failures = 0
        logger.info("%s worker %d ready (pid %d)", self.owner.label, self.index, self.process.pid)

    def _spawned(self, spawned: subprocess.Popen):
        """Its process, as soon as it runs (in its thread): ended at once when the worker was retired or the
        model stopped meanwhile (``stop`` could not see it yet), rather than once it has loaded."""
        self.spawned = spawned
        if self.retiring.is_set() or self.owner.stopping:
            kill_worker(spawned)

    def _abandoned(self, loading: asyncio.Future):
        if not loading.cancelled() and loading.exception() is None:
            self.process = loading.result()
            threading.Thread(target=self.process.kill, daemon=True).start()

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
        while not self.owner.stopping and not self.retiring.is_set():
            try:
                await self.serve_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - logged; the worker is replaced and the loop goes on
                logger.exception("%s worker %d: unexpected error; the worker is replaced", self.owner.label, self.index)
                if self.process is not None:
                    self.process.kill()
                await asyncio.sleep(1)

    async def serve_once(self):
        """Restart the worker if it is gone, else run the next batch on it."""
        owner = self.owner
        if self.process is None or not self.process.alive():
            await self._restart()
            return
        getting = asyncio.ensure_future(owner.next_batch(self))
        dying = asyncio.ensure_future(self.died.wait())
        retiring = asyncio.ensure_future(self.retiring.wait())
        try:
            await asyncio.wait({getting, dying, retiring}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # stopped (scaled away): the wait for a batch must not take one after
            getting.cancel()  # batch() puts back what it took
            if getting.done() and not getting.cancelled() and getting.exception() is None:
                asyncio.ensure_future(owner.put_back(getting.result()))
            raise
        finally:
            dying.cancel(), retiring.cancel()
        if not getting.done():
            getting.cancel()
            try:
                await getting
            except asyncio.CancelledError:
                pass
            return  # died (or retired) while idle: restarted next turn (or ended), nothing lost
        jobs = getting.result()
        if owner.continuous:  # the next step of its continuous batch, these joining it (continuous.py)
            await continuous_step(self, jobs)
            return
        if not jobs:
            return
        sent = time.perf_counter()
        try:
            responses = await self.answers(jobs)
        except NotSent:
            await owner.put_back(jobs)
            return
        owner.finished(jobs, responses, sent)

    async def answers(self, jobs: List[Job], call: Optional[Callable[[], List[Response]]] = None) -> List[Response]:
        """``run``, the worker BUSY meanwhile; an unexpected error answers each request 500 and kills the
        worker (serve restarts it). NotSent as ``run``."""
        process, self.status = self.process, "BUSY"
        try:
            return await self.run(jobs, call)
        except NotSent:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever it was, this batch is answered and the worker replaced
            logger.exception(
                "%s worker %d (pid %d): unexpected error in a batch: killed", self.owner.label, self.index, process.pid
            )
            process.kill()
            message = f"the worker's batch failed ({type(exc).__name__}: {exc}); the worker was restarted"
            return batch_error(HTTPStatus.INTERNAL_SERVER_ERROR, message, len(jobs))
        finally:
            self.status = "READY" if self.process is not None and self.process.alive() else "STARTING"

    async def run(self, jobs: List[Job], call: Optional[Callable[[], List[Response]]] = None) -> List[Response]:
        """One batch on the worker: its answers, or what each request gets when the worker's process ends
        (at once: its socket shut down, whatever it forked killed), when it passes responseTimeout, or
        when its reply cannot be read (``BrokenReply``); in each case the worker is killed (serve
        restarts it). NotSent when the batch never reached it. ``call``: what runs it on the worker (in the
        worker's thread; default its ``predict``: continuous.py gives a step of a continuous batch)."""
        owner, process, loop = self.owner, self.process, asyncio.get_running_loop()
        timeout = owner.spec.response_timeout  # for the whole batch, a streamed answer's parts all within it

        def on_part(index: int, part: Response):  # in the worker's thread: a part of a streamed answer
            loop.call_soon_threadsafe(jobs[index].part, part, owner.stream_ended)

        predicting = loop.run_in_executor(
            self.thread, call or (lambda: process.predict([j.request for j in jobs], on_part))
        )
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
                logger.error(
                    "%s worker %d (pid %d) did not answer within %ds: killed",
                    owner.label,
                    self.index,
                    process.pid,
                    timeout,
                )
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
            logger.error(
                "%s worker %d (pid %d): its reply could not be read (%s): killed",
                owner.label,
                self.index,
                process.pid,
                exc,
            )
            process.kill()
            message = f"the worker's reply could not be read ({exc}); the worker was restarted"
            return batch_error(HTTPStatus.INTERNAL_SERVER_ERROR, message, len(jobs))

    def died_with(self, jobs: List[Job], detail: str) -> List[Response]:
        """503 for each request of a worker that died holding them, with the cause."""
        code = self.process.process.poll()
        if code is None:
            cause = "its socket closed"
        else:
            cause = f"signal {-code}" if code < 0 else f"exit code {code}"
        logger.error(
            "%s worker %d (pid %d) died (%s): %s", self.owner.label, self.index, self.process.pid, cause, detail
        )
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
        if self.owner.stopping or self.retiring.is_set():
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
            kill_worker(self.spawned)
        self.thread.shutdown(wait=False)
