"""tsctl export kserve: the PVC tree, manifests valid against KServe's CRDs, and the checks before writing; with
--engine tsctl (alias kserve), a serving runtime for the tsctl engine's image and an InferenceService naming it
over the same storage; the runtime registry and the export targets behind --engine."""

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pydantic
import pytest
import yaml
from click.testing import CliRunner
from kubernetes.client import models as k8s

from archiver import engines, properties
from archiver.cli import main
from archiver.errors import UserError
from archiver.export import core, crds
from archiver.export.kserve import export as kserve
from archiver.export.kserve import targets, tsctl_image
from helpers import deploy_md
from helpers.models import export_tree, package_resnet, package_text
from serving.local_model import LocalModel

SHARED = Path(__file__).resolve().parents[3] / "shared" / "kserve"


@pytest.fixture(scope="module")
def project(image_sample, tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    store = root / "model-store"
    package_resnet(image_sample, store)
    package_resnet(image_sample, store, name="resnet18_b")
    tensor = image_sample / "tensor.yaml"
    tensor.write_text("batchSize: 4\nhandler:\n  input_shape: [3, 224, 224]\n")
    package_resnet(image_sample, store, name="resnet18_t", handler="tensor", config_file=str(tensor), extra_files=[])
    own = root / "my_handler.py"
    own.write_text("def handle(data, context):\n    return data\n")
    package_resnet(image_sample, store, name="custom", handler=str(own), config_text="batchSize: 8\n")
    properties.write_config(store, root / "config" / "config.properties")
    return root


def options(project, out, **changes):
    base = dict(
        out=str(out),
        name="vision",
        storage_uri="pvc://models/tsctl",
        config=str(project / "config" / "config.properties"),
        model_store=str(project / "model-store"),
    )
    base.update(changes)
    return kserve.ExportOptions(**base)


def test_export_writes_the_pvc_tree_and_valid_manifests(project, tmp_path):
    result = kserve.export(options(project, tmp_path, canary=10))
    names = sorted(p.relative_to(tmp_path).as_posix() for p in result.files)
    assert names == [
        "DEPLOY.md",
        "config/config.properties",
        "config/tree-digests.json",  # what the predictor checks the tree against (tests/export/test_model_image.py)
        "inferenceservice-promote.yaml",  # --canary: the rollout's steps (tests/export/test_shadow_export.py)
        "inferenceservice-shadow.yaml",
        "inferenceservice.yaml",
        "inputs/sample.png",
        "model-store/custom.mar",
        "model-store/resnet18.mar",
        "model-store/resnet18_b.mar",
        "model-store/resnet18_t.mar",
        "pvc-copy-pod.yaml",
        "pvc.yaml",
    ]
    isvc = yaml.safe_load((tmp_path / "inferenceservice.yaml").read_text())
    assert crds.problems(isvc) == []
    model = isvc["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "pytorch"} and model["storageUri"] == "pvc://models/tsctl"
    assert model["protocolVersion"] == "v1" and isvc["spec"]["predictor"]["canaryTrafficPercent"] == 10
    pod = yaml.safe_load((tmp_path / "pvc-copy-pod.yaml").read_text())
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "models"
    deploy = (tmp_path / "DEPLOY.md").read_text()
    assert "kubectl cp -n default model-store/resnet18.mar vision-copy:/pvc/tsctl/model-store/resnet18.mar" in deploy
    assert '"http://${INGRESS_HOST}:${INGRESS_PORT}/v1/models/resnet18_b:predict"' in deploy  # the model, not "vision"
    assert len(result.curls) == 4 and all('-H "Host: ${SERVICE_HOSTNAME}"' in c for c in result.curls)
    assert all('-H "Content-Type: application/json"' in c for c in result.curls)
    # the user's own handler runs inside TorchServe's envelope: its batch size is made safe
    snapshot = json.loads(properties.read_properties(tmp_path / "config/config.properties")["model_snapshot"])
    assert snapshot["models"]["custom"]["1.0"]["batchSize"] == 1
    assert snapshot["models"]["resnet18_t"]["1.0"]["batchSize"] == 4
    assert any("custom: batchSize set to 1" in note for note in result.notes)


def test_ab_split_is_a_valid_inference_graph(project, tmp_path):
    kserve.export(options(project, tmp_path, split=[("resnet18", 90), ("resnet18_b", 10)], protocol="v2"))
    graph = yaml.safe_load((tmp_path / "inferencegraph.yaml").read_text())
    assert crds.problems(graph) == []
    steps = graph["spec"]["nodes"]["root"]["steps"]
    assert graph["spec"]["nodes"]["root"]["routerType"] == "Splitter"
    assert [(s["weight"], s["serviceUrl"]) for s in steps] == [
        (90, "http://vision-predictor.default.svc.cluster.local/v2/models/resnet18/infer"),
        (10, "http://vision-predictor.default.svc.cluster.local/v2/models/resnet18_b/infer"),
    ]


def test_transformer_section_is_valid_and_ships_the_archive(project, tmp_path):
    archive = project / "model-store" / "resnet18.mar"
    kserve.export(
        options(
            project,
            tmp_path,
            transformer_image="registry.local/tsctl-transformer:1",
            transformer_archive=str(archive),
            transformer_model="resnet18_t",
        )
    )
    isvc = yaml.safe_load((tmp_path / "inferenceservice.yaml").read_text())
    assert crds.problems(isvc) == []
    container = isvc["spec"]["transformer"]["containers"][0]
    assert container["args"][:4] == ["--model_name", "resnet18_t", "--archive", "/mnt/models/transformer/resnet18.mar"]
    assert (tmp_path / "transformer" / "resnet18.mar").read_bytes() == archive.read_bytes()


def test_broken_manifests_fail_with_a_readable_error():
    isvc = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "x"},
        "spec": {"predictor": {"canaryTrafficPercent": "ten", "model": {"modelFormat": {"name": "pytorch"}}}},
    }
    assert crds.problems(isvc) == ["spec.predictor.canaryTrafficPercent: 'ten' is not of type 'integer'"]
    isvc["spec"]["predictor"] = {"model": {"modelFormat": {"name": "pytorch"}, "storageURI": "pvc://a/b"}}
    [problem] = crds.problems(isvc)
    assert problem.startswith("spec.predictor.model: Additional properties are not allowed ('storageURI'")
    with pytest.raises(UserError, match="x.yaml does not match KServe's InferenceService schema: spec.predictor"):
        crds.check(isvc, "x.yaml")
    graph = {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "InferenceGraph", "metadata": {}, "spec": {}}
    assert crds.problems(graph) == ["spec: 'nodes' is a required property"]


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/kserve is not beside this checkout")
def test_vendored_schemas_match_the_kserve_crds():
    for source, vendored in [
        ("serving.kserve.io_inferenceservices.yaml", "inferenceservice.v1beta1.json"),
        ("serving.kserve.io_inferencegraphs.yaml", "inferencegraph.v1alpha1.json"),
        ("serving.kserve.io_servingruntimes.yaml", "servingruntime.v1alpha1.json"),
        ("serving.kserve.io_clusterservingruntimes.yaml", "servingruntime.v1alpha1.json"),
    ]:
        crd = yaml.load((SHARED / source).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        version = vendored.split(".")[1]
        schema = next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]
        assert json.loads((Path(crds.__file__).parent / "crds" / vendored).read_text()) == schema


