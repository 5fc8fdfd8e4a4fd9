"""``tsctl export kserve --engine tsctl --auto-select [--priority N]``: the runtime KServe picks for an
InferenceService that names only ``modelFormat: pytorch`` and a PVC, beside KServe's own kserve-torchserve
(priority 2) while both are installed, and after it is disabled or removed (kserve/kserve#5638).

No cluster here: the manifests are checked against KServe's CRDs (archiver/export/crds.py) and the choice
against KServe's selection and admission rules as tests/helpers/kserve_runtimes.py models them from
KServe's source at the commit ../shared/kserve is from (a model of the rules, not KServe's code running),
which answers the cases of KServe's own unit tests of those rules as they expect (at the end)."""

import copy
from pathlib import Path

import pytest
import yaml

from archiver import properties
from archiver.export import crds
from archiver.export.kserve import export as kserve
from helpers import kserve_runtimes as rules
from helpers.models import package_resnet

SHARED = Path(__file__).resolve().parents[3] / "shared" / "kserve"
IMAGE = "registry.local/tsctl-engine:1"
OURS = "tsctl-default-vision"
# An InferenceService as users wrote them for KServe's TorchServe runtime: a format and a claim, no runtime.
EXISTING = {
    "apiVersion": "serving.kserve.io/v1beta1",
    "kind": "InferenceService",
    "metadata": {"name": "torchserve", "namespace": "default"},
    "spec": {"predictor": {"model": {"modelFormat": {"name": "pytorch"}, "storageUri": "pvc://models/vision"}}},
}
# kserve-tritonserver (config/runtimes/kserve-tritonserver.yaml at that commit) lists pytorch, not auto-selected.
TRITON = {
    "apiVersion": "serving.kserve.io/v1alpha1",
    "kind": "ClusterServingRuntime",
    "metadata": {"name": "kserve-tritonserver"},
    "spec": {
        "supportedModelFormats": [
            {"name": "onnx", "version": "1", "autoSelect": True, "priority": 1},
            {"name": "pytorch", "version": "1"},
        ],
        "protocolVersions": ["v2", "grpc-v2"],
        "containers": [{"name": "kserve-container", "image": "kserve-tritonserver:replace"}],
    },
}


@pytest.fixture(scope="module")
def kserve_torchserve() -> dict:
    if not (SHARED / "kserve-torchserve-runtime.yaml").is_file():
        pytest.skip("../shared/kserve is not beside this checkout: KServe's own TorchServe runtime is in it")
    return yaml.safe_load((SHARED / "kserve-torchserve-runtime.yaml").read_text())


@pytest.fixture(scope="module")
def project(image_sample, tmp_path_factory):
    root = tmp_path_factory.mktemp("selection")
    package_resnet(image_sample, root / "model-store")
    properties.write_config(root / "model-store", root / "config" / "config.properties")
    return root


def exported(project, out: Path, **changes):
    """(runtime, InferenceService, DEPLOY.md, notes) of an export to ``out``."""
    options = kserve.ExportOptions(
        out=str(out),
        name="vision",
        storage_uri="pvc://models/vision",
        config=str(project / "config" / "config.properties"),
        model_store=str(project / "model-store"),
        **changes,
    )
    result = kserve.export(options)
    written = out / "servingruntime.yaml"
    runtime = yaml.safe_load(written.read_text()) if written.exists() else None
    isvc = yaml.safe_load((out / "inferenceservice.yaml").read_text())
    return runtime, isvc, (out / "DEPLOY.md").read_text(), result.notes


def disabled(runtime: dict) -> dict:
    runtime = copy.deepcopy(runtime)
    runtime["spec"]["disabled"] = True
    return runtime


def with_model(isvc: dict, **model) -> dict:
    isvc = copy.deepcopy(isvc)
    isvc["spec"]["predictor"]["model"].update(model)
    return isvc


