"""tsctl export kserve --autoscale knative|keda|hpa: each mode's manifests valid against the vendored CRDs (KServe's,
KEDA's, the Prometheus Operator's) and the PodDisruptionBudget schema, and against the rules KServe's webhook adds;
every number traced to the capacity result file (written here by hand in tsctl-capacity/1); the one-line refusals
that leave no OUT behind; DEPLOY.md's steps and numbers."""

import json
import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from archiver import properties
from archiver.cli import main
from archiver.errors import UserError
from archiver.export import crds
from archiver.export.kserve import autoscale_modes
from archiver.export.kserve import export as kserve
from helpers import deploy_md
from helpers.models import package_resnet

SHARED = Path(__file__).resolve().parents[3] / "shared"
IMAGE = "registry.local/tsctl-vision:1"
# One replica's measured curve: throughput flattens at concurrency 8 (the knee); p99 holds 500 ms up to 6.
STEPS = [
    (1, 20.0, 60.0, 0.0),
    (2, 38.0, 70.0, 0.0),
    (4, 70.0, 120.0, 0.4),
    (6, 96.0, 450.0, 2.3),
    (8, 110.0, 620.0, 4.1),
    (12, 111.0, 900.0, 8.0),
]


def result(**changes) -> dict:
    steps = [
        {
            "concurrency": c,
            "requests": 200,
            "seconds": 3.0,
            "throughput_rps": rps,
            "p50_ms": p99 / 2,
            "p90_ms": p99 * 0.8,
            "p99_ms": p99,
            "errors": 0,
            "queue_depth": {"mean": queue, "max": math.ceil(queue) + 1},
        }
        for c, rps, p99, queue in STEPS
    ]
    data = {
        "format": "tsctl-capacity/1",
        "model": "resnet18",
        "engine": "tsctl",
        "server": {"workers": 2, "batch_size": 4, "max_batch_delay_ms": 20, "cpu": 1.0, "memory_bytes": 4 << 30},
        "input": {"files": ["kitten.jpg"], "bytes": [12345]},
        "p99_target_ms": 500,
        "steps": steps,
        "knee": {"concurrency": 8, "throughput_rps": 110.0, "p99_ms": 620.0},
        "within_p99": {"concurrency": 6, "throughput_rps": 96.0, "p99_ms": 450.0},
        "measured_at": "2026-11-26T13:00:00Z",
        "tsctl_version": "0.x",
    }
    data.update(changes)
    return data


@pytest.fixture(scope="module")
def project(image_sample, tmp_path_factory):
    root = tmp_path_factory.mktemp("autoscale")
    package_resnet(image_sample, root / "model-store")
    properties.write_config(root / "model-store", root / "config" / "config.properties")
    (root / "RESULT.json").write_text(json.dumps(result()))
    return root


def options(project, out, **changes):
    base = dict(
        out=str(out),
        name="vision",
        storage_uri="pvc://models/tsctl",
        config=str(project / "config" / "config.properties"),
        model_store=str(project / "model-store"),
        from_bench=str(project / "RESULT.json"),
    )
    base.update(changes)
    return kserve.ExportOptions(**base)


def written(out: Path, name: str) -> dict:
    return yaml.safe_load((out / name).read_text())


