"""``tsctl shadow``: the same inputs to a current and a candidate server, on real servers. A candidate with
other weights under the same archive name is caught and an identical one passes: on two tsctl engines in
the default run (a tensor model), on TorchServe against the tsctl engine in ``make matrix`` (an image
classifier: top-1 labels). Bad input (a server that is not there, one without the model, the other
protocol, a threshold out of range) is one line each."""

import concurrent.futures
import json
import shutil

import pytest
import torch
from click.testing import CliRunner

from archiver import engines, server, shadow
from archiver.cli import main
from helpers.hostile import Linear, build
from helpers.paths import short_tmp
from helpers.servers import RunningServer

CONFIG = "batchSize: 1\nmaxBatchDelay: 10\n"


def tsctl(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def weights(path, module_class, seed: int):
    """``module_class`` initialised from ``seed``, scripted: the same architecture, other weights per seed."""
    torch.manual_seed(seed)
    torch.jit.script(module_class().eval()).save(str(path))
    return path


def stores(root, name, handler, module_class, golden_inputs):
    """root/current/store/NAME.mar (seed 0, with golden answers), root/other (seed 1) and root/same (seed 0):
    one archive name in every store."""
    for folder, seed in (("current", 0), ("other", 1), ("same", 0)):
        (root / folder).mkdir()
        trained = weights(root / folder / f"{name}.pt", module_class, seed)
        build(root / folder, name, handler, trained, CONFIG, golden_inputs if folder == "current" else None)
    return {folder: root / folder / "store" for folder in ("current", "other", "same")}


def engine(store):
    return engines.ENGINES["tsctl"].start(store, home=short_tmp("sh-"), timeout=120)


@pytest.fixture(scope="module")
def tensors(tmp_path_factory):
    """The tensor model (4 numbers in, 2 out) in three stores, two golden inputs and a recorded sample."""
    root = tmp_path_factory.mktemp("shadow")
    golden_inputs = root / "golden"
    golden_inputs.mkdir()
    (golden_inputs / "a.json").write_text("[[1, 2, 3, 4]]")
    (golden_inputs / "b.json").write_text('{"instances": [[0, 0, 1, 1]]}')
    sample = root / "sample"
    sample.mkdir()
    for index in range(3):
        (sample / f"request{index}.json").write_text(json.dumps([[index, 1.5, -2, 0.25 * index]]))
    return root, stores(root, "tensor", "tensor", lambda: torch.nn.Linear(4, 2), golden_inputs), sample


def test_other_weights_are_caught_and_the_same_pass_on_two_engines(tensors):
    """Three tsctl engines: the current one, one with other weights, one with the same (~8 s)."""
    root, found, sample = tensors
    archive = found["current"] / "tensor.mar"
    with concurrent.futures.ThreadPoolExecutor(3) as pool:  # started side by side: each waits for its worker
        starting = {folder: pool.submit(engine, store) for folder, store in found.items()}
    started = {folder: future.result() for folder, future in starting.items() if not future.exception()}
    try:
        assert len(started) == 3, [future.exception() for future in starting.values()]
        current = started["current"].inference
        result = tsctl("shadow", archive, "--current", current, "--candidate", started["other"].inference)
        assert result.exit_code == 1, result.output
        lines = result.output.strip().splitlines()
        assert [line.split()[:2] for line in lines[:2]] == [["DISAGREE", "a.json"], ["DISAGREE", "b.json"]]
        assert "max |diff| " in lines[0] and "cosine " in lines[0]
        assert lines[-1].startswith("FAIL: 0 of 2 inputs agree within atol 0.0001 (2 disagree")
        result = tsctl("shadow", archive, "--current", current, "--candidate", started["same"].inference, "--json")
        assert result.exit_code == 0, result.output
        report = json.loads(result.output)
        assert report["passed"] and report["checked"] == 2 and report["disagreed"] == 0
        assert all(c["max_abs_diff"] < 1e-6 and c["cosine"] > 0.999999 for c in report["inputs"]), report
        # A recorded sample of request bodies instead of the golden inputs, over KServe v1 on both
        args = ["--inputs", sample, "--protocol", "v1", "--candidate", started["other"].inference]
        result = tsctl("shadow", archive, "--current", current, *args, "--max-disagree", "100%")
        assert result.exit_code == 2 and "could never fail" in result.output
        result = tsctl("shadow", archive, "--current", current, *args)
        assert result.exit_code == 1 and "FAIL: 0 of 3 inputs agree" in result.output, result.output
        # The bad inputs, each one line
        for extra, said in (
            (["--candidate", "127.0.0.1:1"], "--candidate http://127.0.0.1:1: could not reach it"),
            (["--candidate", started["same"].inference, "--model", "resnet"], "serves no model resnet"),
            (
                ["--candidate", started["same"].inference, "--protocol-candidate", "v2", "--model-candidate", "x"],
                "--candidate " + started["same"].inference,
            ),
            (["--candidate", started["same"].inference, "--max-disagree", "-1"], "--max-disagree -1 is out of range"),
            (["--candidate", current], "the same server"),
        ):
            result = tsctl("shadow", archive, "--current", current, *extra)
            assert result.exit_code in (1, 2) and said in result.output, (extra, result.output)
            assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    finally:
        for srv in started.values():
            server.stop(srv)
            shutil.rmtree(srv.home, ignore_errors=True)


def test_the_threshold_and_the_measures():
    """--max-disagree as a count or a percentage; top-1 and differences of probabilities, cosine of vectors."""
    assert shadow.allowed_disagreements("0", 4) == 0 and shadow.allowed_disagreements("25%", 8) == 2
    assert shadow.allowed_disagreements("10%", 5) == 0 and shadow.allowed_disagreements(" 3 ", 4) == 3
    for text, said in (("4", "could never fail"), ("101%", "out of range"), ("x", "not a number"), ("nan%", "range")):
        with pytest.raises(shadow.UserError, match=said):
            shadow.allowed_disagreements(text, 4)
    top1, diff, cosine = shadow.distance({"cat": 0.7, "dog": 0.2}, {"dog": 0.6, "cat": 0.3, "fox": 0.1})
    assert top1 == ("cat", "dog") and diff == pytest.approx(0.4) and cosine is None
    _, diff, cosine = shadow.distance([[1.0, 0.0]], [[0.0, 2.0]])
    assert diff == 2.0 and cosine == 0.0
    assert shadow.distance("a label", "a label") == (None, None, None)
    same = shadow.compare("x", (200, {"cat": 0.5}), (200, {"cat": 0.50001}), 1e-4)
    assert same.agree and same.top1 == ("cat", "cat")
    moved = shadow.compare("x", (200, {"cat": 0.5}), (200, {"cat": 0.6}), 1e-4)
    assert not moved.agree and "the answer['cat'] is 0.6, was 0.5" in moved.difference
    failed = shadow.compare("x", (200, [1.0]), (503, {"message": "down"}), 1e-4)
    assert not failed.agree and failed.max_abs_diff is None and "status 503" in shadow.line(failed)


@pytest.mark.matrix
def test_torchserve_against_the_engine_catches_an_image_classifier_with_other_weights(tmp_path):
    """TorchServe 0.12 serves the current image classifier, the tsctl engine the candidates (~40 s)."""
    from samples.image_model import sample_jpeg

    golden_inputs = tmp_path / "golden"
    golden_inputs.mkdir()
    for seed in range(3):
        (golden_inputs / f"photo{seed}.jpg").write_bytes(sample_jpeg(seed, (64 + 16 * seed, 48)))
    found = stores(tmp_path, "image", "image_classifier", Linear, golden_inputs)
    archive = found["current"] / "image.mar"
    candidates = {folder: engine(found[folder]) for folder in ("other", "same")}
    try:
        with RunningServer(found["current"]) as current:
            results = {
                folder: tsctl("shadow", archive, "--current", current.inference, "--candidate", srv.inference, "--json")
                for folder, srv in candidates.items()
            }
    finally:
        for srv in candidates.values():
            server.stop(srv)
    same, other = (json.loads(results[folder].output) for folder in ("same", "other"))
    assert results["same"].exit_code == 0 and same["passed"] and same["checked"] == 3, same
    assert all(c["top1"][0] == c["top1"][1] and c["max_abs_diff"] < 1e-6 for c in same["inputs"]), same
    assert results["other"].exit_code == 1 and other["disagreed"] == 3, other
    assert all(c["max_abs_diff"] is None or c["max_abs_diff"] > 1e-3 for c in other["inputs"]), other