def test_the_auto_selected_runtime_waits_for_kserve_torchserve_by_default(project, tmp_path, kserve_torchserve):
    """Priority 1 (default), below kserve-torchserve's 2: KServe's TorchServe keeps pytorch while it is
    installed and enabled; disabled or removed, every InferenceService naming only pytorch gets this runtime,
    whatever its protocol, unchanged."""
    runtime, isvc, deploy, notes = exported(project, tmp_path / "auto", engine="tsctl", image=IMAGE, auto_select=True)
    _, torchserve_isvc, _, _ = exported(project, tmp_path / "torchserve")
    torchserve_model = torchserve_isvc["spec"]["predictor"]["model"]
    assert torchserve_model.pop("command")[:2] == ["sh", "-c"]  # the TorchServe image's own tree check, not here
    for model in (torchserve_model, isvc["spec"]["predictor"]["model"]):  # each tree pinned by its own digest
        assert [e["name"] for e in model.pop("env")] == ["TSCTL_TREE_DIGEST"]
    assert isvc == torchserve_isvc and "runtime" not in isvc["spec"]["predictor"]["model"]  # nothing else changes
    assert crds.problems(runtime) == [] and crds.problems(isvc) == [] and notes == []
    assert runtime["spec"]["supportedModelFormats"] == [
        {"name": "pytorch", "version": "1", "autoSelect": True, "priority": 1}
    ]
    assert rules.refused(runtime, [kserve_torchserve, TRITON]) is None  # the webhook admits it beside KServe's own
    protocols = [with_model(EXISTING, protocolVersion=p) for p in ("v2", "grpc-v2")]
    for service in (isvc, EXISTING, *protocols):
        assert rules.picked(service, [kserve_torchserve, TRITON, runtime]) == "kserve-torchserve"
        assert rules.picked(service, [disabled(kserve_torchserve), TRITON, runtime]) == OURS
        assert rules.picked(service, [TRITON, runtime]) == OURS
    assert "once KServe's own kserve-torchserve (priority 2; this one's: 1) is removed or disabled" in deploy
    assert "kubectl patch clusterservingruntime kserve-torchserve --type merge" in deploy


@pytest.mark.parametrize("priority", [3, 1000])
def test_a_higher_priority_takes_pytorch_over_at_once(project, tmp_path, kserve_torchserve, priority):
    runtime, isvc, deploy, _ = exported(
        project, tmp_path / "auto", engine="tsctl", image=IMAGE, auto_select=True, priority=priority
    )
    assert crds.problems(runtime) == [] and rules.refused(runtime, [kserve_torchserve]) is None
    assert rules.candidates(EXISTING, [runtime, kserve_torchserve, TRITON]) == [OURS, "kserve-torchserve"]
    assert rules.picked(with_model(EXISTING, protocolVersion="v2"), [kserve_torchserve, runtime]) == OURS
    assert f"before KServe's own kserve-torchserve (priority 2; this one's: {priority})" in deploy


def test_kserve_torchserves_own_priority_is_refused_beside_it_and_noted(project, tmp_path, kserve_torchserve):
    runtime, _, _, notes = exported(
        project, tmp_path / "auto", engine="tsctl", image=IMAGE, auto_select=True, priority=2
    )
    refused = rules.refused(runtime, [kserve_torchserve])
    assert refused == "same priority assigned for the model format pytorch (kserve-torchserve)"
    assert rules.refused(runtime, [disabled(kserve_torchserve)]) is None
    [note] = notes
    assert note.startswith("--priority 2 is kserve-torchserve's own: KServe's webhook refuses servingruntime.yaml")


def test_a_model_format_version_it_does_not_list_is_no_one_s(project, tmp_path, kserve_torchserve):
    runtime, *_ = exported(project, tmp_path / "auto", engine="tsctl", image=IMAGE, auto_select=True, priority=3)
    one = with_model(EXISTING, modelFormat={"name": "pytorch", "version": "1"})
    assert rules.picked(one, [kserve_torchserve, runtime]) == OURS
    two = with_model(EXISTING, modelFormat={"name": "pytorch", "version": "2"})
    with pytest.raises(ValueError, match="No runtime found"):
        rules.picked(two, [kserve_torchserve, runtime, TRITON])


def test_without_auto_select_only_the_isvc_naming_it_runs_on_it(project, tmp_path, kserve_torchserve):
    runtime, isvc, deploy, _ = exported(project, tmp_path / "named", engine="tsctl", image=IMAGE)
    assert isvc["spec"]["predictor"]["model"]["runtime"] == OURS
    assert rules.picked(isvc, [kserve_torchserve, runtime]) == OURS
    assert rules.candidates(EXISTING, [kserve_torchserve, runtime]) == ["kserve-torchserve"]
    with pytest.raises(ValueError, match="No runtime found"):
        rules.picked(EXISTING, [runtime])  # after KServe's own is gone, only auto-selection serves these
    assert f"The InferenceService names it (`runtime: {OURS}`)" in deploy


def test_a_namespaced_runtime_comes_before_every_cluster_runtime_in_its_namespace(project, tmp_path, kserve_torchserve):
    runtime, *_, deploy, _ = exported(
        project, tmp_path / "ns", engine="tsctl", image=IMAGE, auto_select=True, runtime_kind="ServingRuntime"
    )
    assert crds.problems(runtime) == [] and runtime["metadata"]["namespace"] == "default"
    assert rules.picked(EXISTING, [kserve_torchserve, runtime]) == "tsctl-vision"  # priority 1 < 2, namespace first
    elsewhere = copy.deepcopy(EXISTING)
    elsewhere["metadata"]["namespace"] = "other"
    assert rules.picked(elsewhere, [kserve_torchserve, runtime]) == "kserve-torchserve"
    assert "before any ClusterServingRuntime whatever its priority" in deploy


