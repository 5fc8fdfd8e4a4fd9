"""``tsctl package --golden DIR`` and ``tsctl verify``: golden answers recorded in, and replayed from,
an archive (the format: handlers/golden.py).

Recording runs the freshly built archive in a TorchServe worker (``LocalModel``, one request at a time,
each with the content type its file suffix says, or the one ``--golden-content-type`` gives) before the
archive is moved into place, so a build whose golden run fails leaves nothing behind. Replaying compares
each answer with the recorded one within ``atol``: in-process, or against a server (``--url``) speaking
TorchServe's API (``ts``) or KServe's v1/v2, a transformer in front of a predictor included.
"""

import base64
import dataclasses
import hashlib
import json
import tempfile
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

from handlers import archives, identity
from handlers import golden as answers
from handlers.archives import printable
from handlers.requests import content_type

from . import handler_resolution, mar
from .errors import ServerFailure, UserError
from .inprocess import worker_gpu
from .output import quiet

MAX_INPUT_BYTES = 16 << 20
MAX_TOTAL_BYTES = 48 << 20
PROTOCOLS = ("ts", "v1", "v2")


def requests_in(source: Path, kind: Optional[str] = None, flag: str = "--golden") -> List[Tuple[str, bytes, str]]:
    """(name, body, content type) of each golden request: every file of a directory (its type ``kind``,
    '' for none, else from its suffix), or each item of a JSON list (a JSON body each). ``flag``: the
    option that named ``source``, in messages (``tsctl shadow --inputs`` reads its requests here too)."""
    if not source.exists():
        raise UserError(f"{flag} {source} does not exist: give a directory of inputs or a JSON list of requests")
    if source.is_file():
        if kind is not None:
            raise UserError(f"--golden-content-type is for a directory of inputs: {source}'s items are JSON bodies")
        try:
            items = json.loads(source.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise UserError(f"{flag} {source} is not a JSON list of request bodies: {exc}") from None
        if not isinstance(items, list) or not items:
            raise UserError(f"{flag} {source} must hold a JSON list of request bodies, one per request")
        return [(f"{source.name}[{i}]", json.dumps(item).encode(), "application/json") for i, item in enumerate(items)]
    files = sorted(p for p in source.iterdir() if p.is_file() and not p.name.startswith("."))
    if not files:
        raise UserError(f"{flag} {source} holds no input files")
    found, total = [], 0
    for path in files:
        size = path.stat().st_size
        total += size
        if size > MAX_INPUT_BYTES or total > MAX_TOTAL_BYTES:
            raise UserError(
                f"{flag} {path} makes the golden inputs {total:,} bytes, above {MAX_TOTAL_BYTES:,} "
                f"(or the file above {MAX_INPUT_BYTES:,}): use smaller inputs"
            )
        found.append((path.name, path.read_bytes(), content_type(path) if kind is None else kind))
    return found


def weights_sha256(path: Optional[str]) -> Optional[str]:
    """sha256 of the weights (--serialized-file; a directory: each file's name and bytes, in order)."""
    if not path:
        return None
    root, digest = Path(path), hashlib.sha256()
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    for file in files:
        if root.is_dir():
            digest.update(file.relative_to(root).as_posix().encode())
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def record(
    archive: archives.ArchiveLike,
    source: Path,
    weights: Optional[str] = None,
    progress: Callable = quiet,
    allow_errors=False,
    metrics_config: Optional[str] = None,
    kind: Optional[str] = None,
    gpu: str = "cpu",
) -> dict:
    """Run ``archive`` in-process (on ``gpu``: ``--golden-gpu``, inprocess.worker_gpu) on the golden requests;
    the golden.json it gets. ``progress`` hears of
    the load and of each input (archiver.output.Progress). An answer of the handler failing (5xx) is no
    golden answer: a ServerFailure naming the input and the handler's error, unless ``allow_errors``
    (a refusal, 4xx, is one: the input is checked to be refused). ``metrics_config``: the worker's
    metrics.yaml (None: TorchServe's); ``kind``: the files' content type (``requests_in``)."""
    requests = requests_in(source, kind)
    progress(f"golden: loading the archive in-process for {len(requests)} inputs (torch, the handler)")

    def each(index: int):
        progress(f"golden: input {index + 1}/{len(requests)} {printable(requests[index][0])}")

    with archives.opened(archive) as opened:
        bodies = [(body, kind) for _, body, kind in requests]
        results, settings = in_process(opened, bodies, each, True, metrics_config, worker_gpu(gpu, opened))
        found = identity.read(opened) or {}
        handler = f"{found.get('module')}.{found.get('class')}" if found else opened.model["handler"]
    failed = [(name, answer) for (name, _, _), (status, answer) in zip(requests, results) if status >= 500]
    if failed and not allow_errors:
        name, answer = failed[0]
        said = answer.get("message") if isinstance(answer, dict) else None
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise ServerFailure(
            f"--golden {printable(name)}{more}: the handler failed ({printable(str(said or answer))[:300]}): fix "
            "the handler or the input, or pass --golden-allow-errors to record its error answers"
        )
    cases = [
        {
            "name": name,
            "content_type": kind,
            "body_b64": base64.b64encode(body).decode(),
            "status": status,
            "answer": answer,
        }
        for (name, body, kind), (status, answer) in zip(requests, results)
    ]
    return {
        "fingerprint": {
            "handler": handler,
            "settings": settings,
            "toolkit": identity.VERSION,
            "versions": answers.versions(),
            "weights_sha256": weights_sha256(weights),
        },
        "cases": cases,
    }


def package(
    options: mar.PackageOptions,
    source: str,
    progress: Callable = quiet,
    allow_errors=False,
    metrics_config=None,
    kind: Optional[str] = None,
    gpu: str = "cpu",
) -> Tuple[Path, mar.BuildPlan, dict]:
    """Build the archive in a scratch directory, record its golden answers, and only then write it,
    with MAR-INF/golden.json, to its place (atomically, as every build; signed before that one write
    with ``options.sign_key``). ``progress`` hears of each step; ``allow_errors`` records the handler's
    failures (5xx) too, with a note naming them; ``metrics_config``: the golden run's metrics.yaml;
    ``kind``: the inputs' content type (None: each file's suffix's); ``gpu``: where the golden run's worker
    runs (``--golden-gpu``)."""
    target = mar.archive_path(options.export_path, options.model_name, options.archive_format)
    if (target.exists() or target.is_symlink()) and not options.force:
        raise UserError(f"{target} already exists: pass --force to overwrite it")
    with tempfile.TemporaryDirectory(prefix="tsctl-golden-") as scratch:
        built, planned = mar.build(dataclasses.replace(options, export_path=scratch, force=True, sign_key=None))
        golden = record(built, Path(source), options.serialized_file, progress, allow_errors, metrics_config, kind, gpu)
    failed = [case["name"] for case in golden["cases"] if case["status"] >= 500]
    if failed:
        planned.notes.append(
            f"golden: {len(failed)} recorded answer(s) of the handler failing ({', '.join(failed)}; "
            "--golden-allow-errors): 'tsctl verify' expects them to fail the same way"
        )
    planned.entries[answers.GOLDEN] = (json.dumps(golden, indent=1, sort_keys=True) + "\n").encode()
    return mar.write_plan(planned, options), planned, golden


# ---- verify -------------------------------------------------------------------------------------------
@dataclass
class Report:
    where: str
    checked: int = 0
    problems: List[str] = field(default_factory=list)
    versions: List[str] = field(default_factory=list)  # libraries here that differ from packaging time

    def as_json(self) -> dict:
        return dataclasses.asdict(self)


def base_url(url: str) -> str:
    """``--url`` as the base URL requests are sent under: ``http://HOST:PORT[/PATH]``, where
    ``HOST:PORT`` alone means ``http://HOST:PORT``. Anything else is one UserError naming the fix."""
    text = url.strip()
    if "://" not in text:
        text = f"http://{text}"
    parts = urllib.parse.urlsplit(text)
    example = "give http://HOST:PORT, e.g. http://127.0.0.1:8080"
    if parts.scheme.lower() != "http":
        raise UserError(f"--url {url}: only plain http:// servers can be reached (not {parts.scheme}://): {example}")
    try:
        port = parts.port
    except ValueError:
        raise UserError(f"--url {url} has no valid port: {example}") from None
    if not parts.hostname or (port is None and parts.netloc.endswith(":")):
        raise UserError(f"--url {url} names no host and port: {example}")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise UserError(f"--url {url} may hold a host, a port and a path only: {example}")
    if parts.hostname.isdigit():  # '57397': a port without its host
        raise UserError(f"--url {url} names no host: {example}")
    endpoint = next((p for p in ("/predictions/", "/v1/models/", "/v2/models/") if p in parts.path + "/"), None)
    if endpoint:
        raise UserError(
            f"--url {url} names an endpoint ({endpoint}...): give the server's base URL, e.g. "
            f"{parts.scheme}://{parts.netloc}; verify adds the path --protocol asks for"
        )
    return text.rstrip("/")


def verify(
    archive,
    url: Optional[str] = None,
    protocol: str = "ts",
    atol: float = answers.DEFAULT_ATOL,
    model: Optional[str] = None,
    timeout: float = 60,
    golden_from=None,
    progress: Callable[[str], None] = lambda message: None,
    metrics_config: Optional[str] = None,
    headers: Optional[dict] = None,
    gpu: str = "auto",
) -> Report:
    """Replay the golden answers of ``archive`` (or of ``golden_from``: another archive of the same
    model, e.g. the original of an ONNX export) in-process with ``archive`` or against ``url``
    (``base_url``). A server that has no endpoint for ``protocol`` (every answer a 404 no golden
    answer was) is a ServerFailure saying so, never a report of mismatches. ``progress`` hears of each
    input as it is answered; ``metrics_config``: the in-process worker's metrics.yaml (None: TorchServe's);
    ``headers``: sent with each request to ``url`` (a token-auth server's ``Authorization``); ``gpu``: where the
    in-process worker runs (``--gpu``: inprocess.worker_gpu)."""
    with archives.opened(archive) as opened:
        golden = answers.read(golden_from or opened)
        if golden is None:
            raise UserError(f"{golden_from or opened.path} has no {answers.GOLDEN}: package it with --golden DIR first")
        if protocol not in PROTOCOLS:
            raise UserError(f"--protocol {protocol!r} must be one of {', '.join(PROTOCOLS)}")
        model = model or opened.model_name
        kind = (identity.read(opened) or {}).get("input")  # None: not a toolkit handler
        atol = max(atol, precision_atol(opened))
        return replay(opened, golden, url, protocol, atol, model, kind, timeout, progress, metrics_config, headers, gpu)


def precision_atol(archive: archives.Archive) -> float:
    """How far a golden number may move for the archive's ``handler.precision`` (handlers/golden.py's
    PRECISION_ATOL): a model run in fp16 or bf16 is checked at that tolerance, whatever ``--atol`` says."""
    handler = archive.config.get("handler")
    precision = handler.get("precision", "fp32") if isinstance(handler, dict) else "fp32"
    return answers.PRECISION_ATOL.get(precision, answers.DEFAULT_ATOL)


def replay(
    archive: archives.Archive,
    golden: dict,
    url,
    protocol,
    atol,
    model,
    kind,
    timeout,
    progress,
    metrics_config=None,
    headers: Optional[dict] = None,
    gpu: str = "auto",
) -> Report:
    """``verify``'s replay of ``golden``'s cases, ``archive`` and its golden answers read."""
    cases = golden["cases"]
    if url is None:
        report = Report("in-process")
        progress(f"loading {archive.path.name}")
        bodies = [(answers.body(c), c["content_type"]) for c in cases]

        def each(index: int):
            progress(f"{index + 1}/{len(cases)} {cases[index]['name']}")

        results, _ = in_process(archive, bodies, each, metrics_config=metrics_config, gpu=worker_gpu(gpu, archive))
        report.versions = answers.version_changes(golden)
    else:
        url = base_url(url)
        report = Report(f"{url} ({protocol})")
        results = []
        for number, case in enumerate(cases, 1):
            results.append(served(url, protocol, model, kind, case, timeout, headers or {}))
            progress(f"{number}/{len(cases)} {case['name']}: {results[-1][0]}")
        refused = unauthorized(url, results, bool(headers))
        if refused:
            raise ServerFailure(refused)
        missing = missing_endpoint(url, protocol, model, cases, results)
        if missing:
            raise ServerFailure(missing)
    for case, (status, answer) in zip(cases, results):
        report.checked += 1
        problem = answers.check_case(case, status, answer, atol)
        if problem:
            report.problems.append(problem)
    return report


def in_process(
    archive: archives.ArchiveLike,
    requests: List[Tuple[bytes, str]],
    before_each: Optional[Callable[[int], None]] = None,
    with_settings: bool = False,
    metrics_config: Optional[str] = None,
    gpu: int = -1,
) -> Tuple[List[Tuple[int, Any]], dict]:
    """(status, answer) of each (body, content type), one request at a time as a worker would run
    it alone; and, ``with_settings``, the handler's settings (``handler_settings``; else {}).
    ``before_each(i)`` is called before request i runs; ``metrics_config``: the worker's metrics.yaml; ``gpu``:
    its GPU (-1: the CPU)."""
    # a worker process: only for --golden and in-process verify
    from serving.local_model import LocalModel, RequestInput

    with LocalModel(archive, batch_size=1, metrics_config=metrics_config, gpu=None if gpu < 0 else gpu) as model:
        results = []
        for index, (body, kind) in enumerate(requests):
            if before_each is not None:
                before_each(index)
            [response] = model.serve([RequestInput(body, typed(kind))])
            results.append((response.status, response.json()))
        settings = handler_settings(model.model_dir, model.manifest, model.record) if with_settings else {}
    return results, settings


def handler_settings(model_dir: Path, manifest: dict, record: Optional[dict]) -> dict:
    """The toolkit handler's settings as its worker reads them: its class's ``Settings`` filled from
    model-config.yaml's ``handler:`` section. The class is found as packaging finds it, without its
    model: a toolkit handler's by name (``handlers.catalogue``), a handler file's by importing the file
    (``handler_resolution.load_handler_file``). {} for a handler that is not a toolkit one (no record)."""
    import importlib

    from handlers import catalogue, settings

    from .model_config import load_model_config

    if record is None:
        return {}
    config = manifest["model"].get("configFile")
    section = load_model_config(model_dir / config).get("handler") if config else None
    own_file = model_dir / f"{record['module']}.py"
    named = (record["class"], tuple(record["bases"]))
    known = [h.settings for h in catalogue.HANDLERS.values() if (h.class_name, h.bases) == named]
    if own_file.is_file() and not record["module"].startswith("handlers."):
        settings_class = getattr(handler_resolution.load_handler_file(own_file), record["class"]).Settings
    elif known:  # a toolkit handler by name: no torch here
        settings_class = getattr(settings, known[0])
    else:
        settings_class = getattr(importlib.import_module(record["module"]), record["class"]).Settings
    return dataclasses.asdict(settings.read_settings(settings_class, section))


ENDPOINTS = {"ts": "/predictions/{model}", "v1": "/v1/models/{model}:predict", "v2": "/v2/models/{model}/infer"}


def missing_endpoint(url: str, protocol: str, model: str, cases: List[dict], results, suffix="") -> Optional[str]:
    """What to say when the server at ``url`` has no endpoint for ``protocol`` or no ``model``: every
    answer a 404 where no golden answer was one; None otherwise (the answers are compared). ``suffix``:
    of the flags named (``--model``, ``--protocol``), for ``tsctl shadow``'s ``--model-candidate``."""
    if not results or any(status != 404 for status, _ in results) or any(c["status"] == 404 for c in cases):
        return None
    answer = results[0][1]
    said = answer.get("message") or answer.get("error") or answer.get("detail") if isinstance(answer, dict) else answer
    said = " ".join(str(said or "").split())[:160]
    path = ENDPOINTS[protocol].format(model=model)
    if model in said and "not found" in said.lower():  # the server speaks the protocol: the model is missing
        return f"{url} serves no model {model} (404: {said}): pass --model{suffix} with the name it is served under"
    if protocol == "ts":
        hint = f"is it a KServe server? try --protocol{suffix} v1 or v2"
    else:
        hint = f"is it TorchServe? try --protocol{suffix} ts (or the other of v1 and v2)"
    return f"{url} has no {path} (404 on every golden request: {said}): {hint}"


KEY_REFUSED = "InvalidKeyException"  # TorchServe's answer (400) to a missing, wrong or expired key


def unauthorized(url: str, results, had_token: bool) -> Optional[str]:
    """What to say when the server at ``url`` refused every golden request for its token (TorchServe's
    token authorization: 400 ``InvalidKeyException``, on the engine too); None otherwise."""
    refused = [isinstance(answer, dict) and answer.get("type") == KEY_REFUSED for _, answer in results]
    if not results or not all(refused):
        return None
    if had_token:
        return f"{url} refused the token on every golden request ({KEY_REFUSED}): pass its current inference key"
    return (
        f"{url} asks for a token ({KEY_REFUSED} on every golden request): pass --token with the inference key "
        "of its key_file.json, or use --served for a server tsctl started"
    )


def served(
    url: str, protocol: str, model: str, kind: Optional[str], case: dict, timeout: float, headers: dict, binary=False
) -> Tuple[int, Any]:
    """Send one golden request the way ``protocol`` carries it; (status, the answer for it). ``kind``:
    what the archive's toolkit handler reads (its record's ``input``; None: not a toolkit handler).
    To a toolkit handler a JSON body goes as it is (KServe v1/v2 shapes included) and a file as one
    KServe instance (text as itself for a text handler, anything else base64), the request built by
    handlers/kserve_client.py. Over v2 a handler that is not the toolkit's gets the file as ``tsctl
    predict --content-type`` sends it (``MLServerRuntime.request_body``): one BYTES element with the
    recorded type as its ``content_type``, so that MLServer hands it what TorchServe's worker gave it
    when the answer was recorded. Answers are read by handlers/kserve_client.py; one that is not UTF-8
    comes back as its bytes with ``binary`` (else as text, the bytes it cannot decode replaced)."""
    from handlers import protocol as wire

    from .server import request

    data, content = answers.body(case), case["content_type"]
    if protocol == "ts":
        return request(f"{url}/predictions/{model}", data, "POST", {**typed(content), **headers}, timeout, binary)
    path = f"/v1/models/{model}:predict" if protocol == "v1" else f"/v2/models/{model}/infer"
    if protocol == "v2" and kind is None:
        from .engines import ENGINES

        body, sent = ENGINES["mlserver"].request_body(data, content, as_request=False)
        kinds = {"Content-Type": sent}
    elif content == wire.JSON_TYPE:  # a whole request body (KServe v1/v2 shapes included): sent as it is
        return request(url + path, data, "POST", {"Content-Type": content, **headers}, timeout, binary)
    else:
        item = data.decode("utf-8") if kind == "text" else base64.b64encode(data).decode()
        body, kinds = wire.encode_request([item], protocol)
    status, answer = request(url + path, body, "POST", {**kinds, **headers}, timeout, binary)
    if status != 200 or isinstance(answer, bytes):
        return status, answer
    try:
        found = wire.decode_answers(answer)
    except ValueError:
        return status, answer
    return (status, wire.jsonable(found[0])) if found else (status, answer)


def typed(kind: str) -> dict:
    """The headers of a golden request of content type ``kind``: none for '' (sent without one)."""
    return {"Content-Type": kind} if kind else {}
