"""What init, package, inspect, config and the exports report: one dict per command, which ``--json``
prints as it is (its schema: docs/json-output.md) and the text output is written from, so the two never
say different things. Plain data in, plain data out: no model library is imported here."""

import json
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

from handlers.archives import printable

SNAPSHOT_SETTINGS = ("minWorkers", "maxWorkers", "batchSize", "maxBatchDelay", "responseTimeout")


# ---- tsctl init ---------------------------------------------------------------------------------------
def init_report(written, start: str, base: str) -> dict:
    """``written``: archiver.scaffold.Written; ``start``: what --from named (the JSON's "kind", as before);
    ``base``: the toolkit class it subclasses (module.Class)."""
    return {
        "directory": str(written.directory),
        "kind": start,
        "class": written.class_name,
        "base": base,
        "files": [str(path) for path in written.files],
        "next_commands": list(written.next_commands),
        "note": written.note,
    }


def init_text(report: dict) -> List[str]:
    handler, config, test = report["files"]
    base = report["base"].rpartition(".")[2]
    lines = [
        f"wrote {handler}  class {report['class']}({base}), handle = entry_point(...)",
        f"wrote {config}  every handler: setting with its default",
        f"wrote {test}  packages the handler with a stand-in model and runs it",
        "next:",
    ]
    return lines + [f"  {command}" for command in report["next_commands"]] + [f"  # {report['note']}"]


# ---- tsctl package ------------------------------------------------------------------------------------
def package_report(path: Path, size: int, planned, golden: Optional[dict], signature: dict) -> dict:
    """``planned``: the build's archiver.mar.BuildPlan; ``golden``: the golden.json recorded (package --golden),
    else None; ``signature``: handlers.signing.signature_of the archive written."""
    return {
        "path": str(path),
        "bytes": size,
        "followed": [{"link": str(link), "target": str(real)} for link, real in planned.followed],
        "golden": golden_summary(golden) if golden is not None else None,
        "signature": signature,
        "notes": list(planned.notes),
    }


def signature_line(signature: dict) -> str:
    if not signature["signed"]:
        return "  not signed (tsctl package --sign-key KEY signs it)"
    key = signature["key_fingerprint"] or "an unnamed key"
    return f"  signed by key {key} (check it: tsctl verify ARCHIVE --public-key PUB)"


def package_text(report: dict) -> List[str]:
    lines = [f"followed {item['link']} -> {item['target']}" for item in report["followed"]]
    lines.append(f"wrote {report['path']} ({report['bytes'] / 1e6:.1f} MB)")
    lines.append(signature_line(report["signature"]))
    golden = report["golden"]
    if golden:
        lines.append(
            f"  golden: {golden['answers']} answers recorded (statuses {golden['statuses']}); check with 'tsctl verify'"
        )
    return lines + [f"note: {note}" for note in report["notes"]]


def golden_summary(recorded: dict) -> dict:
    """What MAR-INF/golden.json holds, without the bodies and answers: how many, which inputs, their
    statuses, and what made them."""
    cases = recorded.get("cases", [])
    fingerprint = recorded.get("fingerprint") if isinstance(recorded.get("fingerprint"), dict) else {}
    versions = fingerprint.get("versions") if isinstance(fingerprint.get("versions"), dict) else {}
    return {
        "answers": len(cases),
        "names": [case["name"] for case in cases],
        "statuses": sorted({case["status"] for case in cases}),
        "handler": fingerprint.get("handler"),
        "versions": {name: version for name, version in versions.items() if version},
        "weights_sha256": fingerprint.get("weights_sha256"),
        "settings": fingerprint.get("settings"),
    }


# ---- tsctl inspect ------------------------------------------------------------------------------------
def inspect_report(manifest: dict, entries: Iterable[Tuple[str, int]], golden: Optional[dict], signature: dict) -> dict:
    return {
        "manifest": manifest,
        "entries": [{"name": name, "size": size} for name, size in sorted(entries)],
        "golden": golden_summary(golden) if golden is not None else None,
        "signature": signature,
    }


def inspect_text(report: dict) -> List[str]:
    """The manifest as JSON (which escapes control characters itself), then one line per file; what the
    archive names is printed with control characters escaped."""
    lines = [json.dumps(report["manifest"], indent=2)]
    lines += [f"{entry['size']:>12,d}  {printable(entry['name'])}" for entry in report["entries"]]
    lines.append(signature_line(report["signature"]).strip())
    golden = report["golden"]
    if golden is not None:
        libraries = ", ".join(f"{k} {v}" for k, v in golden["versions"].items())
        lines.append(printable(f"golden: {golden['answers']} answers ({', '.join(golden['names'])})"))
        lines.append(printable(f"  made by {golden['handler']} with {libraries}"))
        settings = json.dumps(golden["settings"])
        lines.append(printable(f"  weights sha256 {golden['weights_sha256']}; settings {settings}"))
    return lines


# ---- tsctl config -------------------------------------------------------------------------------------
def config_report(path: Path, snapshot: dict, notes: List[str]) -> dict:
    """``snapshot``: the model_snapshot written; one entry per model version, the default version first."""
    models = []
    for name, versions in snapshot.get("models", {}).items():
        for version, entry in versions.items():
            settings = {key: entry.get(key) for key in SNAPSHOT_SETTINGS}
            models.append({"name": name, "version": version, "marName": entry.get("marName"), **settings})
    return {"path": str(path), "models": models, "notes": list(notes)}


def config_text(report: dict) -> List[str]:
    lines = [f"wrote {report['path']}"]
    shown = set()
    for model in report["models"]:
        if model["name"] in shown:  # one line per model: the first version the snapshot lists
            continue
        shown.add(model["name"])
        lines.append(
            f"  {model['name']}: {model['marName']} workers {model['minWorkers']}-{model['maxWorkers']}, "
            f"batch {model['batchSize']} / {model['maxBatchDelay']} ms, timeout {model['responseTimeout']} s"
        )
    return lines + [f"note: {note}" for note in report["notes"]]


# ---- tsctl export kserve / seldon ---------------------------------------------------------------------
def export_report(out, result) -> dict:
    """``result``: archiver.export.kserve.export.Export or archiver.export.seldon.export.SeldonExport (files, notes,
    curls)."""
    return {
        "out": str(out),
        "deploy": str(Path(out) / "DEPLOY.md"),
        "files": [str(path) for path in result.files],
        "notes": list(result.notes),
        "curls": list(result.curls),
    }


def export_text(report: dict) -> List[str]:
    lines = [f"wrote {path}" for path in report["files"]] + [f"note: {note}" for note in report["notes"]]
    per = ", per model" if len(report["curls"]) > 1 else ""  # Core 1: one curl, the graph's
    then = f"once its steps have built the request bodies{per}:"  # the curls read the files those steps write
    return lines + [f"deploy: see {report['deploy']}; {then}"] + [f"  {c}" for c in report["curls"]]


def tree_check_text(report: dict) -> List[str]:
    if report["problem"]:
        return [f"{report['tree']}: {report['problem']}"]
    return [f"{report['tree']}: {report['files']} files as the export wrote them ({report['digest']})"]