@pytest.mark.parametrize(
    "edit, words",
    [
        (("enable_envvars_config", "false"), "enable_envvars_config must be true (KServe's TS_SERVICE_ENVELOPE"),
        (("disable_token_authorization", "false"), "carry no TorchServe token"),
        (("enable_model_api", None), "set enable_model_api explicitly"),
        (("install_py_dep_per_model", "false"), None),
    ],
)
@pytest.mark.parametrize("engine", ["torchserve", "tsctl"])  # both read the config alike: the same checks
def test_config_problems_are_refused_before_writing(project, tmp_path, edit, words, engine):
    engine_options = {"engine": engine, "image": "registry.example.com/e:1"} if engine == "tsctl" else {}
    props = properties.read_properties(project / "config" / "config.properties")
    key, value = edit
    if value is None:
        props.pop(key)
    else:
        props[key] = value
    config = tmp_path / "config.properties"
    config.write_text(properties.render(props))
    out = tmp_path / "out"
    if words is None:  # no archive carries requirements: nothing to install, nothing to refuse
        kserve.export(options(project, out, config=str(config), **engine_options))
        return
    with pytest.raises(UserError, match=words.replace("(", r"\(")):
        kserve.export(options(project, out, config=str(config), **engine_options))
    assert not out.exists()


def test_snapshot_and_store_mismatches_are_refused(project, tmp_path):
    props = properties.read_properties(project / "config" / "config.properties")
    snapshot = json.loads(props["model_snapshot"])
    snapshot["models"]["other"] = snapshot["models"].pop("resnet18")
    props["model_snapshot"] = json.dumps(snapshot)
    config = tmp_path / "c.properties"
    config.write_text(properties.render(props))
    with pytest.raises(UserError, match="model_snapshot key 'other' differs from resnet18.mar's model name"):
        kserve.export(options(project, tmp_path / "o", config=str(config)))
    snapshot["models"]["other"]["1.0"]["marName"] = "gone.mar"
    props["model_snapshot"] = json.dumps(snapshot)
    config.write_text(properties.render(props))
    with pytest.raises(UserError, match="names marName 'gone.mar', which is not in"):
        kserve.export(options(project, tmp_path / "o", config=str(config)))


@pytest.mark.parametrize(
    "args, words",
    [
        (["--name", "Vision_1"], "is not a valid InferenceService name"),
        (["--storage-uri", "s3://bucket/x"], "must look like pvc://CLAIM/PATH"),
        (["--split", "resnet18=50", "--split", "resnet18_b=40"], "add up to 90, not 100"),
        (["--split", "resnet18=50", "--split", "nope=50"], "--split model 'nope' is not in"),
        (["--split", "resnet18:50"], "must look like MODEL=PERCENT"),
        (["--canary", "120"], "from 0 to 100"),
        # an image docker build -t and the kubelet refuse (uppercase repository, a space): one line, as export seldon
        (["--engine", "tsctl", "--image", "Bad_Image:1"], "--image 'Bad_Image:1' is not an image reference"),
        (["--transformer-image", "reg/bad image:1", "--transformer-archive", "x.mar"], "is not an image reference"),
    ],
)
def test_cli_mistakes_are_one_sentence(project, tmp_path, args, words):
    base = {"--name": "vision", "--storage-uri": "pvc://models/tsctl"}
    flags = []
    for key, value in base.items():
        if key not in args:
            flags += [key, value]
    result = CliRunner().invoke(
        main,
        [
            "export",
            "kserve",
            str(tmp_path / "out"),
            "--config",
            str(project / "config/config.properties"),
            "--model-store",
            str(project / "model-store"),
            *flags,
            *args,
        ],
    )
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


# ---- DEPLOY.md: a Kubernetes user can follow it ---------------------------------------------------------
def core_v1_problems(manifest: dict) -> list:
    """The manifest checked against the Kubernetes client's core/v1 models (generated from the API's OpenAPI
    schema): unknown fields, wrong types and missing required fields, as 'path: message'."""
    model = {"Pod": k8s.V1Pod, "PersistentVolumeClaim": k8s.V1PersistentVolumeClaim}[manifest["kind"]]
    try:
        model.model_validate(manifest)
    except pydantic.ValidationError as error:
        return [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()]
    return []


RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}  # the volume types the restricted standard allows


