"""tsctl export seldon --core 1: a SeldonDeployment whose graph is TRANSFORMER -> ROUTER -> MODELs, valid against
Seldon Core 1's CRD (vendored, with the operator's unit values) and its admission webhook's graph checks, the
components' image context, DEPLOY.md as a user runs it, and the refusals that leave no OUT. Files only: the
graph runs under the real wrapper in tests/engine/test_seldon_core1.py."""

import json
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from archiver.cli import main
from archiver.errors import UserError
from archiver.export import crds
from archiver.export.seldon import core1
from helpers import deploy_md
from helpers.models import package_resnet, package_text

SHARED = Path(__file__).resolve().parents[3] / "shared" / "seldon"
IMAGE = "registry.example.com/tsctl-seldon:1"
ANSWER = {
    "data": {"names": [], "ndarray": [{"class_238": 0.02}]},
    "meta": {"routing": {"router": 1, "transformer": -1, "vision-b": -1}},
}


@pytest.fixture(scope="module")
def store(image_sample, text_samples, tmp_path_factory):
    """model-store: vision-a, vision-b, vision-c (tensor), photo (image); transformer/vision.mar (image);
    text/sentiment.mar (a text archive: its handler does not split)."""
    root = tmp_path_factory.mktemp("seldon1")
    tensor = root / "tensor.yaml"
    tensor.write_text("batchSize: 4\nmaxBatchDelay: 20\nhandler:\n  input_shape: [3, 224, 224]\n")
    for name in ("vision-a", "vision-b", "vision-c"):
        package_resnet(
            image_sample, root / "model-store", name=name, handler="tensor", config_file=str(tensor), extra_files=[]
        )
    package_resnet(image_sample, root / "model-store", name="photo")
    package_resnet(image_sample, root / "transformer", name="vision")
    package_text(text_samples, root / "text", "sentiment", "text_classifier", "classifier")
    return root


def options(store: Path, out: Path, **changes) -> core1.SeldonCore1Options:
    values = dict(
        out=str(out),
        image=IMAGE,
        model_store=str(store / "model-store"),
        transformer_archive=str(store / "transformer" / "vision.mar"),
    )
    return core1.SeldonCore1Options(**{**values, **changes})


def manifest_of(out: Path) -> dict:
    return yaml.safe_load((out / "seldondeployment.yaml").read_text())


def invoke(store: Path, out: Path, *args: str):
    return CliRunner().invoke(
        main,
        [
            "export",
            "seldon",
            "--core",
            "1",
            str(out),
            "--model-store",
            str(store / "model-store"),
            "--image",
            IMAGE,
            *args,
        ],
    )


