"""The notes ``tsctl export kserve --autoscale --from-bench`` prints about the measurement it sizes from."""

from typing import TYPE_CHECKING, List

from ...capacity.sweep import MIN_P99_REQUESTS, busy_notes, few_notes
from ..kube import cpu_cores
from ..options import PodSize

if TYPE_CHECKING:
    from . import targets


def measured_notes(plan, pod: PodSize, target: "targets.Target", snapshot: dict) -> List[str]:
    """``plan``: autoscale.Autoscaling, its capacity read. Where the measurement and the export differ, or the
    measurement is weaker than it looks, said as notes: another engine, several models in the pod, limits
    other than the pod's, a knee that is only a lower bound, a p99 target no step held. DEPLOY.md's table
    gains the pod's resources, with what the measurement ran under."""
    capacity, notes = plan.capacity, []
    if capacity["engine"] != target.name:
        notes.append(
            f"--from-bench measured {capacity['model']} on {capacity['engine']}, the export runs --engine "
            f"{target.name}: one replica's capacity differs between engines, measure on the one you deploy"
        )
    if len(snapshot.get("models", {})) > 1:
        notes.append(
            f"the autoscaling is sized for {capacity['model']} alone; the pod serves "
            f"{len(snapshot['models'])} models, whose load shares its CPU"
        )
    measured = capacity["server"].get("cpu")
    cores = float(cpu_cores(pod.cpu))
    if measured is None:
        notes.append(
            f"--from-bench was measured with no CPU limit, the pod is limited to --cpu {pod.cpu}: a "
            f"replica's capacity follows its CPU; measure with 'tsctl bench --capacity --cpu {cores:g}'"
        )
    elif abs(measured - cores) > 1e-9:
        notes.append(
            f"--from-bench was measured under {measured:g} CPU, the pod gets --cpu {pod.cpu}: a "
            f"replica's capacity follows its CPU; measure with --cpu {cores:g}, or export with --cpu {measured:g}"
        )
    notes.extend(gpu_notes(capacity, pod.gpus))
    under = "no CPU limit" if measured is None else f"{measured:g} CPU"
    plan.note("pod resources", f"cpu {pod.cpu}, memory {pod.memory}", f"--cpu, --memory; measured under {under}")
    if capacity.get("stopped") == "bound":
        notes.append(
            f"--from-bench stopped at its largest concurrency before throughput flattened: its knee "
            f"({capacity['knee']['concurrency']}) is a lower bound; measure with a larger --max-concurrency"
        )
    p99_target, knee_p99 = capacity.get("p99_target_ms"), capacity["knee"].get("p99_ms")
    if p99_target is not None and capacity.get("within_p99") is None:
        at_knee = "" if knee_p99 is None else f", whose p99 is {knee_p99:g} ms"
        held = "held its p99 target" + (
            f" from {MIN_P99_REQUESTS} answers or more" if few_notes(capacity["steps"]) else ""
        )
        notes.append(f"no step of --from-bench {held} ({p99_target:g} ms): sized at the knee{at_knee}")
    notes.extend(f"--from-bench: {note}" for note in busy_notes(capacity.get("machine")) + few_notes(capacity["steps"]))
    return notes


def gpu_notes(capacity: dict, gpus: int) -> List[str]:
    """Where the GPUs the measurement's workers ran on (``gpus``, tsctl bench --capacity) are not the pod's
    ``--gpus``: a replica's capacity on a GPU is the GPU's, so the pod must have what was measured."""
    measured = capacity.get("gpus") or []
    names = ", ".join(sorted({g["name"] for g in measured}))
    if len(measured) == gpus:
        return []
    if not measured:
        return [
            f"--from-bench was measured on the CPU, the pod gets --gpus {gpus}: measure on the GPU "
            "you deploy ('tsctl bench --capacity' on a machine with it)"
        ]
    return [
        f"--from-bench was measured on {len(measured)} GPU(s) ({names}), the pod gets --gpus {gpus}: "
        f"export with --gpus {len(measured)} on nodes with that GPU, or measure what you deploy"
    ]
