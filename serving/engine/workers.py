"""The tsctl engine's workers: each model version's queue and its TorchServe worker processes
(worker_process.py: one process, started and driven as TorchServe's frontend drives it).

``ModelWorkers`` is one model version on the engine: a bounded job queue (``job_queue_size``; a
full queue answers 503), batches gathered as TorchServe gathers them (up to ``batchSize`` within
``maxBatchDelay`` ms of the first request), and ``minWorkers`` workers each taking the next batch;
workers added and retired while it serves (scaling: ``add_workers``, ``remove_workers``; unregistering:
``drain``), each on the GPU the server's placement gives it (serving/gpus.py). ``model_opening.open_model``
unpacks and checks an archive and makes its workers' environment and devices (``versions.ModelVersions``
holds a server's model versions, added and removed by name and version).

- **A worker that dies** (killed, out of memory, a handler calling ``sys.exit``) fails only the
  batch it held, as soon as its process ends (its socket shut down, even while a child it forked
  holds it): each of its requests gets 503 with the cause; a batch gathered but not yet sent goes
  back to the queue for the next free worker. A reply that does not parse (``BrokenReply``: a
  handler wrote to the worker's socket) fails its batch with 500 and the worker is killed, so the
  next requests meet a clean stream; any other error in a batch too (logged): the serve loop never
  ends before the engine, and a model whose loop has ended is not ready. The worker is started
  again, after 0, 1, 1, 2, 3, 5... seconds as TorchServe backs off.
- **responseTimeout** is enforced per batch: a worker that has not answered in time is killed, its
  requests get 503 naming the timeout, and it is started again.
- **Streamed answers** (``send_intermediate_predict_response``): each part reaches the request's
  ``Job`` as the worker's reader gets it; the first resolves the request, the others follow in its
  ``Parts`` (``streams.py``); ``submit`` joins them, ``submit_streaming`` does not.
- **Threads.** Each worker gets ``OMP_NUM_THREADS`` = the cores within the CPU quota (``cpu_limit.usable``)
  divided among the model's workers (unless the environment sets it), as the toolkit's handlers do.
- **Fork server.** Workers are forked from the engine's fork server for their environment
  (``fork_server.py``: torch and TorchServe's worker modules imported once; a model of another
  ``OMP_NUM_THREADS`` gets another), a worker's start costing its model's load alone; an archive
  shadowing one of its modules, or ``TSCTL_FORK_SERVER=0``, gets a new process.
- **Logs.** What a worker writes on stdout and stderr goes to the ``tsctl.worker`` log
  (``worker_log_line``), within worker_process.py's output budget.
"""

import asyncio
import collections
import logging
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Deque, Dict, List, Optional

from handlers.archives import printable
from handlers.errors import frontend_error

from .. import gpus
from ..frontend_settings import Frontend
from ..gpus import CPU
from ..ts_config import ModelSpec
from ..worker import fork_server, sockets
from ..worker.ts_wire import BrokenReply, Request, Response, WorkerDied, batch_error
from ..worker.worker_process import LOAD_TIMEOUT, NotSent, WorkerProcess, kill_worker, start_worker
from .continuous import step as continuous_step
from .job_queue import Job, JobQueue
from .sequences import Sequences, SequenceSettings
from .streams import collect

logger = logging.getLogger("tsctl.engine")
worker_log = logging.getLogger("tsctl.worker")

RECENT_BATCHES = 64  # the batches ts_batch_fill_ratio averages
BACKOFF = (0, 1, 1, 2, 3, 5, 8, 13, 21, 34)  # seconds before each restart, as TorchServe's
MAX_WORKERS = sockets.PORTS_PER_MODEL  # workers of one model version: each has a worker id of its own
STOPPING = "the engine is stopping: retry on another replica"


def no_worker_message(name: str, version: Optional[str]) -> str:
    """TorchServe 0.12's 503 for a model version without workers (ApiUtils, quotes as it places them)."""
    named = f'Model "{name}' + (f'" Version {version}' if version else "")
    return (
        f'{named}" has no worker to serve inference request. Please use scale workers API to add workers. '
        "If this is a sequence inference, please check if it is closed, or expired; or exceeds "
        "maxSequenceJobQueueSize"
    )


def worker_log_line(worker, line: str):
    """A worker's output line, in the ``tsctl.worker`` log under its model and index (but the line
    TorchServe's worker writes for every request), its control characters escaped (``printable``: a
    handler's ESC, CR or NUL cannot restyle or rewrite the line, nor make it read as the engine's)."""
    if "Backend received inference at" in line:
        return
    worker_log.info("[%s w%d] %s", printable(worker.owner.label), worker.index, printable(line))


# ---- A model version's queue and workers ---------------------------------------------------------
def unavailable(message: str, status: int = 503) -> Response:
    """The frontend's answer for a request no worker could answer."""
    body = frontend_error(status, "ServiceUnavailableException", message)
    return Response(status, body, "application/json", error=True)


def refused(message: str) -> Response:
    """The frontend's answer for a request it did not take in (no worker, a full queue or sequence)."""
    response = unavailable(message)
    response.refused = True
    return response


