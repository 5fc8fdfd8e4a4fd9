"""pytorch/serve's example handlers and TorchServe's built-in handlers, as files to package: the
inputs of the conformance suite (tests/conformance/test_conformance.py).

    python -m samples.ts_examples samples/build/ts_examples        # build every case, print the flags

Each case is an ``Example``: the files and flags pytorch/serve's README packages it with, plus the
requests to send. The models are built here with random, seeded weights (no model hub here):

- ``mnist``: an ImageClassifier subclass with MNIST's preprocessing answering the digit, its ``Net``
  model file and state_dict; inputs: 28x28 grayscale PNG digits drawn with PIL.
- ``resnet_18``: TorchServe's built-in ``image_classifier`` (``--handler image_classifier``; with tsctl
  that name is tsctl's own image handler) on ``class ImageClassifier(ResNet)``, index_to_name.json of
  1000 ``[wnid, name]`` entries; ``resnet_18_ts``: the same files with ``--handler
  ts.torch_handler.image_classifier`` (TorchServe's own handler, named as a module).
- ``object_detector``: the built-in ``object_detector`` on a Faster R-CNN (ResNet-50 FPN backbone,
  the example's; its resize is 256-320 px instead of 800-1333 so an image takes ~0.3 s on two cores,
  see samples/ts_examples/object_detector/model.py), COCO's 91 names.
- ``image_segmenter``: the built-in ``image_segmenter`` on FCN-ResNet50 with its auxiliary head.
- ``custom_metrics``: the mnist model behind a handler emitting custom metrics of every type (counter,
  gauge, histogram) through every call of TorchServe's metrics cache; as the example, it needs its
  metrics.yaml as ``metrics_config`` and ``model_metrics_auto_detect=true`` (``Example.properties``).
- ``micro_batching``: the mnist model behind TorchServe's ``MicroBatching`` handle (threads of
  its own that never end), with the example's model-config.yaml ``micro_batching`` section.
- ``transformer``: a Transformer_handler_generalized-like handler (setup_config.json, sequence
  classification) on a small BERT written with ``save_pretrained``; the weights are the
  ``--serialized-file``, config and tokenizer files ``--extra-files``, as pytorch/serve's README
  packages it. Like the example's, the handler prints its output on stdout (the worker's log).
- ``function`` / ``function_named``: a handler file of module-level functions, ``my_handler.py``
  (``handle``) and ``my_handler.py:my_function``.
- ``workdir``: a function entry point answering whether it runs in the model directory (TorchServe's
  worker does, and pytorch/serve's transformer handler relies on it).

The cases beside that matrix (xgboost_classfication, the body and context probes) are samples/ts_probes.py.

The handler and model files are stand-ins written for this project (samples/ts_examples/); none is
copied from pytorch/serve. With ``TSCTL_PYTORCH_SERVE`` set to a checkout of pytorch/serve (a
directory holding ``examples/``), the mnist, resnet_18, custom_metrics, micro_batching and transformer
cases use the checkout's own handler and model files instead (``Example.source == "pytorch/serve"``), with the
configuration their READMEs give: custom_metrics needs the example's metrics.yaml as TorchServe's
``metrics_config`` (``Example.properties``), the transformer its model-config.yaml (``handler:``
section; the ``pt2`` compile section is left out: inductor on CPU compiles for minutes).
"""

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

SERVE_ENV = "TSCTL_PYTORCH_SERVE"
STAND_INS = Path(__file__).resolve().parent / "ts_examples"
BIN = Path(sys.executable).parent
PACKAGERS = ("tsctl", "torch-model-archiver")


