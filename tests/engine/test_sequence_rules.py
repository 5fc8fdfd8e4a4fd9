"""The rules of serving/engine/sequences.py's ``Sequences``, as a generated property test: in-process, one
asyncio loop, workers that are plain objects, hypothesis choosing what clients and workers do and in which
order: requests admitted (some ending their sequence), workers gathering batches (with and without a batch
delay), answering them, putting them back unsent, dying or scaled away while they gather (their wait
cancelled, as ``Worker.serve_once`` cancels it), clients leaving, sequences going idle past their time, and
workers added and removed. After every step:

- at most one request of a sequence is in a batch, and ``busy`` says so; a batch holds one request a
  sequence, at most ``size``, on the sequence's own worker (another only once that one has gone);
- the bounds: ``maxNumSequence`` sequences open, ``maxSequenceJobQueueSize`` requests waiting in each, and
  a refusal only past one of them;
- expiry never closes a sequence that has a request in a batch or waiting;
- a gathering cancelled before it returned ends cancelled, whatever it had taken first in its sequences
  again (before the fix, ``asyncio.wait_for`` returned the batch when the cancellation met it done: its
  caller had gone, so those requests were never answered and their sequences stayed busy for ever);

and at the end, every worker draining what waits: each request taken in is answered exactly once (or its
client left), each sequence's in the order they came.
"""

import asyncio
import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.engine.job_queue import Job
from serving.engine.sequences import SEQUENCE_END, SEQUENCE_ID, Sequences, SequenceSettings, key_of
from serving.worker.ts_wire import RequestInput, Response

MAX_SEQUENCES, QUEUE = 3, 2
IDS = ("a", "b", "c", "d", "e")
WORKERS = 3


class FakeWorker:
    """What Sequences reads of a worker: its index and status."""

    def __init__(self, index: int):
        self.index, self.status = index, "READY"

    def __repr__(self):
        return f"w{self.index}"


OPS = st.one_of(
    st.tuples(st.just("admit"), st.sampled_from(IDS), st.booleans()),
    st.tuples(st.just("gather"), st.integers(0, WORKERS - 1), st.integers(1, 3), st.sampled_from([0.0, 30.0])),
    st.tuples(st.just("cancel"), st.integers(0, WORKERS - 1)),
    st.tuples(st.just("step")),
    st.tuples(st.just("answer"), st.integers(0, WORKERS - 1)),
    st.tuples(st.just("put_back"), st.integers(0, WORKERS - 1)),
    st.tuples(st.just("leave"), st.integers(0, 40)),
    st.tuples(st.just("idle"), st.sampled_from(IDS)),
    st.tuples(st.just("scale"), st.integers(0, WORKERS - 1)),
)


