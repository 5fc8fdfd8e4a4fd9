"""Shared fixtures: each test in a directory of its own, never the checkout's working state; the sample
models built on the spot (resnet18, JPEGs, the text models). What the tests share besides fixtures is in
tests/helpers/; pyproject.toml puts the repository and tests/ on sys.path."""

import os
from pathlib import Path

import pytest

from helpers import checkout_state
from samples import image_model

# The TorchServe frontends the tests start (each serves for seconds): the JVM's first compiler only and its
# serial collector. Starting one takes about a third less CPU (3.2 s against 1.9 s alone); the answers are
# the same. A JAVA_TOOL_OPTIONS of your own is kept.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

# The slowest test files, slowest first (measured: docs/tests.md). make test runs files in two processes
# (pytest-xdist --dist loadfile --no-loadscope-reorder), each taking the next file in this order when it is
# free: the long ones start first and short ones fill the end, so neither process waits long for the other
# to finish its last file (xdist's own order, most tests first, left a three-minute file for the end).
# The order changes nothing but the time.
SLOWEST_FIRST = [  # per-file seconds of a fresh clone's .ci/run at 46fe88b, the slowest first
    "security/test_attack_archives.py",
    "conformance/test_kserve_wrapper.py",
    "conformance/test_conformance.py",
    "conformance/test_text_parity.py",
    "conformance/test_kserve_serving.py",
    "export/test_kserve_export.py",
    "engine/test_engine.py",
    "cli/test_readme.py",
    "engine/test_local_model.py",
    "conformance/test_torchserve_compat.py",
    "security/test_signing.py",
    "engine/test_gpu_placement.py",
    "security/test_hostile.py",
    "security/test_hostile_served.py",
    "security/test_attack_fork_server.py",
    "security/test_reading_safety.py",
    "security/test_attack_engine.py",
    "cli/test_serving_cli.py",
    "toolkit/test_harness.py",
    "engine/test_fork_server.py",
    "security/test_attack_fair_share.py",
    "engine/test_serving.py",
    "engine/test_sequences.py",
    "cli/test_hostile_servers.py",
]


def pytest_collection_modifyitems(items):
    """The files of SLOWEST_FIRST first, in its order; the others after them as collected."""
    tests = Path(__file__).parent
    rank = {str(tests / name): place for place, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))


@pytest.fixture(scope="session", autouse=True)
def session_directory(tmp_path_factory):
    """The session's fixtures run in a directory of their own, not in the checkout: the README's flow leaves
    config/config.properties and model-store/ there, which a command given no path would read. What a
    module's or the session's fixtures change in the checkout fails the last test."""
    before, state = os.getcwd(), checkout_state.snapshot()
    os.chdir(tmp_path_factory.mktemp("session-cwd"))
    yield
    os.chdir(before)
    changed = checkout_state.changes(state, checkout_state.snapshot())
    assert not changed, f"the suite's fixtures changed the checkout's working state: {', '.join(changed[:10])}"


@pytest.fixture(autouse=True)
def own_directory(tmp_path_factory, monkeypatch):
    """Each test runs in an empty directory of its own, and fails if the checkout's working state changed
    while it ran (helpers/checkout_state.py: what it wrote, removed or changed there)."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    before = checkout_state.snapshot()
    yield
    changed = checkout_state.changes(before, checkout_state.snapshot())
    assert not changed, f"the test changed the checkout's working state: {', '.join(changed[:10])}"


@pytest.fixture(scope="session")
def image_sample(tmp_path_factory) -> Path:
    """samples/image_model.py's output: resnet18 state_dict, model.py, labels, JPEGs."""
    return image_model.build(tmp_path_factory.mktemp("resnet18"))


@pytest.fixture(scope="session")
def jpegs(image_sample):
    """Eight different realistic-size JPEGs."""
    return [image_model.sample_jpeg(seed, (640 + 16 * seed, 480)) for seed in range(10, 18)]


@pytest.fixture(scope="session")
def text_samples(tmp_path_factory) -> Path:
    """minilm (the real all-MiniLM-L6-v2), classifier and tagger (small random BERTs)."""
    from samples import text_models

    return text_models.build(tmp_path_factory.mktemp("text"))
