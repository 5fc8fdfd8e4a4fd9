"""Continuous batching (``continuousBatching: true``), as TorchServe 0.12's ``wlm/ContinuousBatching.java``
runs it: a batch goes to the worker one step at a time; each answer of a step that says
``ts_stream_next: true`` (a handler's ``context.stopping_criteria`` said go on, ``otf_message_handler``) is
a part sent to its client at once, and its request stays in the batch, sent again at the next step under
the same request id with its headers and no parameters (``ModelRequestEncoder``: ``isCachedInBackend``;
the handler keeps its state in ``context.cache``); an answer without it is the request's last, and its
place goes to the next request waiting. So a request joins a running batch between two steps instead of
waiting for the batch to end. A request whose client left is not sent again (TorchServe: the job is
not open). A worker that dies or passes ``responseTimeout`` in a step fails every request of its batch,
as for any batch (``Worker.answers``)."""

import time
import uuid
from http import HTTPStatus
from typing import List

from ..worker.ts_wire import RequestInput, Response
from ..worker.worker_process import NotSent
from .job_queue import Job


def gone(job: Job) -> bool:
    """A request of the running batch no longer streamed to anyone: its client left (its parts closed),
    or its stream was cut (ended); ended once here, for the in-flight count (``Parts.on_end``)."""
    if job.parts is None or not (job.parts.closed or job.parts.ended):
        return False
    job.parts.end()
    return True


async def step(worker, newcomers: List[Job]):
    """One step of ``worker``'s continuous batch: its running requests and ``newcomers`` (at most batchSize
    in all: ``ModelWorkers.next_batch``)."""
    owner, running = worker.owner, worker.running
    for request_id, job in list(running.items()):
        if gone(job):  # not sent again
            del running[request_id]
            worker.sizes.pop(request_id, None)
    cached = set(running)
    for job in newcomers:
        running[str(uuid.uuid4())] = job
    if not running:
        return
    ids = list(running)
    jobs = [running[i] for i in ids]
    requests = [
        RequestInput(b"", running[i].request.headers, inputs=[]) if i in cached else running[i].request for i in ids
    ]
    process, sent = worker.process, time.perf_counter()
    try:
        responses = await worker.answers(jobs, lambda: process.step(requests, ids, worker.sizes))
    except NotSent:
        for request_id in ids:
            if request_id not in cached:
                del running[request_id]
        await owner.put_back(newcomers)
        return
    ended_jobs: List[Job] = []
    ended: List[Response] = []
    for request_id, job, response in zip(ids, jobs, responses):
        if response.streams and not response.error:
            job.part(response, owner.stream_ended)
            if job.parts is not None and not gone(job):
                continue  # on to the next step
            response = Response(HTTPStatus.OK, b"", headers={})  # its client left: ended here
        del running[request_id]
        worker.sizes.pop(request_id, None)
        ended_jobs.append(job)
        ended.append(response)
    owner.finished(ended_jobs, ended, sent)
