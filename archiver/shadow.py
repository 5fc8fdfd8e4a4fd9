"""``tsctl shadow``: the gate a rollout runs before it raises ``canaryTrafficPercent`` (KServe) or promotes a
mirrored model (Seldon Core 2): the same inputs sent to the current and the candidate server, each pair of
answers compared.

The inputs are the archive's golden requests (``package --golden``), or ``--inputs``: a recorded sample
of real request bodies, a directory of files (one body each, its content type from its suffix as
``predict`` sends it) or a JSON list of bodies, read as ``package --golden`` reads them
(``golden.requests_in``). Each input goes to both servers as ``verify --url`` sends a golden request
(``golden.served``: ts, v1 or v2, with the server's token), and the two answers agree when the
candidate's matches the current's as ``verify`` matches a golden answer (``handlers.golden.check_case``:
the same status, the same keys and labels, every number within ``atol``). What it measures beside that:
for probabilities (a mapping of labels to numbers) the top-1 label of each and the largest difference
over the labels both list; for anything else numeric (embeddings, tensors) the largest difference and the
cosine of the two answers flattened. More than ``--max-disagree`` inputs disagreeing fails the gate.
"""

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

from handlers import archives, identity
from handlers import golden as answers

from . import golden
from .errors import ServerFailure, UserError
from .output import quiet


@dataclass
class Side:
    """One of the two servers: ``role`` is "current" or "candidate" (the flag naming its URL)."""

    role: str
    url: str
    protocol: str = "ts"
    model: Optional[str] = None  # None: the archive's model name
    token: Optional[str] = None

    @property
    def where(self) -> str:
        return f"{self.url} ({self.protocol})"

    @property
    def headers(self) -> dict:
        """The token; over v2, ``seldon-model``, which Seldon Core 2's mesh routes by (other servers ignore it)."""
        found = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return {**found, "seldon-model": str(self.model)} if self.protocol == "v2" else found


@dataclass
class Compared:
    """One input's two answers: whether they agree and how far apart they are."""

    name: str
    agree: bool
    status: Tuple[int, int]  # (current, candidate)
    difference: Optional[str] = None  # the first difference, as verify says it
    top1: Optional[Tuple[str, str]] = None  # probabilities: each side's most likely label
    max_abs_diff: Optional[float] = None
    cosine: Optional[float] = None


@dataclass
class Report:
    current: str
    candidate: str
    atol: float
    allowed: int  # how many inputs may disagree
    max_disagree: str  # as given
    inputs: List[Compared] = field(default_factory=list)

    @property
    def disagreed(self) -> int:
        return sum(not c.agree for c in self.inputs)

    @property
    def passed(self) -> bool:
        return self.disagreed <= self.allowed

    def as_json(self) -> dict:
        found = asdict(self)
        found.update(checked=len(self.inputs), disagreed=self.disagreed, passed=self.passed)
        return found


def allowed_disagreements(text: str, count: int) -> int:
    """``--max-disagree``: a number of inputs (``2``) or a percentage of them (``10%``, rounded down), below
    ``count``: a gate that lets every input disagree could never fail."""
    value = str(text).strip()
    percent = value.endswith("%")
    example = "give a number of inputs (e.g. 0, 2) or a percentage of them (e.g. 5%)"
    try:
        number = float(value[:-1]) if percent else int(value)
    except ValueError:
        raise UserError(f"--max-disagree {text!r} is not a number: {example}") from None
    if not math.isfinite(number) or number < 0 or (percent and number > 100):
        raise UserError(f"--max-disagree {text} is out of range: {example}, from 0 to 100%")
    allowed = math.floor(number * count / 100 + 1e-9) if percent else int(number)
    if allowed >= count:
        raise UserError(
            f"--max-disagree {text} lets all {count} inputs disagree, so the check could never fail: "
            f"allow fewer than {count}"
        )
    return allowed


