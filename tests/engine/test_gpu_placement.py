"""Workers placed on GPUs exactly as TorchServe 0.12 places them (serving/gpus.py), on this machine without one.

TorchServe counts GPUs from CUDA_VISIBLE_DEVICES without opening them, so a GPU-less machine that sets it to
four ids makes TorchServe 0.12 itself hand out gpu ids: a probe handler (samples/ts_examples/gpu_probe) prints
the id its worker was loaded with, and the same store and config.properties on the tsctl engine must print the
same ids, model by model, with TorchServe's ``gpu`` and ``gpuUsage`` in describe. The rules themselves
(number_of_gpu capped at what is found, deviceType, deviceIds, the shared and per-model counters, parallelType)
are checked case by case below, each against what TorchServe's Java does (cited in serving/gpus.py); the CPU
fallback is served for real (``deviceType: gpu`` on no GPU), and ``LocalModel``, ``tsctl run --gpu``
hand their worker the id asked for."""

import json
import re
import time

import pytest
from click.testing import CliRunner

from archiver import properties, server
from archiver.cli import main
from archiver.device_notes import device_notes
from archiver.engines import torchserve_launch
from helpers.engine import Engine
from helpers.paths import short_tmp
from helpers.waiting import until
from samples import ts_examples, ts_probes
from serving import gpus
from serving.local_model import LocalModel

PROBE = re.compile(r"tsctl-gpu-probe model=(\S+) gpu_id=(\S+) pid=(\d+) visible=(\S+)")
VISIBLE = {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}  # four GPUs as TorchServe counts them; none to open here
CONFIGS = {  # model: its model-config.yaml; the store's order (sorted) is the order workers are placed in
    "bad-ids": "minWorkers: 2\nmaxWorkers: 2\ndeviceIds: [1, 7]\n",  # 7 >= number_of_gpu: the list is ignored
    "cpu": "minWorkers: 1\nmaxWorkers: 1\ndeviceType: cpu\n",
    "ids": "minWorkers: 2\nmaxWorkers: 2\ndeviceIds: [2]\n",
    "shared": "minWorkers: 3\nmaxWorkers: 3\n",
}
# What TorchServe's rules give with number_of_gpu=3 of the four visible (each model's workers' gpu ids and
# CUDA_VISIBLE_DEVICES): the shared counter is incremented before it is read, bad-ids takes it as shared does
WANTED = {
    "bad-ids": [("1", "0,1,2,3"), ("2", "0,1,2,3")],
    "cpu": [("None", "0,1,2,3")],
    "ids": [("2", "0,1,2,3"), ("2", "0,1,2,3")],
    "shared": [("0", "0,1,2,3"), ("1", "0,1,2,3"), ("2", "0,1,2,3")],
}


# ---- the rules, case by case ---------------------------------------------------------------------------
def test_the_gpus_counted_are_cuda_visible_devices_else_the_drivers_list():
    assert gpus.count_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2"}, lambda: 8) == 3
    assert gpus.count_gpus({"CUDA_VISIBLE_DEVICES": "GPU-8a3c,1"}, lambda: 8) == 2  # TorchServe: parseInt fails
    assert gpus.count_gpus({"CUDA_VISIBLE_DEVICES": ""}, lambda: 8) == 8  # empty: as unset
    assert gpus.count_gpus({}, lambda: 2) == 2
    assert gpus.count_gpus({}) == 0  # this machine: no NVIDIA driver


def test_number_of_gpu_is_capped_at_what_is_found_and_defaults_to_it():
    assert gpus.number_of_gpu({"number_of_gpu": "1"}, 4) == 1
    assert gpus.number_of_gpu({"number_of_gpu": "8"}, 2) == 2
    assert gpus.number_of_gpu({"number_of_gpu": "4"}, 0) == 0
    assert gpus.number_of_gpu({}, 3) == 3
    with pytest.raises(gpus.PlacementError, match="number_of_gpu='two' is not a whole number"):
        gpus.number_of_gpu({"number_of_gpu": "two"}, 3)


def test_default_workers_are_the_configured_else_the_gpus_else_the_cpus():
    assert gpus.default_workers(3, 2, 16) == 3
    assert gpus.default_workers(0, 2, 16) == 2
    assert gpus.default_workers(0, 0, 16) == 16


