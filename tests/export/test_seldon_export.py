"""tsctl export seldon: one folder per model (its archive and model-settings.json), Seldon Core 2 manifests valid
against the vendored CRD schemas, the A/B experiment and the transformer pipeline, the server image's context,
DEPLOY.md, and the checks that run before anything is written. No cluster and no server: files only."""

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from archiver import mlserver, properties
from archiver.cli import main
from archiver.errors import UserError
from archiver.export import crds
from archiver.export.seldon import export as seldon
from helpers import deploy_md
from helpers.models import package_resnet, package_text

SHARED = Path(__file__).resolve().parents[3] / "shared" / "seldon"
IMAGE = "registry.example.com/tsctl-mlserver:1"
MANIFESTS = ("server.yaml", "models.yaml", "experiment.yaml", "pipeline.yaml")


@pytest.fixture(scope="module")
def store(image_sample, text_samples, tmp_path_factory):
    """resnet18, resnet18-b (image), resnet18-t (tensor), sentiment (text); no config: model-config.yaml each."""
    root = tmp_path_factory.mktemp("seldon")
    store = root / "model-store"
    package_resnet(image_sample, store)
    package_resnet(image_sample, store, name="resnet18-b")
    tensor = root / "tensor.yaml"
    tensor.write_text("batchSize: 4\nhandler:\n  input_shape: [3, 224, 224]\n")
    package_resnet(image_sample, store, name="resnet18-t", handler="tensor", config_file=str(tensor), extra_files=[])
    package_text(text_samples, store, "sentiment", "text_classifier", "classifier")
    pre = root / "pre"
    package_resnet(image_sample, pre, name="pre")  # a toolkit image archive, as the transformer
    own = root / "own.py"
    own.write_text("def handle(data, context):\n    return data\n")
    package_resnet(image_sample, root / "other", name="custom", handler=str(own), config_text="batchSize: 8\n")
    return store


def options(store: Path, out: Path, **changes) -> seldon.SeldonOptions:
    return seldon.SeldonOptions(out=str(out), image=IMAGE, model_store=str(store), **changes)


def documents(path: Path) -> list:
    return list(yaml.safe_load_all(path.read_text()))


def invoke(store: Path, out: Path, *args: str):
    return CliRunner().invoke(
        main, ["export", "seldon", str(out), "--model-store", str(store), "--image", IMAGE, *args]
    )


