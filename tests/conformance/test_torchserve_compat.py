"""Archives made for TorchServe run without a server exactly as on TorchServe: ``LocalModel`` runs them in
TorchServe's own worker process.

A probe handler (a ``BaseHandler`` subclass, as nearly every pytorch/serve example is) reports what
its worker gave it: the request bodies as decoded, request headers, system properties,
model-config.yaml, the metrics cache (``add_time``/``add_counter``/``add_metric``/``get_metric``),
and sets statuses and headers. Served by the real TorchServe and run by ``LocalModel``, every answer
is the same; the reply half of the worker protocol is checked against TorchServe's own writer
(``ts_wire.read_reply``). ``tsctl package`` takes every ``--handler`` torch-model-archiver
takes, every model-config.yaml key TorchServe 0.12 reads, and refuses a handler that cannot fit its
model before writing anything. (pytorch/serve's example handlers: test_conformance.py.)"""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ts.context import Context, RequestProcessor
from ts.protocol import otf_message_handler

from archiver import engines, mar, server
from archiver.errors import UserError
from archiver.model_config import check_model_config
from helpers import archive_reading
from helpers.models import write_model_config
from helpers.paths import short_tmp
from helpers.servers import RunningServer, post_mixed_concurrently
from samples.image_model import resnet18, sample_jpeg
from serving.local_model import LocalModel, RequestInput
from serving.worker import ts_wire

PROBE = '''\
import json

from ts.torch_handler.base_handler import BaseHandler


class Probe(BaseHandler):
    """Answers with what its worker gave it; no model."""

    def initialize(self, context):
        self.context = context
        self.manifest = context.manifest
        self.initialized = True

    def preprocess(self, data):
        context, metrics = self.context, self.context.metrics
        metrics.add_counter("ProbeRequests", len(data))
        metrics.add_metric("ProbeBatch", len(data), "count")
        metrics.add_size("ProbeSize", 1.0)
        metrics.add_percent("ProbePercent", 50.0)
        metrics.get_metric("ProbeRequests").add_or_update(1, ["ProbeModel", "Model"])
        seen = []
        for idx, row in enumerate(data):
            body = row.get("body")
            if body == "boom":
                raise ValueError("the probe was asked to fail")
            seen.append({
                "type": type(body).__name__,
                "body": body if isinstance(body, (str, dict, list)) else len(body),
                "x_probe": {k.lower(): v for k, v in context.get_all_request_header(idx).items()}.get("x-probe"),
                "parameter": context.get_request_header(idx, "body"),
            })
            if body == "teapot":
                context.set_response_status(418, "I'm a teapot", idx)
                context.set_response_header(idx, "X-Probe-Answer", "short and stout")
        return seen

    def inference(self, data):
        return data

    def postprocess(self, data):
        properties = dict(self.context.system_properties)
        properties.pop("model_dir")
        properties.pop("server_version")
        for answer in data:
            answer.update(properties=properties, config=self.context.model_yaml_config,
                          model=self.manifest["model"]["modelName"])
        return data
'''
PROBE_CONFIG = "batchSize: 4\nmaxBatchDelay: 300\nmyThreshold: 0.5\npippy:\n  chunks: 1\nmaxRetryTimeoutInSec: 60\n"
PROBE_REQUESTS = [
    (json.dumps({"text": "hello", "n": [1, 2]}).encode(), "application/json", "json"),
    ("Ünïcödé text".encode(), "text/plain; charset=utf-8", "text"),
    (b"\x89PNG\r\n\x1a\n\x00\x00raw", "image/png", "image"),
    (b"teapot", "text/plain", "teapot"),
    (b"{not json", "application/json", "broken json"),
    (b"\xff\xfe not utf-8", "text/plain", "bad text"),
]


def package_probe(tmp_path: Path, store: Path, name="probe") -> Path:
    (tmp_path / "probe.py").write_text(PROBE)
    config = write_model_config(tmp_path / "probe-config.yaml", PROBE_CONFIG)
    options = mar.PackageOptions(
        model_name=name, handler=str(tmp_path / "probe.py"), config_file=str(config), export_path=str(store)
    )
    return mar.package(options)


