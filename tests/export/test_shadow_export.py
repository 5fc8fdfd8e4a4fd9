"""The rollouts ``tsctl shadow`` gates: ``export kserve --canary`` writes the shadow (canaryTrafficPercent 0),
canary and promote InferenceServices with tag routing, and ``export seldon --mirror`` an Experiment mirroring a
model and its promotion; every manifest valid against the CRDs, and DEPLOY.md runs the check before raising the
traffic or promoting (its shell blocks run with kubectl and tsctl recording their arguments). ~6 s."""

import shlex

import pytest
import torch
import yaml
from click.testing import CliRunner

from archiver import properties
from archiver.cli import main
from archiver.export import crds
from archiver.export.kserve import export as kserve
from handlers import golden as answers
from helpers import deploy_md
from helpers.hostile import build, scripted

IMAGE = "registry.example.com/tsctl-mlserver:1"
SHAPE = "handler:\n  input_shape: [4]\n"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """model-store/ with linear (golden inputs) and linear-v2 (none), config/config.properties."""
    root = tmp_path_factory.mktemp("rollout")
    golden_inputs = root / "golden"
    golden_inputs.mkdir()
    (golden_inputs / "a.json").write_text("[[1, 2, 3, 4]]")
    for name, inputs in (("linear", golden_inputs), ("linear-v2", None)):
        build(root, name, "tensor", scripted(root / f"{name}.pt", torch.nn.Linear(4, 2)), SHAPE, inputs)
    (root / "store").rename(root / "model-store")
    properties.write_config(root / "model-store", root / "config" / "config.properties")
    return root


def kserve_options(project, out, **changes):
    base = dict(out=str(out), name="linear", storage_uri="pvc://models/v2", namespace="ml")
    base.update(config=str(project / "config" / "config.properties"), model_store=str(project / "model-store"))
    return kserve.ExportOptions(**{**base, **changes})


def load(path):
    return yaml.safe_load(path.read_text())


def test_kserve_canary_is_shadow_then_canary_then_promote_behind_the_check(project, tmp_path):
    out = tmp_path / "out"
    kserve.export(kserve_options(project, out, canary=10))
    shadow, canary, promote = (
        load(out / name)
        for name in ("inferenceservice-shadow.yaml", "inferenceservice.yaml", "inferenceservice-promote.yaml")
    )
    for manifest in (shadow, canary, promote):
        assert crds.problems(manifest) == []
        assert manifest["metadata"]["annotations"] == {"serving.kserve.io/enable-tag-routing": "true"}
    assert shadow["spec"]["predictor"]["canaryTrafficPercent"] == 0
    assert canary["spec"]["predictor"]["canaryTrafficPercent"] == 10
    assert "canaryTrafficPercent" not in promote["spec"]["predictor"]
    assert shadow["spec"]["predictor"]["model"] == promote["spec"]["predictor"]["model"]

    run = deploy_md.run_deploy_md(out, tmp_path / "stubs")
    deploy_md.check_referenced_files_exist(out, run)
    steps = [shlex.join(call) for call in run.calls if call[0] == "tsctl" or call[1:2] == ["apply"]]
    applied = [step.split()[-1] for step in steps if step.startswith("kubectl")]
    assert applied[-3:] == ["inferenceservice-shadow.yaml", "inferenceservice.yaml", "inferenceservice-promote.yaml"]
    checks = [step for step in steps if step.startswith("tsctl")]
    assert checks == [
        "tsctl shadow model-store/linear-v2.mar --current http://localhost:8081 --candidate http://localhost:8082 "
        "--protocol v1 --inputs REQUESTS_DIR",
        "tsctl shadow model-store/linear.mar --current http://localhost:8081 --candidate http://localhost:8082 "
        "--protocol v1",
    ]
    order = [step.split()[-1] if step.startswith("kubectl") else "check" for step in steps]
    assert order.index("check") < order.index("inferenceservice.yaml") > order.index("inferenceservice-shadow.yaml")
    deploy = (out / "DEPLOY.md").read_text()
    assert "--protocol v1 &&\nkubectl apply -n ml -f inferenceservice.yaml" in deploy  # the gate: only if it passes
    assert "serving.knative.dev/revision=$${CURRENT}".replace("$$", "$") in deploy
    assert "linear-v2.mar has no golden inputs" in deploy