def test_the_tree_and_every_manifest_are_valid(store, tmp_path):
    out = tmp_path / "out"
    result = seldon.export(options(store, out))
    names = {p.relative_to(out).as_posix() for p in result.files}
    models = ["resnet18", "resnet18-b", "resnet18-t", "sentiment"]
    assert names == {
        *(f"models/{m}/{f}" for m in models for f in (f"{m}.mar", "model-settings.json")),
        *("server.yaml", "models.yaml", "networkpolicy.yaml", "pvc.yaml", "pvc-copy-pod.yaml", "DEPLOY.md"),
        *("server-image/Dockerfile", "server-image/requirements.txt", "server-image/handlers", "server-image/serving"),
        "inputs/sample.png",
    }
    for model in models:  # each folder holds its archive, and its settings name it and tsctl's runtime
        folder = out / "models" / model
        assert (folder / f"{model}.mar").read_bytes() == (store / f"{model}.mar").read_bytes()
        settings = json.loads((folder / "model-settings.json").read_text())
        assert settings["implementation"] == mlserver.IMPLEMENTATION
        assert settings["parameters"]["uri"] == f"./{model}.mar" and (folder / settings["parameters"]["uri"]).is_file()
        assert settings["name"] == model and "role" not in settings["parameters"]["extra"]
    tensor = json.loads((out / "models/resnet18-t/model-settings.json").read_text())
    assert tensor["parameters"]["extra"]["batchSize"] == 4  # the archive's model-config.yaml, without a config

    for name in ("server.yaml", "models.yaml"):
        for document in documents(out / name):
            assert crds.problems(document) == [], name
    [server] = documents(out / "server.yaml")
    assert server["spec"]["serverConfig"] == "mlserver" and server["spec"]["replicas"] == 1
    assert server["spec"]["extraCapabilities"] == ["tsctl", "pvc"]
    rclone, container = server["spec"]["podSpec"]["containers"]
    assert rclone["name"] == "rclone" and rclone["volumeMounts"][0]["mountPath"] == "/var/models"
    assert rclone["volumeMounts"][0]["readOnly"] is True
    [volume] = server["spec"]["podSpec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == "tsctl-models"
    assert container["name"] == "mlserver" and container["image"] == IMAGE
    assert {e["name"]: e["value"] for e in container["env"]} == {
        "MLSERVER_PARALLEL_WORKERS": "0",
        "PYTHONPATH": "/opt/tsctl",
    }
    assert container["resources"]["requests"] == {"cpu": "1", "memory": "8Gi"}  # 4 Models of 2Gi
    assert any("4 Models of --memory 2Gi" in note for note in result.notes)
    listed = documents(out / "models.yaml")
    assert sorted(m["metadata"]["name"] for m in listed) == models
    assert all(m["metadata"]["namespace"] == "seldon-mesh" for m in listed)
    for manifest in listed:
        name = manifest["metadata"]["name"]
        assert manifest["spec"] == {
            "storageUri": f"/var/models/models/{name}",
            "requirements": ["tsctl", "pvc"],
            "memory": "2Gi",
        }
    claim = yaml.safe_load((out / "pvc.yaml").read_text())
    assert claim["metadata"] == {"name": "tsctl-models", "namespace": "seldon-mesh"}
    pod = yaml.safe_load((out / "pvc-copy-pod.yaml").read_text())
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "tsctl-models"

    dockerfile = (out / "server-image/Dockerfile").read_text()
    assert f"FROM python:{sys.version_info.major}.{sys.version_info.minor}-slim\n" in dockerfile
    command = 'exec python -m serving.runtimes.mlserver_start start \\"$MLSERVER_MODELS_DIR\\"'
    assert f'CMD ["sh", "-c", "{command}"]' in dockerfile
    assert (out / "server-image/serving/runtimes/mlserver_start.py").is_file()
    assert "COPY handlers/ /opt/tsctl/handlers/\nCOPY serving/ /opt/tsctl/serving/\n" in dockerfile
    assert (out / "server-image/serving/runtimes/mlserver_runtime.py").is_file()
    assert not list((out / "server-image/handlers").rglob("__pycache__"))
    pins = (out / "server-image/requirements.txt").read_text().splitlines()
    for package in ("torch", "torchvision", "numpy", "Pillow", "PyYAML", "transformers", "safetensors"):
        assert any(re.fullmatch(rf"{package}==[\w.+]+", line) for line in pins), package  # a text model: transformers
    assert "torchserve==0.12.0" in pins and mlserver.REQUIREMENT in pins
    assert not any(line.startswith(("kserve", "starlette", "uvicorn", "protobuf", "grpcio")) for line in pins)


def test_image_models_only_leave_the_text_packages_out(store, tmp_path):
    only = tmp_path / "store"
    only.mkdir()
    shutil.copyfile(store / "resnet18.mar", only / "resnet18.mar")
    seldon.export(options(only, tmp_path / "out"))
    pins = (tmp_path / "out/server-image/requirements.txt").read_text()
    assert "torch==" in pins and "transformers" not in pins and "safetensors" not in pins


def test_the_validator_is_strict_and_names_seldon():
    manifest = seldon.model(options(Path("unused"), Path("unused")), "resnet18")
    assert crds.problems(manifest) == []
    manifest["spec"]["storageURI"] = manifest["spec"].pop("storageUri")
    problems = crds.problems(manifest)
    assert problems[0] == "spec: 'storageUri' is a required property"
    assert problems[1].startswith("spec: Additional properties are not allowed ('storageURI'")
    with pytest.raises(UserError, match="models.yaml does not match Seldon Core's Model schema: spec: "):
        crds.check(manifest, "models.yaml")
    server = seldon.server(options(Path("unused"), Path("unused")), 1)
    server["spec"]["podSpec"]["containers"][1]["envs"] = []
    [problem] = crds.problems(server)
    assert problem.startswith("spec.podSpec.containers.1: Additional properties are not allowed ('envs'")
    experiment = {
        "apiVersion": seldon.API_VERSION,
        "kind": "Experiment",
        "metadata": {"name": "x"},
        "spec": {"candidates": [{"name": "a", "weight": "90"}]},
    }
    assert crds.problems(experiment) == ["spec.candidates.0.weight: '90' is not of type 'integer'"]
    pipeline = {
        "apiVersion": seldon.API_VERSION,
        "kind": "Pipeline",
        "metadata": {"name": "p"},
        "spec": {"steps": [{"name": "a", "input": ["b"]}]},
    }
    [problem] = crds.problems(pipeline)
    assert problem.startswith("spec.steps.0: Additional properties are not allowed ('input'")


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/seldon is not beside this checkout")
def test_vendored_schemas_match_the_seldon_crds():
    for source, kind in [
        ("models", "model"),
        ("servers", "server"),
        ("serverconfigs", "serverconfig"),
        ("experiments", "experiment"),
        ("pipelines", "pipeline"),
    ]:
        crd = yaml.load(
            (SHARED / f"mlops.seldon.io_{source}.yaml").read_text(),
            Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader),
        )
        schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")["schema"]["openAPIV3Schema"]
        vendored = Path(crds.__file__).parent / "crds" / "seldon" / f"{kind}.v1alpha1.json"
        assert json.loads(vendored.read_text()) == schema


