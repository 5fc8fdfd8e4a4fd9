"""Sample archives packaged on the spot: resnet18 and the text models, stand-ins, exported trees."""

import hashlib
import shutil
import zipfile
from pathlib import Path

from archiver import mar, properties


def stand_in_torchscript(path: Path, padding: int = 0) -> Path:
    """A file packaging takes for TorchScript (a zip holding code/ and constants.pkl), made without
    torch: for tests of packaging, which never loads weights."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("w/code/__torch__/model.py", "")
        z.writestr("w/constants.pkl", b"")
        z.writestr("w/data.pkl", b"\0" * padding)
    return path


def write_model_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def package_resnet(sample: Path, store: Path, name="resnet18", config_text=None, **extra) -> Path:
    """resnet18 of ``sample`` packaged into ``store`` as ``name``.mar (``tsctl package``'s function). Without
    ``extra`` options the archive depends only on the sample, the name and ``config_text``: it is packaged
    once per test process (deflating 45 MB of weights: seconds each time, about 40 calls in make test) and
    copied into ``store``."""
    if extra:
        return _package_resnet(sample, store, name, config_text, **extra)
    key = hashlib.sha256(repr((name, config_text)).encode()).hexdigest()[:16]
    packaged = sample.parent / "packaged" / key / f"{name}.mar"
    if not packaged.exists():
        packaged.parent.mkdir(parents=True, exist_ok=True)
        _package_resnet(sample, packaged.parent, name, config_text)
    store.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(packaged, store / f"{name}.mar"))


def _package_resnet(sample: Path, store: Path, name: str, config_text, **extra) -> Path:
    config = sample / "model-config.yaml"
    if config_text is not None:
        config = write_model_config(store.parent / f"{name}-config.yaml", config_text)
    options = mar.PackageOptions(
        model_name=name,
        handler="image_classifier",
        serialized_file=str(sample / "resnet18.pt"),
        model_file=str(sample / "model.py"),
        extra_files=[str(sample / "index_to_name.json")],
        config_file=str(config),
        export_path=str(store),
        force=True,
    )
    for key, value in extra.items():
        setattr(options, key, value)
    return mar.package(options)


def export_tree(root: Path, out: str = "pvc", **options) -> Path:
    """``tsctl config`` of ``root/model-store`` (unless ``root/config`` exists), then ``tsctl export
    kserve`` of it to ``root/out``: the tree KServe would mount."""
    from archiver.export.kserve import export as kserve

    config = root / "config" / "config.properties"
    if not config.exists():
        properties.write_config(root / "model-store", config)
    kserve.export(
        kserve.ExportOptions(
            out=str(root / out),
            name="demo",
            storage_uri="pvc://models/demo",
            config=str(config),
            model_store=str(root / "model-store"),
            **options,
        )
    )
    return root / out


def local_answers(store: Path, inputs: dict) -> dict:
    """{model: [in-process answer, ...]} of ``store/NAME.mar`` for each model's inputs (LocalModel)."""
    from serving.local_model import LocalModel

    answers = {}
    for name, items in inputs.items():
        with LocalModel(store / f"{name}.mar") as model:
            answers[name] = [r.json() for r in model.predict(items)]
    return answers


TEXT_BATCHING = "minWorkers: 1\nmaxWorkers: 1\nbatchSize: 8\nmaxBatchDelay: 100\nresponseTimeout: 120\n"


def package_text(samples: Path, store: Path, name: str, handler: str, directory: str, config_text=TEXT_BATCHING):
    config = store.parent / f"{name}-config.yaml"
    config.write_text(config_text)
    return mar.package(
        mar.PackageOptions(
            model_name=name,
            handler=handler,
            serialized_file=str(samples / directory),
            config_file=str(config),
            export_path=str(store),
            force=True,
        )
    )
