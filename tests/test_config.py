"""tsctl config: the snapshot lists every archive with numbers as JSON numbers; KServe's keys."""

import json

from click.testing import CliRunner

from archiver import properties
from archiver.cli import main
from conftest import package_resnet


def test_snapshot_lists_every_archive_with_settings_from_model_config(image_sample, tmp_path):
    store = tmp_path / "model-store"
    package_resnet(image_sample, store)  # model-config.yaml: batchSize 4, maxBatchDelay 50
    package_resnet(image_sample, store, name="second", config_text="batchSize: 8\nmaxWorkers: 2\n")
    package_resnet(image_sample, store, name="plain", config_file=None)
    path = properties.write_config(store, tmp_path / "config" / "config.properties")
    props = properties.read_properties(path)
    snapshot = json.loads(props["model_snapshot"])
    assert snapshot["modelCount"] == 3
    models = snapshot["models"]
    assert models["resnet18"]["1.0"] == {
        "defaultVersion": True,
        "marName": "resnet18.mar",
        "minWorkers": 1,
        "maxWorkers": 1,
        "batchSize": 4,
        "maxBatchDelay": 50,
        "responseTimeout": 120,
    }
    assert models["second"]["1.0"]["batchSize"] == 8 and models["second"]["1.0"]["maxWorkers"] == 2
    assert models["plain"]["1.0"]["batchSize"] == 1
    assert '"batchSize":4' in props["model_snapshot"]  # a number, not "4"


def test_kserve_values_are_in_the_file(image_sample, tmp_path):
    package_resnet(image_sample, tmp_path / "store")
    props = properties.read_properties(properties.write_config(tmp_path / "store", tmp_path / "c.properties"))
    assert props["model_store"] == "/mnt/models/model-store"
    assert props["inference_address"] == "http://0.0.0.0:8085"
    assert props["enable_envvars_config"] == "true"
    assert props["disable_token_authorization"] == "true"
    assert props["enable_model_api"] == "false"
    assert props["metrics_mode"] == "prometheus"


def test_options_override_model_config_and_cli_reports(image_sample, tmp_path):
    package_resnet(image_sample, tmp_path / "store")
    out = tmp_path / "config.properties"
    result = CliRunner().invoke(
        main,
        [
            "config",
            "--model-store",
            str(tmp_path / "store"),
            "--output",
            str(out),
            "--batch-size",
            "16",
            "--max-batch-delay",
            "5",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "resnet18: resnet18.mar workers 1-1, batch 16 / 5 ms" in result.output
    entry = json.loads(properties.read_properties(out)["model_snapshot"])["models"]["resnet18"]["1.0"]
    assert (entry["batchSize"], entry["maxBatchDelay"]) == (16, 5)


def test_empty_store_is_a_clear_error(tmp_path):
    (tmp_path / "store").mkdir()
    result = CliRunner().invoke(
        main, ["config", "--model-store", str(tmp_path / "store"), "--output", str(tmp_path / "c")]
    )
    assert result.exit_code == 2
    assert "holds no model archives: build one with 'tsctl package'" in result.output
    assert not (tmp_path / "c").exists()


def test_unknown_config_properties_key_is_refused_with_the_nearest_name(image_sample, tmp_path):
    package_resnet(image_sample, tmp_path / "store")
    path = properties.write_config(tmp_path / "store", tmp_path / "config.properties")
    props = properties.read_properties(path)
    assert props["allowed_urls"] == "file:///mnt/models/model-store/.*"
    properties.check_keys(props, path)  # the generated file is clean
    props["inferense_address"] = props.pop("inference_address")
    path.write_text(properties.render(props))
    result = CliRunner().invoke(
        main, ["serve", "--config", str(path), "--model-store", str(tmp_path / "store"), "--home", str(tmp_path / "h")]
    )
    assert result.exit_code == 2
    assert f"{path}: unknown key 'inferense_address'; did you mean 'inference_address'?" in result.output
    assert not (tmp_path / "h").exists()
