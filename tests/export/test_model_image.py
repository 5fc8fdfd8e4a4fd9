"""tsctl export kserve --storage oci (issue #45): the tree as a model image KServe 0.20 mounts, and the digests that
bind what a pod loads to what was exported, on either storage.

- The image (archiver/export/model_image.py) holds exactly the PVC flow's tree under /models, is the same bytes
  from the same inputs, and the InferenceService pins its index's digest (``oci+native://REF@sha256:...``),
  valid against KServe's CRD.
- Served as a pod would serve it: the image's /models unpacked read-only, the tsctl engine started with the
  runtime's arguments and the pinned digest, answering as the engine does on the PVC export's tree.
- A changed byte of an archive, an added archive and a swapped config are each refused before a worker loads, in
  one line naming the file: by the engine at start and at register, and by the check the TorchServe runtime's
  predictor runs before torchserve starts (its exact command, run here with a stub for the image's entrypoint).

``make image-test`` (the matrix test at the end) reads the image with Debian's skopeo and umoci, as a registry
and a kubelet would, and serves it with TorchServe 0.12 started with the runtime's exact arguments."""

import contextlib
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tarfile
import urllib.parse
from pathlib import Path

import pytest
import yaml

from archiver import server
from archiver.engines import torchserve_launch
from archiver.export import crds, model_image
from archiver.export.kserve import export as kserve
from archiver.export.kserve import targets
from helpers import deploy_md
from helpers.engine import Engine
from helpers.models import package_resnet
from serving import tree_digests

REF = "registry.example.com/models/vision:1"


@pytest.fixture(scope="module")
def project(image_sample, tmp_path_factory):
    from archiver import properties

    root = tmp_path_factory.mktemp("model-image")
    package_resnet(image_sample, root / "model-store")
    package_resnet(image_sample, root / "spare", name="spare")  # an archive the export never saw
    properties.write_config(root / "model-store", root / "config" / "config.properties")
    return root


def export(project: Path, out: Path, **changes) -> Path:
    base = dict(
        out=str(out),
        name="vision",
        config=str(project / "config" / "config.properties"),
        model_store=str(project / "model-store"),
    )
    base.update(changes or {"storage": "oci", "image_ref": REF})
    kserve.export(kserve.ExportOptions(**base))
    return out


@pytest.fixture(scope="module")
def exported(project, tmp_path_factory):
    return export(project, tmp_path_factory.mktemp("oci") / "out")


def isvc(out: Path) -> dict:
    return yaml.safe_load((out / "inferenceservice.yaml").read_text())


def blob(layout: Path, digest: str) -> bytes:
    data = (layout / "blobs" / "sha256" / digest.split(":", 1)[1]).read_bytes()
    assert "sha256:" + hashlib.sha256(data).hexdigest() == digest
    return data


def unpack(layout: Path, into: Path, architecture: str = "amd64") -> Path:
    """The image's root file system for ``architecture``, as a runtime unpacks it: index.json, the image index,
    the platform's manifest, its layers in order; each blob's digest checked."""
    [top] = json.loads((layout / "index.json").read_text())["manifests"]
    index = json.loads(blob(layout, top["digest"]))
    [entry] = [m for m in index["manifests"] if m["platform"] == {"architecture": architecture, "os": "linux"}]
    manifest = json.loads(blob(layout, entry["digest"]))
    config = json.loads(blob(layout, manifest["config"]["digest"]))
    assert config["rootfs"]["diff_ids"] == [layer["digest"] for layer in manifest["layers"]]
    into.mkdir(parents=True)
    for layer in manifest["layers"]:
        assert layer["mediaType"] == model_image.LAYER
        with tarfile.open(layout / "blobs" / "sha256" / layer["digest"].split(":", 1)[1]) as found:
            found.extractall(into, filter="data")
    return into