class World:
    """The Sequences under test, its workers, and what the clients and workers did."""

    def __init__(self, workers: int):
        self.slots = [FakeWorker(i) if i < workers else None for i in range(WORKERS)]  # None: scaled away
        self.made = itertools.count(WORKERS)
        self.sequences = Sequences(
            SequenceSettings(max_idle_ms=60_000, timeout_ms=0, max_sequences=MAX_SEQUENCES, queue_size=QUEUE), self.live
        )
        self.gathering = {}  # slot -> (worker, task, size)
        self.held = {}  # slot -> (worker, jobs taken, not yet answered)
        self.gone_held = []  # batches of workers scaled away, still to be answered (retire waits for them)
        self.accepted, self.left = [], set()  # (number, sequence id, job); numbers of jobs whose client left
        self.number = {}  # id(job) -> its number
        self.answered = []  # numbers, in the order answered
        self.ran = {}  # sequence id -> numbers, in the order run
        self.owner = {}  # Sequence -> the worker that last ran it
        self.removed = set()  # workers scaled away

    def live(self):
        return [w for w in self.slots if w is not None]

    # ---- what happens ----------------------------------------------------------------------------------
    async def admit(self, sequence_id: str, end: bool):
        headers = {SEQUENCE_ID: sequence_id, **({SEQUENCE_END: "true"} if end else {})}
        job = Job(RequestInput(b"", headers), asyncio.get_running_loop().create_future())
        taken = await self.sequences.admit(job)
        sequence = self.sequences.open.get(key_of(sequence_id))
        if taken:
            self.number[id(job)] = len(self.accepted)
            self.accepted.append((len(self.accepted), sequence_id, job))
        elif sequence is None:
            assert len(self.sequences.open) >= MAX_SEQUENCES, "a new sequence refused below maxNumSequence"
        else:
            assert sequence.waiting() and len(sequence.jobs) >= QUEUE, "a request refused below its queue's bound"

    def gather(self, slot: int, size: int, delay: float):
        worker = self.slots[slot]
        if worker is None or slot in self.gathering or slot in self.held:
            return
        self.gathering[slot] = (worker, asyncio.ensure_future(self.sequences.batch(worker, size, delay)), size)

    async def cancel(self, slot: int):
        """The worker died or was scaled away while it gathered: serve_once cancels the wait; a batch already
        returned is run (or put back), one not returned must come back cancelled, its requests put back."""
        if slot not in self.gathering:
            return
        worker, task, size = self.gathering.pop(slot)
        if task.done():
            self.collect(slot, worker, task.result(), size)
            return
        task.cancel()
        try:
            jobs = await task
        except asyncio.CancelledError:
            return
        raise AssertionError(f"a cancelled gathering returned {len(jobs)} requests to no one: they are lost")

    async def step(self):
        for _ in range(5):
            await asyncio.sleep(0)
        for slot, (worker, task, size) in list(self.gathering.items()):
            if task.done():
                del self.gathering[slot]
                self.collect(slot, worker, task.result(), size)

    def collect(self, slot: int, worker, jobs, size: int):
        assert 0 < len(jobs) <= size, f"a batch of {len(jobs)} for size {size}"
        held = [j.sequence for _, js in self.batches() for j in js]
        for job in jobs:
            sequence = job.sequence
            assert held.count(sequence) == 0, "two requests of one sequence in batches at once"
            held.append(sequence)
            before = self.owner.get(sequence)
            assert before in (None, worker) or before in self.removed, (
                f"sequence {sequence.id} ran on {before}, then on {worker} while {before} still served"
            )
            self.owner[sequence] = worker
            waiting = [
                n
                for n, s, j in self.accepted
                if j.sequence is sequence and n not in self.left and not j.done.done() and n not in self.running()
            ]
            assert self.number[id(job)] == min(waiting + [self.number[id(job)]]), "a sequence's requests out of order"
        self.held[slot] = (worker, jobs)

    def running(self):
        return {self.number[id(j)] for _, jobs in self.batches() for j in jobs}

    def batches(self):
        return list(self.held.values()) + self.gone_held

    async def answer(self, slot: int):
        if slot in self.held:
            await self.finish(self.held.pop(slot)[1])
        elif self.gone_held:
            await self.finish(self.gone_held.pop(0)[1])

    async def finish(self, jobs):
        for job in jobs:
            number = self.number[id(job)]
            assert number not in self.answered, f"request {number} answered twice"
            self.answered.append(number)
            self.ran.setdefault(job.request.headers[SEQUENCE_ID], []).append(number)
            job.answer(Response(200, b"ok", "text/plain"))
        await self.sequences.answered(jobs)

    async def put_back(self, slot: int):
        if slot in self.held:
            await self.sequences.put_back(self.held.pop(slot)[1])

    def leave(self, index: int):
        waiting = [(n, j) for n, _, j in self.accepted if not j.done.done() and n not in self.running()]
        if waiting:
            number, job = waiting[index % len(waiting)]
            job.done.cancel()  # as submit_streaming's await is cancelled (HTTP 499, a gRPC stream cancelled)
            self.left.add(number)

    def idle(self, sequence_id: str):
        """Time passes for that sequence: past sequenceMaxIdleMSec; then expiry runs."""
        sequence = self.sequences.open.get(key_of(sequence_id))
        if sequence is not None:
            sequence.last -= 3600
        kept = {s: (s.busy, s.waiting()) for s in self.sequences.open.values()}
        self.sequences.expire()
        for sequence, (busy, waiting) in kept.items():
            if busy or waiting:
                assert self.sequences.open.get(sequence.id) is sequence, "a busy or waiting sequence expired"

    async def scale(self, slot: int):
        worker = self.slots[slot]
        if worker is None:
            self.slots[slot] = FakeWorker(next(self.made))
        else:
            self.slots[slot] = None
            self.removed.add(worker)
            await self.cancel(slot)
            if slot in self.held:
                self.gone_held.append(self.held.pop(slot))
        await self.sequences.notify()  # as ModelWorkers.add_workers / remove_workers do

    # ---- what must hold --------------------------------------------------------------------------------
    def check(self):
        sequences = self.sequences
        assert len(sequences.open) <= MAX_SEQUENCES
        in_batches = [j.sequence for _, jobs in self.batches() for j in jobs]
        for sequence in sequences.open.values():
            assert len(sequence.jobs) <= QUEUE
            assert in_batches.count(sequence) <= 1
            if sequence in in_batches:
                assert sequence.busy, f"sequence {sequence.id} in a batch, not busy"
            elif sequence.busy:
                assert self.gathering, f"sequence {sequence.id} busy with no request in a batch or being gathered"
        for _, jobs in self.batches():
            for job in jobs:
                closed = sequences.open.get(job.sequence.id) is not job.sequence
                assert not closed, "a sequence closed with a request in a batch"

    async def drain(self):
        """Every worker back, gathering with no delay and answering, until nothing waits."""
        for slot in list(self.gathering):
            await self.cancel(slot)
        while self.gone_held:
            await self.finish(self.gone_held.pop(0)[1])
        for slot, worker in enumerate(self.slots):
            if worker is None:
                await self.scale(slot)
        for _ in range(200):
            for slot in list(self.held):
                await self.answer(slot)
            if not any(s.waiting() for s in self.sequences.open.values()):
                break
            for slot in range(WORKERS):
                self.gather(slot, 3, 0.0)
            await self.step()
            self.check()
        for slot in list(self.gathering):
            await self.cancel(slot)
        for slot in list(self.held):
            await self.answer(slot)