def test_two_auto_selected_tsctl_runtimes_need_two_priorities(project, tmp_path):
    first, *_ = exported(project, tmp_path / "a", engine="tsctl", image=IMAGE, auto_select=True, priority=3)
    second, *_ = exported(
        project, tmp_path / "b", engine="tsctl", image=IMAGE, auto_select=True, priority=3, namespace="ml"
    )
    assert second["metadata"]["name"] == "tsctl-ml-vision"
    assert rules.refused(second, [first]).startswith("same priority assigned")
    higher, *_ = exported(
        project, tmp_path / "c", engine="tsctl", image=IMAGE, auto_select=True, priority=4, namespace="ml"
    )
    assert rules.refused(higher, [first]) is None
    assert rules.picked(EXISTING, [higher, first]) == "tsctl-ml-vision"


def test_the_rules_model_matches_kserves_own_runtime_file(kserve_torchserve):
    """The model reads KServe's own runtime as KServe's tests expect: it auto-selects pytorch (any version
    given or none, v1, v2 and grpc-v2), never for a model naming another format or runtime."""
    assert rules.picked(EXISTING, [kserve_torchserve]) == "kserve-torchserve"
    assert rules.picked(with_model(EXISTING, protocolVersion="grpc-v2"), [kserve_torchserve]) == "kserve-torchserve"
    with pytest.raises(ValueError, match="No runtime found"):
        rules.picked(with_model(EXISTING, modelFormat={"name": "onnx"}), [kserve_torchserve])
    with pytest.raises(ValueError, match="does not support specified protocol"):
        rules.picked(with_model(EXISTING, runtime="kserve-tritonserver", protocolVersion="v1"), [TRITON])
    assert rules.picked(with_model(EXISTING, runtime="kserve-tritonserver", protocolVersion="v2"), [TRITON])
    assert rules.refused(kserve_torchserve, [kserve_torchserve]) is None  # an update of itself


# ---- the rules model against KServe's own unit tests' cases -----------------------------------------------
# The single-model scenarios of TestGetSupportingRuntimes (pkg/apis/serving/v1beta1/predictor_model_test.go) and
# the cases of TestValidateServingRuntimePriority (pkg/webhook/admission/servingruntime/servingruntime_webhook_test.go)
# at that commit, transcribed as data: the runtimes, the model, and the answer KServe's tests expect.
def runtime(name, formats, protocols=("v1", "v2"), kind="ServingRuntime", **spec) -> dict:
    """A runtime of ``formats``: (name, version or None, autoSelect or None, priority or None) each."""
    entries = []
    for format_name, version, auto, priority in formats:
        entry = {"name": format_name}
        entry.update(
            {k: v for k, v in (("version", version), ("autoSelect", auto), ("priority", priority)) if v is not None}
        )
        entries.append(entry)
    metadata = {"name": name, "creationTimestamp": "0"} | (
        {} if kind == "ClusterServingRuntime" else {"namespace": "default"}
    )
    return {
        "kind": kind,
        "metadata": metadata,
        "spec": {"supportedModelFormats": entries, "protocolVersions": list(protocols), **spec},
    }


SPECS = {
    "tf-runtime": dict(formats=[("tensorflow", "1", True, 1)]),
    "sklearn-runtime": dict(formats=[("sklearn", "0", True, 1)]),
    "pmml-runtime": dict(formats=[("pmml", "4", None, 1)], disabled=True),
    "mlserver-runtime-mms": dict(
        formats=[("sklearn", "0", True, 2), ("xgboost", "1", True, 2), ("lightgbm", "3", True, 2)],
        protocols=("v2",),
        multiModel=True,
    ),
    "mlserver-runtime": dict(formats=[("sklearn", "0", True, 2), ("lightgbm", "3", True, 2)], protocols=("v2",)),
    "xgboost-runtime": dict(formats=[("xgboost", "0", True, 1)], protocols=("v2",)),
    "triton-runtime": dict(
        formats=[("sklearn", "0", True, None), ("triton", "1", True, 1), ("lightgbm", "3", True, None)],
        protocols=("v2",),
    ),
    "test-runtime": dict(formats=[("sklearn", "0", True, None)], protocols=("v2",)),
    "huggingface-multinode-runtime": dict(formats=[("huggingface", "1", True, 2)], workerSpec={}),
}
NAMESPACED = [
    "tf-runtime",
    "sklearn-runtime",
    "pmml-runtime",
    "mlserver-runtime",
    "triton-runtime",
    "test-runtime",
    "huggingface-multinode-runtime",
]
CLUSTER_WIDE = ["mlserver-runtime-mms", "tf-runtime", "xgboost-runtime"]  # named cluster-NAME