@dataclass
class Example:
    """One archive to build: torch-model-archiver's flags (``flags()``) and the requests to send."""

    name: str
    handler: str  # --handler, for both packagers: a built-in name, a module, a .py path, file.py:function
    inputs: List[Tuple[bytes, str]]  # (body, Content-Type) of each request
    serialized_file: Optional[Path] = None
    model_file: Optional[Path] = None
    extra_files: List[Path] = field(default_factory=list)
    config_file: Optional[Path] = None
    source: str = "stand-in"  # or "pytorch/serve": the files come from a checkout (TSCTL_PYTORCH_SERVE)
    packagers: Tuple[str, ...] = PACKAGERS
    properties: Dict[str, str] = field(default_factory=dict)  # config.properties lines the example needs
    metrics: Tuple[str, ...] = ()  # metric names the handler emits (custom_metrics)
    note: str = ""  # what is special about it, for the table
    spelled: Dict[str, str] = field(default_factory=dict)  # --handler by packager, where they differ
    same_as: Optional[str] = None  # another case whose answers these must equal (same handler code and files)

    def flags(self, packager: str = "tsctl") -> List[str]:
        handler = self.spelled.get(packager, self.handler)
        flags = ["--model-name", self.name, "--version", "1.0", "--handler", handler]
        if self.serialized_file:
            flags += ["--serialized-file", str(self.serialized_file)]
        if self.model_file:
            flags += ["--model-file", str(self.model_file)]
        if self.extra_files:
            flags += ["--extra-files", ",".join(str(f) for f in self.extra_files)]
        if self.config_file:
            flags += ["--config-file", str(self.config_file)]
        return flags


def package(example: Example, packager: str, store: Path, timeout: float = 600) -> Path:
    """``tsctl package`` or ``torch-model-archiver`` with the example's flags, into ``store``, as
    whole processes; a refusal raises PackagingError with the command and what it printed."""
    store.mkdir(parents=True, exist_ok=True)
    if packager == "tsctl":
        command = [str(BIN / "tsctl"), "package", *example.flags(packager), "--export-path", str(store), "--force"]
    elif packager == "torch-model-archiver":
        command = [str(BIN / "torch-model-archiver"), *example.flags(packager), "--export-path", str(store), "--force"]
    else:
        raise ValueError(f"unknown packager {packager!r}")
    # torch-model-archiver stages in $TMPDIR/MODEL_NAME, removing what is there: a private TMPDIR keeps
    # two builds of one model name (another test, another run) from emptying each other's
    scratch = tempfile.mkdtemp(prefix="tsx-package-")
    try:
        env = dict(os.environ, TMPDIR=scratch)
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    archive = store / f"{example.name}.mar"
    if done.returncode != 0 or not archive.is_file():
        raise PackagingError(command, done.returncode, (done.stdout + done.stderr).strip())
    return archive


class PackagingError(Exception):
    def __init__(self, command: List[str], code: int, output: str):
        self.command, self.code, self.output = command, code, output
        super().__init__(f"{' '.join(command)} exited {code}: {output[-2000:]}")


def checkout() -> Optional[Path]:
    """The pytorch/serve checkout ``TSCTL_PYTORCH_SERVE`` names, None when unset; a value that is not
    a checkout is an error, not a silent fall-back to the stand-ins."""
    value = os.environ.get(SERVE_ENV)
    if not value:
        return None
    path = Path(value).expanduser().resolve()
    if not (path / "examples").is_dir():
        raise FileNotFoundError(f"{SERVE_ENV}={value}: no examples/ directory there (a pytorch/serve checkout)")
    return path


# ---- inputs -----------------------------------------------------------------------------------------
SEGMENTS = {  # seven-segment strokes on a 28x28 canvas: (x0, y0, x1, y1)
    "a": (9, 5, 19, 5),
    "b": (19, 5, 19, 14),
    "c": (19, 14, 19, 23),
    "d": (9, 23, 19, 23),
    "e": (9, 14, 9, 23),
    "f": (9, 5, 9, 14),
    "g": (9, 14, 19, 14),
}
DIGITS = {
    0: "abcdef",
    1: "bc",
    2: "abged",
    3: "abgcd",
    4: "fgbc",
    5: "afgcd",
    6: "afgedc",
    7: "abc",
    8: "abcdefg",
    9: "abcdfg",
}