def cases_of(archive: archives.Archive, inputs: Optional[str]) -> List[dict]:
    """The requests to send, as golden cases (what ``golden.served`` sends): ``inputs``' files, else the
    archive's golden requests."""
    if inputs is None:
        recorded = answers.read(archive)
        if recorded is None or not recorded["cases"]:
            raise UserError(
                f"{archive.path} has no golden inputs ({answers.GOLDEN}): pass --inputs DIR (request bodies, "
                "one file each), or package it with --golden DIR"
            )
        return recorded["cases"]
    import base64

    found = golden.requests_in(Path(inputs), flag="--inputs")
    return [
        {"name": name, "content_type": kind, "body_b64": base64.b64encode(body).decode(), "status": 200}
        for name, body, kind in found
    ]


def check_sides(current: Side, candidate: Side):
    """Both URLs usable (``golden.base_url``, named by their flags), and not one server twice."""
    for side in (current, candidate):
        if side.protocol not in golden.PROTOCOLS:
            flag = "--protocol" if side.role == "current" else "--protocol-candidate"
            raise UserError(f"{flag} {side.protocol!r} must be one of {', '.join(golden.PROTOCOLS)}")
        try:
            side.url = golden.base_url(side.url)
        except UserError as exc:
            raise UserError(str(exc).replace("--url ", f"--{side.role} ", 1)) from None
    if (current.url, current.protocol, current.model) == (candidate.url, candidate.protocol, candidate.model):
        raise UserError(
            f"--current and --candidate are the same server ({current.url}): the check would compare it with "
            "itself; give the candidate's URL (or --model-candidate for another model on it)"
        )


def shadow(
    archive: archives.ArchiveLike,
    current: Side,
    candidate: Side,
    inputs: Optional[str] = None,
    atol: float = answers.DEFAULT_ATOL,
    max_disagree: str = "0",
    timeout: float = 60,
    progress: Callable[[str], None] = quiet,
) -> Report:
    """Send every input to ``current`` and ``candidate`` and compare the answers (module docstring)."""
    check_sides(current, candidate)
    with archives.opened(archive) as opened:
        cases = cases_of(opened, inputs)
        allowed = allowed_disagreements(max_disagree, len(cases))
        kind = (identity.read(opened) or {}).get("input")  # what a toolkit handler reads; None: not one
        for side in (current, candidate):
            side.model = side.model or opened.model_name
    found = {side.role: answers_of(side, cases, kind, timeout, progress) for side in (current, candidate)}
    report = Report(current.where, candidate.where, atol, allowed, str(max_disagree))
    for case, now, then in zip(cases, found["current"], found["candidate"]):
        report.inputs.append(compare(case["name"], now, then, atol, case["status"]))
    return report


def answers_of(side: Side, cases: List[dict], kind, timeout: float, progress) -> List[Tuple[int, Any]]:
    """(status, answer) of each case from ``side``; a server that cannot be reached, answers past tsctl's
    bounds (http_client.py: in time, bytes, JSON), refuses its token or lacks the endpoint or the model is
    one ServerFailure naming its flag."""
    from .http_client import AnswerError

    flag = f"--{side.role}"
    results = []
    for number, case in enumerate(cases, 1):
        try:
            results.append(golden.served(side.url, side.protocol, side.model, kind, case, timeout, side.headers, True))
        except AnswerError as exc:
            hint = ": raise --timeout" if isinstance(exc, TimeoutError) else ""
            raise ServerFailure(f"{flag} {exc}{hint}") from None
        except OSError as exc:
            raise ServerFailure(f"{flag} {side.url}: could not reach it ({exc})") from None
        progress(f"{side.role} {number}/{len(cases)} {case['name']}: {results[-1][0]}")
    if golden.unauthorized(side.url, results, bool(side.token)):
        said = "refused the token" if side.token else "asks for a token"
        raise ServerFailure(
            f"{flag} {side.url} {said} on every request ({golden.KEY_REFUSED}): pass its inference key with "
            f"--token-{side.role}"
        )
    suffix = "" if side.role == "current" else "-candidate"
    missing = golden.missing_endpoint(side.url, side.protocol, side.model, cases, results, suffix)
    if missing:
        raise ServerFailure(f"{flag} {missing}")
    return results