def tree_of(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_image_holds_the_pvc_tree_is_reproducible_and_is_pinned(project, exported, tmp_path):
    """The image's /models is, byte for byte, the tree the PVC flow copies (config/ with its digests,
    model-store/); a second export of the same inputs writes the same image (the same digest); the
    InferenceService's storageUri pins the image index's digest and its manifest is valid against KServe's CRD;
    both platforms' manifests share the one layer, data only (no command, no binary)."""
    pvc = export(project, tmp_path / "pvc", storage_uri="pvc://models/vision")
    rootfs = unpack(exported / model_image.FOLDER, tmp_path / "rootfs")
    assert sorted(p.name for p in rootfs.iterdir()) == ["models"]
    image_tree = tree_of(rootfs / "models")
    assert image_tree == {k: v for k, v in tree_of(pvc).items() if k.startswith(("config/", "model-store/"))}
    assert image_tree == {k: v for k, v in tree_of(exported).items() if k.startswith(("config/", "model-store/"))}
    assert tree_of(unpack(exported / model_image.FOLDER, tmp_path / "arm64", "arm64")) == tree_of(rootfs)

    again = export(project, tmp_path / "again")
    assert tree_of(again / model_image.FOLDER) == tree_of(exported / model_image.FOLDER)
    [top] = json.loads((exported / model_image.FOLDER / "index.json").read_text())["manifests"]
    assert top["annotations"] == {model_image.REF_NAME: "1"}
    model = isvc(exported)["spec"]["predictor"]["model"]
    assert model["storageUri"] == f"oci+native://{REF}@{top['digest']}"
    crds.check(isvc(exported), "inferenceservice.yaml")
    assert not (exported / "pvc.yaml").exists() and (pvc / "pvc.yaml").exists()
    deploy = (exported / "DEPLOY.md").read_text()
    assert "enableOciModelSupport" in deploy and "kubectl cp" not in deploy
    run = deploy_md.run_deploy_md(exported, tmp_path / "stubs")  # its blocks as a reader pastes them
    assert run.of("skopeo") == [["copy", "--all", "--preserve-digests", "oci:model-image:1", f"docker://{REF}"]]
    deploy_md.check_referenced_files_exist(exported, run)
    assert not any(args[:1] == ["cp"] for args in run.of("kubectl"))


def test_the_tree_digest_both_storages_pin_is_the_listings(project, exported):
    """config/tree-digests.json lists every other file of the tree; its sha256 is what the predictor pins: in
    the TorchServe runtime's check command, and in the tsctl engine's TSCTL_TREE_DIGEST."""
    listing = (exported / tree_digests.LISTING).read_bytes()
    digest = "sha256:" + hashlib.sha256(listing).hexdigest()
    files = json.loads(listing)["sha256"]
    assert sorted(files) == ["config/config.properties", "model-store/resnet18.mar"]
    archive = (exported / "model-store" / "resnet18.mar").read_bytes()
    assert files["model-store/resnet18.mar"] == hashlib.sha256(archive).hexdigest()
    command = isvc(exported)["spec"]["predictor"]["model"]["command"]
    assert command[:2] == ["sh", "-c"] and f"{targets.MOUNT} {digest} && exec" in command[2]
    assert command[3] == Path(tree_digests.__file__).read_text()


def check_command(out: Path, root: Path, stub: Path) -> subprocess.CompletedProcess:
    """The TorchServe predictor's command exactly as the manifest gives it, with the runtime's args KServe
    appends, run here: /mnt/models is ``root``, and the image's entrypoint a stub that prints what it got."""
    command = isvc(out)["spec"]["predictor"]["model"]["command"]
    command[2] = command[2].replace(targets.MOUNT, str(root)).replace(targets.TORCHSERVE_ENTRYPOINT, str(stub))
    runtime_args = ["torchserve", "--start", f"--model-store={targets.MOUNT}/model-store"]
    environment = dict(os.environ, PATH=f"{Path(os.sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(command + runtime_args, capture_output=True, text=True, timeout=120, env=environment)


def changed_trees(project: Path, tree: Path, tmp_path: Path):
    """(what changed, a copy of ``tree`` changed so, the file the refusal must name)."""
    for case, name in (
        ("a changed byte", "model-store/resnet18.mar"),
        ("an added archive", "model-store/spare.mar"),
        ("a swapped config", "config/config.properties"),
    ):
        copy = tmp_path / case.replace(" ", "-")
        shutil.copytree(tree, copy)
        if case == "a changed byte":
            with open(copy / name, "r+b") as archive:
                archive.seek(-100, os.SEEK_END)
                byte = archive.read(1)
                archive.seek(-1, os.SEEK_CUR)
                archive.write(bytes([byte[0] ^ 1]))
        elif case == "an added archive":
            shutil.copy(project / "spare" / "spare.mar", copy / name)
        else:
            (copy / name).write_text((copy / name).read_text() + "number_of_netty_threads=4\n")
        yield case, copy, name


def test_the_torchserve_runtime_starts_only_on_the_exported_tree(project, exported, tmp_path):
    """The predictor's command runs the image's entrypoint with the runtime's args on the exported tree, and
    stops before it on a tree with a changed byte, an added archive or a swapped config, naming the file."""
    stub = tmp_path / "entrypoint"
    stub.write_text('#!/bin/sh\necho "entrypoint: $*"\n')
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    tree = tmp_path / "tree"
    shutil.copytree(exported, tree, ignore=shutil.ignore_patterns(model_image.FOLDER, "inputs"))
    ran = check_command(exported, tree, stub)
    started = f"entrypoint: torchserve --start --model-store={targets.MOUNT}/model-store\n"
    assert ran.returncode == 0 and ran.stdout == started, ran
    for case, changed, name in changed_trees(project, tree, tmp_path):
        ran = check_command(exported, changed, stub)
        assert ran.returncode == 1 and "entrypoint" not in ran.stdout, (case, ran)
        assert ran.stderr.count("\n") == 1 and f": {name} " in ran.stderr, (case, ran.stderr)


def predict(engine: Engine, image: bytes):
    return server.request(f"{engine.url}/predictions/resnet18", image, "POST", {"Content-Type": "image/jpeg"}, 60)


@contextlib.contextmanager
def read_only(folder: Path):
    """``folder`` as a pod mounts an image volume: a read-only bind mount of it (root here; else its files made
    read-only, which binds anyone but root)."""
    mounted = folder.parent / f"{folder.name}-ro"
    mounted.mkdir()
    bind = subprocess.run(["mount", "--bind", str(folder), str(mounted)], capture_output=True)
    if bind.returncode == 0 and subprocess.run(["mount", "-o", "remount,ro,bind", str(mounted)]).returncode == 0:
        try:
            yield mounted
        finally:
            subprocess.run(["umount", str(mounted)], check=True)
        return
    if bind.returncode == 0:
        subprocess.run(["umount", str(mounted)], check=True)
    for path in sorted(folder.rglob("*"), reverse=True):
        path.chmod(path.stat().st_mode & ~0o222)
    yield folder


def test_the_engine_serves_the_image_read_only_as_the_pvc_tree_and_refuses_any_other(
    project, exported, jpegs, tmp_path
):
    """The image's /models unpacked and made read-only, served by the engine with KServe's runtime arguments
    (--model_store, --ts_config under /models) and TSCTL_TREE_DIGEST as the predictor sets it: the same answer
    as the engine on the PVC export's tree. Then an archive copied into the store and registered: 400 naming
    it. Each changed tree: the engine exits 2 before any worker starts, in one line naming the file."""
    digest = isvc(exported)["spec"]["predictor"]["model"]["command"][2].split()[4]
    models = unpack(exported / model_image.FOLDER, tmp_path / "rootfs") / "models"
    pvc = export(project, tmp_path / "pvc", storage_uri="pvc://models/vision")
    answers = []
    with read_only(models) as mounted:
        with pytest.raises(OSError):
            (mounted / "config" / "written").write_text("x")
        for tree, env in ((mounted, {tree_digests.ENVIRONMENT: digest}), (pvc, {})):
            engine = Engine(tree, env=env).wait_ready()
            try:
                status, body = predict(engine, jpegs[0])
                assert status == 200, body
                answers.append(body)
                assert (f"is the one {digest} pins: 2 files checked" in engine.output()) == bool(env)
            finally:
                assert engine.stop() == 0
    assert answers[0] == answers[1]

    writable = tmp_path / "writable"
    shutil.copytree(models, writable, copy_function=shutil.copy)
    for path in writable.rglob("*"):
        path.chmod(path.stat().st_mode | 0o200)
    (writable / "config" / "config.properties").chmod(0o644)
    text = (writable / "config" / "config.properties").read_text()
    engine = Engine(writable, "--enable_model_api", "true", env={tree_digests.ENVIRONMENT: digest}).wait_ready()
    try:
        shutil.copy(project / "spare" / "spare.mar", writable / "model-store" / "spare.mar")
        query = urllib.parse.urlencode({"url": "spare.mar", "initial_workers": 1})
        status, body = server.request(f"{engine.url}/models?{query}", b"", "POST", timeout=60)
        why = "model-store/spare.mar is not in config/tree-digests.json: the tree holds a file the export did not write"
        assert status == 400 and body["message"] == why, body
        status, body = predict(engine, jpegs[0])
        assert status == 200, body
    finally:
        assert engine.stop() == 0
        (writable / "model-store" / "spare.mar").unlink()
    assert "disable_token_authorization=true" in text

    for case, changed, name in changed_trees(project, writable, tmp_path):
        engine = Engine(changed, env={tree_digests.ENVIRONMENT: digest})
        code = engine.process.wait(120)
        lines = [line for line in engine.output().splitlines() if line.startswith("tsctl engine: ")]
        assert code == 2 and len(lines) == 1 and lines[0].startswith(f"tsctl engine: {name} "), (case, engine.output())
        assert "worker" not in engine.output().lower(), (case, engine.output())


def tools(*names: str):
    """Debian's ``names``, installed with apt-get where missing and this runs as root; else the test skips."""
    missing = [name for name in names if shutil.which(name) is None]
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-q", *missing], capture_output=True, timeout=600)
    missing = [name for name in names if shutil.which(name) is None]
    if missing:
        pytest.skip(f"needs {' '.join(missing)} (apt-get install {' '.join(missing)})")


@pytest.mark.matrix
def test_debians_tools_read_the_image_and_torchserve_serves_it(project, exported, jpegs, tmp_path):
    """skopeo reads the layout and finds the digest the InferenceService pins, and a copy of it that keeps its
    digests (as DEPLOY.md's push does) has the same; the amd64 image unpacked by umoci (the platform a node
    pulls) is the export's tree; mounted read-only, the TorchServe predictor's check passes on it and TorchServe
    0.12, started with KServe's runtime arguments, answers as the tsctl engine on the same mount."""
    tools("skopeo", "umoci")
    digest = isvc(exported)["spec"]["predictor"]["model"]["storageUri"].rsplit("@", 1)[1]
    layout = f"oci:{exported / model_image.FOLDER}:1"

    def raw_digest(reference: str) -> str:
        raw = subprocess.run(["skopeo", "inspect", "--raw", reference], capture_output=True, check=True).stdout
        return "sha256:" + hashlib.sha256(raw).hexdigest()

    assert raw_digest(layout) == digest
    pushed = f"oci:{tmp_path / 'pushed'}:1"
    subprocess.run(["skopeo", "copy", "--all", "--preserve-digests", layout, pushed], capture_output=True, check=True)
    assert raw_digest(pushed) == digest
    single = f"oci:{tmp_path / 'single'}:1"
    subprocess.run(["skopeo", "copy", "--override-arch", "amd64", layout, single], capture_output=True, check=True)
    subprocess.run(
        ["umoci", "unpack", "--rootless", "--image", f"{tmp_path / 'single'}:1", str(tmp_path / "bundle")],
        capture_output=True,
        check=True,
    )
    models = tmp_path / "bundle" / "rootfs" / "models"
    assert tree_of(models) == {k: v for k, v in tree_of(exported).items() if k.startswith(("config/", "model-store/"))}

    stub = tmp_path / "entrypoint"
    stub.write_text("#!/bin/sh\necho checked\n")
    stub.chmod(0o755)
    answers = []
    with read_only(models) as mounted:
        assert check_command(exported, mounted, stub).stdout == "checked\n"
        config, store = mounted / "config" / "config.properties", mounted / "model-store"
        running = torchserve_launch.start(config, store, tmp_path / "ts", timeout=240, kserve_args=True)
        try:
            status, body = server.request(
                f"{running.inference}/predictions/resnet18", jpegs[0], "POST", {"Content-Type": "image/jpeg"}, 60
            )
            assert status == 200, body
            answers.append(body)
        finally:
            server.stop(running)
        engine = Engine(mounted, env={tree_digests.ENVIRONMENT: digest_of_tree(exported)}).wait_ready()
        try:
            status, body = predict(engine, jpegs[0])
            assert status == 200, body
            answers.append(body)
        finally:
            assert engine.stop() == 0
    assert answers[0] == answers[1]


def digest_of_tree(out: Path) -> str:
    return "sha256:" + hashlib.sha256((out / tree_digests.LISTING).read_bytes()).hexdigest()


def test_seldon_core2_mounts_the_same_kind_of_image_into_its_server(project, tmp_path):
    """export seldon --storage oci: Seldon Core 2 fetches Models with rclone, which reads no OCI image, so the
    Server's pod mounts the model image (by its index's digest, subPath models, where the claim was) and each
    Model's storageUri lies in it; no claim, no copy pod; DEPLOY.md pushes it; --core 1 refuses the flags."""
    from archiver.export.seldon import export as seldon
    from archiver.export.seldon import plan

    ref = "registry.example.com/models/seldon:1"
    out = tmp_path / "seldon"
    config = str(project / "config" / "config.properties")
    store = str(project / "model-store")
    seldon.export(
        seldon.SeldonOptions(
            out=str(out),
            image="registry.example.com/mlserver:1",
            config=config,
            model_store=store,
            storage="oci",
            image_ref=ref,
        )
    )
    [top] = json.loads((out / model_image.FOLDER / "index.json").read_text())["manifests"]
    [server_manifest] = list(yaml.safe_load_all((out / "server.yaml").read_text()))
    crds.check(server_manifest, "server.yaml")
    pod = server_manifest["spec"]["podSpec"]
    pinned = {"reference": f"{ref}@{top['digest']}", "pullPolicy": "IfNotPresent"}
    assert pod["volumes"] == [{"name": plan.CLAIM_VOLUME, "image": pinned}]
    [mount] = pod["containers"][0]["volumeMounts"]
    assert mount["mountPath"] == plan.MOUNT and mount["subPath"] == model_image.ROOT and mount["readOnly"]
    rootfs = unpack(out / model_image.FOLDER, tmp_path / "rootfs")
    for document in yaml.safe_load_all((out / "models.yaml").read_text()):
        inside = Path(document["spec"]["storageUri"]).relative_to(plan.MOUNT)  # where the mount puts it
        assert (rootfs / model_image.ROOT / inside / "model-settings.json").is_file(), inside
    assert tree_of(rootfs / model_image.ROOT) == {k: v for k, v in tree_of(out).items() if k.startswith("models/")}
    assert not (out / "pvc.yaml").exists() and not (out / "pvc-copy-pod.yaml").exists()
    run = deploy_md.run_deploy_md(out, tmp_path / "stubs")
    assert ["copy", "--all", "--preserve-digests", "oci:model-image:1", f"docker://{ref}"] in run.of("skopeo")
    deploy_md.check_referenced_files_exist(out, run)


@pytest.mark.parametrize(
    "reference, registry",
    [
        ("registry.example.com/models/vision:1", "registry.example.com"),
        ("localhost:5000/vision:1", "localhost:5000"),
        ("localhost/vision:1", "localhost"),
        ("myorg/vision:1", "docker.io"),  # an outsider's case: DEPLOY.md said 'skopeo login myorg'
        ("vision:1", "docker.io"),
        ("ghcr.io/org/team/vision", "ghcr.io"),
    ],
)
def test_deploy_md_logs_in_to_the_registry_docker_would_push_to(reference, registry):
    """DEPLOY.md's 'skopeo login REGISTRY': the first part of the name is a host only with a '.' or a ':', or as
    localhost (Docker's rule, distribution/reference); else the image goes to Docker Hub."""
    assert model_image.registry_of(reference) == registry