def kserve_webhook(isvc: dict) -> list:
    """What KServe's admission webhook refuses for the autoscaling fields (kserve/kserve aaac4e29,
    pkg/apis/serving/v1beta1/inference_service_validation.go: validateAutoScalingCompExtension and the
    checks it calls), for the modes the export writes."""
    annotations, predictor = isvc["metadata"].get("annotations", {}), isvc["spec"]["predictor"]
    mode, klass = (
        annotations.get("serving.kserve.io/deploymentMode"),
        annotations.get("serving.kserve.io/autoscalerClass"),
    )
    problems = []
    if klass is not None and klass not in ("hpa", "kpa", "external", "keda", "none"):
        problems.append(f"[{klass}] is not a supported autoscaler class type")
    metrics = (predictor.get("autoScaling") or {}).get("metrics", [])
    if mode == "Standard" and klass == "hpa":
        metric = predictor.get("scaleMetric", "cpu")
        if metric not in ("cpu", "memory"):
            problems.append(f"[{metric}] is not a supported metric")
        if metric == "cpu" and not 1 <= predictor.get("scaleTarget", 80) <= 100:
            problems.append("the target utilization percentage should be a [1-100] integer")
        problems += ["only Resource metrics with hpa" for m in metrics if m["type"] != "Resource"]
    elif mode == "Standard" and klass == "keda":
        if "scaleMetric" in predictor:
            problems.append("ScaleMetric is not supported for KEDA")
        for m in metrics:
            if m["type"] == "External" and (
                not m["external"]["metric"].get("query") or "value" not in m["external"]["target"]
            ):
                problems.append("the query and the target threshold value should not be empty")
    elif mode != "Standard":
        metric = predictor.get("scaleMetric", "concurrency")
        if metric not in ("concurrency", "rps"):
            problems.append(f"[{metric}] is not a supported metric")
        if metric == "rps" and predictor.get("scaleTarget", 1) < 1:
            problems.append("the target for rps should be greater than 1")
    return problems


def check_valid(out: Path, names):
    for name in names:
        manifest = written(out, name)
        assert crds.problems(manifest) == [], name
    assert kserve_webhook(written(out, "inferenceservice.yaml")) == []


def test_knative_sizes_one_replica_from_the_p99_point(project, tmp_path):
    """containerConcurrency and scaleTarget are within_p99's concurrency (6), each traced in DEPLOY.md to the
    file, model, date and step; a PDB, Prometheus annotations, readiness on /ping; TorchServe's metrics port
    is not one its pod declares (KServe gives it 8080 alone), so Prometheus finds it through a Service and a
    ServiceMonitor, not a PodMonitor, whose target the Prometheus Operator would drop."""
    result_ = kserve.export(options(project, tmp_path, autoscale="knative", min_replicas=2, max_replicas=20))
    names = sorted(p.relative_to(tmp_path).as_posix() for p in result_.files)
    assert {"pdb.yaml", "metrics-service.yaml", "servicemonitor.yaml", "capacity.json"} <= set(names)
    assert "podmonitor.yaml" not in names
    check_valid(tmp_path, ["inferenceservice.yaml", "pdb.yaml", "servicemonitor.yaml"])
    isvc = written(tmp_path, "inferenceservice.yaml")
    predictor, annotations = isvc["spec"]["predictor"], isvc["metadata"]["annotations"]
    assert (predictor["scaleMetric"], predictor["scaleTarget"], predictor["containerConcurrency"]) == (
        "concurrency",
        6,
        6,
    )
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (2, 20)
    assert annotations["serving.kserve.io/deploymentMode"] == "Knative"
    assert annotations["autoscaling.knative.dev/target-utilization-percentage"] == "70"
    assert annotations["autoscaling.knative.dev/scale-down-delay"] == "300s"
    # TorchServe: metrics on its metrics address, readiness on its own /ping (not the wrapper's first-worker one)
    assert (annotations["prometheus.kserve.io/port"], annotations["prometheus.kserve.io/path"]) == ("8082", "/metrics")
    assert predictor["model"]["readinessProbe"]["httpGet"] == {"path": "/ping", "port": 8085}
    pdb, service = written(tmp_path, "pdb.yaml"), written(tmp_path, "metrics-service.yaml")
    labels = {"serving.kserve.io/inferenceservice": "vision", "component": "predictor"}
    assert pdb["spec"]["selector"]["matchLabels"] == labels and pdb["spec"]["maxUnavailable"] == 1
    assert service["spec"]["selector"] == labels and service["spec"]["ports"][0]["targetPort"] == 8082
    assert json.loads((tmp_path / "capacity.json").read_text()) == result()
    deploy = (tmp_path / "DEPLOY.md").read_text()
    trace = "capacity.json (resnet18 on tsctl, measured 2026-11-26T13:00:00Z), steps[3]: concurrency 6, 96 rps"
    assert "| containerConcurrency | 6 |" in deploy and trace in deploy
    assert "| maxReplicas | 20 | --max-replicas |" in deploy
    assert "--from-bench measured resnet18 on tsctl, the export runs --engine torchserve" in " ".join(result_.notes)
    run = deploy_md.run_deploy_md(tmp_path, tmp_path.parent / f"{tmp_path.name}-stubs")
    deploy_md.check_referenced_files_exist(tmp_path, run)
    applied = [a[-1] for a in run.of("kubectl") if a[:1] == ["apply"]]
    assert {"inferenceservice.yaml", "pdb.yaml", "metrics-service.yaml", "servicemonitor.yaml"} <= set(applied)
    assert deploy_md.paths_in_tree(tmp_path, [str(project), str(tmp_path)]) == []


