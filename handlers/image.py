"""Image classification: an image in, ``{label: probability}`` for the top k classes out.

model-config.yaml, all optional (ImageNet defaults)::

    handler:
      resize: 256          # shorter side, before the crop (as torchvision's Resize)
      crop: 224            # centre crop; at most resize
      mean: [0.485, 0.456, 0.406]
      std: [0.229, 0.224, 0.225]
      top_k: 5
      labels: index_to_name.json
      max_pixels: 89478485         # one image above this many pixels: 413 (decompression bombs)
      max_request_pixels: 178956970  # all images of one request together: 413
      max_aspect_ratio: 50         # longer side / shorter side above this: 413
      formats: [BMP, GIF, ICO, JPEG, PNG, PPM, TGA, TIFF, WEBP]  # null: every format PIL reads
      jpeg_draft: false    # true: JPEGs decode at a reduced DCT scale (2-4x faster; answers move ~1e-3)
      decode_threads: 2    # decode a batch's images in parallel (PIL releases the GIL)
      channels_last: true  # NHWC batches: faster convolutions on CPU
      optimize: true       # TorchScript: freeze + optimize_for_inference (folds batch norm into convolutions)
      gpu_decode: true     # on a GPU: a batch's JPEGs decoded (nvJPEG), resized and cropped there
      precision: fp32      # fp16 or bf16: half the memory and bandwidth on a GPU, answers move ~1e-3

Labels map class indices to names like TorchServe's ``index_to_name.json``: ``{"0": "tench"}`` or
``{"0": ["n01440764", "tench"]}``; without the file, labels are the class indices.

The resize and crop are torchvision's, on the PIL image, as TorchServe's built-in image classifier
makes them (``resize_crop``): with ``jpeg_draft`` off (the default) the answers equal the built-in's.
A resized copy is bounded: ``max_aspect_ratio`` refuses extreme shapes first (a 1x100,000 PNG would
ask for 26 GB), and above ``EXACT_RESIZE_PIXELS`` only the crop's box is resampled. Images above a
quarter of ``max_pixels`` decode one at a time, so a batch's decode memory stays near that of one
image at the limit.

**On a GPU** (a worker given one: serving/gpus.py) the JPEGs of a batch, which are most of what clients send,
are not decoded by ``decode``: it reads their headers and checks their size as for any image, and
``preprocess`` decodes them together on the model's GPU (``torchvision.io.decode_jpeg``, nvJPEG), resizes
and crops each there with torchvision's antialiased bilinear resize, the same coordinates as ``resize_crop``
(``gpu_decode: false`` turns it off). On the CPU, that path gives PIL's pixels within one level; nvJPEG's
IDCT may move a few more. Other formats, CMYK JPEGs, ``jpeg_draft`` and a JPEG nvJPEG cannot read are
decoded by PIL as on the CPU, and copied to the GPU through pinned memory.
"""

import contextlib
import io
import json
import math
import os
import threading
from http import HTTPStatus
from typing import Iterator, List, Optional, Sequence, Union

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torchvision.transforms.v2 import functional as F

from .base import ToolkitHandler, entry_point
from .errors import ClientError
from .items import to_bytes
from .loading import to_device
from .settings import ImageSettings