def test_an_ab_graph_is_a_valid_seldon_deployment(store, tmp_path):
    out = tmp_path / "out"
    result = core1.export(options(store, out, ab=[("vision-a", 90), ("vision-b", 10)]))
    names = {p.relative_to(out).as_posix() for p in result.files}
    assert names == {
        "models/transformer/vision.mar",
        "models/vision-a/vision-a.mar",
        "models/vision-b/vision-b.mar",
        "seldondeployment.yaml",
        "pvc.yaml",
        "pvc-copy-pod.yaml",
        "DEPLOY.md",
        "inputs/sample.png",
        "component-image/Dockerfile",
        "component-image/requirements.txt",
        "component-image/handlers",
        "component-image/serving",
    }
    assert any("not in the graph, not exported: photo, vision-c" in note for note in result.notes)
    manifest = manifest_of(out)
    assert crds.problems(manifest) == []
    assert manifest["metadata"] == {"name": "tsctl-graph", "namespace": "seldon"}
    spec = manifest["spec"]
    assert spec["protocol"] == "seldon" and spec["transport"] == "rest"
    assert spec["annotations"] == {"seldon.io/rest-timeout": "60000"}
    [predictor] = spec["predictors"]
    assert predictor["svcOrchSpec"]["env"] == [{"name": "SELDON_ENABLE_ROUTING_INJECTION", "value": "true"}]
    graph = predictor["graph"]
    assert graph["name"] == "transformer" and graph["type"] == "TRANSFORMER"
    assert graph["methods"] == ["TRANSFORM_INPUT", "TRANSFORM_OUTPUT"]  # transform-input in, transform-output out
    assert graph["parameters"] == [
        {"name": "archive", "value": "/var/models/models/transformer/vision.mar", "type": "STRING"}
    ]
    [router] = graph["children"]
    assert router == {  # the executor's own A/B router: no type (a ROUTER would be called over HTTP)
        "name": "router",
        "implementation": "RANDOM_ABTEST",
        "parameters": [{"name": "ratioA", "value": "0.9", "type": "FLOAT"}],
        "children": router["children"],
    }
    a, b = router["children"]
    assert (a["name"], b["name"]) == ("vision-a", "vision-b") and a["type"] == b["type"] == "MODEL"
    assert {p["name"]: (p["value"], p["type"]) for p in a["parameters"]} == {
        "archive": ("/var/models/models/vision-a/vision-a.mar", "STRING"),
        "batch_size": ("4", "INT"),
        "max_batch_delay": ("20", "INT"),
        "min_workers": ("1", "INT"),
        "response_timeout": ("120", "INT"),
    }
    [component] = predictor["componentSpecs"]
    [volume] = component["spec"]["volumes"]
    assert volume == {"name": "models", "persistentVolumeClaim": {"claimName": "tsctl-models", "readOnly": True}}
    containers = component["spec"]["containers"]
    assert [c["name"] for c in containers] == ["transformer", "vision-a", "vision-b"]  # one per unit with a class
    for c, (component_class, kind) in zip(
        containers, [("Transformer", "TRANSFORMER"), ("Model", "MODEL"), ("Model", "MODEL")]
    ):
        assert c["image"] == IMAGE
        assert {e["name"]: e["value"] for e in c["env"]} == {
            "MODEL_NAME": f"serving.runtimes.seldon_components.{component_class}",
            "SERVICE_TYPE": kind,
            "GRPC_WORKERS": "0",
        }
        assert c["volumeMounts"] == [{"name": "models", "mountPath": "/var/models", "readOnly": True}]
        assert c["readinessProbe"]["httpGet"] == {"path": "/health/status", "port": "http"}
    for unit in (graph, a, b):  # each unit's archive is in the tree where the claim puts it
        archive = unit["parameters"][0]["value"]
        assert (out / archive.removeprefix("/var/models/")).is_file()
    dockerfile = (out / "component-image/Dockerfile").read_text()
    assert (
        'CMD ["sh", "-c", "exec seldon-core-microservice \\"$MODEL_NAME\\" --service-type \\"$SERVICE_TYPE\\""]'
        in dockerfile
    )
    assert "COPY serving/ /opt/tsctl/serving/" in dockerfile
    assert (out / "component-image/serving/runtimes/seldon_components.py").is_file()
    pins = (out / "component-image/requirements.txt").read_text().splitlines()
    assert pins[:4] == ["seldon-core==1.17.1", "numpy==1.26.4", "PyYAML==6.0.1", "setuptools==80.9.0"]
    assert "torchserve==0.12.0" in pins and not any(p.startswith(("mlserver", "kserve", "numpy==2")) for p in pins)


def test_three_candidates_get_the_tsctl_router_and_one_model_none(store, tmp_path):
    out = tmp_path / "out"
    core1.export(options(store, out, ab=[("vision-a", 50), ("vision-b", 30), ("vision-c", 20)], name="abc"))
    manifest = manifest_of(out)
    assert crds.problems(manifest) == []
    [router] = manifest["spec"]["predictors"][0]["graph"]["children"]
    assert router["type"] == "ROUTER" and router["endpoint"] == {"type": "REST"}
    assert router["parameters"] == [{"name": "weights", "value": "50,30,20", "type": "STRING"}]
    assert [c["name"] for c in router["children"]] == ["vision-a", "vision-b", "vision-c"]
    containers = manifest["spec"]["predictors"][0]["componentSpecs"][0]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["transformer", "router", "vision-a", "vision-b", "vision-c"]
    assert containers[1]["env"][0]["value"] == "serving.runtimes.seldon_components.Router"

    one = tmp_path / "one"
    core1.export(options(store, one, transformer_model="vision-c"))
    graph = manifest_of(one)["spec"]["predictors"][0]["graph"]
    assert crds.problems(manifest_of(one)) == []
    [model] = graph["children"]
    assert model["name"] == "vision-c" and model["type"] == "MODEL" and "children" not in model


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/seldon is not beside this checkout")
def test_the_vendored_schema_is_seldons_crd():
    crd = yaml.load(
        (SHARED / "machinelearning.seldon.io_seldondeployments.yaml").read_text(),
        Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader),
    )
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]
    vendored = Path(crds.__file__).parent / "crds" / "seldon" / "seldondeployment.v1.json"
    assert json.loads(vendored.read_text()) == schema