def restricted_problems(pod: dict) -> list:
    """The checks of the restricted Pod Security Standard (baseline included) that a pod spec can fail,
    as the pod-security admission controller applies them: kubernetes.io/docs/concepts/security/pod-security-standards.
    Also the kubelet's: runAsNonRoot with an image whose user is root (busybox) needs a non-zero runAsUser."""
    spec, problems = pod["spec"], []
    pod_context = spec.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            problems.append(f"spec.{key} is true")
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']} is of a restricted type: {sorted(kinds)}")
    if (pod_context.get("seccompProfile") or {}).get("type") == "Unconfined":
        problems.append("spec.securityContext.seccompProfile is Unconfined")
    for container in spec.get("initContainers", []) + spec.get("containers", []):
        context, where = container.get("securityContext", {}), f"container {container['name']}"
        if context.get("privileged"):
            problems.append(f"{where}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation must be false")
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
            problems.append(f"{where}: runAsNonRoot must be true")
        user = context.get("runAsUser", pod_context.get("runAsUser"))
        if not isinstance(user, int) or user == 0:
            problems.append(f"{where}: runAsUser must be a non-zero uid (the image's user is root)")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile")) or {}
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccompProfile.type must be RuntimeDefault or Localhost")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{where}: capabilities must drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: capabilities may add only NET_BIND_SERVICE")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            problems.append(f"{where}: hostPort")
    return problems


def code_blocks(markdown: str) -> list:
    return re.findall(r"```sh\n(.*?)```", markdown, re.S)


def test_deploy_md_is_complete(project, tmp_path):
    out = tmp_path / "deploy"
    result = kserve.export(options(project, out))
    deploy = (out / "DEPLOY.md").read_text()
    assert "cd " not in deploy and str(tmp_path) not in deploy  # every path is relative to OUT, wherever it is
    assert 'test -f DEPLOY.md -a -d model-store || echo "error: run these commands from' in deploy

    claim = yaml.safe_load((out / "pvc.yaml").read_text())
    assert core_v1_problems(claim) == []
    assert claim["kind"] == "PersistentVolumeClaim" and claim["metadata"] == {"name": "models", "namespace": "default"}
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}}}
    pod = yaml.safe_load((out / "pvc-copy-pod.yaml").read_text())
    assert core_v1_problems(pod) == [] and restricted_problems(pod) == []
    assert pod["spec"]["securityContext"]["fsGroup"] == 1000  # the uid KServe's TorchServe runtime runs as
    assert deploy.index("-f pvc.yaml") < deploy.index("-f pvc-copy-pod.yaml") < deploy.index("kubectl cp")
    assert "Skip this step if the claim exists already" in deploy

    # the ingress exactly as KServe's "Determine the ingress IP and ports": load balancer or port-forward
    for line in [
        "export INGRESS_HOST=$(kubectl -n istio-system get service istio-ingressgateway "
        "-o jsonpath='{.status.loadBalancer.ingress[0].ip}')",
        "export INGRESS_PORT=$(kubectl -n istio-system get service istio-ingressgateway "
        "-o jsonpath='{.spec.ports[?(@.name==\"http2\")].port}')",
        "kubectl port-forward --namespace istio-system svc/${INGRESS_GATEWAY_SERVICE} 8080:80",
        "export INGRESS_HOST=localhost",
        "export INGRESS_PORT=8080",
    ]:
        assert line + "\n" in deploy
    assert deploy.index("INGRESS_HOST=") < deploy.index("curl ")

    # every curl sends JSON with its Content-Type, from a file a line above writes
    curls = [line for block in code_blocks(deploy) for line in block.splitlines() if line.startswith("curl ")]
    assert curls == result.curls
    written = set(re.findall(r"^python3 .* (input-[\w-]+\.json)$", deploy, re.M))
    assert written == {"input-image.json", "input-resnet18_t.json", "input-custom.json"}
    for line in curls:
        assert '-H "Content-Type: application/json"' in line
        [body] = re.findall(r"--data-binary @(\S+)$", line)
        assert body in written
    assert "custom: its handler (my_handler.py) is your own; `input-custom.json` holds" in deploy
    assert "INPUT=inputs/sample.png\n" in deploy and "IMAGE=inputs/sample.png\n" in deploy

    # no ingress: a port-forward to the predictor's pod; other ingresses named
    pods = "-l serving.kserve.io/inferenceservice=vision,component=predictor -o name | head -n 1"
    assert f"kubectl port-forward -n default $(kubectl get pod -n default {pods}) 8080:8080" in deploy
    assert "Kourier" in deploy and "Gateway API" in deploy


@pytest.mark.parametrize(
    "change, problem",
    [
        (lambda c, p: c.pop("allowPrivilegeEscalation"), "allowPrivilegeEscalation must be false"),
        (lambda c, p: p.update(runAsUser=0), "runAsUser must be a non-zero uid"),
        (lambda c, p: p.pop("runAsNonRoot"), "runAsNonRoot must be true"),
        (lambda c, p: p.pop("seccompProfile"), "seccompProfile.type must be RuntimeDefault"),
        (lambda c, p: c["capabilities"].update(drop=["NET_RAW"]), "capabilities must drop ALL"),
    ],
)
def test_the_restricted_check_catches_each_missing_setting(project, change, problem):
    pod = core.copy_pod("vision", "default", "models")
    change(pod["spec"]["containers"][0]["securityContext"], pod["spec"]["securityContext"])
    assert any(problem in p for p in restricted_problems(pod))