def package_with_torch_model_archiver(store: Path, name: str, handler: str, *flags: str) -> Path:
    archiver = Path(sys.executable).parent / "torch-model-archiver"
    command = [str(archiver), "--model-name", name, "--version", "1.0", "--handler", handler, "--export-path"]
    store.mkdir(parents=True, exist_ok=True)
    # torch-model-archiver stages in $TMPDIR/NAME, removing what is there: a TMPDIR of its own, so that another
    # test process packaging the same name at the same time does not empty it (a suite run: /tmp/a gone)
    scratch = store.parent / f"{store.name}-tmp"
    scratch.mkdir(exist_ok=True)
    subprocess.run(command + [str(store), *flags], check=True, timeout=300, env=dict(os.environ, TMPDIR=str(scratch)))
    return store / f"{name}.mar"


def requests_of(table):
    return [RequestInput(body, {"Content-Type": kind, "X-Probe": label}) for body, kind, label in table]


# ---- the worker protocol, against TorchServe's own reader and writer ------------------------------
ANSWERS = st.one_of(
    st.binary(max_size=32),
    st.text(max_size=16),
    st.dictionaries(st.text(max_size=5), st.floats(allow_nan=False) | st.integers(), max_size=3),
    st.lists(st.integers(), max_size=4),
)


@settings(max_examples=200, deadline=None)
@given(
    answers=st.lists(ANSWERS, min_size=1, max_size=4),
    statuses=st.lists(st.sampled_from([None, 200, 201, 400, 418, 500]), min_size=4, max_size=4),
    batch_code=st.sampled_from([200, 200, 503, 507, 413]),
)
def test_replies_are_read_as_torchserves_frontend_reads_them(answers, statuses, batch_code):
    context = Context("m", "/tmp", {}, len(answers), None, "0.12.0")
    ids = {i: f"request-{i}" for i in range(len(answers))}
    context.request_ids = ids
    context.request_processor = [RequestProcessor({}) for _ in answers]
    for i in range(len(answers)):
        if statuses[i] is not None:
            context.set_response_status(statuses[i], "phrase", i)
        context.set_response_header(i, "X-Index", str(i))
    if batch_code == 200:
        reply = otf_message_handler.create_predict_response(answers, ids, "Prediction success", 200, context)
    else:
        reply = otf_message_handler.create_predict_response(None, ids, "Prediction failed", batch_code)
    responses = ts_wire.read_reply(reply, list(ids.values()))
    assert len(responses) == len(answers)
    for i, (response, answer) in enumerate(zip(responses, answers)):
        if batch_code != 200:
            want = 507 if batch_code == 413 else batch_code
            assert (response.status, response.json()["message"]) == (want, "Prediction failed")
            assert response.json() == {"code": want, "type": "InternalServerException", "message": "Prediction failed"}
            continue
        assert response.status == (statuses[i] or 200)
        assert response.headers["X-Index"] == str(i)
        if isinstance(answer, bytes):
            assert response.body == answer
        elif isinstance(answer, str):
            assert response.body == answer.encode("utf-8")
        else:
            assert response.json() == answer


# ---- the probe: in-process and served by TorchServe answer alike --------------------------------
@pytest.fixture(scope="module")
def probe_store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probe")
    store = tmp / "model-store"
    package_probe(tmp, store)
    package_with_torch_model_archiver(
        store, "probe_tma", str(tmp / "probe.py"), "--config-file", str(tmp / "probe-config.yaml")
    )
    return store