@pytest.mark.parametrize(
    "args, words",
    [
        (["--ab", "resnet18=90"], "--ab needs at least two candidates"),
        (["--ab", "resnet18=90,resnet18-b=10"], "names several candidates: give each its own --ab"),
        (["--ab", "resnet18=0", "--ab", "resnet18-b=10"], "--ab 'resnet18=0' must be MODEL=WEIGHT"),
        (["--ab", "resnet18=9.5", "--ab", "resnet18-b=10"], "WEIGHT a positive whole number"),
        (["--ab", "resnet18:90", "--ab", "resnet18-b=10"], "must be MODEL=WEIGHT"),
        (["--ab", "nope=50", "--ab", "resnet18=50"], "--ab model 'nope' is not a model of the store"),
        (["--ab", "resnet18=50", "--ab", "resnet18=50"], "--ab names 'resnet18' twice"),
        (["--ab", "resnet18=50", "--ab", "resnet18-b=50", "--default", "sentiment"], "--default 'sentiment' is not"),
        (["--default", "resnet18"], "--default is for an A/B experiment"),
        (["--ab", "resnet18=5", "--ab", "resnet18-b=5", "--experiment", "AB_1"], "--experiment 'AB_1' is not a valid"),
        (["--server", "Tsctl"], "--server 'Tsctl' is not a valid Kubernetes name"),
        (["--memory", "lots"], "--memory 'lots' must be a memory quantity"),
        (["--transformer-model", "resnet18-t"], "--transformer-archive and --transformer-model go together"),
        (["--image", "Bad_Image:1"], "--image 'Bad_Image:1' is not an image reference"),  # docker refuses it
    ],
)
def test_mistakes_are_one_line_exit_2_and_write_nothing(store, tmp_path, args, words):
    out = tmp_path / "out"
    result = invoke(store, out, *args)
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no OUT, no staging directory beside it


def test_an_experiment_splits_by_weight_with_its_default(store, tmp_path):
    out = tmp_path / "out"
    seldon.export(options(store, out, ab=[("resnet18-b", 30), ("resnet18", 70)], default="resnet18"))
    [experiment] = documents(out / "experiment.yaml")
    assert crds.problems(experiment) == []
    assert experiment["metadata"] == {"name": "resnet18-b-ab", "namespace": "seldon-mesh"}  # FIRST-ab
    assert experiment["spec"] == {
        "default": "resnet18",
        "candidates": [{"name": "resnet18-b", "weight": 30}, {"name": "resnet18", "weight": 70}],
    }
    deploy = (out / "DEPLOY.md").read_text()
    assert '-H "seldon-model: resnet18-b-ab.experiment" "http://${MESH_IP}/v2/models/resnet18-b-ab/infer"' in deploy
    assert "x-seldon-route" in deploy and '-H "x-seldon-route: ${ROUTE}"' in deploy
    assert "requests naming `resnet18` itself are split the same way" in deploy
    assert deploy.index("-f models.yaml") < deploy.index("-f experiment.yaml")

    seldon.export(options(store, out, ab=[("resnet18", 1), ("resnet18-b", 1)], experiment="vision", force=True))
    [experiment] = documents(out / "experiment.yaml")
    assert experiment["metadata"]["name"] == "vision" and experiment["spec"]["default"] == "resnet18"  # the first


