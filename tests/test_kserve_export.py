"""tsctl export kserve: the PVC tree, manifests valid against KServe's CRDs, and the checks before writing."""

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from archiver import crds, kserve, properties
from archiver.cli import main
from archiver.errors import UserError
from conftest import package_resnet

SHARED = Path(__file__).resolve().parents[2] / "shared" / "kserve"


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
        "inferenceservice.yaml",
        "model-store/custom.mar",
        "model-store/resnet18.mar",
        "model-store/resnet18_b.mar",
        "model-store/resnet18_t.mar",
        "pvc-copy-pod.yaml",
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
def test_config_problems_are_refused_before_writing(project, tmp_path, edit, words):
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
        kserve.export(options(project, out, config=str(config)))
        return
    with pytest.raises(UserError, match=words.replace("(", r"\(")):
        kserve.export(options(project, out, config=str(config)))
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
