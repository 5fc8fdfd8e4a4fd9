"""Golden answers (package --golden, tsctl verify, handler.verify_on_start) against the real thing:
verify passes on an untouched archive in-process and served (TorchServe, the KServe engine on v1 and
v2), and fails, naming the input, on a tampered golden answer and on a server whose archive has other
preprocessing settings; a worker with verify_on_start and skewed preprocessing never becomes READY
and ``tsctl serve`` says why; a KServe transformer verifying on start refuses a predictor with other
weights. ``make test`` runs the in-process tests; the served ones run in ``make matrix``."""

import json

import pytest
from click.testing import CliRunner

from archiver import engines, golden, mar, server
from archiver.cli import main
from handlers import golden as answers
from helpers import archive_reading
from helpers.models import export_tree, package_resnet
from helpers.paths import short_tmp
from helpers.servers import RunningServer, Transformer, kserve_runtime
from samples.image_model import sample_jpeg

CONFIG = "batchSize: 4\nmaxBatchDelay: 50\nhandler:\n  top_k: 3\n"
SKEWED = CONFIG + "  mean: [0.5, 0.5, 0.5]\n  std: [0.5, 0.5, 0.5]\n"  # another normalisation, same weights


def tsctl(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def package_args(sample, store, name, config, *more):
    return [
        "package",
        "--model-name",
        name,
        "--serialized-file",
        sample / "resnet18.pt",
        "--model-file",
        sample / "model.py",
        "--handler",
        "image_classifier",
        "--extra-files",
        sample / "index_to_name.json",
        "--config-file",
        config,
        "--export-path",
        store,
        "--force",
        *more,
    ]


@pytest.fixture(scope="module")
def built(image_sample, tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    inputs = root / "inputs"
    inputs.mkdir()
    for seed in range(3):
        (inputs / f"photo{seed}.jpg").write_bytes(sample_jpeg(seed, (400 + 40 * seed, 300)))
    (inputs / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")  # a refusal is a golden answer too
    config, skewed = root / "config.yaml", root / "skewed.yaml"
    config.write_text(CONFIG)
    skewed.write_text(SKEWED)
    result = tsctl(*package_args(image_sample, root / "model-store", "resnet18", config, "--golden", inputs))
    assert result.exit_code == 0, result.output
    assert "golden: 4 answers recorded (statuses [200, 400])" in result.output
    # The same weights with other preprocessing, under the same name in a store of its own.
    result = tsctl(*package_args(image_sample, root / "skewed-store", "resnet18", skewed))
    assert result.exit_code == 0, result.output
    return root


def test_the_archive_carries_its_golden_answers_and_inspect_shows_them(built):
    archive = built / "model-store" / "resnet18.mar"
    recorded = answers.read(archive)
    assert [c["name"] for c in recorded["cases"]] == ["broken.png", "photo0.jpg", "photo1.jpg", "photo2.jpg"]
    assert [c["status"] for c in recorded["cases"]] == [400, 200, 200, 200]
    fingerprint = recorded["fingerprint"]
    assert fingerprint["handler"] == "handlers.image.ImageClassifier" and fingerprint["settings"]["top_k"] == 3
    assert fingerprint["versions"]["torch"] and len(fingerprint["weights_sha256"]) == 64
    shown = tsctl("inspect", archive)
    assert shown.exit_code == 0 and "golden: 4 answers (broken.png, photo0.jpg" in shown.output


def test_verify_passes_in_process_and_fails_on_a_tampered_answer_naming_the_input(built, tmp_path):
    archive = built / "model-store" / "resnet18.mar"
    result = tsctl("verify", archive)
    assert result.exit_code == 0, result.output
    assert "4 of 4 golden answers match (in-process)" in result.output
    recorded = answers.read(archive)
    label = next(iter(recorded["cases"][2]["answer"]))
    recorded["cases"][2]["answer"][label] += 0.01
    tampered = tmp_path / "resnet18.mar"
    mar.rewrite_archive(archive, tampered, {answers.GOLDEN: json.dumps(recorded).encode()})
    result = tsctl("verify", tampered, "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    assert report["checked"] == 4 and len(report["problems"]) == 1
    assert report["problems"][0].startswith(f"photo1.jpg: the answer[{label!r}] is ")


def test_a_failed_golden_run_leaves_no_archive(image_sample, built, tmp_path):
    config = built / "config.yaml"
    missing = tsctl(*package_args(image_sample, tmp_path / "store", "x", config, "--golden", tmp_path / "nothing"))
    assert missing.exit_code == 2 and "--golden" in missing.output and "Traceback" not in missing.output
    garbage = tmp_path / "resnet18.pt"
    garbage.write_bytes(b"not weights at all")
    args = package_args(image_sample, tmp_path / "store", "x", config, "--golden", built / "inputs")
    args[args.index(image_sample / "resnet18.pt")] = garbage
    result = tsctl(*args)
    assert result.exit_code == 2 and "resnet18.pt" in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "store").exists() or not list((tmp_path / "store").iterdir())


@pytest.mark.matrix
def test_verify_against_servers_passes_and_catches_other_preprocessing(built):
    archive = built / "model-store" / "resnet18.mar"
    with RunningServer(built / "model-store") as srv:
        result = tsctl("verify", archive, "--url", srv.inference)
        assert result.exit_code == 0, result.output
    engine = engines.ENGINES["tsctl"].start(built / "model-store", home=short_tmp("gk-"))
    try:
        for protocol in ("v1", "v2"):
            report = golden.verify(archive, engine.inference, protocol)
            assert report.problems == [] and report.checked == 4, (protocol, report)
        result = tsctl("verify", archive, "--served", "--home", engine.home)  # the server tsctl serve records
        assert result.exit_code == 0 and f"4 of 4 golden answers match ({engine.inference} (ts))" in result.output
    finally:
        server.stop(engine)
    with RunningServer(built / "skewed-store") as skewed:  # same name, same weights, other normalisation
        result = tsctl("verify", archive, "--url", skewed.inference)
    assert result.exit_code == 1, result.output
    mismatches = [line for line in result.output.splitlines() if line.startswith("mismatch: ")]
    assert {line.split(":")[1].strip() for line in mismatches} == {"photo0.jpg", "photo1.jpg", "photo2.jpg"}


@pytest.mark.matrix
def test_a_worker_verifying_on_start_with_skewed_preprocessing_never_becomes_ready(built, tmp_path):
    """The skewed archive with the original's golden answers and verify_on_start: TorchServe's worker
    refuses to start, and serve reports the drift, naming an input."""
    store = tmp_path / "model-store"
    store.mkdir()
    recorded = answers.read(built / "model-store" / "resnet18.mar")
    skewed = built / "skewed-store" / "resnet18.mar"
    config = (SKEWED + "  verify_on_start: true\n").encode()
    config_name = archive_reading.manifest(skewed)["model"]["configFile"]
    golden_data = json.dumps(recorded).encode()
    mar.rewrite_archive(skewed, store / "resnet18.mar", {answers.GOLDEN: golden_data, config_name: config})
    with pytest.raises(server.ServerFailure) as failed:
        with RunningServer(store, timeout=120):
            pass
    message = str(failed.value)
    assert "DriftError" in message and "golden answers drifted" in message and "photo0.jpg" in message
    # The untouched archive, verifying on start, comes up.
    good = tmp_path / "good-store"
    good.mkdir()
    original = built / "model-store" / "resnet18.mar"
    config_name = archive_reading.manifest(original)["model"]["configFile"]
    mar.rewrite_archive(original, good / "resnet18.mar", {config_name: (CONFIG + "  verify_on_start: true\n").encode()})
    with RunningServer(good, timeout=120) as srv:
        assert "resnet18" in srv.models


# ---- a KServe transformer checks its predictor ----------------------------------------------------------
def predictor_tree(image_sample, root, weights):
    """An exported tree serving resnet18_t: the tensor handler on ``weights``, as a predictor."""
    root.mkdir(parents=True)
    tensor = root / "tensor.yaml"
    tensor.write_text("batchSize: 4\nmaxBatchDelay: 50\nhandler:\n  input_shape: [3, 224, 224]\n")
    package_resnet(
        image_sample,
        root / "model-store",
        name="resnet18_t",
        handler="tensor",
        config_file=str(tensor),
        extra_files=[],
        serialized_file=str(weights),
    )
    return export_tree(root)


@pytest.mark.matrix
def test_a_transformer_verifying_on_start_checks_its_predictor(built, image_sample, tmp_path):
    import torch

    other = tmp_path / "other.pt"  # another version of the model: the same architecture, other weights
    state = torch.load(image_sample / "resnet18.pt", weights_only=True)
    torch.save({k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v for k, v in state.items()}, other)
    transformer_archive = built / "model-store" / "resnet18.mar"
    for weights, matches in ((image_sample / "resnet18.pt", True), (other, False)):
        tree = predictor_tree(image_sample, tmp_path / ("same" if matches else "other"), weights)
        predictor = kserve_runtime(tree, "kserve")
        try:
            host = predictor.inference.split("://", 1)[1]
            transformer = Transformer(transformer_archive, "resnet18_t", host, "v1", "--verify_on_start")
            try:
                if matches:
                    assert transformer.url, transformer.output[-2000:]
                    assert "golden answers verified" in transformer.output
                    # tsctl verify through the transformer and its predictor, KServe v1
                    report = golden.verify(transformer_archive, transformer.url, "v1", model="resnet18_t")
                    assert report.checked == 4 and report.problems == [], report
                else:
                    assert transformer.exit_code not in (None, 0), transformer.output[-2000:]
                    assert "golden answers drifted through the predictor: photo0.jpg" in transformer.output
                    assert "the predictor differs" in transformer.output
            finally:
                transformer.stop()
        finally:
            server.stop(predictor)