def placed(cases, number_of_gpu):
    """Each model's workers' gpu ids, its models placed in order by one server's Placement."""
    placement = gpus.Placement(number_of_gpu)
    result = {}
    for name, config, workers in cases:
        devices = gpus.model_devices(config, number_of_gpu, name)
        result[name] = [placement.next_gpu(devices) for _ in range(workers)]
    return result


def test_the_shared_counter_is_incremented_before_it_is_read_across_models():
    assert placed([("a", {}, 3), ("b", {}, 2)], 2) == {"a": [1, 0, 1], "b": [0, 1]}
    assert placed([("a", {}, 2)], 1) == {"a": [0, 0]}


def test_device_ids_have_a_counter_of_their_own_and_an_id_out_of_range_drops_the_list():
    assert placed([("a", {"deviceIds": [3, 1]}, 3), ("b", {}, 1)], 4) == {"a": [3, 1, 3], "b": [1]}
    devices = gpus.model_devices({"deviceIds": [0, 4]}, 4, "m.yaml")
    assert devices.ids is None and devices.gpus == 4 and "deviceIds [0, 4] names a GPU" in devices.notes[0]
    assert gpus.model_devices({"deviceIds": [0, "1"]}, 4, "m.yaml").ids is None  # ModelConfig: not all integers


def test_device_type_cpu_stays_on_the_cpu_and_gpu_without_one_falls_back_with_a_note():
    assert placed([("a", {"deviceType": "cpu"}, 2)], 4) == {"a": [-1, -1]}
    devices = gpus.model_devices({"deviceType": "gpu"}, 0, "m.mar's model-config.yaml")
    assert not devices.on_gpu
    assert devices.notes == [
        "m.mar's model-config.yaml: deviceType is gpu but this machine has no GPU "
        "(number_of_gpu 0): its workers run on the CPU"
    ]
    assert "ignored, as TorchServe ignores it" in gpus.model_devices({"deviceType": "tpu"}, 1, "m").notes[0]


def test_a_parallel_type_is_refused_in_one_line_naming_it():
    """TorchServe 0.12 starts one worker over parallelLevel GPUs with a process (a socket) for each rank: under
    torchrun for pp/tp/pptp, the handler's own for custom (TorchServe waits for them); tsctl starts no ranks."""
    torchrun = {"parallelType": "pp", "torchrun": {"nproc-per-node": 2}}  # torchrun sets parallelLevel
    for config in ({"parallelType": "tp", "parallelLevel": 2}, torchrun):
        with pytest.raises(gpus.PlacementError, match="with torchrun over 2 GPUs.*--engine torchserve"):
            gpus.model_devices(config, 4, "m.yaml")
    with pytest.raises(gpus.PlacementError, match="^m.yaml: parallelType 'custom' with parallelLevel 2 asks"):
        gpus.model_devices({"parallelType": "custom", "parallelLevel": 2}, 4, "m.yaml")
    assert placed([("a", {"parallelLevel": 2}, 2)], 2) == {"a": [1, 0]}  # no parallelType: TorchServe ignores it


def test_gpu_usage_is_na_on_the_cpu_and_torchserves_words_when_it_cannot_be_read():
    sample = gpus.DeviceSample(0, "NVIDIA H200", 37, 12, 4321, 143771)
    assert gpus.describe_usage(-1, {}) == "N/A"
    assert gpus.describe_usage(1, {0: sample}) == "failed to obtained gpu usage"
    assert gpus.describe_usage(0, {0: sample}) == (
        "gpuId::0 utilization.gpu [%]::37 % utilization.memory [%]::12 % memory.used [MiB]::4321 MiB"
    )


# ---- TorchServe 0.12 and the engine on one store, CUDA_VISIBLE_DEVICES naming four GPUs --------------------
@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpus")
    store = root / "model-store"
    for name, config in CONFIGS.items():
        ts_examples.package(ts_probes.build_gpu_probe(root / "probes", name, config), "torch-model-archiver", store)
    properties.write_config(store, root / "config" / "config.properties", extra={"number_of_gpu": "3"})
    return root


def probes(text: str) -> dict:
    """Each model's workers' (gpu_id, CUDA_VISIBLE_DEVICES), sorted, from the lines the probes printed."""
    found = {}
    for model, gpu, _, visible in PROBE.findall(text):
        found.setdefault(model, []).append((gpu, visible))
    return {model: sorted(ids) for model, ids in found.items()}


