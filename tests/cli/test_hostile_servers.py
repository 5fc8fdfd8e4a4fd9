"""tsctl as a client of servers it did not start (issue 43, cases 8 to 12): ``bench``, ``shadow``, ``verify
--url`` and ``predict`` against hostile servers (helpers/hostile_http.py: each a process of its own), every
command a process of its own as a user runs it, in a memory cgroup of its own. Each ends within its timeout
(``--timeout``, ``--duration``) and a few seconds of starting Python, exit 1, with one line on stderr naming
the server and the bound it passed: never a traceback, a hang or an out-of-memory kill."""

import base64
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from typing import Optional

import pytest

from helpers.cgroups import MemoryLimit
from helpers.hostile_http import hostile_server, server_json
from helpers.paths import ROOT

TIMEOUT = 3  # --timeout and --duration, in seconds
MARGIN = 5  # starting Python and reading the archive, on a busy machine
KILLED_AFTER = TIMEOUT + 20  # a command still running then is killed: its bound did not hold
MEMORY = 1 << 30  # the command's cgroup: what the attack reached was 2 GiB and more
BIG = "[" + ", ".join(["0.5"] * 230_000) + "]"  # 1.1 MiB: sent with Expect: 100-continue


@dataclass
class Ran:
    code: int
    seconds: float
    stderr: str
    peak: Optional[int]  # the cgroup's peak memory, bytes

    def one_line(self, *named: str) -> str:
        """The one line on stderr, checked to name each of ``named`` (and no traceback)."""
        lines = self.stderr.strip().splitlines()
        assert "Traceback" not in self.stderr and len(lines) == 1, self.stderr[-3000:]
        for text in named:
            assert text in lines[0], lines[0]
        return lines[0]


def tsctl(*args, memory: int = MEMORY) -> Ran:
    """``python -m archiver.cli ARGS`` in a memory cgroup of ``memory`` bytes; killed (with its process group)
    after ``KILLED_AFTER`` seconds."""
    limit = MemoryLimit(None, memory)
    if limit.kind is None:
        pytest.skip("no memory cgroup can be made here")
    command = [sys.executable, "-m", "archiver.cli", *map(str, args)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=limit.join,
        start_new_session=True,
    )
    try:
        _, stderr = process.communicate(timeout=KILLED_AFTER)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate()
        stderr += f"\n(killed: still running after {KILLED_AFTER} s)"
    seconds, peak = time.monotonic() - started, limit.peak()
    limit.release()
    print(f"tsctl {args[0]}: exit {process.returncode} after {seconds:.1f} s, peak {(peak or 0) / 2**20:.0f} MiB")
    return Ran(process.returncode, seconds, stderr, peak)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """m.mar (a bare manifest and one golden case, a JSON body of 1.1 MiB), the same body as shadow's
    --inputs and as a file for predict, and a small one for bench."""
    root = tmp_path_factory.mktemp("hostile-servers")
    case = {"name": "big.json", "content_type": "application/json", "status": 200, "answer": {}}
    case["body_b64"] = base64.b64encode(BIG.encode()).decode()
    with zipfile.ZipFile(root / "m.mar", "w") as archive:
        manifest = {"model": {"modelName": "m", "handler": "h.py", "modelVersion": "1.0"}}
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        archive.writestr("MAR-INF/golden.json", json.dumps({"cases": [case]}))
    (root / "inputs").mkdir()
    (root / "inputs" / "big.json").write_text(BIG)
    (root / "big.json").write_text(BIG)
    (root / "small.json").write_text("[[1, 2, 3, 4]]")
    return root


def client(name: str, files, url: str, pid: int, home) -> list:
    """The arguments of ``name`` (shadow, verify --url or predict) sending the 1.1 MiB body to ``url``."""
    if name == "shadow":
        other = url.replace("127.0.0.1", "localhost")  # the same server: never reached, the current fails first
        return ["shadow", files / "m.mar", "--current", url, "--candidate", other, "--inputs", files / "inputs"]
    if name == "verify":
        return ["verify", files / "m.mar", "--url", url]
    return ["predict", "m", files / "big.json", "--home", server_json(home, url, pid, "m")]


CLIENTS = ["shadow", "verify", "predict"]