def test_without_canary_nothing_changes(project, tmp_path):
    kserve.export(kserve_options(project, tmp_path / "out"))
    names = sorted(p.name for p in (tmp_path / "out").glob("*.yaml"))
    assert names == ["inferenceservice.yaml", "pvc-copy-pod.yaml", "pvc.yaml"]
    assert "annotations" not in load(tmp_path / "out" / "inferenceservice.yaml")["metadata"]
    assert "tsctl shadow" not in (tmp_path / "out" / "DEPLOY.md").read_text()


def seldon_export(project, out, *args):
    """``tsctl export seldon OUT`` of the project's store (a later --model-store wins)."""
    command = ["export", "seldon", str(out), "--model-store", str(project / "model-store"), "--image", IMAGE, *args]
    return CliRunner().invoke(main, [str(a) for a in command])


def test_seldon_mirror_is_an_experiment_and_its_promotion_behind_the_check(project, tmp_path):
    out = tmp_path / "out"
    result = seldon_export(project, out, "--mirror", "linear-v2=50")  # --default: the store's other model
    assert result.exit_code == 0, result.output
    [mirrored] = yaml.safe_load_all((out / "experiment.yaml").read_text())
    [promoted] = yaml.safe_load_all((out / "experiment-promote.yaml").read_text())
    assert crds.problems(mirrored) == [] and crds.problems(promoted) == []
    assert mirrored["metadata"]["name"] == promoted["metadata"]["name"] == "linear-mirror"
    assert mirrored["spec"] == {
        "default": "linear",
        "candidates": [{"name": "linear", "weight": 100}],
        "mirror": {"name": "linear-v2", "percent": 50},
    }
    assert promoted["spec"] == {"default": "linear", "candidates": [{"name": "linear-v2", "weight": 100}]}
    run = deploy_md.run_deploy_md(out, tmp_path / "stubs", env={"MESH_IP": "10.0.0.1"})
    deploy_md.check_referenced_files_exist(out, run)
    [check] = run.of("tsctl")
    assert check == [
        "shadow",
        "models/linear/linear.mar",
        "--current",
        "http://localhost:9000",
        "--candidate",
        "http://localhost:9000",
        "--protocol",
        "v2",
        "--model",
        "linear",
        "--model-candidate",
        "linear-v2",
    ]
    assert answers.read(out / "models" / "linear" / "linear.mar")  # the check's inputs travel with the export
    applied = [deploy_md.positional(args)[-1] for args in run.of("kubectl") if args[0] == "apply"]
    assert applied[-2:] == ["experiment.yaml", "experiment-promote.yaml"]


def test_a_mirror_joins_an_ab_experiment(project, tmp_path):
    """With --ab the mirror goes into the A/B experiment; a mirror that is a candidate is refused."""
    store = tmp_path / "store"
    build(tmp_path, "linear-b", "tensor", scripted(tmp_path / "b.pt", torch.nn.Linear(4, 2)), SHAPE)
    for name in ("linear", "linear-v2"):
        (store / f"{name}.mar").write_bytes((project / "model-store" / f"{name}.mar").read_bytes())
    args = ["--ab", "linear=90", "--ab", "linear-b=10", "--model-store", store]
    result = seldon_export(project, tmp_path / "out", *args, "--mirror", "linear-v2")
    assert result.exit_code == 0, result.output
    [experiment] = yaml.safe_load_all((tmp_path / "out" / "experiment.yaml").read_text())
    assert crds.problems(experiment) == [] and experiment["spec"]["mirror"] == {"name": "linear-v2", "percent": 100}
    assert [c["name"] for c in experiment["spec"]["candidates"]] == ["linear", "linear-b"]
    result = seldon_export(project, tmp_path / "out2", *args, "--mirror", "linear-b")
    assert result.exit_code == 2 and "--mirror 'linear-b' is an --ab candidate already" in result.output