def test_a_basehandler_archive_gets_a_workers_context_in_process(probe_store):
    for archive in ("probe.mar", "probe_tma.mar"):
        with LocalModel(probe_store / archive, batch_size=4) as model:
            responses = model.serve(requests_of(PROBE_REQUESTS[:4]))
            assert [r.status for r in responses] == [200, 200, 200, 418], [r.body for r in responses]
            json_answer, text, image, teapot = (r.json() for r in responses)
            assert json_answer["type"] == "dict" and json_answer["body"] == {"text": "hello", "n": [1, 2]}
            assert text["type"] == "str" and text["body"] == "Ünïcödé text"
            assert image["type"] == "bytearray" and image["body"] == len(PROBE_REQUESTS[2][0])
            assert [a["x_probe"] for a in (json_answer, text, image, teapot)] == ["json", "text", "image", "teapot"]
            assert text["parameter"] == {"content-type": "text/plain"}  # the MIME type, as the frontend passes it
            assert responses[3].headers["X-Probe-Answer"] == "short and stout"
            want = {"gpu_id": None, "batch_size": 4, "limit_max_image_pixels": True, "server_name": "MMS"}
            assert json_answer["properties"] == want
            assert json_answer["config"]["myThreshold"] == 0.5 and json_answer["config"]["pippy"] == {"chunks": 1}
            assert json_answer["model"] == archive[:-4]
        emitted = list(model.metrics)  # complete once closed: what the worker's metrics cache logged
        for name in ("HandlerTime", "PredictionTime"):  # BaseHandler's and the worker's own
            assert any(line.startswith(f"[METRICS]{name}.") and "#type:GAUGE" in line for line in emitted), emitted


def test_a_batch_the_handler_fails_gets_torchserves_503_for_every_request(probe_store):
    with LocalModel(probe_store / "probe.mar", batch_size=2) as model:
        responses = model.predict(["boom", "fine"])
    assert [r.status for r in responses] == [503, 503]
    body = responses[0].json()
    assert (body["code"], body["type"]) == (503, "InternalServerException")
    assert body["message"].startswith("Prediction failed: "), body  # the handler's error after TorchServe's words


def test_in_process_answers_equal_torchserves_for_a_basehandler_archive(probe_store):
    with RunningServer(probe_store) as srv:
        for model in ("probe", "probe_tma"):
            path = f"/predictions/{model}"
            served = []
            for body, kind, label in PROBE_REQUESTS:  # one at a time: each answer is its own
                [(status, answer)] = post_mixed_with_header(srv, path, [(body, kind)], label)
                served.append((status, answer))
            failed = post_mixed_concurrently(srv, path, [(b"boom", "text/plain")])
            with LocalModel(probe_store / f"{model}.mar", batch_size=4) as local:
                here = [local.serve([r])[0] for r in requests_of(PROBE_REQUESTS)]
                [boom] = local.predict(["boom"])
            for (status, answer), response, (_, _, label) in zip(served, here, PROBE_REQUESTS):
                assert (status, answer) == (response.status, response.json()), label
            status, answer = failed[0]
            mine = boom.json()  # TorchServe's body, the handler's error after its message (docs/engines.md)
            assert (status, answer["type"]) == (boom.status, mine["type"]), (failed, mine)
            assert mine["message"].startswith(answer["message"] + ": ValueError"), (answer, mine)
        status, metrics = server.request(srv.metrics_url, timeout=10)
        assert status == 200
        for name in ("HandlerTime", "PredictionTime"):  # BaseHandler's and the worker's own, as in-process
            assert any(line.startswith(name + "{") and "probe_tma" in line for line in metrics.splitlines()), name


def test_a_basehandler_archive_serves_on_the_kserve_engine_as_in_process(probe_store):
    engine = engines.ENGINES["tsctl"].start(probe_store, home=short_tmp("pk-"), timeout=240)
    try:
        with LocalModel(probe_store / "probe.mar", batch_size=4) as local:  # one worker, as the engine's
            for body, kind, label in PROBE_REQUESTS[:4]:
                headers = {"Content-Type": kind, "X-Probe": label}
                url = f"{engine.inference}/v1/models/probe:predict"
                status, answer = server.request(url, body, "POST", headers, 60)
                [here] = local.serve([RequestInput(body, headers)])
                assert status == here.status, (label, answer)
                assert {k: v for k, v in answer.items() if k != "error"} == here.json(), label
    finally:
        server.stop(engine)