def test_the_validator_checks_every_unit(store, tmp_path):
    manifest = core1.check(options(store, tmp_path / "o", ab=[("vision-a", 50), ("vision-b", 50)])).manifest
    assert crds.problems(manifest) == []
    model = manifest["spec"]["predictors"][0]["graph"]["children"][0]["children"][1]
    model["type"] = "MODELL"
    model["parameters"][1]["type"] = "INTEGER"
    model["endpoint"]["typ"] = "REST"
    problems = crds.problems(manifest)
    where = "spec.predictors.0.graph.children.0.children.1"
    assert f"{where}.endpoint: Additional properties are not allowed ('typ' was unexpected)" in problems
    assert any(p.startswith(f"{where}.parameters.1.type: 'INTEGER' is not one of") for p in problems)
    assert any(p.startswith(f"{where}.type: 'MODELL' is not one of") for p in problems)
    manifest = core1.check(options(store, tmp_path / "o", transformer_model="vision-a")).manifest
    manifest["spec"]["predictors"][0]["graph"]["children"][0]["name"] = "elsewhere"
    with pytest.raises(UserError, match="graph unit 'elsewhere' has no container of its name"):
        core1.webhook_check(manifest)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--transformer-archive", "TEXT", "--transformer-model", "vision-a"], "cannot run apart from its model"),
        (["--ab", "vision-a=100"], "a router needs two or more candidates"),
        (["--ab", "vision-a=60", "--ab", "vision-b=30"], "must add up to 100 (the router's shares), got 60 + 30 = 90"),
        (["--ab", "vision-a=60", "--ab", "vision-b=60"], "got 60 + 60 = 120"),
        (["--ab", "vision-a=50", "--ab", "vision-a=50"], "--ab names 'vision-a' twice"),
        (["--ab", "nope=50", "--ab", "vision-a=50"], "--ab model 'nope' is not a model of the store"),
        (["--ab", "photo=50", "--ab", "vision-a=50"], "model 'photo' gets the transformer's tensors"),
        (["--name", "Vision_Graph", "--transformer-model", "vision-a"], "--name 'Vision_Graph' is not a valid"),
        (["--namespace", "ML", "--transformer-model", "vision-a"], "--namespace 'ML' is not a valid Kubernetes name"),
        (["--claim", "-x", "--transformer-model", "vision-a"], "--claim '-x' is not a valid Kubernetes name"),
        (["--transformer-model", "vision-a", "--mirror", "vision-b"], "--mirror is for Seldon Core 2"),
        (["--transformer-model", "vision-a", "--server", "s"], "--server is for Seldon Core 2"),
        (["--transformer-model", "vision-a", "--ab", "vision-a=50", "--ab", "vision-b=50"], "one or the other"),
        (["--memory", "2GB", "--transformer-model", "vision-a"], "--memory '2GB' must be a memory quantity"),
        (["--ab", "vision-a=\u00b2", "--ab", "vision-b=50"], "must be MODEL=WEIGHT"),  # isdigit, not int: a traceback
        # image references docker and the kubelet refuse (InvalidImageName), or a shell runs in DEPLOY.md's build
        (["--image", "Registry.example.com/Tsctl:1", "--transformer-model", "vision-a"], "is not an image reference"),
        (["--image", "reg/x:1;id", "--transformer-model", "vision-a"], "is not an image reference"),
        (["--image", "$(id)", "--transformer-model", "vision-a"], "is not an image reference"),
        (["--image", "reg/x:", "--transformer-model", "vision-a"], "is not an image reference"),
        (["--image", "Bad_Image:1", "--transformer-model", "vision-a"], "--image 'Bad_Image:1' is not an image"),
    ],
)
def test_mistakes_are_one_line_exit_2_and_write_nothing(store, tmp_path, args, words):
    out = tmp_path / "out"
    args = [str(store / "text" / "sentiment.mar") if a == "TEXT" else a for a in args]
    if "--transformer-archive" not in args:
        args += ["--transformer-archive", str(store / "transformer" / "vision.mar")]
    result = invoke(store, out, *args)
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no OUT, no staging directory beside it