def test_the_core_v1_check_catches_unknown_and_mistyped_fields(project):
    pod = core.copy_pod("vision", "default", "models")
    pod["spec"]["securityContext"]["runAsUsr"] = 1000
    pod["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = "no"
    assert sorted(core_v1_problems(pod)) == [
        "spec.containers.0.securityContext.allowPrivilegeEscalation: Input should be a valid boolean",
        "spec.securityContext.runAsUsr: Extra inputs are not permitted",
    ]
    claim = core.claim_manifest("models", "default", [])
    claim["spec"]["resources"]["requests"]["storage"] = 2
    assert core_v1_problems(claim) == ["spec.resources.requests.storage: Input should be a valid string"]


def test_claim_is_twice_the_archives_and_at_least_2gi(project, tmp_path):
    big = tmp_path / "big.mar"
    with open(big, "wb") as f:
        f.truncate(int(1.4 * 2**30))  # sparse: its size is what counts
    small = project / "model-store" / "resnet18.mar"
    assert core.claim_size([small]) == "2Gi"
    assert core.claim_size([small, big]) == "3Gi"


READER = """import base64


def handle(data, context):
    \"\"\"A handler of one's own that reads files: each request's bytes (raw, or base64 as KServe's envelopes
    hand a BYTES element or an instance's data) to their size; anything else is refused.\"\"\"
    if data is None:
        return None
    answers = []
    for row in data:
        value = row.get("data") if row.get("data") is not None else row.get("body")
        if isinstance(value, str):
            value = base64.b64decode(value, validate=True)
        if not isinstance(value, (bytes, bytearray)):
            raise ValueError(f"expected a file's bytes, got {type(value).__name__}")
        answers.append({"bytes": len(value)})
    return answers
"""


@pytest.fixture(scope="module")
def mixed(project, text_samples, tmp_path_factory):
    """An image, a tensor and a text model: one of each kind of request body; and two archives of a handler of
    one's own that reads files, one with golden answers (package --golden), one without."""
    from archiver import golden, mar

    root = tmp_path_factory.mktemp("mixed")
    store = root / "model-store"
    store.mkdir()
    for name in ("resnet18.mar", "resnet18_t.mar"):
        shutil.copyfile(project / "model-store" / name, store / name)
    package_text(text_samples, store, "sentiment", "text_classifier", "classifier")
    reader = root / "reader.py"
    reader.write_text(READER)
    inputs = root / "golden"
    inputs.mkdir()
    (inputs / "reading.bin").write_bytes(b"\x00\x01 a reading \xff")
    for name, source in (("reader_golden", str(inputs)), ("reader_plain", None)):
        flags = mar.PackageOptions(
            model_name=name,
            handler=str(reader),
            serialized_file=str(project / "model-store" / "resnet18_t.mar"),  # any file: the handler loads none
            export_path=str(store),
        )
        golden.package(flags, source) if source else mar.package(flags)
    properties.write_config(store, root / "config" / "config.properties")
    return root


TEXT = """He said "héllo" & 'bye' $HOME `date`"""  # quotes, non-ASCII, shell characters: all kept as typed
MODELS = {  # model: its request body in DEPLOY.md
    "resnet18": "input-image.json",
    "sentiment": "input-text.json",
    "resnet18_t": "input-resnet18_t.json",
    "reader_golden": "input-reader_golden.json",
    "reader_plain": "input-reader_plain.json",
}


@pytest.mark.parametrize("protocol", ["v1", pytest.param("v2", marks=pytest.mark.matrix)])  # v2 in make matrix: 26 s
def test_deploy_md_runs_from_its_directory_and_its_bodies_get_200(mixed, tmp_path, tmp_path_factory, protocol):
    """DEPLOY.md's shell blocks run as written from OUT (kubectl, docker and curl recording their arguments):
    every file they apply, copy or send is in the tree, no path of this machine is, and each body the
    handlers get under KServe's envelope is answered 200."""
    out = tmp_path / "deploy"
    result = kserve.export(options(mixed, out, protocol=protocol))
    run = deploy_md.run_deploy_md(out, tmp_path / "stubs")
    deploy_md.check_referenced_files_exist(out, run)
    here = [str(tmp_path_factory.getbasetemp()), str(Path.cwd()), str(Path(__file__).resolve().parents[2])]
    assert deploy_md.paths_in_tree(out, here) == []
    applied = [deploy_md.positional(args)[-1] for args in run.of("kubectl") if args[0] == "apply"]
    assert applied == ["pvc.yaml", "pvc-copy-pod.yaml", "inferenceservice.yaml"]
    sent = [arg[1:] for args in run.of("curl") for arg in args if arg.startswith("@")]
    assert sorted(sent) == sorted(MODELS.values()) and len(result.curls) == len(MODELS)
    deploy = (out / "DEPLOY.md").read_text()
    # the text model's requirements: installed in the pod from the index, --offline the way around it
    assert "installs the requirements of sentiment.mar (" in deploy and "the cluster needs outbound access" in deploy
    assert "export again with `--offline --force`" in deploy

    bodies = {name: json.loads((out / body).read_text()) for name, body in MODELS.items()}
    image = (out / "inputs" / "sample.png").read_bytes()
    golden_input = (out / "inputs" / "reader_golden-reading.bin").read_bytes()
    assert golden_input == b"\x00\x01 a reading \xff" and "INPUT=inputs/reader_golden-reading.bin\n" in deploy
    if protocol == "v1":
        [item] = bodies["resnet18"]["instances"]
        assert list(item) == ["data"] and base64.b64decode(item["data"], validate=True) == image
        assert bodies["sentiment"] == {"instances": ["A sentence to send"]}
        [tensor] = bodies["resnet18_t"]["instances"]
        assert [len(tensor), len(tensor[0]), len(tensor[0][0])] == [3, 224, 224] and tensor[2][223][223] == 0.0
        assert base64.b64decode(bodies["reader_golden"]["instances"][0]["data"]) == golden_input
    else:
        [image_input] = bodies["resnet18"]["inputs"]
        assert {k: v for k, v in image_input.items() if k != "data"} == {
            "name": "input-0",
            "shape": [1],
            "datatype": "BYTES",
        }
        assert base64.b64decode(image_input["data"][0], validate=True) == image
        assert bodies["sentiment"] == {
            "inputs": [{"name": "input-0", "shape": [1], "datatype": "BYTES", "data": ["A sentence to send"]}]
        }
        [tensor] = bodies["resnet18_t"]["inputs"]
        assert tensor["shape"] == [1, 3, 224, 224] and tensor["datatype"] == "FP32"
        assert tensor["data"] == [0.0] * (3 * 224 * 224)
        assert base64.b64decode(bodies["reader_golden"]["inputs"][0]["data"][0]) == golden_input
    assert base64.b64decode(json.dumps(bodies["reader_plain"]).split('"')[-2]) == image  # no golden: the picture

    # and the handlers, under the envelope KServe sets for the protocol, answer them: 200
    envelope = "kservev2" if protocol == "v2" else "kserve"
    for name, body in bodies.items():
        with LocalModel(out / "model-store" / f"{name}.mar", envelope=envelope) as model:
            [response] = model.predict([json.dumps(body).encode()])
            if name == "reader_plain" and protocol == "v2":  # the FP32 body a user would try first: refused
                fp32 = {"inputs": [{"name": "input-0", "shape": [1, 2], "datatype": "FP32", "data": [0.5, 1.0]}]}
                [refused] = model.predict([json.dumps(fp32).encode()])
                assert refused.status != 200
        assert response.status == 200, (name, response.json())
        answer = response.json()
        if protocol == "v1":
            assert len(answer["predictions"]) == 1
        else:
            assert answer["model_name"] == name and len(answer["outputs"]) == 1

    # a text typed with quotes and shell characters reaches the body as typed
    [command] = [c for b in code_blocks(deploy) for c in b.splitlines() if c.startswith("python3 ") and "TEXT" in c]
    subprocess.run(["sh", "-c", command], cwd=out, env=dict(os.environ, TEXT=TEXT), check=True, timeout=60)
    typed = json.loads((out / "input-text.json").read_text())
    assert (typed["instances"][0] if protocol == "v1" else typed["inputs"][0]["data"][0]) == TEXT


@pytest.mark.parametrize(
    "variant",
    [
        {"engine": "kserve", "image": "registry.example.com/tsctl-engine:1", "namespace": "ml"},
        {"engine": "tsctl", "image": "registry.example.com/tsctl-engine:1", "auto_select": True, "priority": 3},
        {"transformer_image": "registry.example.com/t:1", "transformer_model": "resnet18_t", "protocol": "v2"},
        {"split": [("resnet18", 90), ("resnet18_b", 10)]},
    ],
    ids=["engine", "auto-select", "transformer", "split"],
)
def test_every_variant_of_deploy_md_runs_as_written(project, tmp_path, tmp_path_factory, variant):
    """The tsctl engine's (step 0 builds its image), a transformer's and a split's DEPLOY.md: every file they
    build, apply, copy or send is in OUT, and no path of this machine is in the tree."""
    if "transformer_image" in variant:
        variant = dict(variant, transformer_archive=str(project / "model-store" / "resnet18.mar"))
    out = tmp_path / "deploy"
    kserve.export(options(project, out, **variant))
    run = deploy_md.run_deploy_md(out, tmp_path / "stubs")
    deploy_md.check_referenced_files_exist(out, run)
    here = [str(tmp_path_factory.getbasetemp()), str(Path.cwd()), str(Path(__file__).resolve().parents[2])]
    assert deploy_md.paths_in_tree(out, here) == []
    applied = [deploy_md.positional(args)[-1] for args in run.of("kubectl") if args[0] == "apply"]
    assert "inferenceservice.yaml" in applied
    if "engine" in variant:
        assert run.of("docker")[0] == ["build", "-t", variant["image"], "predictor-image"]
        assert applied.index("servingruntime.yaml") < applied.index("inferenceservice.yaml")
    if "split" in variant:
        assert applied[-1] == "inferencegraph.yaml"
    if "transformer_image" in variant:
        assert any(args[:4] == ["cp", "-n", "default", "transformer/resnet18.mar"] for args in run.of("kubectl"))
        assert "component=transformer" in (out / "DEPLOY.md").read_text()


def test_a_missing_input_file_is_one_line_and_no_body(mixed, tmp_path):
    out = tmp_path / "deploy"
    kserve.export(options(mixed, out, protocol="v2"))
    deploy = (out / "DEPLOY.md").read_text()
    [command] = [c for b in code_blocks(deploy) for c in b.splitlines() if c.startswith("python3 ") and "IMAGE" in c]
    done = subprocess.run(
        ["sh", "-c", command], cwd=out, env=dict(os.environ, IMAGE="kitten.jpg"), capture_output=True, text=True
    )
    assert done.returncode == 1 and not (out / "input-image.json").exists()
    assert done.stderr == "error: no file at 'kitten.jpg': set IMAGE to an image file (JPEG, PNG, ...)\n"


def cli_export(project, out, *args):
    return CliRunner().invoke(
        main,
        [
            "export",
            "kserve",
            str(out),
            "--config",
            str(project / "config/config.properties"),
            "--model-store",
            str(project / "model-store"),
            "--name",
            "vision",
            "--storage-uri",
            "pvc://models/tsctl",
            *args,
        ],
    )


@pytest.mark.parametrize("archive", ["sentiment.mar", "resnet18_t.mar"])
def test_transformer_archive_that_cannot_split_is_refused(mixed, tmp_path, archive):
    path = mixed / "model-store" / archive
    result = cli_export(
        mixed,
        tmp_path / "out",
        "--transformer-image",
        "r/t:1",
        "--transformer-archive",
        str(path),
        "--transformer-model",
        "resnet18_t",
    )
    assert result.exit_code == 2, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert "Traceback" not in result.output
    assert line.startswith(f"error: --transformer-archive {path}: its handler (")
    assert "cannot run apart from its model" in line and line.endswith("built with --handler image_classifier")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("model", ["resnet18", "sentiment"])
def test_transformer_predictor_that_is_not_a_tensor_model_is_refused(mixed, tmp_path, model):
    archive = mixed / "model-store" / "resnet18.mar"
    result = cli_export(
        mixed,
        tmp_path / "out",
        "--transformer-image",
        "r/t:1",
        "--transformer-archive",
        str(archive),
        "--transformer-model",
        model,
    )
    assert result.exit_code == 2, result.output
    [line] = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert "Traceback" not in result.output
    predictor = mixed / "model-store" / f"{model}.mar"
    assert line.startswith(f"error: --transformer-model '{model}' is served by {predictor}, whose handler is ")
    assert "(MANIFEST model.handler)" in line and "package the same weights with --handler tensor" in line
    assert not (tmp_path / "out").exists()


# ---- the runtime registry, export targets, and --engine tsctl's serving runtime --------------------------
def test_the_engine_registry_is_the_clis_engine_choice():
    for command in (main.commands["serve"], main.commands["export"].commands["kserve"]):
        [option] = [param for param in command.params if param.name == "engine"]
        assert list(option.type.choices) == list(engines.ENGINES) + list(engines.ALIASES), command.name
        assert all(engine.help in option.help for engine in engines.ENGINES.values())
    for name, engine in engines.ENGINES.items():
        assert engine.name == name and engines.named(name) is engine and engine.title
        assert set(engine.serve_flags) <= set(engines.SERVE_FLAGS)
    for name, target in targets.TARGETS.items():
        assert target.name == name and targets.named(name) is target and engines.named(name).title == target.title
        assert set(target.export_flags) <= set(targets.EXPORT_FLAGS)
    assert engines.named("kserve") is engines.named("tsctl") and targets.named("kserve") is targets.named("tsctl")
    with pytest.raises(UserError, match="--engine 'triton' must be one of torchserve, tsctl, mlserver"):
        engines.named("triton")
    with pytest.raises(UserError, match="--engine 'triton' must be one of torchserve, tsctl, mlserver"):
        targets.named("triton")
    with pytest.raises(UserError, match="run 'tsctl export seldon OUT' instead"):
        targets.named("mlserver")


def test_an_engine_added_to_the_registry_is_asked_not_compared(project, tmp_path, monkeypatch):
    """What a third engine needs: a runtime subclass and a registry entry, a target and its entry; serve's
    flag checks and the server's predict URL come from the runtime, export's predictor from the target."""

    class Stub(engines.Runtime):
        name, title, help = "stub", "stub engine", "stub: a test double."

        def predict_url(self, server, model):
            return f"{server.inference}/v2/models/{model}/infer"

    class StubTarget(targets.Target):
        name, title = "stub", "stub engine"
        export_flags = ("image",)

        def predictor(self, flags, resources, storage_uri):
            return {"model": targets.storage_model(flags.service.protocol, storage_uri, resources, "stub-runtime")}

    monkeypatch.setitem(engines.ENGINES, "stub", Stub())
    monkeypatch.setitem(targets.TARGETS, "stub", StubTarget())
    from archiver.server import Server

    served = Server(1, str(tmp_path), "http://127.0.0.1:1", "", "", ["m"], engine="stub")
    assert engines.predict_url(served, "m") == "http://127.0.0.1:1/v2/models/m/infer"
    assert served.metrics_url == "/metrics"
    with pytest.raises(UserError, match="--install-deps is not an option of --engine stub .*--engine torchserve"):
        engines.check_serve_flags(engines.named("stub"), install_deps=True)
    kserve.export(options(project, tmp_path / "out", engine="stub", image="r/stub:1"))
    isvc = yaml.safe_load((tmp_path / "out" / "inferenceservice.yaml").read_text())
    assert isvc["spec"]["predictor"]["model"]["runtime"] == "stub-runtime"
    with pytest.raises(UserError, match="--offline is not an option of --engine stub"):
        kserve.export(options(project, tmp_path / "o2", engine="stub", image="r/stub:1", offline=True))


IMAGE = "registry.local/tsctl-engine:1"


@pytest.mark.parametrize("kind", [None, "ServingRuntime"])
def test_engine_export_is_a_serving_runtime_and_an_isvc_over_the_same_storage(project, tmp_path, kind):
    kserve.export(options(project, tmp_path / "ts", canary=10))
    result = kserve.export(
        options(project, tmp_path / "engine", canary=10, engine="kserve", image=IMAGE, runtime_kind=kind)
    )
    names = sorted(p.relative_to(tmp_path / "engine").as_posix() for p in result.files)
    assert "servingruntime.yaml" in names and "predictor-image/Dockerfile" in names
    runtime = yaml.safe_load((tmp_path / "engine" / "servingruntime.yaml").read_text())
    isvc = yaml.safe_load((tmp_path / "engine" / "inferenceservice.yaml").read_text())
    torchserve = yaml.safe_load((tmp_path / "ts" / "inferenceservice.yaml").read_text())
    assert crds.problems(runtime) == [] and crds.problems(isvc) == []

    # moving off TorchServe is a change of runtime, not of storage; each checks the same pinned tree its own way
    model = isvc["spec"]["predictor"]["model"]
    assert model.pop("runtime") == runtime["metadata"]["name"]
    [pin], [ts_pin] = model.pop("env"), torchserve["spec"]["predictor"]["model"].pop("env")
    check = torchserve["spec"]["predictor"]["model"].pop("command")
    assert pin["name"] == ts_pin["name"] == "TSCTL_TREE_DIGEST" and f" {ts_pin['value']} && exec " in check[2]
    for tree, digest in ((tmp_path / "engine", pin["value"]), (tmp_path / "ts", ts_pin["value"])):  # each its own
        assert digest == "sha256:" + hashlib.sha256((tree / "config" / "tree-digests.json").read_bytes()).hexdigest()
    assert isvc == torchserve
    assert model["storageUri"] == "pvc://models/tsctl" and model["modelFormat"] == {"name": "pytorch"}

    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    server_type = {"serving.kserve.io/server-type": "torchserve"}  # KServe >= 0.17: TorchServe's defaults
    if kind == "ServingRuntime":
        assert runtime["kind"] == "ServingRuntime"
        assert runtime["metadata"] == {"name": "tsctl-vision", "namespace": "default", "annotations": server_type}
    else:
        assert runtime["kind"] == "ClusterServingRuntime"
        assert runtime["metadata"] == {"name": "tsctl-default-vision", "annotations": server_type}
    spec = runtime["spec"]
    assert spec["supportedModelFormats"] == [{"name": "pytorch", "version": "1", "autoSelect": False}]
    assert spec["protocolVersions"] == ["v1", "v2", "grpc-v2"]
    [container] = spec["containers"]
    assert container["name"] == "kserve-container" and container["image"] == IMAGE
    assert container["env"] == [{"name": "TS_SERVICE_ENVELOPE", "value": "{{.Labels.serviceEnvelope}}"}]
    assert container["args"] == [
        "--model_store=/mnt/models/model-store",
        "--ts_config=/mnt/models/config/config.properties",
        "--http_port=8080",
        "--grpc_port=8081",
    ]
    assert container["ports"] == [{"containerPort": 8080, "protocol": "TCP"}]
    assert container["resources"] == torchserve["spec"]["predictor"]["model"]["resources"]
    assert container["securityContext"]["runAsUser"] == 1000 and container["securityContext"]["runAsNonRoot"]

    deploy = (tmp_path / "engine" / "DEPLOY.md").read_text()
    namespace = " -n default" if kind == "ServingRuntime" else ""
    assert deploy.index(f"kubectl apply{namespace} -f servingruntime.yaml") < deploy.index("-f inferenceservice.yaml")
    assert f"docker build -t {IMAGE} predictor-image" in deploy and f"docker push {IMAGE}" in deploy
    dockerfile = (tmp_path / "engine" / "predictor-image" / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["python", "-m", "serving.engine"]' in dockerfile and "USER 1000" in dockerfile
    assert "\nARG BASE_IMAGE=python:3." in dockerfile and "\nFROM ${BASE_IMAGE}\n" in dockerfile
    assert '"--ts_config=/mnt/models/config/config.properties"' in dockerfile
    # the engine's workers are TorchServe's, in KServe's envelope as on TorchServe (issue #47: 8 of 8 concurrent
    # v1 requests answered 503 with batchSize 8): the user's own handler's batch size is made safe too
    snapshot = json.loads(properties.read_properties(tmp_path / "engine/config/config.properties")["model_snapshot"])
    assert snapshot["models"]["custom"]["1.0"]["batchSize"] == 1
    assert any("custom: batchSize set to 1" in note for note in result.notes)
    for archive in (project / "model-store").glob("*.mar"):
        assert (tmp_path / "engine" / "model-store" / archive.name).read_bytes() == archive.read_bytes()


@pytest.mark.parametrize(
    "change, problem",
    [
        (
            lambda r: r["spec"]["containers"][0].update(imagePullPolcy="Always"),
            "spec.containers.0: Additional properties",
        ),
        (lambda r: r["spec"].update(protocolVersions=["v3"]), "spec.protocolVersions.0: 'v3' is not one of"),
        (
            lambda r: r["spec"]["supportedModelFormats"][0].update(autoSelect="no"),
            "spec.supportedModelFormats.0.autoSelect: 'no' is not",
        ),
        (lambda r: r["metadata"].update(namespace="default"), "metadata: {"),  # cluster-scoped: no namespace
        (lambda r: r["spec"].pop("containers"), "spec: 'containers' is a required property"),
    ],
)
def test_the_runtime_check_catches_what_kserve_would_refuse(project, change, problem):
    runtime = tsctl_image.serving_runtime(options(project, "unused", engine="tsctl", image=IMAGE).target_flags, {})
    assert crds.problems(runtime) == []
    change(runtime)
    assert any(p.startswith(problem) for p in crds.problems(runtime)), crds.problems(runtime)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/kserve is not beside this checkout")
def test_kserves_own_torchserve_runtime_passes_the_runtime_check_and_ours_keeps_its_keys():
    """KServe's own runtime passes the runtime check (its CRD, and the checks added to it); the engine's
    has every key kserve-torchserve has (the envelope, the server type, resources, Prometheus), its
    format and protocols, and its container's security context."""
    reference = yaml.safe_load((SHARED / "kserve-torchserve-runtime.yaml").read_text())
    assert crds.problems(reference) == []
    ours = tsctl_image.serving_runtime(
        kserve.ExportOptions(
            out="o", name="vision", storage_uri="pvc://m/v", image=IMAGE, auto_select=True
        ).target_flags,
        {},
    )
    assert set(ours["spec"]) == set(reference["spec"]) and ours["metadata"]["annotations"] == {
        "serving.kserve.io/server-type": "torchserve"
    }
    assert ours["metadata"]["annotations"] == reference["metadata"]["annotations"]
    [mine], [theirs] = ours["spec"]["containers"], reference["spec"]["containers"]
    assert set(theirs) - set(mine) == set() and mine["env"] == theirs["env"]
    assert mine["securityContext"] == theirs["securityContext"]
    assert ours["spec"]["protocolVersions"] == reference["spec"]["protocolVersions"]
    [format_] = reference["spec"]["supportedModelFormats"]
    assert format_["priority"] == tsctl_image.KSERVE_TORCHSERVE_PRIORITY
    assert {k: v for k, v in format_.items() if k != "priority"} == {
        k: v for k, v in ours["spec"]["supportedModelFormats"][0].items() if k != "priority"
    }


@pytest.mark.parametrize(
    "args, words",
    [
        (["--engine", "kserve"], "--engine tsctl needs --image"),  # kserve: an alias of tsctl
        (["--engine", "tsctl", "--image", IMAGE, "--offline"], "--offline is not an option of --engine tsctl"),
        (
            ["--image", IMAGE],
            "--image is not an option of --engine torchserve (TorchServe): drop --image, or export with --engine tsctl",
        ),
        (["--runtime-kind", "ServingRuntime"], "--runtime-kind is not an option of --engine torchserve"),
        (["--engine", "kserve", "--image", IMAGE, "--runtime-kind", "Runtime"], "'Runtime' is not one of"),
        (["--auto-select"], "--auto-select is not an option of --engine torchserve"),
        (["--priority", "0"], "--priority is not an option of --engine torchserve"),
        (["--engine", "tsctl", "--image", IMAGE, "--priority", "3"], "--priority goes with --auto-select"),
        (["--engine", "tsctl", "--image", IMAGE, "--auto-select", "--priority", "0"], "--priority 0 must be from 1"),
        (["--engine", "tsctl", "--image", IMAGE, "--auto-select", "--priority", str(2**31)], "to 2147483647"),
    ],
)
def test_export_engine_mistakes_are_one_sentence(project, tmp_path, args, words):
    result = cli_export(project, tmp_path / "out", *args)
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_export_engine_kserve_writes_what_engine_tsctl_writes(project, tmp_path):
    """``export kserve --engine kserve`` (an alias of tsctl) writes the same tree byte for byte and the
    same --json document; stderr says once that it is an alias."""
    trees, documents = {}, {}
    for engine in ("tsctl", "kserve"):
        out = tmp_path / engine
        result = cli_export(project, out, "--engine", engine, "--image", IMAGE, "--json")
        assert result.exit_code == 0, result.output
        note = "note: --engine kserve is an alias of --engine tsctl"
        assert result.stderr.splitlines().count(note) == (1 if engine == "kserve" else 0), result.stderr
        documents[engine] = json.loads(result.stdout.replace(str(out), "OUT"))
        trees[engine] = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert documents["kserve"] == documents["tsctl"]
    assert trees["kserve"] == trees["tsctl"] and "servingruntime.yaml" in trees["tsctl"]


def test_serve_reads_config_properties_unless_the_engine_can_do_without_the_missing_file(tmp_path, monkeypatch):
    """``tsctl serve`` without --config: config/config.properties; an engine that serves a store without
    one (needs_config false) is given none when that file does not exist."""
    started = []

    class Recorder(engines.Runtime):
        name, title, help = "recorder", "recorder", "recorder: a test double."

        def start(self, model_store="model-store", config=None, home=".tsctl", timeout=180, **options):
            started.append(config)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(engines.ENGINES, "recorder", Recorder())
    engines.serve("recorder")
    Recorder.needs_config = False
    engines.serve("recorder")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.properties").write_text("")
    engines.serve("recorder")
    engines.serve("recorder", "other.properties")
    assert started == ["config/config.properties", None, "config/config.properties", "other.properties"]


@pytest.mark.parametrize(
    "option, value, said",
    [
        ("namespace", "Bad_NS", "--namespace 'Bad_NS' is not a valid Kubernetes name"),
        ("memory", "2GB", "--memory '2GB' must be a memory quantity such as 2Gi or 1500Mi (did you mean 2Gi?)"),
        ("cpu", "abc", "--cpu 'abc' must be a CPU quantity such as 1, 2 or 500m"),
    ],
)
def test_kubernetes_values_are_one_line_naming_the_flag(project, tmp_path, option, value, said):
    """--namespace Bad_NS was written into every manifest; --memory 2GB failed with the CRD's regex."""
    with pytest.raises(UserError) as refused:
        export_tree(project, f"out-{option}", **{option: value})
    assert str(refused.value).startswith(said), refused.value
    assert not (project / f"out-{option}").exists()


def test_a_split_between_an_image_and_a_text_model_is_refused(mixed, tmp_path):
    """DEPLOY.md sends one body to the graph: 10 % of images went to the text model."""
    with pytest.raises(
        UserError,
        match=r"--split: \S*/resnet18\.mar \('resnet18'\) takes image, \S*/sentiment\.mar \('sentiment'\) takes text",
    ):
        export_tree(mixed, "split-kinds", split=[("resnet18", 90), ("sentiment", 10)])
    assert not (mixed / "split-kinds").exists()


def test_exporting_into_the_project_is_refused_and_deletes_nothing(project, tmp_path):
    """OUT holding the store: the export used to clear OUT/model-store (the input) before copying from it."""
    mine = tmp_path / "mine"
    shutil.copytree(project, mine)
    before = sorted(p.name for p in (mine / "model-store").iterdir())
    for args in ((), ("--force",)):
        result = cli_export(mine, mine, *args)
        assert result.exit_code == 2, result.output
        assert "--model-store" in result.output and "is inside OUT" in result.output, result.output
    assert sorted(p.name for p in (mine / "model-store").iterdir()) == before
    assert (mine / "config" / "config.properties").is_file()


def test_out_has_the_mode_mkdir_gives_it(project, tmp_path):
    """OUT is made as mkdir makes a directory (umask applied), not 0700 as its staging directory was
    created: a container running as another uid (the runtime's 1000) reads the tree mounted as it is."""
    kserve.export(options(project, tmp_path / "out"))
    (tmp_path / "plain").mkdir()
    assert (tmp_path / "out").stat().st_mode == (tmp_path / "plain").stat().st_mode


def test_a_non_empty_out_needs_force_and_a_failed_write_keeps_the_previous_one(project, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = cli_export(project, out)
    assert result.exit_code == 2 and "exists and is not empty: pass --force" in result.output, result.output

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(core, "write_inputs", broken)
    with pytest.raises(OSError, match="disk full"):
        kserve.export(options(project, out, force=True))
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (out / "keep.txt").read_text() == "mine"
    monkeypatch.undo()
    result = cli_export(project, out, "--force")
    assert result.exit_code == 0, result.output
    assert not (out / "keep.txt").exists() and (out / "DEPLOY.md").is_file()  # nothing stale stays
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert ".tsctl-" not in (out / "DEPLOY.md").read_text()  # written beside OUT, no trace of where


@pytest.mark.parametrize(
    "memory, noted",
    [("2Gi", "give at least --memory 5Gi"), ("5Gi", None), ("4500Mi", "give at least --memory 5Gi"), ("6G", None)],
)
def test_a_container_too_small_for_its_workers_gets_a_note(project, tmp_path, memory, noted):
    """The project's 4 models run a worker each in the predictor's one container: 2Gi (the default) cannot
    hold 4 workers of ~1 GiB and the server."""
    result = kserve.export(options(project, tmp_path / "out", memory=memory))
    said = [note for note in result.notes if "model worker" in note]
    if noted:
        [note] = said
        assert note.startswith(f"the predictor runs 4 model workers in one container of --memory {memory};"), note
        assert noted in note, note
    else:
        assert said == []


def test_the_engine_export_serves_a_users_handler_under_concurrent_requests(project, tmp_path):
    """The engine export of a user's handler (batchSize 8 in its archive), served as the pod serves it: the
    engine on the exported tree with KServe's TS_SERVICE_ENVELOPE=kserve. 8 concurrent v1 requests all
    answered (issue #47: with batchSize 8 kept, TorchServe's envelope answered all 8 with 503 'number of
    batch response mismatched')."""
    from concurrent.futures import ThreadPoolExecutor

    from archiver import server
    from helpers.engine import Engine

    out = tmp_path / "engine"
    kserve.export(options(project, out, engine="tsctl", image=IMAGE))
    engine = Engine(out, env={"TS_SERVICE_ENVELOPE": "kserve"}).wait_ready()
    try:
        url = f"{engine.url}/v1/models/custom:predict"
        bodies = [json.dumps({"instances": [[k, k + 1]]}).encode() for k in range(8)]
        with ThreadPoolExecutor(8) as pool:
            answers = list(
                pool.map(lambda b: server.request(url, b, "POST", {"Content-Type": "application/json"}, 60), bodies)
            )
    finally:
        assert engine.stop() == 0
    assert [status for status, _ in answers] == [200] * 8, answers
