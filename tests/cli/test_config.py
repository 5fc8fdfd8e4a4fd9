"""tsctl config: the snapshot lists every archive with numbers as JSON numbers; KServe's keys; the
per-model install off (on in what tsctl export kserve writes); the archives KServe's image lacks a
package for, named without resolving anything."""

import json
import shutil

import pytest
from click.testing import CliRunner

from archiver import properties
from archiver.cli import main
from archiver.export.kserve import export as kserve
from helpers.models import package_resnet, package_text


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


def test_the_per_model_install_is_off_here_and_on_in_the_export(image_sample, tmp_path):
    """The environment running torchserve has the packages; KServe's image gets them from the export."""
    package_resnet(image_sample, tmp_path / "store")
    config = properties.write_config(tmp_path / "store", tmp_path / "config" / "config.properties")
    text = config.read_text()
    assert properties.read_properties(config)["install_py_dep_per_model"] == "false"
    assert text.startswith("# Written by tsctl config. Locally, where the archives' packages are installed:\n")
    assert "#   torchserve --start --ncs --model-store model-store --ts-config config/config.properties\n" in text
    options = dict(name="vision", storage_uri="pvc://models/v", config=str(config), model_store=str(tmp_path / "store"))
    kserve.export(kserve.ExportOptions(out=str(tmp_path / "out"), **options))
    exported = tmp_path / "out" / "config" / "config.properties"
    assert properties.read_properties(exported)["install_py_dep_per_model"] == "true"
    assert exported.read_text().startswith("# Written by tsctl export kserve for KServe (mounted at /mnt/models)")
    assert "# install_py_dep_per_model=true: TorchServe installs each archive" in exported.read_text()
    assert properties.read_properties(config)["install_py_dep_per_model"] == "false"  # the source is not changed
    # the tsctl engine's export: a config tsctl config did not write is not said to be tsctl config's
    mine = tmp_path / "mine.properties"
    mine.write_text("# my own\n" + "\n".join(line for line in text.splitlines() if not line.startswith("#")) + "\n")
    options.update(config=str(mine), engine="tsctl", image="registry.example.com/e:1")
    kserve.export(kserve.ExportOptions(out=str(tmp_path / "engine"), **options))
    header = [
        line
        for line in (tmp_path / "engine" / "config" / "config.properties").read_text().splitlines()
        if line.startswith("#")
    ]
    assert header == [
        "# Written by tsctl export kserve for KServe (mounted at /mnt/models), served by tsctl engine:",
        "# the keys of mine.properties (--config), its model_snapshot checked against the model store.",
    ]


LACKS = "which KServe's torchserve-kfs:0.9.0 image lacks"
INSTEAD = ": for KServe, export with 'tsctl export kserve' (it installs the archive's locked requirements)"


@pytest.fixture(scope="module")
def mixed_store(image_sample, text_samples, tmp_path_factory):
    """Archives whose requirements torchserve-kfs:0.9.0 has, and some it lacks."""
    root = tmp_path_factory.mktemp("gaps")
    store = root / "model-store"
    package_resnet(image_sample, store)  # no requirements
    needs = {
        "onnx_like": "onnxruntime>=1.16\n",
        "markers": "numpy>=1.20\nscipy>=1; python_version >= '3.11'\n--no-index\n",  # 1.24.3; not for 3.9
        "newer": "Pillow>=10\ntransformers>=4.40\n",  # pillow 10.0.1 is there; transformers 4.34.0
        "extras": "transformers[torch]>=4.34\n",
    }
    for name, text in needs.items():
        (root / f"{name}.txt").write_text(text)
        package_resnet(image_sample, store, name=name, requirements_file=str(root / f"{name}.txt"))
    package_text(text_samples, store, "sentiment", "text_classifier", "classifier")  # transformers>=4.34,<6
    package_text(text_samples, store, "minilm", "text_embedder", "minilm")  # + sentence-transformers>=3,<7
    lower = root / "lower"  # lower-casing: only sentence-transformers does it
    shutil.copytree(text_samples / "minilm", lower / "minilm")
    settings = json.loads((lower / "minilm" / "sentence_bert_config.json").read_text())
    (lower / "minilm" / "sentence_bert_config.json").write_text(json.dumps({**settings, "do_lower_case": True}))
    package_text(lower, store, "minilm_lower", "text_embedder", "minilm")
    return store


def test_config_names_each_archive_whose_requirements_the_kserve_image_lacks(mixed_store, tmp_path):
    result = CliRunner().invoke(main, ["config", "--model-store", str(mixed_store), "--output", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note: ")]
    assert notes == [
        f"note: extras needs transformers[torch]>=4.34, {LACKS} (it has transformers 4.34.0 without its "
        f"extras){INSTEAD}",
        f"note: minilm_lower needs sentence-transformers>=3,<7, {LACKS}{INSTEAD}",
        f"note: newer needs transformers>=4.40, {LACKS} (it has transformers 4.34.0){INSTEAD}",
        f"note: onnx_like needs onnxruntime>=1.16, {LACKS}{INSTEAD}",
    ]
    # minilm asks for sentence-transformers too, but its modules are computed without it: it loads there
    newer = properties.kserve_gaps(mixed_store, "torchserve-kfs:0.12.0")  # transformers 4.44.2
    assert [gap.split(" needs ")[0] for gap in newer] == ["extras", "minilm_lower", "onnx_like"]