def post_mixed_with_header(srv, path, bodies, label):
    return [
        server.request(srv.inference + path, body, "POST", {"Content-Type": kind, "X-Probe": label}, 60)
        for body, kind in bodies
    ]


# ---- tsctl's image_classifier answers as TorchServe's built-in ----------------------------------
@pytest.mark.matrix  # out of make test for its time (issue #32's tests took its room); make matrix runs it
def test_the_toolkit_image_classifier_answers_as_torchserves_built_in(image_sample, tmp_path):
    model = resnet18(seed=3)
    with torch.no_grad():
        model.fc.weight.mul_(30)  # peaked probabilities: random weights otherwise answer ~0.001 everywhere
    scripted = tmp_path / "peaky.pt"
    torch.jit.trace(model, torch.randn(1, 3, 224, 224)).save(str(scripted))
    store = tmp_path / "store"
    labels = str(image_sample / "index_to_name.json")
    for name, handler in (("ours", "image_classifier"), ("theirs_via_tsctl", "ts.torch_handler.image_classifier")):
        mar.package(
            mar.PackageOptions(
                model_name=name,
                handler=handler,
                serialized_file=str(scripted),
                extra_files=[labels],
                export_path=str(store),
            )
        )
    package_with_torch_model_archiver(
        store, "theirs", "image_classifier", "--serialized-file", str(scripted), "--extra-files", labels
    )
    assert archive_reading.manifest(store / "theirs_via_tsctl.mar")["model"]["handler"] == "image_classifier"
    photos = [sample_jpeg(seed, size) for seed, size in ((0, (640, 480)), (1, (1280, 960)), (2, (300, 500)))]
    photos.append((image_sample / "kitten.jpg").read_bytes())
    with (
        LocalModel(store / "ours.mar", 1) as ours,
        LocalModel(store / "theirs.mar", 1) as theirs,
        LocalModel(store / "theirs_via_tsctl.mar", 1) as via,
    ):
        for photo in photos:
            [mine], [built_in], [same] = ours.predict([photo]), theirs.predict([photo]), via.predict([photo])
            assert built_in.status == mine.status == same.status == 200, built_in.body
            assert built_in.json() == same.json()
            want, got = built_in.json(), mine.json()
            assert max(want.values()) > 0.05, want  # a peaked answer, so the comparison means something
            assert list(want) == list(got)
            assert max(abs(want[k] - got[k]) for k in want) < 1e-5, (want, got)


# ---- tsctl package: torch-model-archiver's handler values, model-config keys, fits ---------------
@pytest.mark.parametrize(
    "handler", ["object_detector", "image_segmenter", "base_handler", "ts.torch_handler.image_classifier"]
)
def test_torchserves_handler_names_mean_what_they_mean_to_torch_model_archiver(image_sample, tmp_path, handler):
    weights = str(image_sample / "resnet18.pt")
    ours = mar.package(
        mar.PackageOptions(model_name="a", handler=handler, serialized_file=weights, export_path=str(tmp_path / "s"))
    )
    bare = handler.removeprefix("ts.torch_handler.")  # torch-model-archiver takes built-ins by bare name only
    theirs = package_with_torch_model_archiver(tmp_path / "t", "a", bare, "--serialized-file", weights)
    handlers = [archive_reading.manifest(archive)["model"]["handler"] for archive in (ours, theirs)]
    assert handlers == [bare, bare]
    names = {name for name, _ in archive_reading.members(ours)}
    assert not any(n.startswith("handlers/") for n in names) and archive_reading.record(ours) is None