class Worker:
    """One worker slot of a model version: its process, restarted when it dies, on GPU ``gpu`` (-1: the CPU),
    which it keeps when it is started again (TorchServe's WorkerThread.gpuId)."""

    def __init__(self, owner: "ModelWorkers", index: int, gpu: int = CPU):
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
            return batch_error(500, message, len(jobs))
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
            return batch_error(500, message, len(jobs))

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


class ModelWorkers:
    """One model version: its queue, its workers, and what it counts for /metrics and describe."""

    def __init__(
        self,
        spec: ModelSpec,
        model_dir: Path,
        handler: str,
        frontend: Frontend,
        run_dir: str,
        first_port: int,
        env: dict,
        on_line: Callable,
        on_metric: Optional[Callable] = None,
        devices: Optional[gpus.ModelDevices] = None,
        placement: Optional[gpus.Placement] = None,
        sequences: Optional[SequenceSettings] = None,
    ):
        self.spec, self.model_dir, self.handler, self.frontend = spec, model_dir, handler, frontend
        self.run_dir, self.first_port, self.env, self.on_line = run_dir, first_port, env, on_line
        self.on_metric = on_metric  # (worker, line) for each line of its metrics logger; None: logged
        self.devices = devices or gpus.ModelDevices()  # where its workers run (serving/gpus.py)
        self.placement = placement or gpus.Placement(0)  # the server's: each new worker's GPU
        self.label = printable(f"{spec.name} {spec.version}")  # in log lines: an archive names its version
        self.queue = JobQueue(spec.job_queue_size or frontend.job_queue_size)
        # a stateful model's (sequenceBatching): its requests wait in their sequences, not in the queue
        self.sequences = Sequences(sequences, lambda: self.workers) if sequences else None
        self.v2_metadata: Optional[dict] = None  # the inputs and outputs it declares (serving/v2_metadata.py)
        self.continuous = bool(spec.continuous_batching)  # continuousBatching: requests join running batches
        self.workers = [self.new_worker(i) for i in range(spec.min_workers)]
        self.retired: List[Worker] = []  # scaled away: their index not given again while they hold it
        self.observe: Callable = lambda jobs, responses, sent, done: None  # metrics hook
        self.stopping = False
        self.stopped_message = STOPPING
        self.serving = True  # counts for the engine's readiness (a model being registered: once it has loaded)
        self.in_flight = 0  # requests taken and not yet answered: queued or in a worker's batch
        self.batches = self.batched = 0  # batches sent to the workers, and the requests they held
        self.recent_fill: Deque[float] = collections.deque(maxlen=RECENT_BATCHES)  # each: its size / batchSize

    def new_worker(self, index: int) -> Worker:
        """A worker slot on the next GPU the server's placement gives this model (TorchServe's addThreads)."""
        return Worker(self, index, self.placement.next_gpu(self.devices))

    async def start(self):
        """Start every worker and wait until each has loaded the model; RuntimeError if one cannot."""
        await asyncio.gather(*(w.start() for w in self.workers))
        for worker in self.workers:
            worker.task = asyncio.ensure_future(worker.serve())

    async def start_settled(self) -> Optional[BaseException]:
        """Start every worker and wait until each has loaded or failed (none still loading in the
        background); the first error, else None and every worker serving."""
        results = await asyncio.gather(*(w.start() for w in self.workers), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            return errors[0]
        for worker in self.workers:
            worker.task = asyncio.ensure_future(worker.serve())
        return None

    @property
    def ready(self) -> bool:
        """Every worker up and its serve loop running (a loop that ended would leave requests waiting); a
        worker added by scaling counts once it has loaded. A model version with no worker is not ready."""
        counted = [w for w in self.workers if w.counted]
        return bool(self.workers) and all(
            w.status in ("READY", "BUSY") and (w.task is None or not w.task.done()) for w in counted
        )

    async def add_workers(self, count: int, wait: bool = True) -> Optional[BaseException]:
        """``count`` more workers (the lowest free indexes), counted for readiness once each is up. ``wait``:
        until each has loaded or failed; then a worker that could not start is removed again (its process
        ended), and its error returned (None when all started). Not waiting: each is started in the
        background and, like any worker, started again after the backoff when it fails."""
        added = [self.new_worker(index) for index in await self.free_indexes(count)]
        for worker in added:
            worker.counted = False
        self.workers.extend(added)
        if not wait:
            for worker in added:
                worker.task = asyncio.ensure_future(worker.serve())  # its first turn starts it
            return None
        results = await asyncio.gather(*(w.start() for w in added), return_exceptions=True)
        failed = [(w, r) for w, r in zip(added, results) if isinstance(r, BaseException)]
        for worker, _ in failed:
            worker.stop()
            self.workers.remove(worker)
        for worker in added:
            if worker not in self.workers:
                continue
            worker.task = asyncio.ensure_future(worker.serve())
        return failed[0][1] if failed else None

    async def free_indexes(self, count: int) -> List[int]:
        """The ``count`` lowest indexes no worker holds, serving or scaled away (``holds_slot``: two processes on
        one socket path, a load answered by the wrong one or never); too few: waited for, within LOAD_TIMEOUT."""
        deadline = time.monotonic() + LOAD_TIMEOUT
        while True:
            self.retired = [w for w in self.retired if w.holds_slot]
            taken = {w.index for w in self.workers + self.retired}
            free = [i for i in range(MAX_WORKERS) if i not in taken]
            if len(free) >= count or not self.retired or time.monotonic() > deadline:
                return free[:count]
            await asyncio.sleep(0.1)

    async def remove_workers(self, count: int, wait: bool = True):
        """``count`` fewer workers: those loading first, then idle ones, then busy ones; each takes no more
        batches and its process is ended once it holds none (``retire``). ``wait``: until they have."""
        order = {"STARTING": 0, "READY": 1, "BUSY": 2}
        leaving = sorted(self.workers, key=lambda w: (order.get(w.status, 0), -w.index))[:count]
        for worker in leaving:
            self.workers.remove(worker)
        self.retired.extend(leaving)
        if self.sequences is not None:  # theirs are the others' now: a worker waiting for its own looks again
            await self.sequences.notify()
        retired = asyncio.ensure_future(self.retire(leaving))
        if wait:
            await retired

    async def retire(self, workers: List["Worker"]):
        """Each worker takes no more batches and is ended as soon as it holds none: an idle or loading one at
        once, a busy one once its batch is answered (within its responseTimeout), each on its own (an idle
        worker does not wait for a busy one: describe and the processes agree)."""
        for worker in workers:
            worker.retiring.set()

        async def end(worker: Worker):
            if worker.status == "BUSY" and worker.task is not None:
                await asyncio.wait({worker.task}, timeout=self.spec.response_timeout + 5)
            worker.stop()

        await asyncio.gather(*(end(worker) for worker in workers))

    async def drain(self, message: str):
        """Unregistering: every request queued answered 503 with ``message``, no new one taken, the batches
        workers hold answered (within responseTimeout), then every worker ended."""
        self.begin_stop(message)
        await self.retire(list(self.workers))

    async def submit(self, request: Request, named: Optional[str] = None) -> Response:
        """The request's answer, whole (a streamed answer's parts joined: ``streams.collect``;
        ``named``: the version the client named, for messages)."""
        return await collect(await self.submit_streaming(request, named))

    async def submit_streaming(self, request: Request, named: Optional[str] = None) -> Response:
        """The request's answer, or the first part of a streamed answer (its ``rest`` the others)."""
        if self.stopping:
            return unavailable(self.stopped_message)
        if not self.workers:  # registered with no worker, as TorchServe allows: its answer
            return refused(no_worker_message(self.spec.name, named))
        done = asyncio.get_running_loop().create_future()
        if self.sequences is not None:
            if not await self.sequences.admit(Job(request, done)):  # TorchServe's answer past either bound
                return refused(no_worker_message(self.spec.name, named))
        elif not await self.queue.put(Job(request, done)):
            return refused(
                f"model {self.spec.name} version {self.spec.version}: its job queue is full "
                f"({self.queue.limit} requests, job_queue_size): retry later"
            )
        self.in_flight += 1
        streamed = False
        try:
            answer = await done
            streamed = answer.rest is not None  # in flight until its last part (stream_ended)
            return answer
        finally:
            if not streamed:
                self.in_flight -= 1

    def stream_ended(self):
        self.in_flight -= 1

    async def next_batch(self, worker: Worker) -> List[Job]:
        """The next batch for ``worker``: from the queue, or from its sequences (sequences.py)."""
        size, delay = self.spec.batch_size, self.spec.max_batch_delay / 1000
        if self.continuous and worker.running:  # a running continuous batch: those waiting now join it
            return self.queue.take_now(size - len(worker.running))
        if self.sequences is not None:
            return await self.sequences.batch(worker, size, delay)
        return await self.queue.batch(size, delay)

    async def put_back(self, jobs: List[Job]):
        """A batch taken but never sent: first in line again."""
        if self.sequences is not None:
            await self.sequences.put_back(jobs)
        else:
            await self.queue.put_back(jobs)

    def finished(self, jobs: List[Job], responses: List[Response], sent: float):
        """A batch a worker ran (or failed): its answers given, counted for the metrics."""
        done_at = time.perf_counter()
        self.batches += 1
        self.batched += len(jobs)
        self.recent_fill.append(len(jobs) / max(1, self.spec.batch_size))
        for job, response in zip(jobs, responses):
            job.answer(response)
        if self.sequences is not None:
            asyncio.ensure_future(self.sequences.answered(jobs))
        self.observe(jobs, responses, sent, done_at)

    def begin_stop(self, message: str = STOPPING):
        """No worker starts again; every request still queued is answered 503 now with ``message`` (a
        batch a worker holds is answered as usual)."""
        self.stopping = True
        self.stopped_message = message
        waiting = list(self.queue.items) + (self.sequences.drop_all() if self.sequences is not None else [])
        self.queue.items.clear()
        for job in waiting:
            if not job.done.done():
                job.done.set_result(unavailable(message))

    def stop(self):
        if not self.stopping:
            self.begin_stop()
        for worker in self.workers:
            worker.stop()