WIDE_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")  # 16-bit and float images
EXACT_RESIZE_PIXELS = 1 << 24  # a full resized copy up to this size (48 MB in RGB), as torchvision makes it


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
    input_kind = "image"
    splits = True  # one request in, one tensor out of preprocess: a KServe transformer can run it

    def load_model(self):
        model = super().load_model()
        if self.settings.optimize and isinstance(model, torch.jit.ScriptModule):
            model = torch.jit.optimize_for_inference(torch.jit.freeze(model))
        return model

    def setup(self):
        self.formats = None if self.settings.formats is None else [f.upper() for f in self.settings.formats]
        self.large_decode = threading.Lock()  # one image above max_pixels / 4 decodes at a time
        self.labels = read_labels(os.path.join(self.model_dir, self.settings.labels))
        self.mean = torch.tensor(self.settings.mean, device=self.device).view(1, 3, 1, 1)
        self.std = torch.tensor(self.settings.std, device=self.device).view(1, 3, 1, 1)
        self.decode_on_gpu = self.settings.gpu_decode and self.device.type == "cuda"

    def decode(self, item) -> Union[torch.Tensor, "EncodedJpeg"]:
        """Bytes to a resized, centre-cropped uint8 CHW tensor; its size checked before it is decoded. On a
        GPU a JPEG is left encoded for ``preprocess`` to decode with the batch's others (``EncodedJpeg``)."""
        data = to_bytes(item, "image")
        if not data:
            raise ClientError("image is empty (0 bytes)")
        settings = self.settings
        image = open_image(data, self.formats, settings.max_pixels)
        self.check_size(*image.size)
        on_gpu = self.decode_on_gpu and image.format == "JPEG" and image.mode in ("RGB", "L")
        if on_gpu and not settings.jpeg_draft and resized_whole(*image.size, settings.resize):  # else: PIL's box
            return EncodedJpeg(data, image)
        shorter_side = settings.resize if settings.jpeg_draft else None
        large = image.size[0] * image.size[1] > settings.max_pixels // 4
        with self.large_decode if large else contextlib.nullcontext():
            image = decode_image(image, settings.resize, settings.crop, shorter_side)
        return F.pil_to_tensor(image)

    def check_size(self, width: int, height: int):
        """Refuse an image whose size alone makes it too costly (413) or empty (400)."""
        settings = self.settings
        if width < 1 or height < 1:
            raise ClientError(f"image is {width}x{height}: it has no pixels")
        pixels = width * height
        if pixels > settings.max_pixels:
            raise ClientError(
                f"image is {width}x{height} = {pixels:,} pixels, above the limit of {settings.max_pixels:,} "
                "(handler.max_pixels)",
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            )
        ratio = max(width, height) / min(width, height)
        if ratio > settings.max_aspect_ratio:
            raise ClientError(
                f"image is {width}x{height}, an aspect ratio of {ratio:,.0f}:1, above the limit of "
                f"{settings.max_aspect_ratio:g}:1 (handler.max_aspect_ratio)",
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            )
        self.spend(pixels, "decoded pixels", "max_request_pixels", settings.max_request_pixels)

    def preprocess(self, inputs):
        jpegs = [i for i in inputs if isinstance(i, EncodedJpeg)]
        if jpegs:  # on a GPU: decoded there together, the others copied there one by one
            decoded = decode_jpegs(jpegs, self.device, self.settings)
            images = torch.stack(
                [next(decoded) if isinstance(i, EncodedJpeg) else to_device(i, self.device) for i in inputs]
            )
        else:  # one copy of the whole batch (pinned, to a GPU)
            images = to_device(torch.stack(inputs), self.device)
        batch = (images.float().div_(255) - self.mean) / self.std
        if self.settings.channels_last:
            batch = batch.contiguous(memory_format=torch.channels_last)
        return batch.to(self.dtype)

    def postprocess(self, output, inputs=None):
        probabilities = torch.softmax(output.float(), dim=1)
        k = min(self.settings.top_k, probabilities.shape[1])
        values, indices = probabilities.topk(k, dim=1)
        return [
            {self.labels.get(i, str(i)): p for i, p in zip(row_indices, row_values)}
            for row_indices, row_values in zip(indices.tolist(), values.tolist())
        ]


class EncodedJpeg:
    """A JPEG whose header ``decode`` read and checked, left encoded for ``decode_jpegs`` (on the GPU)."""

    __slots__ = ("data", "image")

    def __init__(self, data: bytes, image: Image.Image):
        self.data, self.image = data, image


def decode_jpegs(jpegs: List[EncodedJpeg], device: torch.device, settings) -> Iterator[torch.Tensor]:
    """Each JPEG as a resized, centre-cropped uint8 CHW tensor on ``device``, in order: decoded together
    by torchvision (on a GPU, nvJPEG, in one call), each then resized and cropped there
    (``resize_crop_tensor``). A batch nvJPEG refuses is decoded again one by one (``decode_one``). A JPEG
    whose resized copy would be above ``EXACT_RESIZE_PIXELS`` (an extreme shape) is decoded by PIL, which
    resamples only the crop's box (``resize_crop``), and copied to ``device``."""
    if not jpegs:
        return iter(())
    from torchvision.io import ImageReadMode, decode_jpeg

    encoded = {
        index: torch.frombuffer(bytearray(jpeg.data), dtype=torch.uint8)
        for index, jpeg in enumerate(jpegs)
        if resized_whole(*jpeg.image.size, settings.resize)
    }
    try:
        found = decode_jpeg(list(encoded.values()), mode=ImageReadMode.RGB, device=device) if encoded else []
        pictures: Optional[dict] = dict(zip(encoded, found))
    except RuntimeError:  # one JPEG nvJPEG cannot read fails the call: the others are decoded alone
        pictures = None
    return iter(
        [
            pil_decoded(jpeg, device, settings)
            if index not in encoded
            else decode_one(jpeg, encoded[index], device, settings)
            if pictures is None
            else resize_crop_tensor(pictures[index], settings.resize, settings.crop)
            for index, jpeg in enumerate(jpegs)
        ]
    )


def resized_size(width: int, height: int, resize: int) -> "tuple[int, int]":
    """(width, height) of an image resized so that its shorter side is ``resize``, as torchvision's Resize."""
    if width <= height:
        return resize, int(resize * height / width)
    return int(resize * width / height), resize


def resized_whole(width: int, height: int, resize: int) -> bool:
    """Whether a full resized copy of a width x height image stays within ``EXACT_RESIZE_PIXELS``."""
    new_width, new_height = resized_size(width, height, resize)
    return new_width * new_height <= EXACT_RESIZE_PIXELS


def pil_decoded(jpeg: EncodedJpeg, device: torch.device, settings) -> torch.Tensor:
    """A JPEG decoded, resized and cropped by PIL as on the CPU (``decode_image``), copied to ``device``."""
    return to_device(F.pil_to_tensor(decode_image(jpeg.image, settings.resize, settings.crop)), device)


