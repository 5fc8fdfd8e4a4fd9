"""TorchServe's management API on the tsctl engine: the same calls, statuses and bodies as TorchServe 0.12.

- ``GET /models[?limit=&next_page_token=]``: the default version of each model, sorted by name, pages
  of ``limit`` (at most 100: outside 0..100 it is 100) and ``nextPageToken`` while more remain.
- ``GET /models/NAME[/VERSION|/all]``: TorchServe's describe (``describe_model``).
- ``POST /models?url=&model_name=&initial_workers=&batch_size=&max_batch_delay=&response_timeout=&synchronous=``
  (or those keys as a JSON body): register an archive of the model store (``archive_for``), its
  settings as TorchServe picks them (``register_spec``), its signature checked first when the engine
  has ``--public_key`` (``open_model``, the one check of startup), its workers started; ``synchronous``
  (default true) waits for them.
- ``DELETE /models/NAME[/VERSION]``: unregister (queued requests 503, the batches workers hold answered,
  then the workers end); not the default version while others remain (403, as TorchServe).
- ``PUT /models/NAME[/VERSION]?min_worker=&max_worker=&synchronous=`` (or ``model_version=``): scale
  (``synchronous`` default false: 202 at once).
- A register or scale whose workers would not fit in the engine's memory is refused before any starts:
  TorchServe's 507 (``memory_admission.admit``, ``admitted``).
- ``PUT /models/NAME/VERSION/set-default``.

Safe by default: every call that changes state (register, unregister, scale, set-default) answers
TorchServe's 405 unless ``enable_model_api=true`` (config.properties, ``--enable_model_api``); the
listing and describe stay. TorchServe 0.12 gates only register and unregister; the engine gates scale
and set-default too, because its management API may share the port KServe exposes. Token
authorization (serving/engine/token_auth.py) is checked before any of it.

Bad input is one TorchServe-shaped 4xx (``{"code", "type", "message"}``) and changes nothing, where
TorchServe 0.12 may differ: a query value that is not a whole number (TorchServe takes the default),
``min_worker`` 0 or above the engine's ``MAX_WORKERS`` (TorchServe scales to 0), batch settings TorchServe
would take and then ignore (``ts_config.settings_problem``), an archive that fails to load (TorchServe:
500, and the model stays registered with no worker). URLs: a file name is looked up in the model store,
as TorchServe does, and must lie inside it (serving/model_store.py: a name with a directory part, which
TorchServe reads as its file name, and a link leading out of the store, which TorchServe follows, are its
404); ``file://``/``http(s)://`` URLs outside ``allowed_urls`` get TorchServe's 404; inside it the engine
downloads nothing (400, TorchServe's message for a download that failed, with the reason). A call's body
(a register's parameters as JSON) is bounded by ``body_limit.MAX_MANAGEMENT_BODY`` before it is read.
"""

import asyncio
import datetime
import functools
import inspect
import json
import logging
import os
import re
from http import HTTPStatus
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from starlette.requests import Request as HttpRequest
from starlette.responses import Response as HttpResponse
from starlette.routing import Route

from handlers.archives import Archive, ArchiveError
from handlers.errors import frontend_error
from handlers.signing import SignatureError

from .. import config_properties, frontend_settings, gpus, model_config_keys, tree_digests, ts_config
from ..model_store import NotInStore, store_entry
from ..worker.worker_process import LOAD_TIMEOUT
from . import memory_admission
from .workers import MAX_WORKERS, ModelWorkers

logger = logging.getLogger("tsctl.engine")

NOT_ALLOWED = "Requested method is not allowed, please refer to API document."
NOT_FOUND = "Requested resource is not found, please refer to API document."
VALID_URL = re.compile(r"file?://.*|http(s)?://.*", re.IGNORECASE)  # TorchServe's ArchiveUtils.VALID_URL_PATTERN
WHOLE = re.compile(r"[+-]?\d{1,18}")  # as Java's Integer.parseInt reads one (any decimal digits), and not too long
MODEL_NAME = re.compile(r"[^/\x00-\x1f\x7f]{1,255}")  # one segment of /predictions/NAME
ALL_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]
# What TorchServe's describe adds for settings the engine has in one form only: their values (a model that is
# not stateful: the sequence fields; model_config_keys.described: the noted keys).
TORCHSERVE_DEFAULTS = {
    "parallelType": "",
    "parallelLevel": 0,
    "deviceType": "cpu",
    "stateful": False,
    "sequenceMaxIdleMSec": 0,
    "sequenceTimeoutMSec": 0,
    "maxNumSequence": 0,
    "maxSequenceJobQueueSize": 0,
}


