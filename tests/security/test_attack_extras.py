"""An outsider's attack on the engine's fork server importing ``EXTRAS`` once idle (Pillow, torchvision,
transformers and what they import: scipy, tokenizers, safetensors, huggingface_hub, regex...).

TorchServe's worker has imported torch, numpy and its own modules before the handler, nothing of the
extras: an archive may vendor its own Pillow or transformers in a subfolder and put it first on
``sys.path`` in its handler (a common way to pin a version), and a spawned worker imports that one. A
worker forked after the server imported the extras found the server's instead (the server's shadow
check looked at the PYTHONPATH entries' top level only): it must be spawned, as a worker the server
could not fork faithfully is. The served test about 8 s alone, up to 30 s on a loaded machine (the
server's idle imports), -m matrix; ``test_vendored_finds_a_package_anywhere_in_the_folder`` is its smoke.
"""

import os
import time

import pytest

from helpers.forks import forked_probe
from serving.worker import fork_server, module_shadowing

PROBE = """\
import json, os, sys
sys.path.insert(0, os.path.abspath(os.path.join("lib", "vendored")))  # as a handler pins its own copy
import PIL
print(json.dumps({"PIL": PIL.__file__, "extras": "torchvision" in sys.modules}))
"""


def test_vendored_finds_a_package_anywhere_in_the_folder(tmp_path, monkeypatch):
    (tmp_path / "docs.d").mkdir()
    (tmp_path / "handler.py").write_text("")
    assert module_shadowing.vendored(str(tmp_path), {"PIL", "regex"}) == []
    (tmp_path / "lib" / "deep").mkdir(parents=True)
    (tmp_path / "lib" / "deep" / "regex.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    assert module_shadowing.vendored(str(tmp_path), {"PIL", "regex"}) == ["regex"]
    monkeypatch.setattr(module_shadowing, "VENDOR_WALK", 3)  # a folder too large to look through: spawned
    assert module_shadowing.vendored(str(tmp_path), {"PIL"}) == [str(tmp_path)]


@pytest.mark.matrix
def test_a_package_vendored_in_a_subfolder_is_not_replaced_by_the_servers_extra(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    vendoring, plain = tmp_path / "vendoring", tmp_path / "plain"
    for folder in (vendoring, plain):
        folder.mkdir()
        (folder / "probe.py").write_text(PROBE)
    (vendoring / "lib" / "vendored" / "PIL").mkdir(parents=True)
    (vendoring / "lib" / "vendored" / "PIL" / "__init__.py").write_text("OURS = True\n")
    server = fork_server.ForkServer(fork_server.start_environment(env), extras=True, settle=fork_server.IDLE)
    try:
        deadline, seen = time.monotonic() + 120, {"extras": False}
        while not seen["extras"] and time.monotonic() < deadline:
            time.sleep(fork_server.IDLE + 4)
            seen = forked_probe(server, plain, env)
        assert seen["extras"], "the server never imported the extras"
        got = forked_probe(server, vendoring, env)
        assert got is None or got["PIL"] == str(vendoring / "lib" / "vendored" / "PIL" / "__init__.py"), got
        assert forked_probe(server, plain, env) is not None  # a folder vendoring nothing is still forked
    finally:
        server.close()
