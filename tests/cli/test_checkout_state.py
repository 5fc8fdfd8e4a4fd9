"""The suite's guard on the checkout (helpers/checkout_state.py), on a stand-in root: what a test writes in
the working state fails it; the user's own log of the run, growing in the root, does not (`make test >
test.log` failed every test once)."""

from helpers import checkout_state


def test_a_growing_log_in_the_root_is_the_users_and_the_working_state_is_guarded(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.properties").write_text("inference_address=http://127.0.0.1:8080\n")
    (tmp_path / "test.log").write_text("collected 1662 items\n")
    before = checkout_state.snapshot(tmp_path)

    with open(tmp_path / "test.log", "a") as log:
        log.write("." * 72 + " [  4%]\n")
    assert checkout_state.changes(before, checkout_state.snapshot(tmp_path)) == []

    (tmp_path / "config" / "config.properties").write_text("inference_address=http://0.0.0.0:8080\n")
    (tmp_path / "model.mar").write_bytes(b"PK")
    (tmp_path / "test.log").unlink()
    assert checkout_state.changes(before, checkout_state.snapshot(tmp_path)) == [
        "model.mar written",
        "test.log removed",
        "config/config.properties changed",
    ]