class ApiError(Exception):
    """A TorchServe-shaped error answer."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status, self.kind, self.message = int(status), kind, message


def ts_json(body, status: int = HTTPStatus.OK) -> HttpResponse:
    """JSON as TorchServe's frontend sends it: indented by two spaces, a newline after."""
    return HttpResponse(json.dumps(body, indent=2) + "\n", int(status), media_type="application/json")


def ts_error(status: int, kind: str, message: str) -> HttpResponse:
    return HttpResponse(frontend_error(status, kind, message), int(status), media_type="application/json")


def status(message: str, code: int = HTTPStatus.OK) -> HttpResponse:
    return ts_json({"status": message}, code)


Done = Tuple[str, int]  # what a call that changes state answers: TorchServe's status message, and its HTTP status


def model_not_found(name: str) -> ApiError:
    return ApiError(HTTPStatus.NOT_FOUND, "ModelNotFoundException", f"Model not found: {name}")


def version_not_found(name: str, version: str) -> ApiError:
    return ApiError(
        HTTPStatus.NOT_FOUND,
        "ModelVersionNotFoundException",
        f"Model version: {version} does not exist for model: {name}",
    )


# ---- Query values -----------------------------------------------------------------------------------
def whole(params: Dict[str, str], key: str, default: Optional[int]) -> Optional[int]:
    """A query value that must be a whole number (TorchServe takes the default for anything else: here
    400), or ``default`` when absent."""
    value = params.get(key)
    if value is None:
        return default
    text = str(value).strip()
    if not WHOLE.fullmatch(text):  # not int(): it reads "1_0" as 10
        raise ApiError(HTTPStatus.BAD_REQUEST, "BadRequestException", f"{key}={text[:100]!r} is not a whole number")
    return int(text)


def flag(params: Dict[str, str], key: str, default: bool) -> bool:
    value = params.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() not in ("true", "false"):
        raise ApiError(HTTPStatus.BAD_REQUEST, "BadRequestException", f"{key}={value!r} is not true or false")
    return str(value).strip().lower() == "true"


async def parameters(http: HttpRequest) -> Dict[str, str]:
    """The call's parameters: its query, or for a JSON body (register), that body's keys."""
    if http.headers.get("content-type", "").split(";")[0].strip().lower() == "application/json":
        try:
            body = json.loads(await http.body() or b"{}")
        except ValueError as exc:
            raise ApiError(
                HTTPStatus.BAD_REQUEST, "BadRequestException", f"the JSON body could not be read: {exc}"
            ) from None
        if not isinstance(body, dict):
            raise ApiError(HTTPStatus.BAD_REQUEST, "BadRequestException", "the JSON body is not an object")
        return {k: v if isinstance(v, (str, bool)) else json.dumps(v) for k, v in body.items() if v is not None}
    return dict(http.query_params)


# ---- Reading ----------------------------------------------------------------------------------------
def list_models(engine, params: Dict[str, str]) -> dict:
    limit = whole(params, "limit", 100)
    start = whole(params, "next_page_token", 0)
    limit = 100 if limit > 100 or limit < 0 else limit
    start = max(start, 0)
    names = sorted(engine.defaults)
    end = min(start + limit, len(names))
    page = {}
    if start + limit <= len(names):
        page["nextPageToken"] = str(start + limit)
    page["models"] = [{"modelName": n, "modelUrl": model_url(engine.defaults[n])} for n in names[start:end]]
    return page


def describe(engine, name: str, version: Optional[str]) -> List[dict]:
    versions = engine.versions.get(name)
    if not versions:
        raise model_not_found(name)
    if version == "all":
        return [describe_model(m) for m in list(versions.values())]
    model = engine.find(name, version)
    if model is None:
        raise version_not_found(name, version)
    return [describe_model(model)]


def model_url(model: ModelWorkers) -> str:
    return model.spec.url or model.spec.archive.name


