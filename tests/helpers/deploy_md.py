"""Run an exported DEPLOY.md's shell blocks as a user pastes them, without a cluster: kubectl, docker and
curl (and skopeo) are stub scripts first on PATH that record their arguments (and answer nothing); everything else
(python3 building the request bodies, test, sh itself) is real. Then check what they were given: every file
``kubectl apply -f`` / ``kubectl cp`` / ``docker build`` / ``curl --data-binary @`` names exists relative to
the directory DEPLOY.md is in, and no path of the machine that exported it appears anywhere in the tree."""

import os
import re
import shlex
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

STUBBED = ("kubectl", "docker", "curl", "tsctl", "skopeo")  # the cluster's side, the calls that would reach it
SEPARATOR = "\x1f"  # between a call's arguments; a call per line
STUB = """#!/bin/sh
# records its name and arguments, one call per line, and answers nothing. DEPLOY.md runs some in the
# background (kubectl port-forward ... &): each call's line is written whole, under a lock
exec 9>>"{log}.lock"
flock 9
printf '%s\\037' "$(basename "$0")" "$@" >> "{log}"
printf '\\n' >> "{log}"
"""


def sh_blocks(markdown: str) -> List[str]:
    return re.findall(r"```sh\n(.*?)```", markdown, re.S)


@dataclass
class Run:
    calls: List[List[str]]  # [program, args...] per stubbed call, in order
    output: str

    def of(self, program: str) -> List[List[str]]:
        return [call[1:] for call in self.calls if call[0] == program]


def run_deploy_md(out: Path, stubs: Path, env: Dict[str, str] = None, answer: Optional[str] = None) -> Run:
    """Every ```sh block of ``out/DEPLOY.md``, in order, in one shell started in ``out`` (as a user runs
    them there), stopping at the first command that fails; ``stubs``: an empty directory for the stubs;
    ``answer``: what the curl stub writes to its ``-o FILE`` (else nothing)."""
    stubs.mkdir(parents=True, exist_ok=True)
    log = stubs / "calls.jsonl"
    for name in STUBBED:
        stub = stubs / name
        stub.write_text(STUB.format(log=log))
        stub.chmod(0o755)
    if answer is not None:
        (stubs / "answer").write_text(answer)
        with open(stubs / "curl", "a") as stub:
            stub.write(f'while [ $# -gt 0 ]; do [ "$1" = -o ] && cp "{stubs / "answer"}" "$2"; shift; done\n')
    script = "set -e\n" + "\n".join(sh_blocks((out / "DEPLOY.md").read_text()))
    environment = {**os.environ, **(env or {}), "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["sh", "-c", script], cwd=out, env=environment, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"DEPLOY.md's commands failed (exit {done.returncode}):\n{output}"
    assert "error:" not in output, output
    lines = log.read_text().splitlines() if log.exists() else []
    calls = [line.split(SEPARATOR)[:-1] for line in lines]
    malformed = [number for number, call in enumerate(calls, 1) if not call or call[0] not in STUBBED]
    assert not malformed, f"the stubs recorded malformed calls (lines {malformed} of {log}): {lines}"
    return Run(calls, output)


def referenced_files(run: Run) -> List[str]:
    """The local files the recorded calls read: kubectl apply -f F, kubectl cp F POD:..., docker build CONTEXT,
    curl --data-binary @F."""
    files = []
    for args in run.of("kubectl"):
        if args[:1] == ["apply"]:
            files += [args[i + 1] for i, arg in enumerate(args) if arg == "-f"]
        if args[:1] == ["cp"]:
            files.append(positional(args[1:])[0])
    for args in run.of("docker"):
        if args[:1] == ["build"]:
            files.append(args[-1])
    for args in run.of("curl"):
        files += [arg[1:] for arg in args if arg.startswith("@")]
    for args in run.of("skopeo"):  # skopeo copy ... oci:LAYOUT:TAG docker://REF
        files += [arg.split(":")[1] for arg in args if arg.startswith("oci:")]
    return files


def positional(args: List[str]) -> List[str]:
    """kubectl's arguments without its flags (``-n NS``, ``--namespace NS``, ``--flag=value``, ``-c NAME``)."""
    found, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("-n", "--namespace", "-c", "--container"):
            skip = True
        elif not arg.startswith("-"):
            found.append(arg)
    return found


def check_referenced_files_exist(out: Path, run: Run):
    files = referenced_files(run)
    assert files, run.calls
    missing = [f for f in files if not (out / f).exists()]
    assert missing == [], f"DEPLOY.md refers to files that are not in {out}: {missing}"
    assert all(not Path(f).is_absolute() for f in files), files


def paths_in_tree(out: Path, paths: List[str]) -> List[str]:
    """Where any of ``paths`` (this machine's directories) appears in the exported tree: in a file's bytes,
    or in a member of an archive (read uncompressed)."""
    needles = [p.encode() for p in paths if p and p != "/"]
    found = []
    for file in sorted(p for p in out.rglob("*") if p.is_file()):
        data = file.read_bytes()
        if any(needle in data for needle in needles):
            found.append(str(file.relative_to(out)))
        if zipfile.is_zipfile(file):
            with zipfile.ZipFile(file) as archive:
                for member in archive.namelist():
                    if any(needle in archive.read(member) for needle in needles):
                        found.append(f"{file.relative_to(out)}:{member}")
    return found


def kubectl_commands(run: Run) -> List[str]:
    return [shlex.join(args) for args in run.of("kubectl")]
