"""The lifecycle every toolkit handler shares: one TorchServe batch in, one response per request out.

    rows ──parse_request──► Request(items)                       (decoding.py; limits.py checks the limits)
    items ──decode(item)──► model-ready input                    per item, in ``decode_threads`` threads
    inputs ──preprocess──► batch ──inference──► output ──postprocess(output, inputs)──► one answer per input
                                                                 in chunks of at most batchSize inputs
    answers regrouped per request; failures at their index with a status and a JSON body

Isolation is built in, not left to each hook: whatever parsing or ``decode`` raises for one request
(a ClientError, or any other exception, which is a handler bug and is logged with its traceback)
becomes that request's 4xx; the other requests go on. Only the batched forward pass
(preprocess/inference/postprocess) is shared, and when it fails for a chunk holding several
requests, each of them is run again alone, so only the request that really fails gets an error:
the ClientError a hook raised (a tensor the model cannot take), else a 500 (507 out of memory).
Every status comes from ``errors.STATUS``; requests are decoded by decoding.py and answers encoded by
answers.py (this module reaches them all through protocol.py, which re-exports the wire).

Subclasses set ``Settings`` (a dataclass, read from model-config.yaml's ``handler:`` section) and
``item_keys``, and override ``decode``, ``preprocess``, ``inference``, ``postprocess``; optionally
``load_model`` and ``setup``. Everything runs under ``torch.inference_mode()``. ``postprocess``
gets the chunk's inputs too (what ``decode`` returned for them: a text and its offsets, say); one
written as ``postprocess(self, output)`` is called with the output alone.

``ToolkitHandler`` stands on its own: it owns the whole lifecycle TorchServe asks of a handler
(``initialize``, then ``handle`` per batch, through the ``module:handle`` function ``entry_point`` makes),
so it does not subclass TorchServe's ``BaseHandler``, none of whose methods it would run. It records
what ``BaseHandler.handle`` did (its ``HandlerTime`` metric); TorchServe's captum explanations and its
profiler are not run by toolkit handlers. Neither TorchServe 0.9.0 nor 0.12.0 asks a handler's class
for more: their model loader calls the entry point function, or instantiates the one class a handler
file defines and calls its ``initialize`` and ``handle``.
"""

import inspect
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, List, Optional

import torch

from . import catalogue, envelopes, golden, log_text, protocol, signing
from .loading import PRECISIONS, load_model, pick_device, pick_threads, release_memory, to_device, with_precision
from .protocol import Busy, ClientError, InferenceError, Limits, Request, too_large  # noqa: F401 (InferenceError)
from .settings import Settings, read_settings

logger = log_text.logger(__name__)

MIN_AUTO_ITEMS = 16  # max_items: 0 allows max(4 x batchSize, this many) inputs per request


@dataclass(eq=False)
class Job:
    """One request on its way through a batch: its inputs, answers, or the error it gets."""

    request: Optional[Request]
    error: Optional[ClientError] = None
    inputs: list = field(default_factory=list)
    answers: list = field(default_factory=list)
    binary: bool = False  # KServe v2: answer in the binary tensor extension (protocol.py)
    spent: dict = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, error: ClientError):
        if self.error is None:
            self.error = protocol.forget(error)


class Budget:
    """What one batch's requests may cost together, counted as they are read and decoded (``spend``).

    Memory (``protocol.MEMORY``: parsed JSON, tensors, estimated before they are built) may not pass
    ``handler.max_batch_bytes`` for the whole batch; every other unit (JSON values, pixels, text...)
    ``handler.batch_budget`` times its per-request limit. A request above its own limit gets 413; one
    within it that does not fit beside the requests read before it gets 503 with ``Retry-After``
    (sent again, it is read in another batch). A refused request's counts are given back."""

    def __init__(self, share: float):
        self.share, self.totals, self.lock = share, {}, threading.Lock()

    def spend(self, job: Optional[Job], amount: int, unit: str, setting: str, limit: int):
        with self.lock:
            mine = amount + (job.spent.get(unit, 0) if job else 0)
            if mine > limit:
                subject = "the request would take" if unit == protocol.MEMORY else "the request holds"
                raise too_large(subject, mine, unit, setting, limit)
            if job is None:  # decode called on its own (a test, a transformer): its own limit only
                return
            ceiling = limit if unit == protocol.MEMORY else int(limit * self.share)
            total = self.totals.get(unit, 0) + amount
            if total > ceiling:
                how = f"handler.{setting}" if unit == protocol.MEMORY else f"handler.batch_budget x handler.{setting}"
                raise Busy(
                    f"this batch's requests hold {total:,} {unit} with this one, above the batch's budget of "
                    f"{ceiling:,} ({how}): send it again"
                )
            job.spent[unit], self.totals[unit] = mine, total

    def give_back(self, job: Job):
        """Return what a refused request had counted."""
        with self.lock:
            for unit, amount in job.spent.items():
                self.totals[unit] = self.totals.get(unit, 0) - amount
            job.spent.clear()