def test_without_a_transformer_and_with_name_on_core_2(store, tmp_path):
    result = invoke(store, tmp_path / "out", "--ab", "vision-a=50", "--ab", "vision-b=50")
    assert result.exit_code == 2 and "give --transformer-archive" in result.output, result.output
    core2 = CliRunner().invoke(
        main,
        [
            "export",
            "seldon",
            str(tmp_path / "out"),
            "--model-store",
            str(store / "model-store"),
            "--image",
            IMAGE,
            "--name",
            "g",
        ],
    )
    assert core2.exit_code == 2 and "--name names a Seldon Core 1 SeldonDeployment" in core2.output, core2.output
    assert list(tmp_path.iterdir()) == []


def test_deploy_md_runs_as_written_from_its_directory(store, tmp_path, tmp_path_factory):
    out = tmp_path / "out"
    result = invoke(
        store,
        out,
        "--ab",
        "vision-a=70",
        "--ab",
        "vision-b=30",
        "--name",
        "vision",
        "--namespace",
        "ml",
        "--transformer-archive",
        str(store / "transformer" / "vision.mar"),
    )
    assert result.exit_code == 0, result.output
    curl_line = (
        'curl -sS --fail-with-body -H "Content-Type: application/json" "http://${INGRESS:?set INGRESS to the ingress '
        'address, HOST:PORT}/seldon/ml/vision/api/v1.0/predictions" --data-binary @input.json -o answer.json'
    )
    assert result.output.splitlines()[-2:] == [
        "deploy: see " + str(out / "DEPLOY.md") + "; once its steps have built the request bodies:",
        f"  {curl_line}",
    ]
    assert curl_line in (out / "DEPLOY.md").read_text().splitlines()  # the summary's curl is DEPLOY.md's
    run = deploy_md.run_deploy_md(out, tmp_path / "stubs", {"INGRESS": "localhost:8080"}, json.dumps(ANSWER))
    assert 'data.ndarray: [{"class_238": 0.02}]' in run.output
    assert 'meta.routing: {"router": 1, "transformer": -1, "vision-b": -1}' in run.output
    deploy_md.check_referenced_files_exist(out, run)
    here = [str(tmp_path_factory.getbasetemp()), str(Path.cwd()), str(Path(__file__).resolve().parents[2])]
    assert deploy_md.paths_in_tree(out, here) == []
    assert [args[:3] for args in run.of("docker")] == [["build", "-t", IMAGE], ["push", IMAGE]]
    applied = [deploy_md.positional(args)[-1] for args in run.of("kubectl") if args[0] == "apply"]
    assert applied == ["pvc.yaml", "pvc-copy-pod.yaml", "seldondeployment.yaml"]
    copied = [deploy_md.positional(args)[1] for args in run.of("kubectl") if args[0] == "cp"]
    assert copied == ["models/transformer/vision.mar", "models/vision-a/vision-a.mar", "models/vision-b/vision-b.mar"]
    [curl] = run.of("curl")
    assert "http://localhost:8080/seldon/ml/vision/api/v1.0/predictions" in curl
    body = json.loads((out / "input.json").read_text())
    assert list(body) == ["binData"] and (out / "inputs/sample.png").read_bytes() == __import__("base64").b64decode(
        body["binData"]
    )
    deploy = (out / "DEPLOY.md").read_text()
    assert "meta.routing" in deploy and "SELDON_ENABLE_ROUTING_INJECTION" in deploy
    assert 'meta.routing: {"router": 0, "transformer": -1, "vision-a": -1}' in deploy
    shares = "the router `router` (RANDOM_ABTEST, ratioA) sends each request to one of vision-a 70%, vision-b 30%"
    assert shares in deploy