def test_a_pipeline_runs_the_transformer_then_the_model(store, tmp_path):
    out = tmp_path / "out"
    archive = store.parent / "pre" / "pre.mar"
    seldon.export(options(store, out, transformer_archive=str(archive), transformer_model="resnet18-t"))
    for step, role in (("pre-pre", "preprocess"), ("pre-post", "postprocess")):  # the archive's two halves
        folder = out / "models" / step
        assert (folder / "pre.mar").read_bytes() == archive.read_bytes()
        settings = json.loads((folder / "model-settings.json").read_text())
        assert settings["implementation"] == mlserver.IMPLEMENTATION and settings["parameters"]["uri"] == "./pre.mar"
        assert settings["parameters"]["extra"]["role"] == role and settings["name"] == step
        assert step in [m["metadata"]["name"] for m in documents(out / "models.yaml")]
    [pipeline] = documents(out / "pipeline.yaml")
    assert crds.problems(pipeline) == []
    assert pipeline["metadata"]["name"] == "resnet18-t-pipeline"
    assert pipeline["spec"] == {
        "steps": [
            {"name": "pre-pre"},
            {"name": "resnet18-t", "inputs": ["pre-pre"]},
            {"name": "pre-post", "inputs": ["resnet18-t"]},
        ],
        "output": {"steps": ["pre-post"]},
    }
    deploy = (out / "DEPLOY.md").read_text()
    assert '-H "seldon-model: resnet18-t-pipeline.pipeline"' in deploy
    assert "models/pre-pre/pre.mar" in deploy and "model/pre-pre" in deploy and "model/pre-post" in deploy


def test_a_pipeline_into_an_experiment_steps_into_its_default_model(store, image_sample, tmp_path):
    out = tmp_path / "out"
    archive = store.parent / "pre" / "pre.mar"
    ab = dict(ab=[("resnet18-t", 50), ("resnet18-b", 50)], default="resnet18-t", experiment="split")
    with pytest.raises(
        UserError,
        match=r"--ab: \S*/resnet18-t\.mar \('resnet18-t'\) takes tensor, \S*/resnet18-b\.mar \('resnet18-b'\) takes",
    ):  # candidates of mixed kinds are refused before the pipeline is looked at
        seldon.export(options(store, out, transformer_archive=str(archive), transformer_model="split", **ab))
    assert not out.exists()
    tensors = tmp_path / "tensors"  # two tensor models: both candidates take the transformer's tensors
    for name in ("t1", "t2"):
        package_resnet(
            image_sample,
            tensors,
            name=name,
            handler="tensor",
            extra_files=[],
            config_file=str(store.parent / "tensor.yaml"),
        )
    result = seldon.export(
        options(
            tensors,
            out,
            ab=[("t1", 50), ("t2", 50)],
            default="t2",
            experiment="split",
            transformer_archive=str(archive),
            transformer_model="split",
        )
    )
    [pipeline] = documents(out / "pipeline.yaml")
    assert pipeline["metadata"]["name"] == "split-pipeline"
    assert [step["name"] for step in pipeline["spec"]["steps"]] == ["pre-pre", "t2", "pre-post"]
    assert any("a Pipeline step names a Model, not an Experiment" in note for note in result.notes)
    deploy = (out / "DEPLOY.md").read_text()
    assert "whose calls the experiment `split` splits between its candidates" in deploy


def test_transformer_archives_are_checked(store, tmp_path):
    custom = store.parent / "other" / "custom.mar"
    with pytest.raises(UserError, match="is not a toolkit archive .* package it with --handler image_classifier"):
        seldon.export(options(store, tmp_path / "o", transformer_archive=str(custom), transformer_model="resnet18"))
    pre = str(store.parent / "pre" / "pre.mar")
    with pytest.raises(UserError, match="--transformer-model 'nope' is not a model of the store"):
        seldon.export(options(store, tmp_path / "o", transformer_archive=pre, transformer_model="nope"))
    with pytest.raises(UserError, match="--transformer-archive .*gone.mar does not exist"):
        seldon.export(
            options(store, tmp_path / "o", transformer_archive=str(tmp_path / "gone.mar"), transformer_model="resnet18")
        )
    step = r"'resnet18' \(the pipeline's model step\) gets the transformer's tensors"  # an image model: no tensors
    with pytest.raises(UserError, match=step):
        seldon.export(options(store, tmp_path / "o", transformer_archive=pre, transformer_model="resnet18"))
    text = str(store / "sentiment.mar")  # a toolkit archive whose preprocessing needs its model
    with pytest.raises(UserError, match="sentiment.mar: its handler .* cannot run apart from its model"):
        seldon.export(options(store, tmp_path / "o", transformer_archive=text, transformer_model="resnet18-t"))
    assert not (tmp_path / "o").exists()


