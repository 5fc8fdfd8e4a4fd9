"""A model in ONNX, run by ONNX Runtime, behind the same hooks: torch tensors in, torch tensors out.

``--serialized-file model.onnx`` (image and tensor handlers), or a Hugging Face directory holding a
``model.onnx`` beside its config and tokenizer files (text handlers), loads an ``OnnxModel`` instead
of a torch module. It is called as the torch model is: positional tensors go to the graph's inputs in
order, keyword tensors (``input_ids=...``) by name (inputs the graph does not take are left out, as a
tokenizer's ``token_type_ids`` for a model exported without them). Called with positional tensors,
a graph with one output returns that tensor (an image model's logits); called with keywords (a
transformers model), an ``OnnxOutput`` whose attributes are the output names (``.logits``,
``.last_hidden_state``), as transformers' outputs are. Needs ``onnxruntime`` (the archive's
requirements.txt asks for it); runs on the CPU.
"""

from typing import Any, Dict, List, Optional

import torch


class OnnxOutput(dict):
    """A graph's named outputs: ``out.logits``, ``out["logits"]`` or ``out[0]``."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, key):
        if isinstance(key, int):
            return list(self.values())[key]
        return super().__getitem__(key)


class OnnxModel:
    def __init__(self, path: str, config: Any = None, threads: Optional[int] = None):
        """``threads``: ONNX Runtime's intra-op threads; by default torch's count, which the handler set
        for its worker (``loading.pick_threads``)."""
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads or torch.get_num_threads()
        self.session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.input_names: List[str] = [i.name for i in self.session.get_inputs()]
        self.output_names: List[str] = [o.name for o in self.session.get_outputs()]
        self.config = config  # a Hugging Face directory's config (labels), as the torch model has it

    def __call__(self, *args, **kwargs):
        feeds: Dict[str, Any] = dict(zip(self.input_names, args))
        feeds.update({name: value for name, value in kwargs.items() if name in self.input_names})
        arrays = {name: as_array(value) for name, value in feeds.items()}
        outputs = [torch.from_numpy(o) for o in self.session.run(self.output_names, arrays)]
        if len(outputs) == 1 and not kwargs:
            return outputs[0]
        return OnnxOutput(zip(self.output_names, outputs))

    def eval(self):
        return self

    def to(self, *args, **kwargs):
        return self  # ONNX Runtime's CPU provider: tensors come back on the CPU


def as_array(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().contiguous().numpy()
    return value