def test_deploy_md_step_6_fails_loudly_and_reads_what_it_got(store, tmp_path):
    """INGRESS unset: the shell's message, before curl runs; the graph's refusal (Seldon's error shape, no meta)
    and no answer at all: one error line each, no traceback; no router: meta.routing has none."""
    out = tmp_path / "out"
    result = invoke(
        store,
        out,
        "--transformer-model",
        "vision-a",
        "--transformer-archive",
        str(store / "transformer" / "vision.mar"),
    )
    assert result.exit_code == 0, result.output
    deploy = (out / "DEPLOY.md").read_text()
    assert 'meta.routing: {"transformer": -1, "vision-a": -1}' in deploy and "'router'" not in deploy
    assert "this graph has no router" in deploy and "the index of the child" not in deploy
    with pytest.raises(AssertionError, match="INGRESS: set INGRESS to the ingress address") as unset:
        deploy_md.run_deploy_md(out, tmp_path / "s1", {"INGRESS": ""})
    assert "Traceback" not in str(unset.value)
    with pytest.raises(AssertionError, match=r"error: no answer in answer.json \(\[Errno 2\]") as missing:
        deploy_md.run_deploy_md(out, tmp_path / "s2", {"INGRESS": "localhost:8080"})  # curl wrote nothing
    assert "Traceback" not in str(missing.value)
    refused = {
        "status": {
            "code": -1,
            "info": "tensor input has shape [3, 224, 224]",
            "reason": "MICROSERVICE_BAD_DATA",
            "status": 1,
        }
    }
    with pytest.raises(AssertionError, match="error: the graph refused the request: .*MICROSERVICE_BAD_DATA") as bad:
        deploy_md.run_deploy_md(out, tmp_path / "s3", {"INGRESS": "localhost:8080"}, json.dumps(refused))
    assert "Traceback" not in str(bad.value)
    answer = {"data": {"ndarray": [{"class_1": 0.5}]}, "meta": {}}  # SELDON_ENABLE_ROUTING_INJECTION off
    run = deploy_md.run_deploy_md(out, tmp_path / "s4", {"INGRESS": "localhost:8080"}, json.dumps(answer))
    assert "meta.routing: none (SELDON_ENABLE_ROUTING_INJECTION is off)" in run.output


def test_the_pod_size_is_noted_and_the_router_asks_little(store, tmp_path):
    """Every unit is a container of one pod: the export says what it asks of a node. tsctl's router (three or
    more candidates) only draws a child: 100m / 256Mi (its wrapper's processes: about 105 MB PSS measured)."""
    abc = [("vision-a", 50), ("vision-b", 30), ("vision-c", 20)]
    three = core1.export(options(store, tmp_path / "abc", ab=abc, cpu="2", memory="3Gi"))
    containers = manifest_of(tmp_path / "abc")["spec"]["predictors"][0]["componentSpecs"][0]["spec"]["containers"]
    router = next(c for c in containers if c["name"] == "router")
    assert router["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"cpu": "100m", "memory": "256Mi"},
    }
    [note] = [n for n in three.notes if n.startswith("seldondeployment.yaml: ")]
    assert (
        "the graph's pod asks for 8.1 CPU and 12544Mi of memory (transformer 2 / 3Gi, router 100m / 256Mi, "
        "vision-a 2 / 3Gi, vision-b 2 / 3Gi, vision-c 2 / 3Gi;" in note
    )
    assert "plus Seldon's executor container" in note and "stays Pending" in note
    assert note.removeprefix("seldondeployment.yaml: ") in (tmp_path / "abc" / "DEPLOY.md").read_text()
    ab = core1.export(options(store, tmp_path / "ab", ab=[("vision-a", 90), ("vision-b", 10)]))
    assert any(
        "asks for 3 CPU and 6Gi of memory (transformer 1 / 2Gi, vision-a 1 / 2Gi, vision-b 1 / 2Gi;" in n
        for n in ab.notes
    )


def test_the_help_and_commands_md_describe_core_1_for_the_options_it_uses():
    command = main.commands["export"].commands["seldon"]
    helps = {p.name: p.help for p in command.params if isinstance(p, click.Option)}
    for name in ("image", "transformer_archive", "transformer_model", "cpu", "memory", "ab", "name", "namespace"):
        assert "--core 1" in helps[name], (name, helps[name])
    assert "OUT/component-image" in helps["image"] and "required" in helps["transformer_archive"]
    commands_md = (Path(__file__).resolve().parents[2] / "docs" / "commands.md").read_text()
    [row] = [line for line in commands_md.splitlines() if line.startswith("| `tsctl export seldon")]
    assert "`--core 1" in row and "component-image" in row


def test_the_image_is_said_to_be_cpu_only(store, tmp_path):
    core1.export(options(store, tmp_path / "out", transformer_model="vision-a"))
    assert "download.pytorch.org/whl/cpu" in (tmp_path / "out" / "component-image" / "Dockerfile").read_text()
    assert "torch's CPU-only build" in (tmp_path / "out" / "DEPLOY.md").read_text()
    seldon_md = (Path(__file__).resolve().parents[2] / "docs" / "seldon.md").read_text()
    assert "torch's CPU-only build" in seldon_md