def test_knative_rps_takes_the_steps_throughput_and_peak_rps_sets_the_maximum(project, tmp_path):
    kserve.export(options(project, tmp_path, autoscale="knative", scale_metric="rps", peak_rps=1000))
    check_valid(tmp_path, ["inferenceservice.yaml"])
    predictor = written(tmp_path, "inferenceservice.yaml")["spec"]["predictor"]
    assert (predictor["scaleMetric"], predictor["scaleTarget"], predictor["containerConcurrency"]) == ("rps", 96, 6)
    assert predictor["maxReplicas"] == math.ceil(1000 / 96)
    assert "ceil(--peak-rps 1000 / 96 rps per replica)" in (tmp_path / "DEPLOY.md").read_text()


def test_a_target_by_hand_picks_the_step_below_it(project, tmp_path):
    """--target 5 with the result: the step read is concurrency 4's (the largest measured at or below 5)."""
    kserve.export(options(project, tmp_path, autoscale="knative", target=5))
    predictor = written(tmp_path, "inferenceservice.yaml")["spec"]["predictor"]
    assert (predictor["scaleTarget"], predictor["containerConcurrency"]) == (5, 5)
    assert "steps[2]: concurrency 4, 70 rps" in (tmp_path / "DEPLOY.md").read_text()
    other = tmp_path.parent / f"{tmp_path.name}-bare"
    kserve.export(options(project, other, autoscale="knative", target=3, from_bench=None))
    assert written(other, "inferenceservice.yaml")["spec"]["predictor"]["containerConcurrency"] == 3
    assert (
        not (other / "capacity.json").exists()
        and "--target (by hand, no measurement)" in (other / "DEPLOY.md").read_text()
    )