def describe_model(model: ModelWorkers) -> dict:
    """TorchServe's describe answer for one model version."""
    spec = model.spec
    workers = []
    samples = gpus.sample_devices() if any(w.gpu >= 0 for w in model.workers) else {}  # NVML, once
    for worker in list(model.workers):
        process = worker.process
        workers.append(
            {
                "id": str(worker.id),
                "startTime": iso_time(process.started) if process else None,
                "status": {"BUSY": "READY", "STARTING": "LOADING"}.get(worker.status, worker.status),
                "memoryUsage": rss(process.pid) if process else 0,
                "pid": process.pid if process and process.alive() else -1,
                "gpu": worker.gpu >= 0,
                "gpuUsage": gpus.describe_usage(worker.gpu, samples),
            }
        )
    return {
        "modelName": spec.name,
        "modelVersion": spec.version,
        "modelUrl": model_url(model),
        "runtime": "python",
        **spec.describe_settings(),
        "startupTimeout": int(spec.startup_timeout or LOAD_TIMEOUT),
        **model_config_keys.described(),
        "continuousBatching": spec.continuous_batching,
        **TORCHSERVE_DEFAULTS,
        **(model.sequences.settings.described() if model.sequences is not None else {}),
        **devices_described(model.devices),
        "loadedAtStartup": spec.loaded_at_startup,
        "workers": workers,
        "jobQueueStatus": {
            "remainingCapacity": model.queue.limit - len(model.queue),  # (a stateful model's wait in sequences)
            "pendingRequests": len(model.queue),
        },
    }


def devices_described(devices) -> dict:
    """Where a model's workers run, as TorchServe's describe says it (ApiUtils.createModelResponse): its
    deviceType, and its deviceIds when it has a valid list (Gson leaves a null out)."""
    described = {"deviceType": "gpu" if devices.on_gpu else "cpu"}
    if devices.ids:
        described["deviceIds"] = list(devices.ids)
    return described


def iso_time(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# ---- Registering ------------------------------------------------------------------------------------
def archive_for(url: str, allowed: List[str], store: Path) -> Path:
    """The archive a register's ``url`` names, as TorchServe 0.12 finds it (ModelArchive.downloadModel):
    ``..`` refused; a URL matching ``allowed_urls`` would be downloaded into the store, which the engine
    does not do (400, unless the store has that file already: TorchServe's 500); a ``file://`` or
    ``http(s)://`` URL matching none is TorchServe's 404; anything else is the store's entry of that file
    name (a .mar, .tar.gz or unpacked directory) inside the store (``model_store.store_entry``: a
    directory part or a link leading out is TorchServe's 404 for a url it cannot find, with why)."""
    if not url:
        raise ApiError(HTTPStatus.NOT_FOUND, "ModelNotFoundException", "empty url")
    if ".." in url:
        raise ApiError(HTTPStatus.NOT_FOUND, "ModelNotFoundException", f"Relative path is not allowed in url: {url}")
    if any(re.fullmatch(pattern, url, re.IGNORECASE) for pattern in allowed if pattern):
        name = url.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0].split("#", 1)[0]
        if (store / name).exists():
            raise ApiError(
                HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerException", f"Model file already exists {name}"
            )
        raise ApiError(
            HTTPStatus.BAD_REQUEST,
            "DownloadArchiveException",
            f"Failed to download archive from: {url} (the tsctl engine downloads nothing: copy the archive "
            "into its model store and register it by its file name)",
        )
    if VALID_URL.fullmatch(url):
        raise ApiError(
            HTTPStatus.NOT_FOUND, "ModelNotFoundException", f"Given URL {url} does not match any allowed URL(s)"
        )
    try:
        found = store_entry(store, url.rstrip("/"))
        usable = not url.startswith(".") and (found.is_file() or (found / "MAR-INF").is_dir())
    except NotInStore as exc:
        raise ApiError(HTTPStatus.NOT_FOUND, "ModelNotFoundException", exc.message(url)) from None
    if not usable:
        raise ApiError(HTTPStatus.NOT_FOUND, "ModelNotFoundException", f"Model not found at: {url}")
    return found