def digit_png(digit: int, shift: int = 0) -> bytes:
    """A 28x28 grayscale PNG of ``digit``: white strokes on black, as MNIST's."""
    from PIL import Image, ImageDraw

    image = Image.new("L", (28, 28), 0)
    draw = ImageDraw.Draw(image)
    for segment in DIGITS[digit]:
        x0, y0, x1, y1 = SEGMENTS[segment]
        draw.line((x0 + shift, y0, x1 + shift, y1), fill=255, width=3)
    return png(image)


def png(image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def photo(seed: int, size: Tuple[int, int], fmt: str = "JPEG") -> bytes:
    """A synthetic photo (samples/image_model.py's), as JPEG or PNG."""
    from PIL import Image

    from samples.image_model import sample_jpeg

    jpeg = sample_jpeg(seed, size)
    if fmt == "JPEG":
        return jpeg
    return png(Image.open(io.BytesIO(jpeg)).convert("RGB"))


# ---- models -----------------------------------------------------------------------------------------
def _load_class(path: Path, name: str):
    """The class ``name`` of the model file at ``path`` (its directory first on sys.path meanwhile)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_ts_example_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return getattr(module, name)


def _save_state(model, path: Path) -> Path:
    import torch

    torch.save(model.state_dict(), path)
    return path


def _sharpen(layer, factor: float = 30.0):
    """Random weights give near-uniform outputs: scale the last layer so the top answer stands out
    and an argmax never rests on a near-tie (answers are compared across runtimes)."""
    import torch

    with torch.no_grad():
        layer.weight.mul_(factor)


def mnist_weights(model_file: Path, out: Path, seed: int = 0) -> Path:
    import torch

    torch.manual_seed(seed)
    net = _load_class(model_file, "Net")().eval()
    _sharpen(net.fc2)
    return _save_state(net, out)


def build_mnist(out: Path, serve: Optional[Path]) -> Example:
    out.mkdir(parents=True, exist_ok=True)
    if serve:
        folder = serve / "examples/image_classifier/mnist"
        model_file, handler = folder / "mnist.py", folder / "mnist_handler.py"
    else:
        model_file, handler = STAND_INS / "mnist/mnist.py", STAND_INS / "mnist/mnist_handler.py"
    weights = mnist_weights(model_file, out / "mnist_cnn.pt")
    inputs = [(digit_png(d, shift), "image/png") for d, shift in ((0, 0), (1, 1), (7, -1), (3, 0))]
    return Example(
        "mnist",
        str(handler),
        inputs,
        serialized_file=weights,
        model_file=model_file,
        source="pytorch/serve" if serve else "stand-in",
    )


def imagenet_style_labels(count: int = 1000) -> dict:
    """``{"0": ["n01440764", "tench"], ...}``-style labels: made-up WordNet-like ids and names."""
    return {str(i): [f"n{1440764 + 7 * i:08d}", f"class_{i:04d}"] for i in range(count)}


def build_resnet_18(out: Path, serve: Optional[Path]) -> List[Example]:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    if serve:
        folder = serve / "examples/image_classifier/resnet_18"
        model_file, labels = folder / "model.py", folder / "index_to_name.json"
    else:
        model_file, labels = STAND_INS / "resnet_18/model.py", out / "index_to_name.json"
        labels.write_text(json.dumps(imagenet_style_labels()))
    torch.manual_seed(1)
    model = _load_class(model_file, "ImageClassifier")().eval()
    _sharpen(model.fc)
    weights = _save_state(model, out / "resnet-18.pt")
    inputs = [
        (photo(1, (320, 240)), "image/jpeg"),
        (photo(2, (200, 300), "PNG"), "image/png"),
        (photo(3, (256, 256)), "image/jpeg"),
    ]
    source = "pytorch/serve" if serve else "stand-in"
    common = dict(serialized_file=weights, model_file=model_file, extra_files=[labels], source=source)
    return [
        Example(
            "resnet_18",
            "image_classifier",
            inputs,
            note="tsctl packages `--handler image_classifier` as its own image handler "
            "(handlers/image.py); torch-model-archiver as TorchServe's built-in",
            **common,
        ),
        Example(
            "resnet_18_ts",
            "ts.torch_handler.image_classifier",
            inputs,
            note="TorchServe's built-in handler named as a module (torch-model-archiver takes only "
            "its short names or a .py path)",
            packagers=("tsctl",),
            same_as="resnet_18",
            **common,
        ),
    ]


def build_object_detector(out: Path) -> Example:
    import torch
    from torchvision.models.detection import FasterRCNN_ResNet50_FPN_Weights

    out.mkdir(parents=True, exist_ok=True)
    model_file = STAND_INS / "object_detector/model.py"
    names = FasterRCNN_ResNet50_FPN_Weights.DEFAULT.meta["categories"]  # COCO's 91 (static metadata)
    labels = out / "index_to_name.json"
    labels.write_text(json.dumps({str(i): name for i, name in enumerate(names)}))
    torch.manual_seed(2)
    weights = _save_state(_load_class(model_file, "FRCNNObjectDetector")().eval(), out / "fasterrcnn.pt")
    inputs = [(photo(4, (96, 64)), "image/jpeg"), (photo(5, (80, 80), "PNG"), "image/png")]
    return Example(
        "object_detector",
        "object_detector",
        inputs,
        serialized_file=weights,
        model_file=model_file,
        extra_files=[labels],
    )


def build_image_segmenter(out: Path) -> Example:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    model_file = STAND_INS / "image_segmenter/model.py"
    torch.manual_seed(3)
    model = _load_class(model_file, "FCNImageSegmenter")().eval()
    _sharpen(model.classifier[4])
    weights = _save_state(model, out / "fcn_resnet50.pt")
    inputs = [(photo(6, (64, 64)), "image/jpeg")]
    return Example(
        "image_segmenter",
        "image_segmenter",
        inputs,
        serialized_file=weights,
        model_file=model_file,
        note="answers 224x224x2 nested lists (the handler's resize and crop)",
    )


CUSTOM_METRICS = (  # the metrics pytorch/serve's custom_metrics handler emits
    "InitializeCallCount",
    "InferenceRequestCount",
    "PreprocessCallCount",
    "RequestBatchSize",
    "SizeOfImage",
    "HandlerMethodTime",
    "PostprocessCallCount",
    "ExamplePercentMetric",
)


STAND_IN_METRICS = (  # what samples/ts_examples/custom_metrics/metrics_handler.py emits
    "ConformanceLoads",
    "ConformanceRequests",
    "ConformanceBatchSize",
    "ConformanceImageBytes",
    "ConformancePreprocessTime",
    "ConformancePostprocessCalls",
    "ConformanceDigitShare",
)


def build_custom_metrics(out: Path, serve: Optional[Path]) -> Example:
    out.mkdir(parents=True, exist_ok=True)
    if serve:
        model_file = serve / "examples/image_classifier/mnist/mnist.py"
        handler = serve / "examples/custom_metrics/mnist_handler.py"
        metrics = CUSTOM_METRICS
        # its README: config.properties names the example's metrics.yaml (RequestBatchSize, which the
        # handler's get_metric needs, is declared there only) and turns on auto-detection
        properties = {
            "metrics_config": str(serve / "examples/custom_metrics/metrics.yaml"),
            "model_metrics_auto_detect": "true",
        }
    else:  # in the example's shape: its own metrics.yaml, some of its metrics auto-detected
        metrics = STAND_IN_METRICS
        model_file = STAND_INS / "mnist/mnist.py"
        handler = STAND_INS / "custom_metrics/metrics_handler.py"
        properties = {
            "metrics_config": str(STAND_INS / "custom_metrics/metrics.yaml"),
            "model_metrics_auto_detect": "true",
        }
    weights = mnist_weights(model_file, out / "mnist_cnn.pt")
    inputs = [(digit_png(d), "image/png") for d in (2, 5, 8)]
    return Example(
        "custom_metrics",
        str(handler),
        inputs,
        serialized_file=weights,
        model_file=model_file,
        source="pytorch/serve" if serve else "stand-in",
        properties=properties,
        metrics=tuple(metrics),
        note="needs its metrics.yaml (TorchServe's metrics_config): `tsctl run` reads it from "
        "config/config.properties, as `tsctl serve` does, or takes --metrics-config",
    )


def build_micro_batching(out: Path, serve: Optional[Path]) -> Example:
    """A handler whose ``handle`` is TorchServe's MicroBatching: non-daemon threads that never end."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    if serve:  # its README: resnet_18's model.py and the image classifier's labels, its config.yaml
        folder = serve / "examples/micro_batching"
        model_file = serve / "examples/image_classifier/resnet_18/model.py"
        torch.manual_seed(6)
        model = _load_class(model_file, "ImageClassifier")().eval()
        _sharpen(model.fc)
        weights = _save_state(model, out / "resnet-18.pt")
        extra = [serve / "examples/image_classifier/index_to_name.json"]
        inputs = [(photo(7, (320, 240)), "image/jpeg"), (photo(8, (200, 300), "PNG"), "image/png")]
    else:
        folder, model_file, extra = STAND_INS / "micro_batching", STAND_INS / "mnist/mnist.py", []
        weights = mnist_weights(model_file, out / "mnist_cnn.pt", seed=6)
        inputs = [(digit_png(d, shift), "image/png") for d, shift in ((4, 0), (6, 1), (9, -1))]
    return Example(
        "micro_batching",
        str(folder / "micro_batching_handler.py"),
        inputs,
        serialized_file=weights,
        model_file=model_file,
        extra_files=extra,
        config_file=folder / "config.yaml",
        source="pytorch/serve" if serve else "stand-in",
        note="TorchServe's MicroBatching: non-daemon threads that never end; `tsctl run` must exit anyway",
    )


SEQUENCE_LABELS = {0: "Not Accepted", 1: "Accepted"}
TEXTS = [
    "Bloomberg has decided to publish a new report on the global economy.",
    "The cat sat on the mat and would not move for anybody.",
    "Ünïcödé text, with emoji 🙂 and punctuation!",
]


def build_transformer(out: Path, serve: Optional[Path]) -> Example:
    from samples.text_models import minilm_dir, small_bert

    model_dir = small_bert("BertForSequenceClassification", SEQUENCE_LABELS, out / "Transformer_model", seed=4)
    for name in ("vocab.txt", "special_tokens_map.json"):  # the tokenizer files older transformers wrote
        shutil.copy(minilm_dir() / name, model_dir / name)
    tokenizer_files = [
        model_dir / n for n in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
    ]
    if serve:
        import yaml

        folder = serve / "examples/Huggingface_Transformers"
        config = yaml.safe_load((folder / "model-config.yaml").read_text())
        config.pop("pt2", None)  # torch.compile(inductor) on CPU: minutes, and a C compiler
        config["handler"].update(num_labels=len(SEQUENCE_LABELS))
        config_file = out / "model-config.yaml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        labels = folder / "Seq_classification_artifacts/index_to_name.json"
        handler = folder / "Transformer_handler_generalized.py"
        # captum_explanation: true (the example's setting) reads each text as {"text", "target"}
        inputs = [(json.dumps({"text": t, "target": 1}).encode(), "text/plain") for t in TEXTS]
        extra = [model_dir / "config.json", labels, *tokenizer_files]
    else:
        setup = out / "setup_config.json"
        setup.write_text(
            json.dumps(
                {
                    "model_name": "tiny-random-bert",
                    "mode": "sequence_classification",
                    "do_lower_case": True,
                    "num_labels": str(len(SEQUENCE_LABELS)),
                    "save_mode": "pretrained",
                    "max_length": "64",
                }
            )
        )
        labels = out / "index_to_name.json"
        labels.write_text(json.dumps({str(k): v for k, v in SEQUENCE_LABELS.items()}))
        config_file, handler = None, STAND_INS / "transformer/transformer_handler.py"
        inputs = [(t.encode("utf-8"), "text/plain") for t in TEXTS]
        extra = [model_dir / "config.json", setup, labels, *tokenizer_files]
    return Example(
        "transformer",
        str(handler),
        inputs,
        serialized_file=model_dir / "model.safetensors",
        extra_files=extra,
        config_file=config_file,
        source="pytorch/serve" if serve else "stand-in",
    )


def build_function(out: Path) -> List[Example]:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    handler = STAND_INS / "function/my_handler.py"
    torch.manual_seed(5)
    mlp = _load_class(handler, "mlp")()
    weights = _save_state(mlp, out / "mlp.pt")
    rows = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3], [-1.0, 0.0, 1e-3, 42.0]]
    inputs = [(json.dumps({"values": row}).encode(), "application/json") for row in rows]
    return [
        Example("function", str(handler), inputs, serialized_file=weights, note="module-level handle(data, context)"),
        Example(
            "function_named",
            f"{handler}:my_function",
            inputs,
            serialized_file=weights,
            note="file.py:function entry point; torch-model-archiver spells it my_handler:my_function "
            "(it appends .py itself, and refuses my_handler.py:my_function)",
            spelled={"torch-model-archiver": f"{handler.with_suffix('')}:my_function"},
        ),
    ]