def test_keda_scales_on_the_answer_rate_and_requests_in_flight(project, tmp_path):
    """Two External metrics over the predictor's pods: the rate of ts_inference_requests_total against 70% of
    the p99 step's throughput (96 -> "67.2") and ts_requests_in_flight against 70% of its concurrency (6 ->
    "4.2"), handed to KEDA as written; the ScaledObject KServe makes of them passes KEDA's CRD; the
    ServiceMonitor scrapes a headless Service on the engine's port."""
    kserve.export(
        options(
            project,
            tmp_path,
            autoscale="keda",
            engine="tsctl",
            image=IMAGE,
            monitor="servicemonitor",
            prometheus_url="http://prometheus.mon.svc:9090",
        )
    )
    check_valid(tmp_path, ["inferenceservice.yaml", "pdb.yaml", "servicemonitor.yaml"])
    isvc = written(tmp_path, "inferenceservice.yaml")
    annotations, predictor = isvc["metadata"]["annotations"], isvc["spec"]["predictor"]
    assert (annotations["serving.kserve.io/deploymentMode"], annotations["serving.kserve.io/autoscalerClass"]) == (
        "Standard",
        "keda",
    )
    pods = '{namespace="default",pod=~"vision-predictor-.*",model_name="resnet18"}'
    rate, in_flight = predictor["autoScaling"]["metrics"]
    assert rate == {
        "type": "External",
        "external": {
            "metric": {
                "backend": "prometheus",
                "serverAddress": "http://prometheus.mon.svc:9090",
                "query": f"sum(rate(ts_inference_requests_total{pods}[1m]))",
            },
            "target": {"type": "Value", "value": "67.2"},
        },
    }
    assert in_flight["external"]["metric"]["query"] == f"sum(ts_requests_in_flight{pods})"
    assert in_flight["external"]["target"] == {"type": "Value", "value": "4.2"}
    assert "scaleMetric" not in predictor and predictor["model"]["readinessProbe"]["httpGet"]["port"] == 8080
    scaled = autoscale_modes.kserve_scaled_object(isvc)
    assert crds.problems(scaled) == []
    assert [t["metadata"]["threshold"] for t in scaled["spec"]["triggers"]] == ["67.2", "4.2"]
    service, monitor = written(tmp_path, "metrics-service.yaml"), written(tmp_path, "servicemonitor.yaml")
    assert monitor["spec"]["selector"]["matchLabels"] == service["metadata"]["labels"]
    assert service["spec"]["ports"][0] == {"name": "metrics", "port": 8080, "targetPort": 8080, "protocol": "TCP"}
    deploy = (tmp_path / "DEPLOY.md").read_text()
    assert (
        "| threshold (ts_requests_in_flight per replica) | 4.2 | 70% (Knative's target utilisation) x the "
        "operating point 6 |" in deploy
    )
    assert (
        "| threshold (rate of ts_inference_requests_total per replica) | 67.2 | 70% (Knative's target "
        "utilisation) x the throughput of capacity.json (resnet18 on tsctl" in deploy
    )
    assert f"sum(rate(ts_inference_requests_total{pods}[1m]))" in deploy
    assert f"sum(ts_requests_in_flight{pods})" in deploy
    assert "kubectl apply -n default -f metrics-service.yaml" in deploy
    crds_first = [
        deploy.index(f"kubectl get crd {c}") for c in ("servicemonitors.monitoring.coreos.com", "scaledobjects.keda.sh")
    ]
    assert max(crds_first) < deploy.index("kubectl apply -n default -f inferenceservice.yaml")  # step 3 checks first
    # DEPLOY.md's pointer: tsctl simulate on the result copied beside it
    assert "`tsctl simulate capacity.json --autoscale keda` here" in deploy
    args = ["simulate", str(tmp_path / "capacity.json"), "--autoscale", "keda", "--trace", "spike", "--json"]
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 0 and json.loads(done.output)["rows"][0]["mode"] == "keda", done.output


@pytest.mark.parametrize(
    "changes, flags, said",
    [
        (
            {"server": {**result()["server"], "cpu": None}},
            {},
            "measured with no CPU limit, the pod is limited to --cpu 1",
        ),
        (
            {"server": {**result()["server"], "cpu": 2.0}},
            {"cpu": "500m"},
            "measured under 2 CPU, the pod gets --cpu 500m",
        ),
        ({"stopped": "bound"}, {}, "its knee (8) is a lower bound; measure with a larger --max-concurrency"),
        (
            {"p99_target_ms": 50, "within_p99": None},
            {},
            "no step of --from-bench held its p99 target (50 ms): sized at the knee, whose p99 is 620 ms",
        ),
        (  # issue #47: a p99 from 7 answers sized containerConcurrency; now the knee, and said
            {"steps": [{**step, "requests": 7} for step in result()["steps"]], "within_p99": None},
            {},
            "no step of --from-bench held its p99 target from 100 answers or more (500 ms): sized at the knee",
        ),
        (
            {"steps": [{**step, "requests": 7} for step in result()["steps"]], "within_p99": None},
            {},
            "--from-bench: p99 from too few answers (7 at concurrency 1, 7 at concurrency 2,",
        ),
        (
            {"machine": {"cpus": 2, "load_average": 9.5}},
            {},
            "--from-bench: the machine was busy before the sweep (1-minute load average 9.5 on 2 CPUs)",
        ),
    ],
)
def test_what_makes_the_measurement_weaker_is_a_note(project, tmp_path, changes, flags, said):
    """Exported all the same (a measurement is better than none), with the reason it may not hold said."""
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(result(**changes)))
    done = kserve.export(options(project, tmp_path / "out", autoscale="knative", from_bench=str(bench), **flags))
    assert any(said in note for note in done.notes), done.notes


