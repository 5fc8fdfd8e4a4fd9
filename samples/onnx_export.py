"""Export a model to ONNX for the toolkit handlers, and check it against the original.

    python -m samples.onnx_export image samples/build/resnet18 samples/build/resnet18.onnx
    python -m samples.onnx_export text samples/build/text/minilm samples/build/minilm-onnx

- ``image``: the eager model (``model.py`` + ``resnet18.pt`` state_dict, as ``tsctl package`` takes
  them) to one ONNX file with a dynamic batch: input ``input`` [N, 3, H, W], output ``logits``.
  Package it with ``--serialized-file resnet18.onnx --handler image_classifier`` (no --model-file).
- ``text``: a Hugging Face directory to a directory holding ``model.onnx`` (inputs ``input_ids``,
  ``attention_mask`` and ``token_type_ids`` if the model takes them, dynamic batch and length; output
  ``logits`` for a classification head, else ``last_hidden_state``) beside a copy of the directory's
  config, tokenizer and sentence-transformers files (not its weights). Package the directory with
  the same text handler as the original.

Both check the export on sample inputs against the torch model and print the largest difference;
``tsctl package --golden`` and ``tsctl verify`` then compare the served archives. Uses
``torch.onnx.export`` (its TorchScript exporter, ``dynamo=False``: no onnxscript needed).
"""

import shutil
import sys
from pathlib import Path

import torch

OPSET = 17


def export_image(sample: Path, out: Path, size: int = 224) -> float:
    """``sample``'s model.py + resnet18.pt to ``out``; the largest |difference| from torch on a batch."""
    from handlers.loading import model_class

    model = model_class(str(sample), "model.py")()
    model.load_state_dict(torch.load(sample / "resnet18.pt", weights_only=True))
    model.eval()
    example = torch.randn(2, 3, size, size)
    torch.onnx.export(
        model,
        (example,),
        str(out),
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=OPSET,
        dynamo=False,
    )
    from handlers.onnx_runtime import OnnxModel

    batch = torch.randn(3, 3, size, size)
    with torch.inference_mode():
        return float((OnnxModel(str(out))(batch) - model(batch)).abs().max())


HEADS = ("ForSequenceClassification", "ForTokenClassification")


def export_text(hf_dir: Path, out: Path) -> float:
    """``hf_dir`` to ``out``/model.onnx plus its non-weight files; the largest |difference| on two texts."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(hf_dir, local_files_only=True)
    architecture = (config.architectures or [""])[0]
    head = next((h for h in HEADS if architecture.endswith(h)), None)
    auto = f"AutoModel{head}" if head else "AutoModel"
    model = getattr(transformers, auto).from_pretrained(hf_dir, local_files_only=True).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
    out.mkdir(parents=True, exist_ok=True)
    for path in hf_dir.rglob("*"):  # config, tokenizer, sentence-transformers modules: not the weights
        target = out / path.relative_to(hf_dir)
        if path.is_dir() or path.suffix in (".safetensors", ".bin", ".h5", ".onnx", ".msgpack", ".ot"):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    texts = ["A short sentence.", "A rather longer sentence, to make the batch hold some padding."]
    features = tokenizer(texts, padding=True, return_tensors="pt")
    names = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in features]
    output = "logits" if head else "last_hidden_state"

    class Graph(torch.nn.Module):  # named inputs in, the one output the handlers read
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            return getattr(self.model(**dict(zip(names, tensors))), output)

    axes = {name: {0: "batch", 1: "tokens"} for name in names}
    axes[output] = {0: "batch"} if head == "ForSequenceClassification" else {0: "batch", 1: "tokens"}
    torch.onnx.export(
        Graph().eval(),
        tuple(features[n] for n in names),
        str(out / "model.onnx"),
        input_names=names,
        output_names=[output],
        dynamic_axes=axes,
        opset_version=OPSET,
        dynamo=False,
    )
    from handlers.onnx_runtime import OnnxModel

    check = tokenizer(texts[::-1] + ["third"], padding=True, return_tensors="pt")
    with torch.inference_mode():
        want = getattr(model(**check), output)
    got = getattr(OnnxModel(str(out / "model.onnx"))(**check), output)
    return float((got - want).abs().max())


if __name__ == "__main__":
    kind, source, target = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    difference = export_image(source, target) if kind == "image" else export_text(source, target)
    print(f"wrote {target}; largest difference from torch: {difference:.2e}")