class ToolkitHandler:
    Settings = Settings
    item_keys = ("data",)
    v2_datatypes = ("BYTES",)
    v2_output_name = "output-0"
    # KServe v2 model metadata (recorded in MAR-INF/tsctl.json, answered by GET /v2/models/NAME and gRPC
    # ModelMetadata): the inputs a request holds and the outputs its answer has; -1 a dimension of any size
    v2_metadata = {
        "inputs": [{"name": "input-0", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "output-0", "datatype": "BYTES", "shape": [-1]}],
    }
    input_kind = "any"  # what a request holds: image, text, tensor or any (MAR-INF/tsctl.json, identity.py)
    splits = False  # True: decode/preprocess and postprocess can run apart from the model (KServe transformer)
    with_model = True  # False: only decode/preprocess/postprocess are used (a KServe transformer)

    requirements: tuple = ()  # what the archive's requirements.txt asks for (tsctl package merges them)
    requirements_if_present: tuple = ()  # (file, requirement): asked for when the model directory holds file

    @classmethod
    def requirements_for(cls, serialized: Optional[str]) -> tuple:
        """What an archive of ``serialized`` (the --serialized-file) needs installed (catalogue.Declared)."""
        return catalogue.declared_by(cls).requirements_for(serialized)

    # ---- lifecycle -------------------------------------------------------------------------
    def __init__(self):
        self.model = None  # what load_model returned, once initialize ran
        self.device = None
        self.context = None  # TorchServe's Context of the batch being handled
        self.manifest = None
        self.initialized = False
        # What TorchServe's BaseHandler.__init__ set, kept at its first values (toolkit handlers never ran
        # BaseHandler.initialize): users' subclasses written when ToolkitHandler subclassed it read them.
        self.mapping = None
        self.model_pt_path = None
        self.map_location = None
        self.explain = False
        self.target = 0
        self.profiler_args = {}

    def initialize(self, context):
        properties = context.system_properties
        self.context = context
        if signing.required_key():  # TSCTL_PUBLIC_KEY: TorchServe ran this code first; the engine checks before
            model_dir, name = properties.get("model_dir"), context.model_name  # signed as the name it is served as
            signing.verify(model_dir, signing.required_key(), name, expect_name=name)
        self.manifest = context.manifest or {}
        self.model_dir = properties.get("model_dir")
        self.model_name = context.model_name
        self.model_version = self.manifest.get("model", {}).get("modelVersion")
        self.device = pick_device(properties.get("gpu_id"))  # the load command's gpu (serving/gpus.py), if CUDA is here
        config_file = self.manifest.get("model", {}).get("configFile", "model-config.yaml")
        yaml_config = getattr(context, "model_yaml_config", None) or {}
        self.settings = read_settings(self.Settings, yaml_config.get("handler"), where=config_file)
        self.dtype = PRECISIONS[self.settings.precision]  # the model's floating-point inputs (load_model casts it)
        self.batch_size = max(1, int(properties.get("batch_size") or 1))
        self.threads = pick_threads(self.settings.torch_threads, yaml_config.get("minWorkers"))
        self.limits = self.request_limits()
        self.budget = Budget(self.settings.batch_budget)
        threads = self.settings.decode_threads
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="decode") if threads > 1 else None
        self.current = threading.local()  # the Job a decode thread is working for
        self.model = self.load_model() if self.with_model else None
        self.postprocess_takes_inputs = takes_inputs(self.postprocess)  # once, not per chunk
        self.setup()
        if self.settings.verify_on_start:
            self.verify_golden()
        self.initialized = True
        logger.info(
            "tsctl %s ready on %s (%d intra-op threads); limits %s",
            type(self).__name__,
            self.device,
            self.threads,
            self.limits,
        )
        (logger.info if envelopes.in_place() else logger.error)("tsctl: %s", envelopes.report())

    def verify_golden(self):
        """Replay the archive's golden requests (``handler.verify_on_start``); a DriftError naming the
        inputs whose answers moved, and the library versions that differ from packaging time, keeps
        this worker from starting."""
        recorded = golden.read(self.model_dir)
        if recorded is None:
            raise golden.DriftError(
                f"handler.verify_on_start is true but the archive has no {golden.GOLDEN}: "
                "package it with --golden DIR, or turn verify_on_start off"
            )
        problems = golden.check_on_start(self, recorded)
        if problems:
            moved = golden.version_changes(recorded)
            raise golden.DriftError(
                f"{len(problems)} of {len(recorded['cases'])} golden answers drifted (handler.verify_on_start): "
                + "; ".join(problems[:3])
                + (f"; versions: {', '.join(moved)}" if moved else "; library versions as when packaged")
            )
        logger.info("tsctl: %d golden answers verified at start", len(recorded["cases"]))

    def request_limits(self) -> Limits:
        s = self.settings
        max_items = s.max_items or max(4 * self.batch_size, MIN_AUTO_ITEMS)
        return Limits(max_items, s.max_body_bytes, s.max_json_depth, s.max_json_values, s.max_batch_bytes)

    def load_model(self):
        """The archive's model on ``self.device``, its weights in ``handler.precision``."""
        model = load_model(self.model_dir, self.manifest.get("model", {}), self.device, self.settings.allow_pickle)
        return with_precision(model, self.settings.precision)

    def setup(self):
        """Load anything else the handler needs (labels, tokenizer) after the model."""

    # ---- hooks -----------------------------------------------------------------------------
    def decode(self, item: Any) -> Any:
        """One raw item (bytes, text, JSON value) to a model-ready input; raise ClientError if bad."""
        return item

    def preprocess(self, inputs: List[Any]) -> Any:
        return to_device(torch.stack(inputs), self.device, self.dtype)

    def inference(self, batch: Any, *args, **kwargs) -> Any:
        return self.model(batch)

    def postprocess(self, output: Any, inputs: Optional[List[Any]] = None) -> List[Any]:
        """``output`` of inference for ``inputs`` (what decode returned, in order; None in a KServe
        transformer, which sees the model's output alone): exactly one answer per input."""
        return output.tolist()

    def call_postprocess(self, output: Any, inputs: Optional[List[Any]]) -> List[Any]:
        """``postprocess(output, inputs)``, or ``postprocess(output)`` for one written that way."""
        if self.postprocess_takes_inputs:
            return self.postprocess(output, inputs)
        return self.postprocess(output)

    def v2_output(self, answers: list) -> Optional[dict]:
        """A KServe v2 output tensor for these answers; None means BYTES holding JSON."""
        return None

    def spend(self, amount: int, unit: str, setting: str, limit: int):
        """Count ``amount`` of ``unit`` (e.g. decoded pixels) against the current request's ``limit``
        (413 once its items together exceed it) and its batch's budget (503, ``Budget``). Call it
        from ``decode``, before the work it counts."""
        budget = getattr(self, "budget", None) or Budget(self.settings.batch_budget)
        budget.spend(getattr(self.current, "job", None), amount, unit, setting, limit)

    # ---- one batch -------------------------------------------------------------------------
    def handle(self, data, context):
        started = time.perf_counter()
        self.context = context
        self.budget = Budget(self.settings.batch_budget)
        jobs = [self.read(row, index) for index, row in enumerate(data)]
        self.decode_jobs(jobs)
        for job in jobs:  # what was parsed has been decoded: the parsed bodies can go
            if job.request is not None:
                job.request.items = []
        self._forward([job for job in jobs if job.error is None])
        responses = [self._respond(context, index, job) for index, job in enumerate(jobs)]
        elapsed_ms = (time.perf_counter() - started) * 1000
        metrics = getattr(context, "metrics", None)
        if metrics is not None:  # TorchServe's own per-batch metric, as its BaseHandler.handle records it
            metrics.add_time("HandlerTime", round(elapsed_ms, 2), None, "ms")
        logger.info(
            "tsctl batch size=%d items=%d rejected=%d time_ms=%.1f",
            len(jobs),
            sum(len(job.inputs) for job in jobs if job.error is None),
            sum(job.error is not None for job in jobs),
            elapsed_ms,
        )
        return responses

    def read(self, row, index: int = 0) -> Job:
        """One TorchServe row (request ``index`` of the batch) as a Job: its request, decoded once
        (protocol.py: JSON, KServe v1/v2, v2's binary tensor extension), or the error it gets."""
        job = Job(None)
        self.current.job = job  # what parsing meters (self.spend) is this request's
        try:
            headers = request_headers(self.context, index)
            if headers is not None and headers.get("explain") == "True":
                raise ClientError(
                    f"{type(self).__name__} gives no explanations (TorchServe's /explanations, KServe's "
                    ":explain): send the request to /predictions, :predict or /infer",
                    HTTPStatus.NOT_IMPLEMENTED,
                )
            request = protocol.parse_request(row, self.item_keys, self.v2_datatypes, self.limits, headers, self.spend)
            job.binary = protocol.wants_binary(request, self.v2_output_name)
            if job.binary and headers is None:  # no context to set the answer's header length on
                raise ClientError("binary outputs need a TorchServe worker's context: ask for JSON outputs")
            job.request = request
        except Exception as exc:  # noqa: BLE001 - one request's problem, whatever it is
            self.refuse(job, client_error(exc, "the request could not be read"))
        finally:
            self.current.job = None
        return job

    def refuse(self, job: Job, error: ClientError):
        """Fail ``job`` with ``error``; what it had counted against its batch's budget is given back."""
        job.fail(error)
        budget = getattr(self, "budget", None)
        if budget is not None:
            budget.give_back(job)

    def decode_jobs(self, jobs: List[Job]):
        """Decode every item of the jobs not failed yet, in ``decode_threads`` threads."""
        tasks = [(job, position) for job in jobs if job.error is None for position in range(len(job.request.items))]
        for job in jobs:
            job.inputs = [None] * (len(job.request.items) if job.error is None else 0)
        if self.pool is not None and len(tasks) > 1:
            list(self.pool.map(self._decode_one, tasks))
        else:
            for task in tasks:
                self._decode_one(task)

    def _decode_one(self, task):
        """Decode one item into its job's inputs; the first failure fails the job, whose later items
        are skipped. In a request of several items the message names the item."""
        job, position = task
        if job.error is not None:
            return
        self.current.job = job
        try:
            job.inputs[position] = self.decode(job.request.items[position])
        except Exception as exc:  # noqa: BLE001 - one item's problem is its request's error
            error = client_error(exc, "the input could not be decoded")
            if len(job.request.items) > 1:
                error = type(error)(f"input {position}: {error.message}", error.status)
            self.refuse(job, error)
        finally:
            self.current.job = None

    def _forward(self, jobs: List[Job]):
        """Run the valid inputs through the model in chunks of at most batchSize inputs. A chunk that
        fails runs again request by request, so one request's failure is that request's 500 only."""
        rows = [(job, position) for job in jobs for position in range(len(job.inputs))]
        for job in jobs:
            job.answers = [None] * len(job.inputs)
        retry = []
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start : start + self.batch_size]
            try:
                answers = self._run([job.inputs[position] for job, position in chunk])
            except Exception as exc:  # noqa: BLE001 - retried per request below
                if protocol.out_of_memory(exc):  # the same requests alone start from an empty cache
                    release_memory(self.device)
                retry.extend(job for job, _ in chunk if job not in retry)
                continue
            for (job, position), answer in zip(chunk, answers):
                job.answers[position] = answer
        for job in retry:
            try:
                job.answers = [
                    answer
                    for start in range(0, len(job.inputs), self.batch_size)
                    for answer in self._run(job.inputs[start : start + self.batch_size])
                ]
            except ClientError as error:  # a hook that knows the inputs were at fault says so
                job.fail(error)
            except Exception as exc:  # noqa: BLE001 - the model failed on this request
                logger.exception("tsctl inference failed for one request")
                if protocol.out_of_memory(exc):  # 507; what it held given back for the next batch
                    release_memory(self.device)
                job.fail(protocol.error_for(exc, protocol.INFERENCE, "inference failed"))

    def _run(self, inputs: list) -> list:
        """preprocess -> inference -> postprocess for one chunk; exactly one answer per input."""
        with torch.inference_mode():
            answers = self.call_postprocess(self.inference(self.preprocess(inputs)), inputs)
        if not isinstance(answers, list) or len(answers) != len(inputs):
            got = len(answers) if isinstance(answers, list) else type(answers).__name__
            raise RuntimeError(
                f"{type(self).__name__}.postprocess returned {got} answers for {len(inputs)} inputs: "
                "it must return a list with one answer per input, in order"
            )
        return answers

    def _respond(self, context, index: int, job: Job) -> bytes:
        """The request's answer or error, encoded once (protocol.py), its status and headers set."""
        if job.error is not None:
            error = job.error
            self._set_status(context, index, error.status, HTTPStatus(error.status).phrase)
            logger.info("tsctl request %d rejected (%d): %s", index, error.status, error.message)
            data, headers = protocol.encode_error(error)
        else:
            v2 = self.v2_output(job.answers) if job.request.form is protocol.V2 else None
            data, headers = protocol.encode_answers(
                job.request, job.answers, self.model_name, v2, self.model_version, job.binary
            )
        self._set_headers(context, index, headers)
        return data

    @staticmethod
    def _set_status(context, index: int, status: int, phrase: str):
        processors = getattr(context, "request_processor", None)
        if processors is not None and index < len(processors):
            context.set_response_status(status, phrase, idx=index)

    @staticmethod
    def _set_headers(context, index: int, headers: dict):
        processors = getattr(context, "request_processor", None)
        if processors is not None and index < len(processors):
            for name, value in headers.items():
                if name == "Content-Type":
                    context.set_response_content_type(index, value)
                else:
                    context.set_response_header(index, name, value)