def open_registered(archive: Path, store: Path) -> Archive:
    """A register's archive opened once, within the model store: what was opened must lie inside it
    (``Archive``'s ``within``), though a link may have been swapped since ``archive_for`` looked. The
    register reads everything from this one opening, and the workers run what it unpacks or copies."""
    try:
        return Archive(archive, within=store)
    except ArchiveError as exc:
        raise ApiError(HTTPStatus.BAD_REQUEST, "InvalidModelException", f"{archive.name}: {exc}") from None


def register_spec(
    params: Dict[str, str], archive: Archive, frontend: frontend_settings.Frontend
) -> ts_config.ModelSpec:
    """The model version a register makes, its settings picked as TorchServe 0.12 picks them
    (ModelManager.createModel, ApiUtils.handleRegister): ``batch_size``/``max_batch_delay`` given, else the
    archive's model-config.yaml, else 1 / 100; the archive's ``responseTimeout`` before ``response_timeout``;
    workers from the archive's ``minWorkers``/``maxWorkers`` when they make sense, else ``initial_workers``
    (default ``default_workers_per_model``, 0). Settings TorchServe would ignore are refused (400)."""
    try:
        config, name, version = archive.config, archive.model_name, archive.version
    except ArchiveError as exc:
        raise ApiError(HTTPStatus.BAD_REQUEST, "InvalidModelException", f"{archive.path.name}: {exc}") from None
    name = params.get("model_name") or name
    if not MODEL_NAME.fullmatch(name):
        raise ApiError(
            HTTPStatus.BAD_REQUEST,
            "BadRequestException",
            f"model_name {name!r} cannot be a model's name (a URL path segment)",
        )
    initial = whole(params, "initial_workers", frontend.configured_workers)
    low, high = config.get("minWorkers"), config.get("maxWorkers")
    if isinstance(low, int) and isinstance(high, int) and 0 < low <= high:
        workers = (low, high)
    else:
        workers = (initial, initial)
    response = config.get("responseTimeout") if (config.get("responseTimeout") or 0) > 0 else None
    settings = {
        "batchSize": first(whole(params, "batch_size", None), config.get("batchSize"), 1),
        "maxBatchDelay": first(whole(params, "max_batch_delay", None), config.get("maxBatchDelay"), 100),
        "responseTimeout": response or whole(params, "response_timeout", frontend.default_response_timeout),
    }
    problem = ts_config.settings_problem(settings)
    if problem is None and not 0 <= workers[0] <= MAX_WORKERS:
        problem = f"initial_workers is {workers[0]}: give 0 to {MAX_WORKERS}"
    if problem:
        for key, query in (
            ("batchSize", "batch_size"),
            ("maxBatchDelay", "max_batch_delay"),
            ("responseTimeout", "response_timeout"),
        ):
            problem = problem.replace(key, query)
        raise ApiError(HTTPStatus.BAD_REQUEST, "BadRequestException", problem)
    return ts_config.ModelSpec(
        name=name,
        version=version,
        archive=archive.path,
        default=False,
        min_workers=workers[0],
        max_workers=max(workers),
        batch_size=settings["batchSize"],
        max_batch_delay=settings["maxBatchDelay"],
        response_timeout=settings["responseTimeout"],
        url=params["url"],
        store=archive.within,
    )


def first(*values):
    return next(v for v in values if v is not None)


def load_failure(spec: ts_config.ModelSpec, error: BaseException) -> ApiError:
    """A register whose workers could not load the model: TorchServe's message, the worker's error, 400."""
    cause = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
    message = f"Failed to start workers for model {spec.name} version: {spec.version}: {cause}"
    return ApiError(HTTPStatus.BAD_REQUEST, "InvalidModelException", message[:2000])


