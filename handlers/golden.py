"""Golden answers: requests and the answers the archive gave when it was built, kept inside it.

    MAR-INF/golden.json
    {"fingerprint": {"handler": "handlers.image.ImageClassifier", "settings": {...}, "toolkit": "0.1.0",
                     "versions": {"torch": "2.15.0", "Pillow": "11.1.0", ...}, "weights_sha256": "..."},
     "cases": [{"name": "kitten.jpg", "content_type": "image/jpeg", "body_b64": "...",
                "status": 200, "answer": {...}}, ...]}

``tsctl package --golden DIR`` writes it (archiver/golden.py); ``tsctl verify`` replays it in-process
or against a server; a worker with ``handler: verify_on_start: true`` replays it in ``initialize``
and refuses to start when an answer drifted (``DriftError``: a runtime image with other library
versions, a preprocessing setting changed), naming the input and what differs. What shaped the
answers is in the fingerprint, so a drift can be traced to a version or the weights.
"""

import base64
import json
import math
from importlib import metadata
from typing import Any, List, Optional

from . import archives

GOLDEN = "MAR-INF/golden.json"
MAX_GOLDEN_BYTES = 64 << 20
LIBRARIES = ("torch", "torchvision", "Pillow", "numpy", "transformers", "tokenizers", "sentence-transformers")
DEFAULT_ATOL = 1e-4  # probabilities and embeddings agree to ~1e-6 across batch sizes; a real drift is far larger
# How far a golden number may move for a model run in each handler.precision: half precision keeps 11 (fp16) or 8
# (bf16) significant bits, so probabilities in [0, 1] move by up to ~1e-3 or ~1e-2 from their fp32 values
PRECISION_ATOL = {"fp32": DEFAULT_ATOL, "fp16": 5e-3, "bf16": 3e-2}


class DriftError(RuntimeError):
    """An answer that differs from the golden one: the message names the input and the difference."""


def versions() -> dict:
    """The installed versions of the libraries that shape answers (None where one is missing)."""
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def version_changes(golden: dict) -> List[str]:
    """The libraries whose installed versions differ from the ones golden.json was recorded with."""
    then, now = golden.get("fingerprint", {}).get("versions", {}), versions()
    return [
        f"{name} {now[name]} here, {then[name]} when packaged" for name in now if then.get(name, now[name]) != now[name]
    ]


def read(archive: archives.ArchiveLike) -> Optional[dict]:
    """The archive's golden.json (an Archive's, read and checked once; a path is opened for the call),
    or None when it has none."""
    with archives.opened(archive) as opened:
        return opened.cached("golden cases", lambda: _checked(opened))


def _checked(archive: archives.Archive) -> Optional[dict]:
    golden = archive.read_json(GOLDEN, MAX_GOLDEN_BYTES)
    if golden is None:
        return None
    where = archive.path
    if not isinstance(golden, dict) or not isinstance(golden.get("cases"), list):
        raise archives.ArchiveError(f"{where}: {GOLDEN} has no list of cases: package it again")
    if not isinstance(golden.get("fingerprint", {}), dict):
        raise archives.ArchiveError(f"{where}: {GOLDEN}'s fingerprint is not an object: package it again")
    for index, case in enumerate(golden["cases"]):
        problem = case_problem(case)
        if problem:
            raise archives.ArchiveError(f"{where}: {GOLDEN} case {index} {problem}: package it again")
    return golden


CASE_TYPES = {"name": str, "content_type": str, "body_b64": str, "status": int}
MAX_TYPE = 1024  # characters of a content type (TorchServe's frontend takes 8 KiB of headers in all)


def header_text(value: str) -> bool:
    """A Content-Type value every server's HTTP can carry: printable ASCII (tabs too), no line break, no
    NUL, at most ``MAX_TYPE`` characters."""
    return len(value) <= MAX_TYPE and all(" " <= c <= "~" or c == "\t" for c in value)


def case_problem(case: Any) -> Optional[str]:
    """What is wrong with one recorded case's shape, or None."""
    if not isinstance(case, dict):
        return f"is not an object but {type(case).__name__}"
    for key, kind in CASE_TYPES.items():
        if not isinstance(case.get(key), kind) or isinstance(case.get(key), bool):
            return f"has no {key} of type {kind.__name__}"
    try:
        base64.b64decode(case["body_b64"], validate=True)
    except ValueError:
        return "has a body_b64 that is not base64"
    if not header_text(case["content_type"]):
        return "has a content_type no HTTP header can carry"
    return None


def body(case: dict) -> bytes:
    return base64.b64decode(case["body_b64"])


def difference(got: Any, want: Any, atol: float = DEFAULT_ATOL, where: str = "") -> Optional[str]:
    """Where ``got`` differs from ``want`` (numbers beyond ``atol``, other keys, other lengths), or
    None. Mappings compare by key, so a top-k answer may list equal-enough labels in another order."""
    here = f"the answer{where}"
    if isinstance(want, bool) or want is None or isinstance(want, str):
        return None if got == want else f"{here} is {short(got)}, was {short(want)}"
    if isinstance(want, (int, float)):
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            return f"{here} is {short(got)}, was {want}"
        if math.isclose(got, want, rel_tol=0, abs_tol=atol):
            return None
        return f"{here} is {got:.6g}, was {want:.6g} (off by {abs(got - want):.2g}, atol {atol:g})"
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            keys = sorted(got) if isinstance(got, dict) else short(got)
            return f"{here} has keys {short(keys)}, was {short(sorted(want))}"
        for key in want:
            found = difference(got[key], want[key], atol, f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            length = len(got) if isinstance(got, list) else short(got)
            return f"{here} has {length} items, was {len(want)}"
        for index, (a, b) in enumerate(zip(got, want)):
            found = difference(a, b, atol, f"{where}[{index}]")
            if found:
                return found
        return None
    return None if got == want else f"{here} is {short(got)}, was {short(want)}"


def short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_case(case: dict, status: int, answer: Any, atol: float = DEFAULT_ATOL) -> Optional[str]:
    """One line naming the input and what differs from its golden answer, or None when it matches."""
    if status != case["status"]:
        return f"{case['name']}: status {status} ({short(answer)}), was {case['status']}"
    if status != 200:  # a refusal: the same status and message (servers may add keys, as KServe's "error")
        got = answer.get("message", answer.get("error")) if isinstance(answer, dict) else answer
        want = case["answer"].get("message") if isinstance(case["answer"], dict) else case["answer"]
        return None if got == want else f"{case['name']}: refused with {short(got)}, was {short(want)}"
    found = difference(answer, case["answer"], atol)
    return f"{case['name']}: {found}" if found else None


def check_on_start(handler, golden: dict) -> List[str]:
    """Replay the golden requests through ``handler`` (initialised, in its worker) as one TorchServe
    batch each, with their content types; the lines that differ."""
    from ts.context import RequestProcessor

    context = handler.context
    saved = (getattr(context, "request_processor", None), getattr(context, "request_ids", None))
    problems = []
    try:
        for case in golden["cases"]:
            context.request_ids = {0: f"golden-{case['name']}"}
            context.request_processor = [RequestProcessor({"Content-Type": case["content_type"]})]
            [raw] = handler.handle([{"body": body(case)}], context)
            status = context.get_response_status(0)[0]
            atol = max(handler.settings.verify_atol, PRECISION_ATOL[handler.settings.precision])
            problem = check_case(case, status, json.loads(raw), atol)
            if problem:
                problems.append(problem)
    finally:
        context.request_processor, context.request_ids = saved
    return problems