async def play(workers: int, ops):
    world = World(workers)
    for op in ops:
        kind, args = op[0], op[1:]
        if kind in ("admit", "answer", "put_back", "scale", "cancel", "step"):
            await getattr(world, kind)(*args)
        else:
            getattr(world, kind)(*args)
        world.check()
    await world.drain()
    for number, sequence_id, job in world.accepted:
        if number not in world.left:
            assert world.answered.count(number) == 1, f"request {number} of {sequence_id} never answered"
    for sequence_id, numbers in world.ran.items():
        assert numbers == sorted(numbers), f"sequence {sequence_id} ran {numbers}"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, WORKERS), st.lists(OPS, max_size=60))
def test_sequences_keep_their_rules_whatever_the_interleaving(workers, ops):
    asyncio.run(play(workers, ops))


def test_a_gathering_cancelled_as_a_request_arrives_takes_nothing():
    """The interleaving hypothesis finds, written out: a worker has taken one request and waits for more
    within its batch delay; a second request arrives and, in the same turn, the worker dies (serve_once
    cancels the wait). Before the fix the cancelled wait returned both requests (asyncio.wait_for before
    3.12), which serve_once dropped: both sequences busy for ever, their clients never answered."""
    ops = [("admit", "a", False), ("gather", 0, 2, 30.0), ("step",), ("admit", "b", False), ("cancel", 0)]
    asyncio.run(play(1, ops))


def test_a_queue_gathering_cancelled_as_a_request_arrives_takes_nothing():
    """The same interleaving on a stateless model's JobQueue: before the fix both requests were returned to
    the cancelled caller and never answered."""
    from serving.engine.job_queue import JobQueue

    async def run():
        queue, loop = JobQueue(8), asyncio.get_running_loop()
        jobs = [Job(RequestInput(b"", {}), loop.create_future()) for _ in range(2)]
        await queue.put(jobs[0])
        gathering = asyncio.ensure_future(queue.batch(2, 30.0))
        for _ in range(5):
            await asyncio.sleep(0)
        await queue.put(jobs[1])
        gathering.cancel()
        try:
            taken = await gathering
        except asyncio.CancelledError:
            taken = []
        assert not taken and list(queue.items) == jobs, f"{len(taken)} returned to no one, {len(queue.items)} queued"

    asyncio.run(run())


def settings_of(sequences: int = 4) -> SequenceSettings:
    return SequenceSettings(max_idle_ms=60_000, timeout_ms=0, max_sequences=sequences, queue_size=4)


def test_a_new_sequence_goes_to_a_worker_that_is_up():
    """Found by the attack (tests/security/test_attack_sequences.py's helper): a new sequence went to a
    restarting worker holding fewer sequences, and waited for its load while the other worker was free."""

    async def run():
        workers = [FakeWorker(0), FakeWorker(1)]
        sequences, loop = Sequences(settings_of(), lambda: workers), asyncio.get_running_loop()
        for name in ("a", "b"):
            await sequences.admit(Job(RequestInput(b"", {SEQUENCE_ID: name}), loop.create_future()))
        assert [s.worker for s in sequences.open.values()] == workers  # one each
        workers[0].status = "STARTING"
        await sequences.admit(Job(RequestInput(b"", {SEQUENCE_ID: "c"}), loop.create_future()))
        assert sequences.open[key_of("c")].worker is workers[1]
        workers[1].status = "STARTING"  # all restarting: the least held again
        await sequences.admit(Job(RequestInput(b"", {SEQUENCE_ID: "d"}), loop.create_future()))
        assert sequences.open[key_of("d")].worker is workers[0]

    asyncio.run(run())


def test_an_end_request_whose_client_left_ends_nothing():
    """Found by the attack: a queued end request whose client left before a worker took it is not run, yet
    it closed the sequence when the request before it was answered; the next request of that sequence then
    opened a new one, on any worker, its handler's state left behind. The end closes only once run."""

    async def run():
        workers = [FakeWorker(0), FakeWorker(1)]
        sequences, loop = Sequences(settings_of(), lambda: workers), asyncio.get_running_loop()
        first = Job(RequestInput(b"", {SEQUENCE_ID: "a"}), loop.create_future())
        ending = Job(RequestInput(b"", {SEQUENCE_ID: "a", SEQUENCE_END: "true"}), loop.create_future())
        await sequences.admit(first)
        [taken] = await sequences.batch(first.sequence.worker, 4, 0.0)
        await sequences.admit(ending)
        ending.done.cancel()  # its client left
        taken.answer(Response(200, b"1", "text/plain"))
        await sequences.answered([taken])
        assert sequences.open.get(key_of("a")) is first.sequence, "closed by an end that never ran"
        last = Job(RequestInput(b"", {SEQUENCE_ID: "a", SEQUENCE_END: "true"}), loop.create_future())
        await sequences.admit(last)
        [taken] = await sequences.batch(first.sequence.worker, 4, 0.0)
        assert taken is last
        taken.answer(Response(200, b"2", "text/plain"))
        await sequences.answered([taken])
        assert key_of("a") not in sequences.open

    asyncio.run(run())
