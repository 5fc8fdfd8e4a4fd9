"""Kubernetes names and quantities as both exports (``export kserve``, ``export seldon``) check them
before writing: a flag Kubernetes would refuse is one line naming it and the fix, not a schema dump."""

import re
from decimal import Decimal

import yaml

from ..errors import UserError

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
MEMORY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([KMGTPE]i|[kMGTPE])?$")
CPU = re.compile(r"^([0-9]+(?:\.[0-9]+)?m?)$")
# an image reference as docker and the kubelet read it (distribution/reference's grammar): [HOST[:PORT]/]PATH
# [:TAG][@DIGEST], the path lowercase; anything else is InvalidImageName in the pod, or a shell word in DEPLOY.md
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?/)?"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
_TAG = r"(?::[\w][\w.-]{0,127})?"
_DIGEST = r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
IMAGE_REFERENCE = re.compile(f"^{_HOST}{_PATH}{_TAG}{_DIGEST}$")
UNITS = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
UNITS.update({f"{unit.upper()}i": 2 ** (10 * power) for power, unit in enumerate("kMGTPE", 1)})
LABEL_RULE = "lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters"


def label(value: str, what: str, fix: str):
    """``value`` is a DNS-1123 label, as Kubernetes (and Seldon's scheduler) need names to be."""
    if not DNS_LABEL.match(value or ""):
        raise UserError(f"{what} {value!r} is not a valid Kubernetes name ({LABEL_RULE}): {fix}")


def image_reference(value: str, what: str, fix: str):
    """``value`` is an image reference a pod can pull (``registry.example.com/name:tag``)."""
    if not value or len(value) > 255 or not IMAGE_REFERENCE.match(value):
        raise UserError(f"{what} {value!r} is not an image reference ([HOST[:PORT]/]lowercase/path[:TAG]): {fix}")


def suggest(name: str) -> str:
    """A DNS-1123 label close to ``name``, for the fix of an error."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:63].strip("-") or "model"


def memory_bytes(memory: str) -> int:
    """A memory quantity (``2Gi``, ``1500M``, ``1073741824``) in bytes; check_resources has checked it."""
    number, unit = MEMORY.match(memory).groups()
    return int(Decimal(number) * UNITS.get(unit, 1))


def cpu_cores(cpu: str) -> Decimal:
    """A CPU quantity (``1``, ``1.5``, ``500m``) in cores; check_resources has checked it."""
    return Decimal(cpu[:-1]) / 1000 if cpu.endswith("m") else Decimal(cpu)


GPU_RESOURCE = "nvidia.com/gpu"  # NVIDIA's device plugin's resource: whole GPUs, requests equal to limits


def container_resources(cpu: str, memory: str, gpus: int = 0) -> dict:
    """A container's ``resources``: ``cpu`` and ``memory`` requested and limited alike, and ``gpus`` whole
    NVIDIA GPUs when asked (an extended resource: Kubernetes wants its request equal to its limit)."""
    amount = {"cpu": cpu, "memory": memory, **({GPU_RESOURCE: str(gpus)} if gpus else {})}
    return {"requests": dict(amount), "limits": dict(amount)}


def check_gpus(gpus: int):
    """``--gpus`` a whole number of GPUs, 0 (none) or more."""
    if gpus < 0:
        raise UserError(f"--gpus {gpus} must be 0 (no GPU) or a whole number of GPUs, e.g. --gpus 1")


def check_resources(cpu: str, memory: str):
    """``--cpu`` and ``--memory`` as Kubernetes quantities above 0 (``2GB`` is not one: ``2Gi``)."""
    found = MEMORY.match(memory or "")
    if not found:
        hint = f" (did you mean {memory[:-1]}i?)" if re.fullmatch(r"[0-9.]+[KMGTPE]B", memory or "") else ""
        raise UserError(f"--memory {memory!r} must be a memory quantity such as 2Gi or 1500Mi{hint}")
    if Decimal(found.group(1)) == 0:
        raise UserError(f"--memory {memory!r} must be more than 0, e.g. --memory 2Gi")
    if not CPU.match(cpu or "") or float(cpu.rstrip("m")) == 0:
        raise UserError(f"--cpu {cpu!r} must be a CPU quantity such as 1, 2 or 500m")


class ManifestDumper(yaml.SafeDumper):
    """YAML as ``kubectl`` users read it: a string of several lines (a script in a container's command) as a
    literal block, the rest as ``yaml.safe_dump`` writes it."""


def _string(dumper: yaml.SafeDumper, value: str):
    block = "\n" in value and not any(line != line.rstrip() for line in value.splitlines())
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if block else None)


ManifestDumper.add_representer(str, _string)


def manifest_text(manifest: dict) -> str:
    return yaml.dump(manifest, Dumper=ManifestDumper, sort_keys=False)