def takes_inputs(method) -> bool:
    """True if the bound ``method`` takes a second positional argument (``postprocess(output, inputs)``)."""
    parameters = inspect.signature(method).parameters.values()
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in parameters)


def request_headers(context, index: int) -> Optional[dict]:
    """The HTTP headers of request ``index`` of the batch (names as the client spelt them); None
    without a worker's context (a KServe transformer reading a body)."""
    processors = getattr(context, "request_processor", None)
    if not processors or index >= len(processors):
        return None
    return context.get_all_request_header(index)


def client_error(exc: BaseException, what: str) -> ClientError:
    """The error one request gets for an exception raised while reading or decoding it
    (``protocol.STATUS``). Anything but a ClientError or a RecursionError is a handler bug or an
    input too big to handle: logged with its traceback."""
    if not isinstance(exc, (ClientError, RecursionError)):
        logger.warning("tsctl: %s", what, exc_info=exc)
    return protocol.error_for(exc, protocol.READ, what)


def entry_point(handler_class):
    """A TorchServe ``module:handle`` function serving ``handler_class``.

    The instance lives on the TorchServe context it was initialised with. A worker has one context
    for its life, so one instance per worker process, as TorchServe does; every ``LocalModel`` has
    its own context, so two of them (of one model directory, say) never share an instance or the
    settings it read, and the instance goes when its context does."""

    def handle(data, context):
        handler = handler_for(context)
        if handler is None:
            handler = handler_class()
            handler.initialize(context)
            vars(context).setdefault("_tsctl_handlers", {})[handle] = handler
        if data is None:
            return None
        return handler.handle(data, context)

    def handler_for(context):
        """The instance serving ``context``, or None before the first call."""
        return getattr(context, "_tsctl_handlers", {}).get(handle)

    handle.handler_class = handler_class
    handle.handler_for = handler_for
    return handle


def is_toolkit_entry(function) -> bool:
    """True for a toolkit ``module:handle`` function or the ``handle`` of a toolkit handler instance,
    from this copy of ``handlers`` or another one (each archive carries its own)."""
    owner = getattr(function, "__self__", None)
    return hasattr(function, "handler_class") or any(
        (klass.__module__, klass.__qualname__) == (ToolkitHandler.__module__, ToolkitHandler.__qualname__)
        for klass in type(owner).__mro__
    )


envelopes.step_aside_for(is_toolkit_entry)