async def register(engine, params: Dict[str, str]) -> Done:
    if params.get("url") is None:
        raise ApiError(HTTPStatus.BAD_REQUEST, "BadRequestException", "Parameter url is required.")
    synchronous = flag(params, "synchronous", True)
    path = archive_for(params["url"], engine.frontend.allowed_urls, engine.model_store)
    loop = asyncio.get_running_loop()
    archive = await loop.run_in_executor(None, open_registered, path, engine.model_store)
    try:
        spec = await loop.run_in_executor(None, register_spec, params, archive, engine.frontend)
        if spec.version in engine.versions.get(spec.name, {}):
            message = f"Model version {spec.version} is already registered for model {spec.name}"
            raise ApiError(HTTPStatus.CONFLICT, "ConflictStatusException", message)
        await admitted(engine, spec.name, spec.version, spec.min_workers, None)
        try:  # unpacked (or copied) from the one opening; its signature checked first
            model = await loop.run_in_executor(None, engine.open, spec, archive)
        except (ArchiveError, SignatureError, config_properties.ConfigError, tree_digests.TreeChanged) as exc:
            raise ApiError(HTTPStatus.BAD_REQUEST, "InvalidModelException", str(exc)) from None
    finally:
        archive.close()
    model.serving = not model.workers  # counts for the engine's readiness once loaded
    engine.add(model)
    logger.info("%s registered from %s (%d workers)", model.label, spec.url, spec.min_workers)
    if not model.workers:
        message = (
            f'Model "{spec.name}" Version: {spec.version} registered with 0 initial workers. Use scale '
            "workers API to add workers for the model."
        )
        return message, HTTPStatus.OK
    starting = asyncio.ensure_future(start_registered(engine, model))
    if not synchronous:
        return "Processing worker updates...", HTTPStatus.ACCEPTED
    error = await starting
    if error is not None:
        raise load_failure(spec, error)
    return (
        f'Model "{spec.name}" Version: {spec.version} registered with {spec.min_workers} initial workers',
        HTTPStatus.OK,
    )


async def start_registered(engine, model: ModelWorkers) -> Optional[BaseException]:
    """Start a registered model's workers; when one cannot load, unregister it again (no worker left,
    nothing else changed) and return why."""
    error = await model.start_settled()
    if error is None:
        model.serving = True
        return None
    logger.error("%s could not load, and is unregistered again: %s", model.label, error)
    engine.remove(model)
    await model.drain("the model could not load")
    engine.forget(model)
    return error


# ---- Changing ---------------------------------------------------------------------------------------
async def unregister(engine, name: str, version: Optional[str]) -> Done:
    versions = engine.versions.get(name)
    if not versions:
        raise model_not_found(name)
    default = engine.defaults.get(name)
    version = version or (default.spec.version if default else None)
    model = versions.get(version)
    if model is default and len(versions) > 1:
        raise ApiError(
            HTTPStatus.FORBIDDEN, "InvalidModelVersionException", f"Cannot remove default version for model {name}"
        )
    if model is None:
        raise version_not_found(name, version)
    engine.remove(model)
    await model.drain(f"model {name} version {model.spec.version} was unregistered")
    engine.forget(model)
    logger.info("%s unregistered", model.label)
    return f'Model "{name}" unregistered', HTTPStatus.OK