def described_gpus(management: str, headers: dict) -> dict:
    described = {}
    for model in CONFIGS:
        status, body = server.request(f"{management}/models/{model}", headers=headers, timeout=30)
        assert status == 200, body
        described[model] = sorted((w["gpu"], w["gpuUsage"]) for w in body[0]["workers"])
    return described


def engine_probes(engine, workers: int) -> dict:
    return until(
        lambda: probes(engine.output()),
        lambda found: sum(len(ids) for ids in found.values()) >= workers,
        "every worker's probe line in the engine's output",
        engine.out,
        engine.alive,
        60,
    )


def test_the_engine_gives_each_worker_the_gpu_torchserve_gives_it(tree):
    """make test's half of the next test (make matrix's, TorchServe's half 40 s): WANTED is what TorchServe 0.12
    gave each worker there."""
    engine = Engine(tree, "--enable-model-api", env=VISIBLE).wait_ready()
    try:
        assert engine_probes(engine, sum(len(ids) for ids in WANTED.values())) == WANTED, engine.output()[-3000:]
        described = described_gpus(engine.url, engine.headers("management"))
        assert described["cpu"] == [(False, "N/A")], described
        assert described["shared"] == [(True, "failed to obtained gpu usage")] * 3, described  # TorchServe's words
    finally:
        engine.stop()