def test_force_never_replaces_an_out_holding_the_inputs(store, tmp_path):
    project = tmp_path / "project"
    shutil.copytree(store, project / "model-store")
    result = invoke(project / "model-store", project, "--force")
    assert result.exit_code == 2 and "--model-store" in result.output and "is inside OUT" in result.output
    assert sorted(p.name for p in (project / "model-store").iterdir()) == sorted(p.name for p in store.iterdir())


def code_blocks(markdown: str) -> list:
    return re.findall(r"```sh\n(.*?)```", markdown, re.S)


def test_deploy_md_runs_from_out_and_applies_every_manifest(store, tmp_path, jpegs):
    out = tmp_path / "out"
    pre = str(store.parent / "pre" / "pre.mar")
    result = seldon.export(
        options(
            store,
            out,
            ab=[("resnet18", 90), ("resnet18-b", 10)],
            transformer_archive=pre,
            transformer_model="resnet18-t",
        )
    )
    deploy = (out / "DEPLOY.md").read_text()
    assert "/tmp" not in deploy and "/work" not in deploy and str(tmp_path) not in deploy
    assert str(Path.cwd()) not in deploy
    written = {p.name for p in result.files if p.suffix == ".yaml"}
    assert written == {
        "server.yaml",
        "models.yaml",
        "experiment.yaml",
        "pipeline.yaml",
        "networkpolicy.yaml",
        "pvc.yaml",
        "pvc-copy-pod.yaml",
    }
    for name in written:
        assert f" -f {name}\n" in deploy, name
    order = [
        "docker build",
        "-f pvc.yaml",
        "-f pvc-copy-pod.yaml",
        "kubectl cp",
        "-f server.yaml",
        "-f models.yaml",
        "-f experiment.yaml",
        "-f pipeline.yaml",
        "MESH_IP=",
        "curl ",
    ]
    assert [deploy.index(step) for step in order] == sorted(deploy.index(step) for step in order)
    commands = [line for block in code_blocks(deploy) for line in block.splitlines()]
    for entry in ("resnet18", "resnet18-b", "resnet18-t", "sentiment", "pre-pre", "pre-post"):
        for file in (f"{'pre' if entry.startswith('pre-') else entry}.mar", "model-settings.json"):
            path = f"models/{entry}/{file}"
            assert (out / path).is_file()
            assert f"kubectl cp -n seldon-mesh {path} tsctl-mlserver-copy:/pvc/{path}" in commands
        assert f"kubectl wait -n seldon-mesh --for condition=ready --timeout=600s model/{entry}" in commands
    for model in ("resnet18", "resnet18-b", "resnet18-t", "sentiment"):
        assert any(f'-H "seldon-model: {model}" "http://${{MESH_IP}}/v2/models/{model}/infer"' in c for c in commands)

    # the request bodies: each command writes the v2 body its models take
    (tmp_path / "photo.jpg").write_bytes(jpegs[0])
    env = dict(os.environ, IMAGE=str(tmp_path / "photo.jpg"), TEXT="He said \"héllo\" & 'bye' $HOME")
    for command in (c for c in commands if c.startswith("python3 ")):
        subprocess.run(["sh", "-c", command], cwd=out, env=env, check=True, timeout=60)
    image = json.loads((out / "input-image.json").read_text())
    assert image["inputs"][0]["datatype"] == "BYTES" and image["inputs"][0]["shape"] == [1]
    text = json.loads((out / "input-text.json").read_text())
    assert text == {"inputs": [{"name": "input-0", "shape": [1], "datatype": "BYTES", "data": [env["TEXT"]]}]}
    tensor = json.loads((out / "input-resnet18-t.json").read_text())
    assert tensor["inputs"][0]["shape"] == [1, 3, 224, 224] and tensor["inputs"][0]["datatype"] == "FP32"
    for line in (c for c in commands if c.startswith("curl ")):
        [body] = re.findall(r"--data-binary @(\S+)", line)
        assert (out / body).is_file(), line