def test_deploy_md_says_where_the_operating_point_came_from_truly(project, tmp_path):
    """--target 8 (the knee, p99 620 ms) is "above the 500 ms target", not "<="; a within_p99 past the knee is
    capped at it and said so; the pod's resources are a row, with what the measurement ran under."""
    kserve.export(options(project, tmp_path / "a", autoscale="knative", target=8))
    deploy = (tmp_path / "a" / "DEPLOY.md").read_text()
    assert "concurrency 8, 110 rps, p99 620 ms, above the 500 ms target" in deploy
    assert "| pod resources | cpu 1, memory 2Gi | --cpu, --memory; measured under 1 CPU |" in deploy
    bench = tmp_path / "bench.json"
    steps = [{**step, "p99_ms": 100.0} for step in result()["steps"]]  # every step holds 500 ms: within_p99 is 12
    within = {"concurrency": 12, "throughput_rps": 111.0, "p99_ms": 100.0}
    knee = {"concurrency": 8, "throughput_rps": 110.0, "p99_ms": 100.0}
    bench.write_text(json.dumps(result(steps=steps, within_p99=within, knee=knee)))
    kserve.export(options(project, tmp_path / "b", autoscale="knative", from_bench=str(bench)))
    deploy = (tmp_path / "b" / "DEPLOY.md").read_text()
    assert "knee: where more concurrency stops adding throughput, below within_p99's 12" in deploy


def test_hpa_on_cpu_with_behavior(project, tmp_path):
    """CPU target: 70% x the p99 step's throughput over the knee's (96/110); behavior scale-up and -down."""
    kserve.export(options(project, tmp_path, autoscale="hpa", scale_down_delay="10m"))
    check_valid(tmp_path, ["inferenceservice.yaml", "pdb.yaml", "servicemonitor.yaml"])
    isvc = written(tmp_path, "inferenceservice.yaml")
    predictor = isvc["spec"]["predictor"]
    cpu = round(70 * 96 / 110)
    assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "hpa"
    assert (predictor["scaleMetric"], predictor["scaleTarget"]) == ("cpu", cpu)
    assert predictor["autoScaling"]["metrics"][0]["resource"]["target"]["averageUtilization"] == cpu
    behavior = predictor["autoScaling"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 600 and behavior["scaleUp"]["policies"]
    assert f"| scaleTarget (cpu %) | {cpu} |" in (tmp_path / "DEPLOY.md").read_text()


def test_the_schemas_catch_what_the_cluster_would_refuse():
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "vision-predictor", "namespace": "default"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"component": "predictor"}}},
    }
    assert crds.problems(pdb) == []
    for change, words in [
        ({"minAvailable": 1}, "should not be valid"),  # both set: Kubernetes refuses
        ({"maxUnavailable": "half"}, "is not valid under any of the given schemas"),
        ({"unhealthyPodEvictionPolicy": "Never"}, "is not one of"),
        ({"maxUnavailabe": 1}, "Additional properties are not allowed"),
    ]:
        broken = {**pdb, "spec": {**pdb["spec"], **change}}
        assert any(words in p for p in crds.problems(broken)), crds.problems(broken)
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "m"},
        "spec": {"selector": {}, "podMetricsEndpoints": [{"portNumber": "8082"}]},
    }
    assert crds.problems(monitor) == ["spec.podMetricsEndpoints.0.portNumber: '8082' is not of type 'integer'"]
    with pytest.raises(UserError, match="x.yaml does not match the Prometheus Operator's PodMonitor schema"):
        crds.check(monitor, "x.yaml")


