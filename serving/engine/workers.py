"""The tsctl engine's workers: each model version's queue and its TorchServe worker processes
(worker_runner.py: one worker slot, its process started and driven as TorchServe's frontend drives it).

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
import time
from pathlib import Path
from typing import Callable, Deque, List, Optional

from handlers.archives import printable

from .. import gpus
from ..frontend_settings import Frontend
from ..ts_config import ModelSpec
from ..worker import sockets
from ..worker.ts_wire import RequestInput, Response
from ..worker.worker_process import LOAD_TIMEOUT
from .job_queue import Job, JobQueue
from .sequences import Sequences, SequenceSettings
from .streams import collect
from .worker_runner import Worker, unavailable

logger = logging.getLogger("tsctl.engine")
worker_log = logging.getLogger("tsctl.worker")

RECENT_BATCHES = 64  # the batches ts_batch_fill_ratio averages
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


# ---- A model version's queue and workers ---------------------------------------------------------
def refused(message: str) -> Response:
    """The frontend's answer for a request it did not take in (no worker, a full queue or sequence)."""
    response = unavailable(message)
    response.refused = True
    return response


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

    async def submit(self, request: RequestInput, named: Optional[str] = None) -> Response:
        """The request's answer, whole (a streamed answer's parts joined: ``streams.collect``;
        ``named``: the version the client named, for messages)."""
        return await collect(await self.submit_streaming(request, named))

    async def submit_streaming(self, request: RequestInput, named: Optional[str] = None) -> Response:
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
