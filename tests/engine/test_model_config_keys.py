"""Every key of TorchServe 0.12's model-config.yaml: honoured, refused or noted (serving/model_config_keys.py),
the table in docs/engines.md the same, and describe giving the values in force, on a served engine."""

import re

import pytest

from archiver import properties
from archiver.model_config import WORKER_KEYS
from helpers.engine import Engine
from helpers.paths import ROOT
from samples import ts_examples, ts_stateful
from serving import model_config_keys
from serving.model_config_keys import KEYS

NOTED = """\
minWorkers: 1
maxWorkers: 1
jobQueueSize: 3
startupTimeout: 200
useJobTicket: true
useVenv: true
clientTimeoutInMills: 5000
"""


def test_every_key_torchserve_reads_has_a_state_and_the_docs_say_the_same():
    assert set(KEYS) == set(WORKER_KEYS)
    text = (ROOT / "docs" / "engines.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (honoured|noted|refused) \|", text, re.MULTILINE))
    assert rows == {key: state for key, (state, _) in KEYS.items()}


@pytest.mark.parametrize("key, value", [("asyncCommunication", True), ("parallelType", "pp")])
def test_a_refused_key_is_one_line_naming_it(key, value):
    config = {key: value, "parallelLevel": 2} if key == "parallelType" else {key: value}
    if key in model_config_keys.REFUSED_ELSEWHERE:
        from serving import gpus

        with pytest.raises(gpus.PlacementError, match=key):
            gpus.model_devices(config, 0, "x's model-config.yaml")
        return
    with pytest.raises(model_config_keys.ModelConfigRefused, match=f"x's model-config.yaml: {key} is True"):
        model_config_keys.check(config, "x's model-config.yaml")


@pytest.mark.parametrize(
    "config, said",
    [  # what a new user wrote (issue #44's newcomer); served unchecked before
        ({"sequenceBatching": True, "sequenceMaxIdleMSec": "1 min"}, "'sequenceMaxIdleMSec' must be a whole number"),
        ({"sequenceBatching": "yes"}, "'sequenceBatching' must be a bool, got 'yes'"),
        ({"continuousBatching": "true"}, "'continuousBatching' must be a bool, got 'true'"),
        ({"sequenceTimeoutMSec": -1}, "'sequenceTimeoutMSec' must not be negative, got -1"),
    ],
)
def test_a_value_of_another_type_is_refused_in_one_line(config, said):
    """TorchServe's ModelConfig.build ignores such a value with a log line and serves its default (not
    stateful, not continuous): the engine, tsctl run and tsctl package refuse it, naming the file and key."""
    with pytest.raises(model_config_keys.ModelConfigRefused) as refused:
        model_config_keys.check(config, "x's model-config.yaml")
    assert str(refused.value).startswith("x's model-config.yaml: ") and said in str(refused.value)


def test_a_near_miss_and_a_bound_past_the_engines_are_notes():
    notes = model_config_keys.check({"sequenceMaxIdleMsec": 10, "maxNumSequence": 10_000_000}, "x")
    assert notes == [
        "x: unknown key 'sequenceMaxIdleMsec'; did you mean 'sequenceMaxIdleMSec'? (TorchServe "
        "ignores 'sequenceMaxIdleMsec')",
        "x: maxNumSequence 10000000 is above the engine's bound: 65536 sequences open at most (docs/limits.md)",
    ]


def test_the_engine_serves_the_values_in_force_and_notes_the_rest(tmp_path):
    """An archive with a model-config.yaml: responseTimeout 120 (TorchServe's createModel) though
    default_response_timeout is 300; its startupTimeout and jobQueueSize; useJobTicket, useVenv and
    clientTimeoutInMills noted in one line each, and described as the engine does them."""
    store = tmp_path / "model-store"
    config = tmp_path / "model-config.yaml"
    config.write_text(NOTED)
    case = ts_examples.Example("noted", str(ts_stateful.STAND_INS / "running_sum.py"), [], config_file=config)
    ts_examples.package(case, "torch-model-archiver", store)
    extra = {"disable_token_authorization": "true", "default_response_timeout": "300"}
    properties.write_config(store, tmp_path / "config" / "config.properties", extra=extra)
    engine = Engine(tmp_path).wait_ready()
    try:
        status, [described] = engine.get("/models/noted")
        assert status == 200
        assert {
            k: described[k]
            for k in (
                "responseTimeout",
                "startupTimeout",
                "useJobTicket",
                "useVenv",
                "clientTimeoutInMills",
                "continuousBatching",
            )
        } == {
            "responseTimeout": 120,
            "startupTimeout": 200,
            "useJobTicket": False,
            "useVenv": False,
            "clientTimeoutInMills": 0,
            "continuousBatching": False,
        }
        assert described["jobQueueStatus"]["remainingCapacity"] == 3
        output = engine.output()
        for key in ("useJobTicket", "useVenv", "clientTimeoutInMills"):
            assert f"noted.mar's model-config.yaml: {key}:" in output, output[-3000:]
    finally:
        assert engine.stop() == 0


@pytest.mark.parametrize(
    "config_text, noted, refused",
    [
        (
            "batchSize: 1\nuseVenv: true\n",
            "custom.mar's model-config.yaml: useVenv: True is not done by the tsctl",
            None,
        ),
        (
            "batchSize: 1\nasyncCommunication: true\n",
            None,
            "custom.mar's model-config.yaml: asyncCommunication is True",
        ),
    ],
)
def test_the_engine_export_notes_and_refuses_the_same_keys(image_sample, tmp_path, config_text, noted, refused):
    """tsctl export kserve --engine tsctl says at export what the engine would say at load; the TorchServe
    export nothing (TorchServe does them)."""
    from archiver import properties as config_properties
    from archiver.errors import UserError
    from archiver.export.kserve import export as kserve
    from helpers.models import package_resnet

    store = tmp_path / "model-store"
    handler = tmp_path / "my_handler.py"
    handler.write_text("def handle(data, context):\n    return data\n")
    package_resnet(image_sample, store, name="custom", handler=str(handler), config_text=config_text)
    config_properties.write_config(store, tmp_path / "config" / "config.properties")
    base = dict(
        name="vision",
        storage_uri="pvc://models/tsctl",
        config=str(tmp_path / "config" / "config.properties"),
        model_store=str(store),
    )
    engine = dict(base, out=str(tmp_path / "engine"), engine="tsctl", image="registry.local/tsctl:1")
    if refused:
        with pytest.raises(UserError, match=refused):
            kserve.export(kserve.ExportOptions(**engine))
        return
    assert any(noted in note for note in kserve.export(kserve.ExportOptions(**engine)).notes)
    torchserve = kserve.export(kserve.ExportOptions(**base, out=str(tmp_path / "torchserve")))
    assert not any("useVenv" in note for note in torchserve.notes)