def compare(
    name: str, current: Tuple[int, Any], candidate: Tuple[int, Any], atol: float, expected: int = 200
) -> Compared:
    """Whether ``candidate``'s answer matches ``current``'s (as ``verify`` matches a golden one), and the
    measures of ``distance``. An input the current server did not answer with its ``expected`` status (200,
    or a golden refusal's) compared nothing: it disagrees, whatever the candidate answered, so that two
    servers failing alike never pass. Answers that are not UTF-8 (bytes) agree only byte for byte."""
    statuses = (current[0], candidate[0])
    if current[0] != expected:
        said = f"the current server answered {current[0]}, not {expected}: nothing to compare"
        return Compared(name, False, statuses, f"{name}: {said}")
    if isinstance(current[1], bytes) or isinstance(candidate[1], bytes):
        same = current == candidate
        return Compared(name, same, statuses, None if same else f"{name}: the answers differ (not UTF-8)")
    recorded = {"name": name, "status": current[0], "answer": current[1]}
    difference = answers.check_case(recorded, candidate[0], candidate[1], atol)
    found = Compared(name, difference is None, (current[0], candidate[0]), difference)
    if current[0] == candidate[0] == 200:
        found.top1, found.max_abs_diff, found.cosine = distance(current[1], candidate[1])
    return found


def distance(a: Any, b: Any) -> Tuple[Optional[Tuple[str, str]], Optional[float], Optional[float]]:
    """(top-1 labels, max abs difference, cosine) of two answers. Probabilities (label -> number): the
    top-1 label of each and the difference over the labels both list (a top-k answer may list others).
    Other numeric answers: the difference and cosine of both flattened, when they have as many numbers."""
    if probabilities(a) and probabilities(b):
        top1 = (max(a, key=a.get), max(b, key=b.get))
        both = [key for key in a if key in b]
        return top1, (max(abs(a[k] - b[k]) for k in both) if both else None), None
    x, y = numbers(a), numbers(b)
    if not x or len(x) != len(y):
        return None, None, None
    norms = math.sqrt(sum(v * v for v in x)) * math.sqrt(sum(v * v for v in y))
    cosine = sum(u * v for u, v in zip(x, y)) / norms if norms else None
    return None, max(abs(u - v) for u, v in zip(x, y)), cosine


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def probabilities(answer: Any) -> bool:
    return isinstance(answer, dict) and bool(answer) and all(is_number(v) for v in answer.values())


def numbers(answer: Any) -> List[float]:
    """Every number of an answer, in order (a mapping's by key)."""
    if is_number(answer):
        return [float(answer)]
    if isinstance(answer, list):
        return [n for item in answer for n in numbers(item)]
    if isinstance(answer, dict):
        return [n for key in sorted(answer, key=str) for n in numbers(answer[key])]
    return []


def line(compared: Compared) -> str:
    """One input's line: agree or DISAGREE, its name, what was measured, the difference."""
    parts = [f"{'agree' if compared.agree else 'DISAGREE':8} {archives.printable(compared.name)}"]
    if compared.status[0] != compared.status[1] or compared.status[0] != 200:
        parts.append(f"status {compared.status[0]}/{compared.status[1]}")
    if compared.top1:
        same = "same" if compared.top1[0] == compared.top1[1] else "differs"
        parts.append(f"top-1 {compared.top1[0]}/{compared.top1[1]} ({same})")
    if compared.max_abs_diff is not None:
        parts.append(f"max |diff| {compared.max_abs_diff:.3g}")
    if compared.cosine is not None:
        parts.append(f"cosine {compared.cosine:.6f}")
    text = "  ".join(parts)
    if compared.difference:
        text += f": {compared.difference.split(': ', 1)[-1]}"
    return text


def summary(report: Report) -> str:
    checked, agreed = len(report.inputs), len(report.inputs) - report.disagreed
    verdict = "pass" if report.passed else "FAIL"
    return (
        f"{verdict}: {agreed} of {checked} inputs agree within atol {report.atol:g} ({report.disagreed} disagree, "
        f"--max-disagree {report.max_disagree} allows {report.allowed}); current {report.current}, "
        f"candidate {report.candidate}"
    )
