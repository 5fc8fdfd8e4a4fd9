"""With TorchServe's token authorization on, tsctl predict and bench read the key file and still work."""

import re
from pathlib import Path

from click.testing import CliRunner

from archiver import engines, server
from archiver.cli import main
from helpers.models import package_resnet
from helpers.servers import RunningServer, post


def test_predict_and_bench_use_the_key_file(image_sample, jpegs, tmp_path):
    store = tmp_path / "model-store"
    package_resnet(image_sample, store)
    image = tmp_path / "a.jpg"
    image.write_bytes(jpegs[0])
    with RunningServer(store, env={"TS_DISABLE_TOKEN_AUTHORIZATION": "false"}) as srv:
        status, body = post(srv, "resnet18", jpegs[0], "image/jpeg")  # no token: TorchServe 0.12 says 400
        assert (status, body["type"]) == (400, "InvalidKeyException"), body
        assert server.read_keys(srv.home)["inference"]
        assert engines.ENGINES["torchserve"].key_file(srv) == Path(srv.home) / "key_file.json"  # serve's line
        result = CliRunner().invoke(main, ["predict", "resnet18", str(image), "--home", srv.home])
        assert result.exit_code == 0 and ": 200 {" in result.output, result.output
        result = CliRunner().invoke(
            main, ["bench", "resnet18", "--input", str(image), "--requests", "4", "--home", srv.home]
        )
        assert result.exit_code == 0 and "0 errors" in result.output, result.output


def test_a_key_file_still_being_written_has_no_keys_yet(tmp_path):
    """TorchServe writes key_file.json while tsctl polls for READY: empty or cut short, it is retried."""
    key_file = tmp_path / "key_file.json"
    for partial in ("", '{"management": {"key": "ab'):
        key_file.write_text(partial)
        assert server.read_keys(tmp_path) == {}
    key_file.write_text('{"management": {"key": "m"}, "inference": {"key": "i"}}')
    assert server.read_keys(tmp_path) == {"management": "m", "inference": "i"}


def test_on_the_engine_too_with_the_batch_sweep(tmp_path):
    """The tsctl engine with TorchServe's defaults (tokens on, no disable_token_authorization in the config):
    serve, predict, bench and bench --sweep-batch (through its management API, --enable-model-api) read
    the key file the engine writes in its home, as for TorchServe."""
    from helpers.management import build_store, write_config
    from helpers.paths import short_tmp

    build_store(tmp_path)
    config = write_config(tmp_path, enable_model_api="false")
    home, text = short_tmp("te-"), tmp_path / "in.txt"
    text.write_text("hello")
    runner = CliRunner()
    where = ["--home", str(home)]
    serve = ["serve", "--engine", "tsctl", "--config", str(config), "--model-store", str(tmp_path / "model-store")]
    result = runner.invoke(main, [*serve, *where, "--enable-model-api"])
    try:
        assert result.exit_code == 0, result.output
        srv = server.read_state(home)
        assert srv.management != srv.inference and server.read_keys(home)["management"]
        said = f"token authorization is on: the keys are in {home.resolve() / 'key_file.json'} ("
        assert result.output.count(said) == 1, result.output
        assert server.request(f"{srv.inference}/predictions/echo", b"x", "POST", timeout=30)[0] == 400  # no key
        result = runner.invoke(main, ["predict", "echo", str(text), *where])
        assert result.exit_code == 0 and '"echo": "hello"' in result.output, result.output
        sweep = ["bench", "echo", "--input", str(text), "--requests", "8", "--sweep-batch", "1,4", "--sweep-delay"]
        sweep.append("10")
        result = runner.invoke(main, [*sweep, *where])
        assert result.exit_code == 0 and "<- recommended" in result.output, result.output
        best = int(re.search(r"now runs with batchSize (\d+)", result.output).group(1))
        status, described = server.request(
            f"{srv.management}/models/echo", headers=srv.headers("management"), timeout=30
        )
        assert status == 200 and described[0]["batchSize"] == best and described[0]["workers"][0]["status"] == "READY"
    finally:
        runner.invoke(main, ["stop", *where])


def test_verify_sends_the_inference_key(tmp_path):
    """verify against the engine with tokens on (TorchServe's default): --served reads the server's key file;
    --url takes --token, and without it (or with a wrong one) says so in one line instead of reporting
    every golden answer as a mismatch."""
    import torch

    from archiver import engines, properties
    from helpers.hostile import build, scripted
    from helpers.paths import short_tmp

    golden_inputs = tmp_path / "golden"
    golden_inputs.mkdir()
    (golden_inputs / "a.json").write_text("[[1, 2, 3, 4]]")
    archive = build(tmp_path, "tensor", "tensor", scripted(tmp_path / "t.pt", torch.nn.Linear(4, 2)), "", golden_inputs)
    config = tmp_path / "config.properties"
    properties.write_config(tmp_path / "store", config)
    config.write_text(
        config.read_text().replace("disable_token_authorization=true", "disable_token_authorization=false")
    )
    srv = engines.ENGINES["tsctl"].start(tmp_path / "store", config, short_tmp("tv-"))
    runner = CliRunner()
    try:
        key = server.read_keys(srv.home)["inference"]
        result = runner.invoke(main, ["verify", str(archive), "--served", "--home", srv.home])
        assert result.exit_code == 0 and "1 of 1 golden answers match" in result.output, result.output
        result = runner.invoke(main, ["verify", str(archive), "--url", srv.inference, "--token", key])
        assert result.exit_code == 0 and "1 of 1 golden answers match" in result.output, result.output
        for extra, said in (([], "asks for a token"), (["--token", key[::-1]], "refused the token")):
            result = runner.invoke(main, ["verify", str(archive), "--url", srv.inference, *extra])
            assert result.exit_code != 0 and said in result.output and "mismatch" not in result.output, result.output
            assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
        result = runner.invoke(main, ["verify", str(archive), "--served", "--home", srv.home, "--token", key])
        assert result.exit_code == 2 and "--token is for --url" in result.output, result.output
    finally:
        server.stop(srv)
