"""Image classification: an image in, ``{label: probability}`` for the top k classes out.

model-config.yaml, all optional (ImageNet defaults)::

    handler:
      resize: 256          # shorter side, before the crop
      crop: 224            # centre crop
      mean: [0.485, 0.456, 0.406]
      std: [0.229, 0.224, 0.225]
      top_k: 5
      max_pixels: 89478485 # larger images are refused with 413 (decompression bombs)
      labels: index_to_name.json
      jpeg_draft: true     # decode JPEGs at the smallest DCT scale still >= the resize target (2-4x faster)
      decode_threads: 2    # decode a batch's images in parallel (PIL releases the GIL)
      channels_last: true  # NHWC batches: faster convolutions on CPU
      optimize: true       # TorchScript: freeze + optimize_for_inference (folds batch norm into convolutions)

Labels map class indices to names like TorchServe's ``index_to_name.json``: ``{"0": "tench"}`` or
``{"0": ["n01440764", "tench"]}``; without the file, labels are the class indices.
"""

import io
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torchvision.transforms.v2 import functional as F

from .base import Settings, ToolkitHandler, entry_point
from .requests import ClientError, to_bytes

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
WIDE_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")  # 16-bit and float images


@dataclass
class ImageSettings(Settings):
    resize: int = 256
    crop: int = 224
    mean: Tuple[float, ...] = IMAGENET_MEAN
    std: Tuple[float, ...] = IMAGENET_STD
    top_k: int = 5
    max_pixels: int = 89_478_485
    labels: str = "index_to_name.json"
    jpeg_draft: bool = True
    decode_threads: int = 2
    channels_last: bool = True
    optimize: bool = True

    def check(self):
        if len(self.mean) != 3 or len(self.std) != 3:
            return "'handler.mean' and 'handler.std' must each hold 3 numbers (R, G, B)"
        if any(s <= 0 for s in self.std):
            return "'handler.std' values must be positive"
        for key in ("resize", "crop", "top_k", "max_pixels", "decode_threads"):
            if getattr(self, key) < 1:
                return f"'handler.{key}' must be at least 1"
        return None


def read_labels(path: str) -> dict:
    """``index_to_name.json`` as {int index: name}; an empty dict when the file is absent."""
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        mapping = json.load(f)
    return {int(k): (v[-1] if isinstance(v, list) else str(v)) for k, v in mapping.items()}


class ImageClassifier(ToolkitHandler):
    Settings = ImageSettings
    item_keys = ("data", "b64", "image")

    def load_model(self):
        model = super().load_model()
        if self.settings.optimize and isinstance(model, torch.jit.ScriptModule):
            model = torch.jit.optimize_for_inference(torch.jit.freeze(model))
        return model

    def setup(self):
        threads = self.settings.decode_threads
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="decode") if threads > 1 else None
        self.labels = read_labels(os.path.join(self.model_dir, self.settings.labels))
        self.mean = torch.tensor(self.settings.mean, device=self.device).view(1, 3, 1, 1)
        self.std = torch.tensor(self.settings.std, device=self.device).view(1, 3, 1, 1)

    def decode(self, item) -> torch.Tensor:
        """Bytes to a resized, centre-cropped uint8 CHW tensor."""
        data = to_bytes(item, "image")
        if not data:
            raise ClientError("image is empty (0 bytes)")
        image = open_image(data, self.settings.max_pixels, self.settings.resize if self.settings.jpeg_draft else None)
        image = F.resize(image, [self.settings.resize], antialias=True)
        image = F.center_crop(image, [self.settings.crop])
        return F.pil_to_tensor(image)

    def decode_map(self, function, jobs):
        if self.pool is None or len(jobs) < 2:
            return super().decode_map(function, jobs)
        return list(self.pool.map(function, jobs))

    def preprocess(self, inputs):
        batch = torch.stack(inputs).to(self.device, non_blocking=True)
        batch = (batch.float().div_(255) - self.mean) / self.std
        if self.settings.channels_last:
            batch = batch.contiguous(memory_format=torch.channels_last)
        return batch

    def postprocess(self, output):
        probabilities = torch.softmax(output.float(), dim=1)
        k = min(self.settings.top_k, probabilities.shape[1])
        values, indices = probabilities.topk(k, dim=1)
        return [
            {self.labels.get(i, str(i)): p for i, p in zip(row_indices, row_values)}
            for row_indices, row_values in zip(indices.tolist(), values.tolist())
        ]


def open_image(data: bytes, max_pixels: int, shorter_side: Optional[int] = None) -> Image.Image:
    """Decode image bytes to RGB; refuse what PIL cannot read and images above ``max_pixels``.

    With ``shorter_side``, a JPEG is decoded at the smallest DCT scale (1/2, 1/4, 1/8) whose shorter
    side is still at least that many pixels: the later antialiased resize sees nearly the same image."""
    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > max_pixels:
            raise ClientError(f"image is {width}x{height}, above the limit of {max_pixels} pixels", 413)
        if width < 1 or height < 1:
            raise ClientError(f"image is {width}x{height}: it has no pixels")
        if shorter_side and image.format == "JPEG":
            scale = shorter_side / min(width, height)
            image.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
        if image.mode in WIDE_MODES:  # 16-bit and float images: scale to 8 bits (PIL would clip at 255)
            values = np.asarray(image, dtype=np.float32)
            top = 65535.0 if image.mode.startswith("I;16") or values.max() > 255 else 255.0
            image = Image.fromarray((values * (255.0 / top)).clip(0, 255).astype(np.uint8), "L")
        return image.convert("RGB")
    except ClientError:
        raise
    except Image.DecompressionBombError as exc:
        raise ClientError(f"image refused as a decompression bomb: {exc}", 413) from None
    except UnidentifiedImageError:
        raise ClientError("could not decode image: not a format PIL can read (send JPEG, PNG, ...)") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ClientError(f"could not decode image: {exc}") from None


handle = entry_point(ImageClassifier)