@pytest.mark.parametrize(
    "changes, data, words",
    [
        ({"autoscale": "knative", "target": 9}, None, "--target 9 is above the measured knee (8 concurrent requests"),
        (
            {"autoscale": "knative", "min_replicas": 5, "max_replicas": 3},
            None,
            "--min-replicas 5 is above --max-replicas 3",
        ),
        ({"autoscale": "hpa", "min_replicas": 0}, None, "--autoscale hpa keeps at least 1 replica"),
        ({"autoscale": "keda"}, None, "ts_requests_in_flight gauge, which TorchServe does not export"),
        ({"autoscale": "knative"}, result(model="bert"), "measured model 'bert', which is not in the config's"),
        ({"autoscale": "knative"}, "{not json", "not JSON"),
        ({"autoscale": "knative"}, result(format="tsctl-capacity/9"), "key 'format' must be 'tsctl-capacity/1'"),
        (
            {"autoscale": "knative"},
            result(knee={"concurrency": 7, "throughput_rps": 110.0, "p99_ms": 620.0}),
            "knee is not what its steps give concurrency 8; the file was changed",
        ),
        (
            {"autoscale": "knative"},
            result(steps=[{**s, "errors": 1} for s in result()["steps"]], knee=None, within_p99=None),
            "has no knee (no step answered every request)",
        ),
        ({"autoscale": "knative"}, result(within_p99=None), "within_p99 is not what its steps give concurrency 6"),
        (
            {"autoscale": "knative", "monitor": "podmonitor"},
            None,
            "--monitor podmonitor: the pod does not declare its metrics port 8082",
        ),
        (
            {"autoscale": "knative", "monitor": "servicemonitor", "name": "v" * 56},
            None,
            "a Service " + "v" * 56 + "-metrics, 64 characters, above Kubernetes' 63: give a --name of 55",
        ),
        (
            {"autoscale": "keda", "engine": "tsctl", "image": IMAGE, "prometheus_url": "prometheus:9090"},
            None,
            "--prometheus-url 'prometheus:9090' is not an address KEDA can query",
        ),
        (
            {"autoscale": "keda", "engine": "tsctl", "image": IMAGE, "prometheus_url": 'http://p:9090/"x'},
            None,
            "is not an address KEDA can query: give http(s)://HOST[:PORT]",
        ),
        ({"autoscale": "knative"}, result(measured_at="today\n| x |"), "key 'measured_at' holds the control character"),
        ({"autoscale": "knative"}, result(engine="tsctl`rm`"), "key 'engine' must be an engine's name"),
        ({"autoscale": "knative"}, result(p99_target_ms="500"), "key 'p99_target_ms' must be a number >= 0 or null"),
        (
            {"autoscale": "knative"},
            '{"format": "tsctl-capacity/1", "steps": NaN}',
            "key 'model' must be a non-empty string",
        ),
        ({"autoscale": "hpa", "from_bench": None, "target": 4}, None, "the CPU target comes from a measured step"),
        (
            {"autoscale": "keda", "engine": "tsctl", "image": IMAGE, "from_bench": None, "target": 4},
            None,
            "the answer-rate threshold comes from a measured step",
        ),
        ({"autoscale": None}, None, "--from-bench sizes the autoscaling: add --autoscale"),
        ({"autoscale": "knative", "scale_down_delay": "2d"}, None, "must look like 300s, 5m or 1h"),
        ({"autoscale": "knative", "from_bench": "missing.json"}, None, "cannot read it"),
    ],
)
def test_bad_values_are_one_line_refusals_and_leave_nothing(project, tmp_path, changes, data, words):
    bench = tmp_path / "bench.json"
    bench.write_text(data if isinstance(data, str) else json.dumps(data or result()))
    out = tmp_path / "out"
    with pytest.raises(UserError) as refused:
        kserve.export(options(project, out, **{"from_bench": str(bench), **changes}))
    assert words in str(refused.value) and "\n" not in str(refused.value)
    assert not out.exists()