def build_workdir(out: Path) -> Example:
    out.mkdir(parents=True, exist_ok=True)
    notes = out / "notes.txt"
    notes.write_text("a file the handler opens by a bare relative name\n")
    return Example(
        "workdir",
        str(STAND_INS / "workdir/workdir_handler.py"),
        [(b"{}", "application/json")],
        extra_files=[notes],
        note="the handler's working directory: TorchServe's worker runs in the model directory",
    )


def build(out: Path, serve: Optional[Path] = None) -> List[Example]:
    """Every case, its files under ``out/NAME/``; ``serve``: a pytorch/serve checkout for the real
    example files (default: ``TSCTL_PYTORCH_SERVE``, else the stand-ins)."""
    out = Path(out)
    serve = serve if serve is not None else checkout()
    return [
        build_mnist(out / "mnist", serve),
        *build_resnet_18(out / "resnet_18", serve),
        build_object_detector(out / "object_detector"),
        build_image_segmenter(out / "image_segmenter"),
        build_custom_metrics(out / "custom_metrics", serve),
        build_micro_batching(out / "micro_batching", serve),
        build_transformer(out / "transformer", serve),
        *build_function(out / "function"),
        build_workdir(out / "workdir"),
    ]


# ---- the results table ----------------------------------------------------------------------------
RUNTIMES = ("in-process", "TorchServe", "KServe engine", "tsctl run", "MLServer")


def render_table(examples: List[Example], cells: Dict[Tuple[str, str, str], str]) -> str:
    """Markdown: one row per case and packager, one column per runtime; ``cells`` maps (case,
    packager, runtime) to "equal" or "differs (reason)"; a missing cell is "not run". ``files``: whose
    handler and model files the case packaged (stand-in, or pytorch/serve's own)."""
    lines = [
        "| case | --handler | files | packager | " + " | ".join(RUNTIMES) + " |",
        "|---|---|---|---|" + "---|" * len(RUNTIMES),
    ]
    for example in examples:
        for packager in PACKAGERS:
            handler = example.spelled.get(packager, example.handler)
            handler = f"`{Path(handler).name if '/' in handler else handler}`"
            row = [cells.get((example.name, packager, runtime), "not run") for runtime in RUNTIMES]
            lines.append(f"| {example.name} | {handler} | {example.source} | {packager} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    built = build(Path(sys.argv[1] if len(sys.argv) > 1 else "samples/build/ts_examples"))
    for example in built:
        print(example.name, example.source, " ".join(example.flags()))
