"""One identity per archive: MAR-INF/tsctl.json, written at package time, read by config, export and the
transformer. A user's subclass of a toolkit handler is a toolkit handler like the built-in ones: its
settings are validated and its requirements merged when it is packaged, export keeps its batchSize,
and it serves on a real TorchServe with the answer it gives in-process."""

import json
import shutil
import textwrap

import pytest

from archiver import mar, properties
from archiver.errors import UserError
from archiver.export.kserve import export as kserve
from handlers import identity
from helpers import archive_reading
from helpers.models import package_resnet, write_model_config
from helpers.servers import RunningServer, batch_lines, post_concurrently
from serving.local_model import LocalModel

MY_HANDLER = '''
from dataclasses import dataclass

from handlers.base import entry_point
from handlers.image import ImageClassifier


@dataclass
class LabelledSettings(ImageClassifier.Settings):
    label_prefix: str = ""


class Labelled(ImageClassifier):
    """The toolkit's image classifier, its labels prefixed by a setting of its own."""

    Settings = LabelledSettings
    requirements = ("pillow>=9",)

    def postprocess(self, output):
        answers = super().postprocess(output)
        return [{self.settings.label_prefix + label: p for label, p in answer.items()} for answer in answers]


handle = entry_point(Labelled)
'''
ONLY_CLASS = """
from handlers.image import ImageClassifier


class Upper(ImageClassifier):
    def postprocess(self, output, inputs):
        answers = super().postprocess(output, inputs)
        return [dict({k.upper(): p for k, p in a.items()}, pixels=x.numel()) for a, x in zip(answers, inputs)]
"""
CONFIG = "batchSize: 4\nmaxBatchDelay: 300\nhandler:\n  top_k: 3\n  label_prefix: 'cat:'\n"


def package_mine(image_sample, store, config_text=CONFIG, source=MY_HANDLER):
    handler = store.parent / "my_handler.py"
    handler.write_text(textwrap.dedent(source))
    config = write_model_config(store.parent / "labelled.yaml", config_text)
    return mar.package(
        mar.PackageOptions(
            model_name="labelled",
            handler=str(handler),
            serialized_file=str(image_sample / "resnet18.pt"),
            model_file=str(image_sample / "model.py"),
            extra_files=[str(image_sample / "index_to_name.json")],
            config_file=str(config),
            export_path=str(store),
            force=True,
        )
    )


def test_toolkit_archives_record_their_handler(image_sample, tmp_path):
    archive = package_resnet(image_sample, tmp_path / "store")
    record = identity.read(archive)
    assert record["entry"] == "handlers.image:handle" and record["module"] == "handlers.image"
    assert record["class"] == "ImageClassifier" and record["input"] == "image" and record["splits"] is True
    assert "handlers.base.ToolkitHandler" in record["bases"]


def test_a_users_subclass_is_found_validated_and_recorded(image_sample, tmp_path):
    archive = package_mine(image_sample, tmp_path / "store")
    record = identity.read(archive)
    assert (record["module"], record["class"], record["entry"]) == ("my_handler", "Labelled", "my_handler.py")
    assert record["input"] == "image" and record["splits"] is True
    assert record["bases"][0] == "handlers.image.ImageClassifier"
    assert archive_reading.member(archive, "requirements.txt").decode() == "pillow>=9\n"  # its own requirements
    names = {name for name, _ in archive_reading.members(archive)}
    assert {"handlers/image.py", "handlers/identity.py", "my_handler.py", identity.RECORD} <= names

    with pytest.raises(UserError, match="unknown key 'handler.label_prefx'; did you mean 'label_prefix'"):
        package_mine(image_sample, tmp_path / "store", CONFIG.replace("label_prefix", "label_prefx"))
    with pytest.raises(UserError, match=r"--handler .*my_handler.py failed to import: NameError: name 'nope'"):
        package_mine(image_sample, tmp_path / "store", source=MY_HANDLER + "\nnope\n")


def test_a_file_defining_only_the_class_is_recorded_as_torchserve_would_load_it(image_sample, tmp_path):
    """No ``handle`` function: TorchServe instantiates the one class the file defines."""
    only_class = ONLY_CLASS
    archive = package_mine(image_sample, tmp_path / "store", CONFIG.replace("  label_prefix: 'cat:'\n", ""), only_class)
    record = identity.read(archive)
    assert (record["module"], record["class"], record["entry"]) == ("my_handler", "Upper", "my_handler.py")
    with LocalModel(archive) as local:
        [answer] = local.predict([(image_sample / "kitten.jpg").read_bytes()])
        assert any("tsctl Upper ready on" in line for line in local.log)  # the class TorchServe instantiated
    labels = answer.json()
    assert answer.status == 200 and labels.pop("pixels") == 3 * 224 * 224  # postprocess saw its input
    assert len(labels) == 3 and all(label.isupper() for label in labels)
    two_classes = only_class + "\n\nclass Other:\n    pass\n"  # TorchServe would refuse it: no record
    assert identity.read(package_mine(image_sample, tmp_path / "store", source=two_classes)) is None


def test_a_handler_file_that_is_not_a_toolkit_handler_has_no_record(image_sample, tmp_path):
    source = "from handlers.requests import to_bytes\n\n\ndef handle(data, context):\n    return None\n"
    archive = package_mine(image_sample, tmp_path / "store", source=source)
    assert identity.read(archive) is None


def test_export_and_config_treat_a_subclass_as_the_toolkit_handler_it_is(image_sample, tmp_path):
    store = tmp_path / "model-store"
    package_mine(image_sample, store)
    config = properties.write_config(store, tmp_path / "config" / "config.properties")
    assert "decode_input_request=false" in config.read_text()  # every archive is a toolkit handler
    result = kserve.export(
        kserve.ExportOptions(
            out=str(tmp_path / "out"),
            name="demo",
            storage_uri="pvc://m/demo",
            config=str(config),
            model_store=str(store),
        )
    )
    assert not [note for note in result.notes if "batchSize set to 1" in note]
    exported = (tmp_path / "out" / "config" / "config.properties").read_text()
    snapshot = json.loads(exported.split("model_snapshot=", 1)[1])
    assert snapshot["models"]["labelled"]["1.0"]["batchSize"] == 4


@pytest.mark.matrix  # make matrix (37 s): make test checks the recorded class in-process
def test_a_users_subclass_serves_on_torchserve_as_it_answers_in_process(image_sample, jpegs, tmp_path):
    store = tmp_path / "model-store"
    archive = package_mine(image_sample, store)
    with LocalModel(archive) as model:
        expected = [r.json() for r in model.predict(jpegs[:4])]
    assert all(len(answer) == 3 and all(label.startswith("cat:") for label in answer) for answer in expected)
    with RunningServer(store) as srv:
        answers = post_concurrently(srv, "labelled", jpegs[:4])
        assert max(line["size"] for line in batch_lines(srv)) > 1
    for (status, body), want in zip(answers, expected):
        assert status == 200, body
        assert list(body) == list(want)
        assert list(body.values()) == pytest.approx(list(want.values()), rel=1e-4)
    shutil.rmtree(store)