def test_keda_refuses_a_metrics_config_without_the_answer_counter(project, tmp_path, monkeypatch):
    """The rate trigger reads ts_inference_requests_total, which the engine exports only as the config's
    metrics_config declares: one without it is refused in one line. TorchServe's own metrics.yaml passes and is
    copied beside the exported config, the key naming the copy as the pod sees it, DEPLOY.md copying it too.
    A relative metrics_config is read from the current directory, as TorchServe reads it."""
    import ts

    monkeypatch.chdir(tmp_path)
    config = tmp_path / "config" / "config.properties"
    config.parent.mkdir()
    text = (project / "config" / "config.properties").read_text()
    (tmp_path / "metrics.yaml").write_text("ts_metrics:\n  counter:\n    - name: Requests2XX\n      unit: Count\n")
    config.write_text(text + "metrics_config=metrics.yaml\n")
    keda = dict(autoscale="keda", engine="tsctl", image=IMAGE, config=str(config))
    with pytest.raises(UserError) as refused:
        kserve.export(options(project, tmp_path / "out", **keda))
    assert (
        f"metrics_config of {config} does not declare ts_inference_requests_total under ts_metrics"
        in str(refused.value)
        and not (tmp_path / "out").exists()
    )
    theirs = Path(ts.__file__).parent / "configs" / "metrics.yaml"
    config.write_text(text + f"metrics_config={theirs}\n")
    kserve.export(options(project, tmp_path / "out", **keda))
    assert len(written(tmp_path / "out", "inferenceservice.yaml")["spec"]["predictor"]["autoScaling"]["metrics"]) == 2
    assert (tmp_path / "out" / "config" / "metrics.yaml").read_bytes() == theirs.read_bytes()
    exported = (tmp_path / "out" / "config" / "config.properties").read_text()
    assert "metrics_config=/mnt/models/config/metrics.yaml" in exported and str(theirs) not in exported
    assert (
        "kubectl cp -n default config/metrics.yaml vision-copy:/pvc/tsctl/config/metrics.yaml"
        in (tmp_path / "out" / "DEPLOY.md").read_text()
    )


def test_the_command_line(project, tmp_path):
    out = tmp_path / "out"
    args = ["export", "kserve", str(out), "--name", "vision", "--storage-uri", "pvc://models/tsctl"]
    args += ["--config", str(project / "config" / "config.properties"), "--model-store", str(project / "model-store")]
    done = CliRunner().invoke(main, args + ["--autoscale", "knative", "--from-bench", str(project / "RESULT.json")])
    assert done.exit_code == 0, done.output
    assert written(out, "inferenceservice.yaml")["spec"]["predictor"]["containerConcurrency"] == 6
    refused = CliRunner().invoke(
        main,
        args + ["--force", "--autoscale", "knative", "--target", "40", "--from-bench", str(project / "RESULT.json")],
    )
    assert refused.exit_code != 0 and "--target 40 is above the measured knee" in refused.output


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared is not beside this checkout")
def test_vendored_schemas_match_the_keda_and_prometheus_operator_crds():
    here = Path(crds.__file__).parent / "crds"
    for source, vendored in [
        ("keda/keda.sh_scaledobjects.yaml", "keda/scaledobject.v1alpha1.json"),
        (
            "prometheus-operator/monitoring.coreos.com_servicemonitors.yaml",
            "prometheus-operator/servicemonitor.v1.json",
        ),
        ("prometheus-operator/monitoring.coreos.com_podmonitors.yaml", "prometheus-operator/podmonitor.v1.json"),
    ]:
        crd = yaml.load((SHARED / source).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        version = vendored.split(".")[1]
        schema = next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]
        assert json.loads((here / vendored).read_text()) == schema
        licence = (SHARED / source).parent / "LICENSE"
        assert (here / vendored).parent.joinpath("LICENSE").read_bytes() == licence.read_bytes()
