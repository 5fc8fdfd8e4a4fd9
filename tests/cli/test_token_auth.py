"""With TorchServe's token authorization on, tsctl predict and bench read the key file and still work."""

from click.testing import CliRunner

from archiver import server
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