def test_deploy_md_runs_as_written_from_its_directory(store, tmp_path, tmp_path_factory):
    """Its shell blocks, as a user pastes them in OUT (kubectl, docker and curl recording their arguments): every
    file they build, apply, copy or send is in the tree, and no path of this machine is anywhere in it."""
    out = tmp_path / "out"
    seldon.export(options(store, out, ab=[("resnet18", 90), ("resnet18-b", 10)]))
    run = deploy_md.run_deploy_md(out, tmp_path / "stubs")
    deploy_md.check_referenced_files_exist(out, run)
    here = [str(tmp_path_factory.getbasetemp()), str(Path.cwd()), str(Path(__file__).resolve().parents[2])]
    assert deploy_md.paths_in_tree(out, here) == []
    assert [args[:3] for args in run.of("docker")] == [["build", "-t", IMAGE], ["push", IMAGE]]
    applied = [deploy_md.positional(args)[-1] for args in run.of("kubectl") if args[0] == "apply"]
    assert applied == [
        "pvc.yaml",
        "pvc-copy-pod.yaml",
        "networkpolicy.yaml",
        "server.yaml",
        "models.yaml",
        "experiment.yaml",
    ]
    sent = {arg[1:] for args in run.of("curl") for arg in args if arg.startswith("@")}
    assert sent == {"input-image.json", "input-text.json", "input-resnet18-t.json"}
    image = json.loads((out / "input-image.json").read_text())["inputs"][0]["data"][0]
    assert base64.b64decode(image) == (out / "inputs" / "sample.png").read_bytes()


def kubernetes_problems(value, kind: str, where: str = "") -> list:
    """Where ``value`` does not fit the Kubernetes API type ``kind`` (the kubernetes client's models, generated
    from the API's OpenAPI spec): unknown keys, wrong types, missing required fields."""
    import re

    import kubernetes.client

    if kind.lower().startswith("list["):
        inner = kind[5:-1]
        if not isinstance(value, list):
            return [f"{where}: not a list"]
        return [p for i, item in enumerate(value) for p in kubernetes_problems(item, inner, f"{where}[{i}]")]
    if kind.lower().startswith(("dict(", "dict[")):
        return [] if isinstance(value, dict) else [f"{where}: not a mapping"]
    simple = {"str": str, "int": int, "bool": bool, "object": object}
    if kind in simple:
        return [] if isinstance(value, simple[kind]) else [f"{where}: not {kind}"]
    model = getattr(kubernetes.client, kind)
    if not isinstance(value, dict):
        return [f"{where}: not a {kind}"]
    by_key = {key: attribute for attribute, key in model.attribute_map.items()}
    problems = [f"{where}.{key}: not a field of {kind}" for key in value if key not in by_key]
    for key, item in value.items():
        if key in by_key:
            problems += kubernetes_problems(item, model.openapi_types[by_key[key]], f"{where}.{key}")
    source = Path(kubernetes.client.__file__).parent / "models" / f"{re.sub(r'(?<!^)(?=[A-Z])', '_', kind).lower()}.py"
    required = re.findall(r"Invalid value for `(\w+)`, must not be `None`", source.read_text())
    problems += [
        f"{where}: {kind} needs {model.attribute_map[name]}"
        for name in required
        if model.attribute_map[name] not in value
    ]
    return problems


def test_the_network_policy_closes_mlservers_own_ports(store, tmp_path):
    out = tmp_path / "out"
    seldon.export(options(store, out))
    policy = yaml.safe_load((out / "networkpolicy.yaml").read_text())
    assert kubernetes_problems(policy, "V1NetworkPolicy") == []
    assert kubernetes_problems({**policy, "spec": {**policy["spec"], "ingres": []}}, "V1NetworkPolicy")  # it checks
    server = yaml.safe_load((out / "server.yaml").read_text())
    assert policy["metadata"]["namespace"] == server["metadata"]["namespace"]
    assert policy["spec"]["podSelector"] == {"matchLabels": {"seldon-server-name": server["metadata"]["name"]}}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]
    assert "from" not in rule and sorted(p["port"] for p in rule["ports"]) == [9001, 9006, 9501]  # not 9000, 9500
    deploy = (out / "DEPLOY.md").read_text()
    assert "## What reaches MLServer" in deploy and "proxy-body-size" in deploy and "max_request_bytes" in deploy