def decode_one(jpeg: EncodedJpeg, data: torch.Tensor, device: torch.device, settings) -> torch.Tensor:
    """One JPEG decoded by torchvision on ``device``, resized and cropped there; one it cannot read by PIL,
    as on the CPU (a damaged one: the ClientError PIL's decode gives), copied to ``device``."""
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        picture = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        return pil_decoded(jpeg, device, settings)
    return resize_crop_tensor(picture, settings.resize, settings.crop)


def resize_crop_tensor(picture: torch.Tensor, resize: int, crop: int) -> torch.Tensor:
    """``resize_crop`` on a uint8 CHW tensor where it is (the GPU): torchvision's antialiased bilinear
    resize of the shorter side to ``resize``, then the centre ``crop`` at the same coordinates. The whole
    resized copy is made: callers keep to ``resized_whole`` (PIL's ``resize_crop`` resamples only the crop's box)."""
    height, width = picture.shape[-2:]
    new_width, new_height = resized_size(width, height, resize)
    left = int(round((new_width - crop) / 2.0))
    top = int(round((new_height - crop) / 2.0))
    resized = F.resize(picture, [new_height, new_width], antialias=True)
    return resized[:, top : top + crop, left : left + crop]


def open_image(data: bytes, formats: Optional[Sequence[str]] = None, max_pixels: int = 0) -> Image.Image:
    """Read the image's header only (format, size, mode); nothing is decoded yet."""
    try:
        return Image.open(io.BytesIO(data), formats=formats)
    except Image.DecompressionBombError as exc:  # PIL's own check, at twice its limit
        message = f"image is above the limit of {max_pixels:,} pixels (handler.max_pixels): {exc}"
        raise ClientError(message, HTTPStatus.REQUEST_ENTITY_TOO_LARGE) from None
    except UnidentifiedImageError:
        accepted = f" (accepted: {', '.join(formats)})" if formats else ""
        raise ClientError(
            f"could not decode image: not an image, damaged, or of a format this model does not accept{accepted}"
        ) from None
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - PIL raises many kinds for malformed headers
        raise ClientError(f"could not decode image: {exc or type(exc).__name__}") from None


def decode_image(image: Image.Image, resize: int, crop: int, shorter_side: Optional[int] = None) -> Image.Image:
    """Decode an opened image to RGB, resized and centre-cropped as torchvision's Resize + CenterCrop.

    With ``shorter_side``, a JPEG is decoded at the smallest DCT scale (1/2, 1/4, 1/8) whose shorter
    side is still at least that many pixels: the antialiased resize sees nearly the same image.
    16-bit and float images are scaled to 8 bits (PIL would clip them at 255)."""
    try:
        if shorter_side and image.format == "JPEG":
            width, height = image.size
            scale = shorter_side / min(width, height)
            image.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
        if image.mode in WIDE_MODES:
            low, high = image.getextrema()
            top = 65535.0 if image.mode.startswith("I;16") or high > 255 else 255.0
            floats = Image.fromarray(np.asarray(image, dtype=np.float32), "F")
            values = np.asarray(resize_crop(floats, resize, crop)) * (255.0 / top)
            return Image.fromarray(values.clip(0, 255).astype(np.uint8), "L").convert("RGB")
        if image.mode == "L":  # resize first: the same pixels, a quarter of the memory
            return resize_crop(image, resize, crop).convert("RGB")
        if image.mode != "RGB":
            image = image.convert("RGB")
        return resize_crop(image, resize, crop)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a malformed file makes PIL raise
        raise ClientError(f"could not decode image: {exc or type(exc).__name__}") from None


def resize_crop(image: Image.Image, resize: int, crop: int) -> Image.Image:
    """torchvision's ``Resize(resize)`` then ``CenterCrop(crop)`` on a PIL image (bilinear,
    antialiased), as TorchServe's built-in image classifier computes them: the same pixels, so the
    same answers. A resized copy above ``EXACT_RESIZE_PIXELS`` (an extreme aspect ratio that
    ``max_aspect_ratio`` was raised to let in) is computed only where the crop is: PIL resamples the
    crop's box of the original straight to crop x crop pixels, with the same filter and coordinates
    (pixels may then differ by one level from the full resize). Needs crop <= resize."""
    width, height = image.size
    new_width, new_height = resized_size(width, height, resize)
    left = int(round((new_width - crop) / 2.0))
    top = int(round((new_height - crop) / 2.0))
    if new_width * new_height <= EXACT_RESIZE_PIXELS:
        resized = image.resize((new_width, new_height), Image.BILINEAR)
        return resized.crop((left, top, left + crop, top + crop))
    scale_x, scale_y = width / new_width, height / new_height
    box = (left * scale_x, top * scale_y, (left + crop) * scale_x, (top + crop) * scale_y)
    return image.resize((crop, crop), Image.BILINEAR, box=box)


handle = entry_point(ImageClassifier)
