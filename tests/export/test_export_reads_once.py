"""Issue #46: an export reads each archive of the store once. ``export kserve`` and ``export seldon`` on a
store of three archives open each exactly once (``handlers.archives.Archive``), whatever they ask of it
(manifest, handler record, input kind, model-config.yaml, transformer's shape, golden answers), and read
nothing of an archive by its path again."""

from collections import Counter
from pathlib import Path

import pytest

from archiver import properties
from archiver.export import options as export_options
from archiver.export.kserve import export as kserve
from archiver.export.seldon import export as seldon
from handlers import archives
from helpers.models import package_resnet


@pytest.fixture(scope="module")
def store(image_sample, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("reads-once")
    store = root / "model-store"
    package_resnet(image_sample, store)
    package_resnet(image_sample, store, name="resnet18-b")
    tensor = image_sample / "tensor-once.yaml"
    tensor.write_text("batchSize: 4\nhandler:\n  input_shape: [3, 224, 224]\n")
    package_resnet(image_sample, store, name="resnet18-t", handler="tensor", config_file=str(tensor), extra_files=[])
    properties.write_config(store, root / "config" / "config.properties")
    return store


@pytest.fixture
def opens(monkeypatch):
    counted = Counter()
    real = archives.Archive.__init__

    def counting(self, path, *args, **kwargs):
        counted[Path(path).name] += 1
        real(self, path, *args, **kwargs)

    monkeypatch.setattr(archives.Archive, "__init__", counting)
    return counted


@pytest.mark.parametrize(
    "flags",
    [
        {"autoscale": "knative", "target": 2},
        # --canary's DEPLOY.md names, per archive, whether its golden answers drive tsctl shadow: read with the rest
        {"canary": 10},
    ],
    ids=["autoscale", "canary"],
)
def test_export_kserve_opens_each_archive_once(store, opens, tmp_path, flags):
    config = store.parent / "config" / "config.properties"
    options = export_options.ExportOptions(
        out=str(tmp_path / "out"),
        name="vision",
        config=str(config),
        model_store=str(store),
        storage_uri="pvc://models/tsctl",
        **flags,
    )
    kserve.export(options)
    assert dict(opens) == {"resnet18.mar": 1, "resnet18-b.mar": 1, "resnet18-t.mar": 1}


def test_export_seldon_opens_each_archive_once(store, opens, tmp_path):
    config = store.parent / "config" / "config.properties"
    seldon.export(
        export_options.SeldonOptions(
            out=str(tmp_path / "out"),
            image="registry.example/tsctl-mlserver:1",
            config=str(config),
            model_store=str(store),
        )
    )
    assert dict(opens) == {"resnet18.mar": 1, "resnet18-b.mar": 1, "resnet18-t.mar": 1}
