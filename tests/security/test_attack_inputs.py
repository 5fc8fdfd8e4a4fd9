"""An outsider's attacks on what the CLI takes from its user and from an archive: ``--content-type``
(predict, run, package --golden-content-type) and a golden file's recorded content types, and the
``metrics_config`` path. Nothing served: each attack is refused at the option, or at reading, as a
UserError or click's usage error, never a traceback nor a hang. About 3 s."""

import base64
from pathlib import Path

import pytest
from click.testing import CliRunner

from archiver.cli import main
from handlers import golden as golden_format

ROOT = Path(__file__).resolve().parents[2]
HOSTILE_TYPES = {
    "crlf": "text/plain; charset=utf-8\r\nX-Injected: 1",
    "lf": "text/plain;\nX-Injected: 1",
    "nul": "text/plain; charset=\x00",
    "unicode": "text/plain; charset=\u20ac",
    "long": "text/plain; p=" + "a" * 100_000,
}


@pytest.mark.parametrize("name", sorted(HOSTILE_TYPES))
def test_a_content_type_no_header_can_carry_is_refused(name, tmp_path):
    """Before: only the part before ';' was checked, so predict against TorchServe or the engine ended in
    http.client's ValueError / UnicodeEncodeError (or a broken pipe for a long one) as a traceback, and
    run handed the handler a Content-Type no server could have received (then recorded by --golden)."""
    data = tmp_path / "row.txt"
    data.write_bytes(b"abc")
    for command in (["predict", "m", str(data)], ["run", str(tmp_path / "m.mar"), str(data)],
                    ["package", "--golden", str(tmp_path)]):  # fmt: skip
        flag = "--golden-content-type" if command[0] == "package" else "--content-type"
        refused = CliRunner().invoke(main, [*command, flag, HOSTILE_TYPES[name]])
        assert refused.exit_code == 2 and "is not a media type" in refused.output, (command, refused.output[-300:])


@pytest.mark.parametrize("kind", ["text/plain; charset=utf-8", 'application/json; charset="utf-8"', ""])
def test_ordinary_content_types_are_taken(kind):
    from archiver.commands.options import media_type

    assert media_type(None, None, kind) == kind


def test_a_golden_case_whose_type_no_header_can_carry_is_refused(tmp_path):
    """A hostile archive's golden file: its recorded type is sent by verify --served as a header."""
    case = {"name": "a.txt", "content_type": HOSTILE_TYPES["crlf"], "body_b64": base64.b64encode(b"a").decode(),
            "status": 200}  # fmt: skip
    assert golden_format.case_problem(case) is not None
    assert golden_format.case_problem({**case, "content_type": "text/plain; charset=utf-8"}) is None
    assert golden_format.case_problem({**case, "content_type": ""}) is None