@pytest.mark.parametrize(
    "handler, words",
    [
        ("image_clasifier", "unknown --handler 'image_clasifier'"),
        ("object_detecter", "did you mean 'object_detector'?"),
        ("missing/handler.py", "--handler missing/handler.py: no such file"),
        ("no_such_module.thing", "unknown --handler 'no_such_module.thing'"),
    ],
)
def test_handler_values_that_mean_nothing_are_refused(image_sample, tmp_path, handler, words):
    with pytest.raises(UserError, match=words.replace("?", r"\?").replace("(", r"\(")):
        mar.package(
            mar.PackageOptions(
                model_name="a",
                handler=handler,
                serialized_file=str(image_sample / "resnet18.pt"),
                export_path=str(tmp_path / "s"),
            )
        )
    assert not (tmp_path / "s").exists()


def hf_directory(path: Path, architectures, extra=None) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"architectures": architectures, "model_type": "bert"}))
    for name, content in (extra or {}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(content)
    return path


def test_handlers_that_cannot_fit_their_model_are_refused_at_package_time(image_sample, tmp_path):
    embedder = hf_directory(tmp_path / "embedder", ["BertModel"])
    classifier = hf_directory(tmp_path / "classifier", ["BertForSequenceClassification"])
    tagger = hf_directory(tmp_path / "tagger", ["BertForTokenClassification"])
    sentence = hf_directory(
        tmp_path / "sentence",
        ["BertModel"],
        {
            "modules.json": json.dumps(
                [
                    {"path": "", "type": "sentence_transformers.models.Transformer"},
                    {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                    {"path": "2_Dense", "type": "sentence_transformers.models.Dense"},
                ]
            ),
            "1_Pooling/config.json": json.dumps({"pooling_mode_mean_tokens": True}),
            "model.onnx": "",
        },
    )
    state_dict = tmp_path / "weights.pt"
    torch.save(resnet18().state_dict(), state_dict)
    pickled = tmp_path / "pickled.pth"
    torch.save(torch.nn.Linear(2, 2), pickled)
    from safetensors.torch import save_file

    save_file({"weight": torch.zeros(2, 2)}, str(tmp_path / "w.safetensors"))
    (tmp_path / "empty.safetensors").write_bytes(b"")
    legacy = tmp_path / "legacy.pth"  # torch.save's pre-1.6 format: a pickle, no zip
    torch.save(resnet18().state_dict(), legacy, _use_new_zipfile_serialization=False)
    photo = image_sample / "kitten.jpg"
    (tmp_path / "vocab.pt").write_bytes(b"")
    (tmp_path / "model.py").write_text("import torch\n")
    cases = [
        (
            dict(handler="text_classifier", serialized_file=str(embedder)),
            "names BertModel, which has no SequenceClassification head",
            "use --handler text_embedder",
        ),
        (
            dict(handler="token_classifier", serialized_file=str(classifier)),
            "has no TokenClassification head",
            "use --handler text_classifier",
        ),
        (
            dict(handler="text_classifier", serialized_file=str(tagger)),
            "has no SequenceClassification head",
            "use --handler token_classifier",
        ),
        (
            dict(handler="image_classifier", serialized_file=str(classifier)),
            "is a Hugging Face directory (BertForSequenceClassification)",
            "use --handler text_classifier",
        ),
        (
            dict(handler="image_classifier", serialized_file=str(state_dict)),
            "is not TorchScript (a state_dict or a pickled model)",
            "pass --model-file model.py",
        ),
        (dict(handler="tensor", serialized_file=str(pickled)), "is not TorchScript", "--model-file"),
        (
            dict(handler="image_classifier", serialized_file=str(tmp_path / "w.safetensors")),
            "holds only weights",
            "--model-file",
        ),
        (
            dict(handler="image_classifier", serialized_file=str(photo), model_file=str(image_sample / "model.py")),
            f"--serialized-file {photo} is not weights torch.save wrote (a state_dict)",
            "save the model's state_dict with torch.save",
        ),
        (
            dict(
                handler="tensor",
                serialized_file=str(tmp_path / "empty.safetensors"),
                model_file=str(tmp_path / "model.py"),
            ),
            "is not a safetensors file",
            "safetensors.torch.save_file",
        ),
        (
            dict(
                handler="text_classifier",
                serialized_file=str(tmp_path / "vocab.pt"),
                model_file=str(tmp_path / "model.py"),
            ),
            "takes no --model-file",
            "--handler ts.torch_handler.text_classifier",
        ),
        (
            dict(handler="text_classifier", serialized_file=str(tmp_path / "vocab.pt")),
            "is a file, but --handler text_classifier takes the directory",
            "ts.torch_handler.text_classifier",
        ),
        (
            dict(handler="text_embedder", serialized_file=str(sentence)),
            "holds model.onnx beside modules.json, but a Dense module needs sentence-transformers",
            "remove model.onnx",
        ),
    ]
    for options, what, fix in cases:
        with pytest.raises(UserError) as refused:
            mar.package(mar.PackageOptions(model_name="m", export_path=str(tmp_path / "store"), **options))
        message = str(refused.value)
        assert what in message and fix in message, message
        assert "\n" not in message
    assert not (tmp_path / "store").exists()
    # and what fits is still taken
    for options in (
        dict(handler="text_embedder", serialized_file=str(classifier)),
        dict(handler="text_classifier", serialized_file=str(classifier)),
        dict(handler="image_classifier", serialized_file=str(state_dict), model_file=str(image_sample / "model.py")),
        dict(handler="image_classifier", serialized_file=str(legacy), model_file=str(image_sample / "model.py")),
    ):
        assert mar.package(mar.PackageOptions(model_name="ok", export_path=str(tmp_path / "ok"), force=True, **options))


def test_every_key_torchserve_0_12_reads_is_taken_and_typos_still_are_not(tmp_path):
    text = (
        "minWorkers: 1\nmaxWorkers: 2\nbatchSize: 4\nmaxBatchDelay: 50\nresponseTimeout: 60\nstartupTimeout: 120\n"
        "deviceType: cpu\ndeviceIds: [0]\nparallelLevel: 1\nparallelType: pp\njobQueueSize: 10\nuseJobTicket: true\n"
        "maxSequenceJobQueueSize: 1\nsequenceMaxIdleMSec: 1000\nsequenceTimeoutMSec: 1000\nmaxNumSequence: 1\n"
        "sequenceBatching: false\ncontinuousBatching: false\nasyncCommunication: false\nuseVenv: false\n"
        "maxRetryTimeoutInSec: 300\nclientTimeoutInMills: 5000\ntorchrun:\n  nproc-per-node: 1\n"
        "pippy:\n  chunks: 1\ndali:\n  batch_size: 2\nhandler:\n  anything: [1, 2]\nmy_own_threshold: 0.3\n"
    )
    assert check_model_config(write_model_config(tmp_path / "all.yaml", text))["clientTimeoutInMills"] == 5000
    for typo, meant in (
        ("BatchSize: 4\n", "batchSize"),
        ("batch_size: 4\n", "batchSize"),
        ("maxWorker: 2\n", "maxWorkers"),
    ):
        with pytest.raises(UserError, match=f"did you mean '{meant}'"):
            check_model_config(write_model_config(tmp_path / "typo.yaml", typo))
    with pytest.raises(UserError, match="'clientTimeoutInMills' must be a whole number"):
        check_model_config(write_model_config(tmp_path / "bad.yaml", "clientTimeoutInMills: soon\n"))


def test_is_torchscript_reads_the_zip_not_the_suffix(tmp_path):
    from handlers.fit import is_torchscript

    model = torch.nn.Linear(2, 2)
    torch.jit.script(model).save(str(tmp_path / "s.bin"))
    torch.save(model.state_dict(), tmp_path / "d.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a zip")
    assert is_torchscript(str(tmp_path / "s.bin"))
    assert not is_torchscript(str(tmp_path / "d.pt")) and not is_torchscript(str(tmp_path / "junk.pt"))
    with zipfile.ZipFile(tmp_path / "s.bin") as z:
        assert any("/code/" in n for n in z.namelist())


# ---- found by an attacker -----------------------------------------------------------------------
DYING_HANDLER = """\
import sys


def handle(data, context):
    if data is None:
        return None
    body = data[0].get("body")
    body = body.decode() if isinstance(body, (bytes, bytearray)) else body
    if body == "exit":
        sys.exit(3)
    if body == "surrogate":
        return ["\\udcff"] * len(data)
    if body == "status":
        context.set_response_status("200", "", 0)
        return ["x"] * len(data)
    if body == "circular":
        loop = []
        loop.append(loop)
        return [loop] * len(data)
    return ["fine"] * len(data)
"""


@pytest.fixture(scope="module")
def dying_store(tmp_path_factory, probe_store):
    tmp = tmp_path_factory.mktemp("dying")
    (tmp / "dying.py").write_text(DYING_HANDLER)
    store = tmp / "model-store"
    mar.package(mar.PackageOptions(model_name="dying", handler=str(tmp / "dying.py"), export_path=str(store)))
    shutil.copy(probe_store / "probe.mar", store / "probe.mar")
    return store


def test_what_would_kill_a_worker_is_that_batchs_500_in_process(dying_store):
    worker_died = {"code": 500, "type": "InternalServerException", "message": "Worker died."}
    with LocalModel(dying_store / "dying.mar", batch_size=1) as model:
        for body in ("exit", "surrogate", "status", "circular"):
            [response] = model.predict([body])
            assert (response.status, response.json()) == (500, worker_died), body
        [fine] = model.predict(["again"])
        assert (fine.status, fine.body) == (200, b"fine")  # a str answer is its UTF-8 bytes


def test_a_handler_that_exits_does_not_stop_the_kserve_engine(dying_store):
    """On the tsctl engine the handler runs in a TorchServe worker process: what kills it fails only the
    request it held (the engine's 503 naming the death) and the worker is started again."""
    engine = engines.ENGINES["tsctl"].start(dying_store, home=short_tmp("dk-"), timeout=240)
    try:
        url = f"{engine.inference}/v1/models/dying:predict"
        for body in ("exit", "surrogate"):
            status, answer = server.request(url, body.encode(), "POST", {"Content-Type": "text/plain"}, 60)
            assert status == 503 and answer["message"].startswith("Worker died"), answer
        assert server.group_alive(engine.pid)
        status, answer = server.request(url, b"again", "POST", {"Content-Type": "text/plain"}, 60)
        assert (status, answer) == (200, "fine")  # a text answer, as a JSON string
        status, answer = server.request(
            f"{engine.inference}/v1/models/probe:predict", b"x" * 4096, "POST", {"Content-Type": "text/plain"}, 60
        )
        assert status == 200, answer  # no other model's body limit applies to it
    finally:
        server.stop(engine)


def test_malformed_model_files_and_configs_are_one_line_refusals(image_sample, tmp_path):
    bad_configs = {
        "list.json": "[1, 2]",
        "arch.json": '{"architectures": 5}',  # no head to check: refused for the image handler only
        "deep.json": "[" * 100000 + "]" * 100000,
        "utf8.json": b"\xff\xfe{}",
    }
    for name, content in bad_configs.items():
        directory = tmp_path / name
        directory.mkdir()
        data = content if isinstance(content, bytes) else content.encode()
        (directory / "config.json").write_bytes(data)
        for handler in ("text_classifier", "image_classifier")[name == "arch.json" :]:
            with pytest.raises(UserError) as refused:
                mar.package(
                    mar.PackageOptions(
                        model_name="m", handler=handler, serialized_file=str(directory), export_path=str(tmp_path / "o")
                    )
                )
            assert "config.json" in str(refused.value) and "\n" not in str(refused.value), (name, handler)
    sentence = hf_directory(tmp_path / "st", ["BertModel"], {"modules.json": '{"a": 1}', "model.onnx": ""})
    with pytest.raises(UserError, match="modules.json is not a list of modules"):
        mar.package(
            mar.PackageOptions(
                model_name="m", handler="text_embedder", serialized_file=str(sentence), export_path=str(tmp_path / "o")
            )
        )
    bomb = "a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]\n"
        for i in range(1, 30)
    )
    for text in (bomb + "minWorkers: *a29\n", bomb + "handler:\n  top_k: *a29\n", "a: " + "[" * 10000):
        config = write_model_config(tmp_path / "bomb.yaml", text)
        with pytest.raises(UserError) as refused:
            check_model_config(config, toolkit_settings("image_classifier"))
        assert len(str(refused.value)) < 400
    assert not (tmp_path / "o").exists()


def toolkit_settings(name):
    from handlers import catalogue

    return catalogue.HANDLERS[name].declared().settings


def test_handler_names_are_checked_without_running_anyones_code(image_sample, tmp_path, monkeypatch):
    package = tmp_path / "path" / "evil"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('x')\n")
    (package / "sub.py").write_text("def handle(data, context):\n    return data\n")
    monkeypatch.syspath_prepend(str(tmp_path / "path"))
    options = dict(serialized_file=str(image_sample / "resnet18.pt"), export_path=str(tmp_path / "o"), force=True)
    assert mar.package(mar.PackageOptions(model_name="m", handler="evil.sub", **options))
    with pytest.raises(UserError, match="unknown --handler 'evil.nothere'"):
        mar.package(mar.PackageOptions(model_name="m", handler="evil.nothere", **options))
    assert not (tmp_path / "ran").exists()  # finding evil.sub did not import evil
    with pytest.raises(UserError, match="is the toolkit's tensor: pass --handler tensor"):
        mar.package(mar.PackageOptions(model_name="m", handler="handlers.tensor:handle", **options))
    carried = tmp_path / "mypkg"
    carried.mkdir()
    (carried / "__init__.py").write_text("")
    (carried / "h.py").write_text("def handle(data, context):\n    return data\n")
    assert mar.package(
        mar.PackageOptions(model_name="m", handler="mypkg.h:handle", extra_files=[str(carried)], **options)
    )
    (tmp_path / "exits.py").write_text("import handlers\nimport sys\nsys.exit(0)\n")
    (tmp_path / "plain.py").write_text("def handle(data, context):\n    return data\n")
    for handler, words in (
        (tmp_path / "exits.py", "failed to import: SystemExit"),
        (f"{tmp_path / 'plain.py'}:nope", "defines no 'nope'"),
    ):
        with pytest.raises(UserError, match=words):
            mar.package(mar.PackageOptions(model_name="m", handler=str(handler), **options))


def test_package_golden_verify_and_run_take_a_basehandler_archive(tmp_path):
    """Each failed with 'NoneType' object has no attribute 'add_time' before LocalModel was a worker."""
    from click.testing import CliRunner

    from archiver.cli import main

    (tmp_path / "probe.py").write_text(PROBE)
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "a.txt").write_text("hello")
    (inputs / "b.json").write_text('{"n": 1}')
    runner = CliRunner()
    store = tmp_path / "store"
    flags = ["--model-name", "probe", "--handler", str(tmp_path / "probe.py"), "--export-path", str(store)]
    result = runner.invoke(main, ["package", *flags, "--golden", str(inputs)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["verify", str(store / "probe.mar")])
    assert result.exit_code == 0 and "2 of 2 golden answers match" in result.output, result.output
    result = runner.invoke(main, ["run", str(store / "probe.mar"), str(inputs / "a.txt"), str(inputs / "b.json")])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    first = json.loads(lines[0].split(": 200 ", 1)[1])
    # each file one request, on the archive's batchSize (1 here), as the server predict sends it to
    assert first["body"] == "hello" and first["properties"]["batch_size"] == 1 and first["model"] == "probe"
    assert json.loads(lines[1].split(": 200 ", 1)[1])["body"] == {"n": 1}