@pytest.mark.parametrize("attack", ["drip", "continue-drip"])
@pytest.mark.parametrize("name", CLIENTS)
def test_a_call_ends_by_its_timeout(files, tmp_path, name, attack):
    """Case 10 and its kin: an answer dripped a byte at a time (a byte a second), or a ``100 Continue``
    whose head never ends (a byte every half second). Before: each byte came within the socket's timeout, so
    predict waited for ever; shadow and verify cut the socket at --timeout and then read the closed
    connection for ever, at 100% CPU."""
    with hostile_server(attack) as (url, pid):
        ran = tsctl(*client(name, files, url, pid, tmp_path / "home"), "--timeout", TIMEOUT)
    ran.one_line(url, f"within {TIMEOUT} s")
    assert ran.code == 1 and ran.seconds < TIMEOUT + MARGIN


@pytest.mark.parametrize("name", CLIENTS)
def test_a_100_continue_then_closed_ends_at_once(files, tmp_path, name):
    """Case 10: the status line of a ``100 Continue``, then the connection closed. Before: the interim
    answer was read a byte at a time until it ended, and a closed connection gives no bytes, for ever."""
    with hostile_server("continue-close") as (url, pid):
        ran = tsctl(*client(name, files, url, pid, tmp_path / "home"), "--timeout", TIMEOUT)
    ran.one_line(url, "100 Continue")
    assert ran.code == 1 and ran.seconds < TIMEOUT + MARGIN


@pytest.mark.parametrize("name", CLIENTS)
def test_an_answer_nested_too_deep_is_one_line(files, tmp_path, name):
    """Case 12: JSON arrays nested 200,000 deep. Before: a RecursionError traceback."""
    with hostile_server("deep") as (url, pid):
        ran = tsctl(*client(name, files, url, pid, tmp_path / "home"), "--timeout", TIMEOUT)
    ran.one_line(url, "64 levels")
    assert ran.code == 1 and ran.seconds < TIMEOUT + MARGIN


def test_shadow_refuses_an_answer_of_millions_of_values_before_parsing_it(files, tmp_path):
    """Case 11: 250 MiB of ``[[],[],...]``, under the 256 MiB tsctl reads of an answer. Before: parsed, 87
    million lists, killed at the cgroup's limit."""
    with hostile_server("empties") as (url, pid):
        ran = tsctl(*client("shadow", files, url, pid, tmp_path / "home"), "--timeout", 30)
    ran.one_line(url, "4,000,000 values")
    assert ran.code == 1 and ran.peak < MEMORY


def test_bench_reads_an_endless_chunked_answer_within_its_bound(files, tmp_path):
    """Case 8: an answer in chunks of 1 MiB that never end. Before: bench read it whole, until it was killed
    at the cgroup's limit (512 MiB here)."""
    with hostile_server("chunked") as (url, pid):
        home = server_json(tmp_path / "home", url, pid, "m")
        ran = tsctl("bench", "m", "--input", files / "small.json", "--requests", 1, "--home", home, memory=512 << 20)
    ran.one_line(url, "268,435,456 bytes")
    assert ran.code == 1 and ran.peak < 512 << 20


def test_bench_ends_at_its_duration_whatever_the_server_drips(files, tmp_path):
    """Case 9: an answer dripped a byte a second, from 2 clients. Before: each byte came within the socket's
    timeout, so bench ran on past --duration until every answer ended (1,000 s). Now both are cut at its
    end and not counted: none was answered, nothing was measured, exit 1."""
    with hostile_server("drip") as (url, pid):
        home = server_json(tmp_path / "home", url, pid, "m")
        args = ["bench", "m", "--input", files / "small.json", "--concurrency", 2, "--duration", TIMEOUT]
        ran = tsctl(*args, "--home", home)
    ran.one_line(url, f"--duration {TIMEOUT} s")
    assert ran.code == 1 and ran.seconds < TIMEOUT + MARGIN


def test_the_bounds_hold_however_the_answer_starts():
    """In-process, the one reader: whitespace before a nest, scalars, text that is not JSON."""
    from archiver.http_client import AnswerError, answer

    assert answer(b' \n[1, {"a": [2]}]', url="http://x") == [1, {"a": [2]}]
    assert answer(b"12") == 12 and answer(b"not [json") == "not [json" and answer(b"\xff") == b"\xff"
    with pytest.raises(AnswerError, match="http://x answered JSON nested deeper than the 64 levels tsctl parses"):
        answer(b" " * 100 + b"[" * 65 + b"]" * 65, url="http://x")