async def scale(engine, name: str, version: Optional[str], params: Dict[str, str]) -> Done:
    low = whole(params, "min_worker", 1)
    high = whole(params, "max_worker", low)
    version = version or params.get("model_version")
    synchronous = flag(params, "synchronous", False)
    if high < low:
        raise ApiError(HTTPStatus.BAD_REQUEST, "BadRequestException", "max_worker cannot be less than min_worker.")
    if name not in engine.defaults:
        raise model_not_found(name)
    model = engine.find(name, version)
    if model is None:
        raise version_not_found(name, version)
    if low < 1:
        why = f"min_worker is {low}: a model with no worker answers every request 503; unregister it, or give 1 or more"
        raise ApiError(HTTPStatus.BAD_REQUEST, "BadRequestException", why)
    if high > MAX_WORKERS:
        why = f"max_worker is {high}, above the engine's {MAX_WORKERS} workers per model version"
        raise ApiError(HTTPStatus.BAD_REQUEST, "BadRequestException", why)
    have = len(model.workers)
    await admitted(engine, name, version, low - have, model)
    model.spec.min_workers, model.spec.max_workers = low, high
    if low < have:
        await model.remove_workers(have - low, wait=synchronous)
    elif low > have:
        error = await model.add_workers(low - have, wait=synchronous)
        if error is not None:
            model.spec.min_workers = len(model.workers)
            message = f"Failed to start workers for model {name} version: {version or 'null'}"
            raise ApiError(HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerException", f"{message}: {error}"[:2000])
    if not synchronous:
        return "Processing worker updates...", HTTPStatus.ACCEPTED
    return f"Workers scaled to {low} for model: {name}" + (f", version: {version}" if version else ""), HTTPStatus.OK


async def admitted(engine, name: str, version: Optional[str], adding: int, model: Optional[ModelWorkers]):
    """``adding`` more workers of a model checked against the engine's memory (``memory_admission.admit``):
    refused, TorchServe's 507 for a scale that ran out of memory."""
    check = functools.partial(memory_admission.admit, name, version, adding, model, engine.all(), engine.inflight.limit)
    try:
        await asyncio.get_running_loop().run_in_executor(None, check)
    except memory_admission.NotEnoughMemory as exc:
        raise ApiError(HTTPStatus.INSUFFICIENT_STORAGE, "InternalServerException", str(exc)[:2000]) from None


def set_default(engine, name: str, version: str) -> Done:
    if name not in engine.versions:
        raise model_not_found(name)
    model = engine.versions[name].get(version)
    if model is None:
        raise ApiError(
            HTTPStatus.NOT_FOUND,
            "ModelVersionNotFoundException",
            f"Model version {version} does not exist for model {name}",
        )
    engine.set_default(model)
    return f'Default version successfully updated for model "{name}" to "{version}"', HTTPStatus.OK


# ---- Routes -----------------------------------------------------------------------------------------
def management_routes(engine) -> List[Route]:
    """TorchServe's management API; each call that changes state one at a time (``engine.changing``)."""

    async def answer(work, changes: bool = False) -> HttpResponse:
        """``work()``'s answer (a response, or an awaitable of one); an ApiError as TorchServe's error."""
        if changes and not engine.frontend.enable_model_api:
            return ts_error(HTTPStatus.METHOD_NOT_ALLOWED, "MethodNotAllowedException", NOT_ALLOWED)
        try:
            if not changes:
                return await settle(work())
            async with engine.changing:
                try:
                    message, code = await settle(work())
                finally:  # what is served may have changed (a scale that failed half-way too): as TorchServe saves
                    if engine.snapshots is not None:
                        engine.snapshots.save("snapshot")
            return status(message, code)
        except ApiError as exc:
            return ts_error(exc.status, exc.kind, exc.message)
        except Exception as exc:  # noqa: BLE001 - logged; the call gets TorchServe's 500, the engine goes on
            logger.exception("a management call failed")
            message = f"{type(exc).__name__}: {exc}"[:2000]
            return ts_error(HTTPStatus.INTERNAL_SERVER_ERROR, "InternalServerException", message)

    async def models(http: HttpRequest):
        if http.method == "GET":
            return await answer(lambda: ts_json(list_models(engine, dict(http.query_params))))
        if http.method == "POST":
            return await answer(lambda: registering(http), changes=True)
        return ts_error(HTTPStatus.METHOD_NOT_ALLOWED, "MethodNotAllowedException", NOT_ALLOWED)

    async def registering(http: HttpRequest):
        return await register(engine, await parameters(http))

    async def model(http: HttpRequest):
        name, version = http.path_params["name"], http.path_params.get("version")
        if http.method == "GET":
            return await answer(lambda: ts_json(describe(engine, name, version)))
        if http.method == "PUT":
            return await answer(lambda: scale(engine, name, version, dict(http.query_params)), changes=True)
        if http.method == "DELETE":
            return await answer(lambda: unregister(engine, name, version), changes=True)
        return ts_error(HTTPStatus.METHOD_NOT_ALLOWED, "MethodNotAllowedException", NOT_ALLOWED)

    async def default(http: HttpRequest):
        if http.method != "PUT":
            return ts_error(HTTPStatus.METHOD_NOT_ALLOWED, "MethodNotAllowedException", NOT_ALLOWED)
        name, version = http.path_params["name"], http.path_params["version"]
        return await answer(lambda: set_default(engine, name, version), changes=True)

    return [
        Route("/models", models, methods=ALL_METHODS),
        Route("/models/{name}", model, methods=ALL_METHODS),
        Route("/models/{name}/{version}", model, methods=ALL_METHODS),
        Route("/models/{name}/{version}/set-default", default, methods=ALL_METHODS),
    ]


async def settle(result):
    return await result if inspect.isawaitable(result) else result