def test_a_failed_write_leaves_no_out_and_the_previous_one_stays(store, tmp_path, monkeypatch):
    out = tmp_path / "out"

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(seldon, "write_image_context", broken)
    with pytest.raises(OSError, match="disk full"):
        seldon.export(options(store, out))
    assert list(tmp_path.iterdir()) == []
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="exists and is not empty: pass --force"):
        seldon.export(options(store, out))
    with pytest.raises(OSError, match="disk full"):
        seldon.export(options(store, out, force=True))
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (out / "keep.txt").read_text() == "mine"
    monkeypatch.undo()
    seldon.export(options(store, out, force=True))  # --force replaces it: nothing stale stays
    assert not (out / "keep.txt").exists() and (out / "DEPLOY.md").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_json_output_parses(store, tmp_path):
    out = tmp_path / "out"
    result = invoke(store, out, "--json", "--server", "vision", "--namespace", "ml", "--memory", "1.5Gi")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert set(report) == {"out", "deploy", "files", "notes", "curls"} and str(out / "DEPLOY.md") in report["files"]
    assert all(Path(f).exists() for f in report["files"])
    [server] = documents(out / "server.yaml")
    assert server["metadata"] == {"name": "vision", "namespace": "ml"}
    assert server["spec"]["podSpec"]["containers"][1]["resources"]["limits"]["memory"] == "6Gi"


def test_only_the_default_version_of_a_model_is_exported(store, tmp_path):
    root = tmp_path / "project"
    versions = root / "model-store"
    versions.mkdir(parents=True)
    shutil.copyfile(store / "resnet18.mar", versions / "resnet18.mar")
    config = root / "config" / "config.properties"
    properties.write_config(versions, config)
    shutil.copyfile(store / "resnet18.mar", versions / "resnet18-v2.mar")  # a second version, as the snapshot says
    props = properties.read_properties(config)
    snapshot = json.loads(props["model_snapshot"])
    first = snapshot["models"]["resnet18"]["1.0"]
    second = dict(first, defaultVersion=True, marName="resnet18-v2.mar", batchSize=2)
    snapshot["models"] = {"resnet18": {"1.0": dict(first, defaultVersion=False), "2.0": second}}
    props["model_snapshot"] = json.dumps(snapshot)
    config.write_text(properties.render(props))
    out = tmp_path / "out"
    result = seldon.export(options(versions, out))  # config/config.properties beside the store: read
    assert sorted(p.relative_to(out).as_posix() for p in result.files if "models/" in p.as_posix()) == [
        "models/resnet18/model-settings.json",
        "models/resnet18/resnet18-v2.mar",
    ]
    settings = json.loads((out / "models/resnet18/model-settings.json").read_text())
    assert settings["parameters"]["version"] == "2.0" and settings["parameters"]["extra"]["batchSize"] == 2
    assert any("versions 1.0, 2.0; exported the default version 2.0 only" in note for note in result.notes)


def test_model_names_must_be_kubernetes_names(store, tmp_path):
    bad = tmp_path / "store"
    bad.mkdir()
    shutil.copyfile(store / "resnet18.mar", bad / "resnet18.mar")
    config = tmp_path / "config.properties"
    properties.write_config(bad, config)
    props = properties.read_properties(config)
    props["model_snapshot"] = props["model_snapshot"].replace('"resnet18"', '"ResNet_18"')
    config.write_text(properties.render(props))
    result = invoke(bad, tmp_path / "out", "--config", str(config))
    assert result.exit_code == 2
    assert "model resnet18.mar's name 'ResNet_18' is not a valid Kubernetes name" in result.output
    assert "package it again with --model-name resnet-18" in result.output
    assert not (tmp_path / "out").exists()


def test_an_experiment_between_an_image_and_a_text_model_is_refused(store, tmp_path):
    with pytest.raises(
        UserError,
        match=r"--ab: \S*/resnet18\.mar \('resnet18'\) takes image, \S*/sentiment\.mar \('sentiment'\) takes text",
    ):
        seldon.export(options(store, tmp_path / "out", ab=[("resnet18", 90), ("sentiment", 10)]))
    assert not (tmp_path / "out").exists()


def test_the_text_output_ends_with_the_curl_lines_as_export_kserve_does(store, tmp_path):
    from click.testing import CliRunner

    from archiver.cli import main

    out = tmp_path / "cli-out"
    done = CliRunner().invoke(main, ["export", "seldon", str(out), "--image", IMAGE, "--model-store", str(store)])
    assert done.exit_code == 0, done.output
    tail = done.output.split("the request bodies, per model:\n", 1)[1].splitlines()
    assert tail and all(line.startswith("  curl ") for line in tail), done.output