@pytest.mark.matrix
def test_torchserve_and_the_engine_give_each_worker_the_same_gpu(tree, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", VISIBLE["CUDA_VISIBLE_DEVICES"])
    home = short_tmp("ts-gpu-")
    config = tree / "config" / "config.properties"
    ts = torchserve_launch.start(config, tree / "model-store", home, timeout=240)
    try:
        workers = sum(len(ids) for ids in WANTED.values())  # each worker's line, written once it is up
        log = ts.logs / "model_log.log"
        ts_server = until(
            lambda: probes(log.read_text(errors="replace")),
            lambda found: sum(len(ids) for ids in found.values()) >= workers,
            "every worker's probe line in model_log.log",
            log,
            timeout=60,
        )
        ts_described = described_gpus(ts.management, ts.headers("management"))
    finally:
        server.stop(ts)
    assert ts_server == WANTED, ts_server  # TorchServe 0.12 itself, as its rules were read
    engine = Engine(tree, "--enable-model-api", env=VISIBLE).wait_ready()
    try:
        found = engine_probes(engine, workers)
        assert found == ts_server, engine.output()[-3000:]
        assert described_gpus(engine.url, engine.headers("management")) == ts_described, ts_described
        status, body = engine.get("/models/ids", "management")
        assert body[0]["deviceType"] == "gpu" and body[0]["deviceIds"] == [2], body
        assert engine.get("/models/cpu", "management")[1][0]["deviceType"] == "cpu"
    finally:
        engine.stop()
    assert ts_described["cpu"] == [(False, "N/A")]
    assert ts_described["shared"] == [(True, "failed to obtained gpu usage")] * 3  # no nvidia-smi, no NVML here


def test_a_model_asking_for_a_gpu_on_a_machine_without_one_is_served_on_the_cpu_with_a_note(tmp_path):
    store = tmp_path / "model-store"
    ts_examples.package(ts_probes.build_gpu_probe(tmp_path, "wants-gpu", "deviceType: gpu\n"), "tsctl", store)
    config = properties.write_config(store, tmp_path / "config" / "config.properties", extra={"number_of_gpu": "1"})
    notes = device_notes(str(config), store)
    assert notes == [
        f"{config}: number_of_gpu=1 but this machine has 0 visible GPU(s): no GPU is visible (CUDA_VISIBLE_DEVICES, "
        "NVML): workers run on the CPU",
        "wants-gpu.mar's model-config.yaml: deviceType is gpu but this machine has no GPU (number_of_gpu 0): its "
        "workers run on the CPU",
    ]
    engine = Engine(tmp_path).wait_ready()
    try:
        assert probes(engine.output()) == {"wants-gpu": [("None", "None")]}
        assert "deviceType is gpu but this machine has no GPU" in engine.output()
        assert f"WARNING tsctl.engine: {notes[0]}" in engine.output()  # the engine's own line (issue #47)
        status, body = engine.post("/predictions/wants-gpu", b"x")
        assert (status, body["gpu_id"]) == (200, None), body
    finally:
        engine.stop()


def test_local_model_and_tsctl_run_load_the_worker_with_the_gpu_asked_for(tmp_path, monkeypatch):
    store = tmp_path / "model-store"
    archive = ts_examples.package(ts_probes.build_gpu_probe(tmp_path, "probe", "minWorkers: 1\n"), "tsctl", store)
    with LocalModel(archive, gpu=1) as model:
        [answer] = model.predict([b"x"])
        assert answer.json()["gpu_id"] == 1
    with pytest.raises(ValueError, match="gpu=-1: give a GPU's id"):
        LocalModel(archive, gpu=-1)
    body = tmp_path / "body.txt"
    body.write_text("x")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    for flag, wanted in ((["--gpu", "1"], 1), ([], 1), (["--gpu", "cpu"], None)):  # auto: TorchServe's first worker
        done = CliRunner().invoke(main, ["run", str(archive), str(body), "--json", *flag])
        assert done.exit_code == 0, done.output
        assert json.loads(done.stdout)["results"][0]["answer"]["gpu_id"] == wanted, (flag, done.output)
    done = CliRunner().invoke(main, ["run", str(archive), str(body), "--gpu", "2"])
    assert done.exit_code == 2 and "Traceback" not in done.output
    assert "--gpu 2: this machine has 2 visible GPUs (CUDA_VISIBLE_DEVICES, the driver)" in done.output, done.output
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    done = CliRunner().invoke(main, ["run", str(archive), str(body), "--gpu", "0", "--json"])
    assert done.exit_code == 2 and "--gpu 0: this machine has no visible GPU" in done.output, done.output


@pytest.mark.parametrize("given", ["²", "٣", "１", "0x1", "+1", "-1", "1e9", "1.0", "1_0"])
def test_gpu_is_an_ascii_whole_number_or_refused_in_one_line(given, monkeypatch):
    """str.isdigit() holds for '²' (int() then raises ValueError, reported as the handler failing to load)
    and for other scripts' digits ('٣' is 3): --gpu takes 0-9 only."""
    from archiver.errors import UserError
    from archiver.inprocess import worker_gpu

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4")
    with pytest.raises(UserError, match=r"give a GPU's id \(0, 1, \.\.\.\), cpu or auto"):
        worker_gpu(given, None)
    assert worker_gpu(" 3 ", None) == 3 and worker_gpu("CPU", None) == gpus.CPU


def test_mlservers_models_take_one_counter_as_torchserves_do(tmp_path, monkeypatch):
    """MLServer loads every model in one process (its parallel_workers 0), so its models' workers take the
    server's one shared counter, as TorchServe's do: with a counter a model, every model's first worker went
    to GPU 1 of 2 (three one-worker models: 1, 1, 1 and GPU 0 idle, where TorchServe gives 1, 0, 1). Each
    answers with the GPU its worker was given, and /metrics holds each worker family once with a series for
    each model: one collector for the process, though MLServer reloads the runtime's module for every model it
    loads (a collector a model gave each family once per model, an exposition Prometheus refuses).

    ``make test``'s MLServer smoke path: the real MLServer 1.7.1 and tsctl's runtime serving three archives;
    tests/engine/test_mlserver.py is MLServer's whole suite (make matrix)."""
    from prometheus_client.parser import text_string_to_metric_families

    from archiver import engines
    from helpers.v2_answers import ask_v2
    from samples import runtime_env

    store = tmp_path / "model-store"
    for name in ("a", "b", "c"):
        probe = ts_probes.build_gpu_probe(tmp_path / "probes", name, "minWorkers: 1\nmaxWorkers: 1\n")
        ts_examples.package(probe, "tsctl", store)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    mlserver = engines.ENGINES["mlserver"]
    srv = mlserver.start(store, home=short_tmp("gpu-mls-"), timeout=300, python=str(runtime_env.ensure_mlserver()))
    try:
        found = probes(mlserver.output(srv).read_text(errors="replace"))
        answers = {name: ask_v2(srv, name, b"which", "text/plain") for name in ("a", "b", "c")}
        time.sleep(1)  # the last request's metric lines read
        status, text = server.request(srv.metrics_url, timeout=30)
    finally:
        mlserver.stop(srv)
    assert sorted(gpu for ids in found.values() for gpu, _ in ids) == ["0", "1", "1"], found  # loaded in any order
    for name, (code, answer) in answers.items():
        assert code == 200 and str(answer["gpu_id"]) == found[name][0][0], (name, code, answer, found)
    assert status == 200, text
    names = [line.split(" ")[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert {sample.labels.get("ModelName") for sample in families["PredictionTime"].samples} >= {"a", "b", "c"}