def kserve_test_runtimes() -> list:
    def made(name, kind, prefix=""):
        spec = dict(SPECS[name])
        return runtime(prefix + name, spec.pop("formats"), spec.pop("protocols", ("v1", "v2")), kind, **spec)

    return [made(n, "ServingRuntime") for n in NAMESPACED] + [
        made(n, "ClusterServingRuntime", "cluster-") for n in CLUSTER_WIDE
    ]


@pytest.mark.parametrize(
    "format_name, protocol, expected",
    [
        ("tensorflow", None, ["tf-runtime", "cluster-tf-runtime"]),  # BothClusterAndNamespaceRuntimesSupportModel
        ("nonexistent-modelformat", None, []),  # RuntimeNotFound
        ("pmml", None, []),  # ModelFormatWithDisabledRuntimeSpecified
        ("sklearn", None, ["sklearn-runtime"]),  # SMSRuntimeModelFormatSpecified
        ("xgboost", "v2", ["cluster-xgboost-runtime"]),  # RuntimeV2ProtocolSpecified
        ("xgboost", "v1", []),  # RuntimeV1ProtocolNotFound
        ("sklearn", "v2", ["mlserver-runtime", "sklearn-runtime", "test-runtime", "triton-runtime"]),  # Multiple...
    ],
)
def test_the_selection_model_answers_kserves_own_test_cases(format_name, protocol, expected):
    model = {"modelFormat": {"name": format_name}, "storageUri": "s3://test/model"}
    if protocol:
        model["protocolVersion"] = protocol
    isvc = {"metadata": {"namespace": "default"}, "spec": {"predictor": {"model": model}}}
    assert rules.candidates(isvc, kserve_test_runtimes()) == expected


SKLEARN_1 = [("sklearn", "1", True, 1)]


@pytest.mark.parametrize(
    "new, existing, refused",
    [
        (dict(), dict(multiModel=True), False),  # both not MMS... (the existing one is)
        (dict(multiModel=True), dict(multiModel=True), True),  # same priority, both multi-model
        (dict(), dict(disabled=True), False),  # the existing one disabled
        (dict(name="same"), dict(name="same"), False),  # an update of itself
        (dict(protocols=("v1",)), dict(protocols=("v2",)), False),  # no protocol in common
        (dict(), dict(formats=[("lightgbm", "1", True, 1)]), False),  # another format
        (dict(formats=[("sklearn", "1", False, 1)]), dict(), False),  # autoSelect false in the new one
        (dict(formats=[("sklearn", "1", None, 1)]), dict(), False),  # autoSelect not given in the new one
        (dict(), dict(formats=[("sklearn", "1", False, 1)]), False),  # autoSelect false in the existing one
        (dict(formats=[("sklearn", None, True, 1)]), dict(formats=[("sklearn", None, True, 1)]), True),  # no versions
        (dict(formats=[("sklearn", None, True, 2)]), dict(formats=[("sklearn", None, True, 1)]), False),
        (dict(formats=[("sklearn", None, True, 1)]), dict(), False),  # version in one only
        (dict(), dict(formats=[("sklearn", None, True, 1)]), False),
        (dict(), dict(), True),  # the same version and priority
        (dict(), dict(formats=[("sklearn", "2", True, 1)]), False),  # another version
        (dict(formats=[("sklearn", "1", True, None)]), dict(formats=[("sklearn", "1", True, None)]), False),
        (dict(formats=[("sklearn", "1", True, None)]), dict(), False),  # no priority in the new one
        (dict(), dict(formats=[("sklearn", "1", True, None)]), False),  # no priority in the existing one
    ],
)
def test_the_admission_model_answers_kserves_own_test_cases(new, existing, refused):
    def made(values, default_name):
        values = dict(values)
        name = values.pop("name", default_name)
        return runtime(name, values.pop("formats", SKLEARN_1), values.pop("protocols", ("v1", "v2")), **values)

    answer = rules.refused(made(new, "new-runtime"), [made(existing, "existing-runtime")])
    assert (answer is not None) == refused, answer
    # TestValidateModelFormatPrioritySame: one format listed twice, at two priorities or at one
    two = runtime("two", [("sklearn", None, True, 1), ("sklearn", None, True, 2)])
    assert rules.refused(two, []) == "different priorities assigned for the model format sklearn"
    assert rules.refused(runtime("one", [("sklearn", None, True, 2), ("sklearn", None, True, 2)]), []) is None