@pytest.mark.parametrize(
    "args, said",
    [
        (["--mirror", "linear-v2=0"], "PERCENT from 1 to 100"),
        (["--mirror", "linear-v2=x"], "PERCENT from 1 to 100"),
        (["--mirror", "nothing"], "--mirror model 'nothing' is not a model of the store"),
        (["--mirror", "linear", "--default", "linear"], "--default 'linear' is not the model answering now"),
    ],
)
def test_seldon_mirror_mistakes_are_one_line(project, tmp_path, args, said):
    result = seldon_export(project, tmp_path / "out", *args)
    assert result.exit_code == 2 and said in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_seldon_vendored_experiment_schema_has_the_mirror():
    assert "mirror" in crds.schema_for("mlops.seldon.io/v1alpha1", "Experiment")["properties"]["spec"]["properties"]


def test_a_canary_keeps_knative_autoscaling_and_standard_mode_has_none(project, tmp_path):
    """Every step of the rollout carries the autoscaling (--autoscale knative); Standard mode (keda, hpa: plain
    Deployments, no revisions) has no canary, refused in one line."""
    from archiver.errors import UserError
    from archiver.export.kserve import autoscale_modes
    from archiver.export.kserve import canary as kserve_canary

    out = tmp_path / "out"
    kserve.export(kserve_options(project, out, canary=10, autoscale="knative", target=4))
    scaled = load(out / "inferenceservice.yaml")
    for name in ("inferenceservice-shadow.yaml", "inferenceservice-promote.yaml"):
        step = load(out / name)
        assert crds.problems(step) == []
        assert step["metadata"]["annotations"] == scaled["metadata"]["annotations"]
        assert step["spec"]["predictor"].get("scaleTarget") == scaled["spec"]["predictor"]["scaleTarget"] == 4
    deploy = (out / "DEPLOY.md").read_text()
    assert "## 7. Autoscaling" in deploy and "## 8. Roll out behind the shadow check" in deploy
    for mode in ("keda", "hpa"):
        with pytest.raises(UserError, match=f"--autoscale {mode} deploys in Standard mode, which has no canary"):
            kserve_canary.manifests(scaled, autoscale_modes.named(mode))
    # the candidate's revision at 0% scales to zero with --min-replicas 0: no pod for tsctl shadow to compare
    with pytest.raises(UserError, match="--canary with --min-replicas 0: Knative scales the candidate's revision"):
        kserve.export(
            kserve_options(project, tmp_path / "zero", canary=10, autoscale="knative", target=4, min_replicas=0)
        )
    assert not (tmp_path / "zero").exists()


def test_the_stubs_record_calls_made_at_once_whole(tmp_path):
    """DEPLOY.md's canary steps run two ``kubectl port-forward ... &`` beside ``tsctl shadow``: on a busy
    machine the stubs' records interleaved into an empty call (an IndexError inside the helper, not an
    assertion about the export). 40 calls at once are 40 whole records."""
    out = tmp_path / "out"
    out.mkdir()
    calls = "\n".join(f"kubectl port-forward pod/p{i} {8000 + i}:8080 &" for i in range(40))
    (out / "DEPLOY.md").write_text(f"```sh\n{calls}\nwait\n```\n")
    run = deploy_md.run_deploy_md(out, tmp_path / "stubs")
    assert sorted(run.of("kubectl")) == sorted(["port-forward", f"pod/p{i}", f"{8000 + i}:8080"] for i in range(40))
