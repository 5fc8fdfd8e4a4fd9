"""The toolkit's GPU paths, run here on the CPU through the very functions a GPU runs them with.

- **JPEGs decoded together on the model's device** (handlers/image.py: ``decode_jpegs``, ``resize_crop_tensor``):
  on the CPU torchvision's decoder is the same libjpeg-turbo PIL uses, so the path's resize and crop are held to
  PIL's pixels within one level, for generated JPEGs of every size, quality and chroma subsampling; through a
  whole handler the answers equal the PIL path's within the golden tolerance, and a damaged JPEG gets PIL's 400
  in its batch while its neighbours are answered. (nvJPEG's own IDCT is the GPU check's: benchmarks/gpu.py.)
- **handler.precision** fp16 and bf16: the model's weights and inputs in that precision, its answers within
  that precision's golden tolerance of fp32's (handlers/golden.py PRECISION_ATOL), and verify checks at it.
- **Out of memory in one batch** (torch's CUDA OutOfMemoryError, raised by the model for one request): that
  request 507, the batch's others answered, the worker kept, the next batch served."""

import io
import json

import pytest
import torch
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image
from torchvision.transforms.v2 import functional as F

from archiver.cli import main
from handlers import golden as golden_format
from handlers.image import EncodedJpeg, decode_image, decode_jpegs, open_image
from helpers.models import package_resnet
from samples.image_model import sample_jpeg
from serving.local_model import InProcessHandler, LocalModel, RequestInput

SETTINGS = type("S", (), {"resize": 256, "crop": 224})  # what decode_jpegs reads of ImageSettings


def jpeg_of(seed: int, size, quality: int, subsampling: int, mode: str = "RGB") -> bytes:
    image = Image.open(io.BytesIO(sample_jpeg(seed, size))).convert(mode)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality, subsampling=subsampling if mode == "RGB" else 0)
    return out.getvalue()


@settings(max_examples=25, deadline=None)
@given(
    width=st.integers(224, 1600),
    height=st.integers(224, 1600),
    quality=st.integers(30, 100),
    subsampling=st.sampled_from([0, 1, 2]),
    mode=st.sampled_from(["RGB", "L"]),
    seed=st.integers(0, 1000),
)
@example(width=272, height=272, quality=30, subsampling=0, mode="RGB", seed=1)  # one pixel of 150,528 two levels off
def test_the_device_path_gives_pils_pixels_within_one_level(width, height, quality, subsampling, mode, seed):
    """Within one level, but for a rare pixel at two (the two decoders' rounding, then the resize's: 1 of
    150,528 in the example hypothesis found); mean difference under 0.05 of a level."""
    data = jpeg_of(seed, (width, height), quality, subsampling, mode)
    [picture] = decode_jpegs([EncodedJpeg(data, open_image(data))], torch.device("cpu"), SETTINGS)
    wanted = F.pil_to_tensor(decode_image(open_image(data), 256, 224))
    assert picture.shape == wanted.shape == (3, 224, 224)
    difference = (picture.int() - wanted.int()).abs()
    assert difference.max() <= 2 and (difference > 1).float().mean() < 1e-3 and difference.float().mean() < 0.05


def test_an_extreme_shape_is_resampled_only_where_the_crop_is_on_the_device_path_too(monkeypatch):
    """resize_crop's bound (above EXACT_RESIZE_PIXELS only the crop's box is resampled, for a shape
    max_aspect_ratio was raised to let in) holds on the device path: a 6000x2 JPEG was resized whole to
    768,000x256 there (600 MB and a second on this CPU; 65,500x2 asks for 12 GB of a GPU's memory)."""
    from handlers import image

    out = io.BytesIO()
    Image.new("RGB", (6000, 2), (10, 200, 30)).save(out, "JPEG")
    data = out.getvalue()
    resized, resize = [], F.resize
    monkeypatch.setattr(F, "resize", lambda picture, size, **kw: resized.append(size) or resize(picture, size, **kw))
    [picture] = decode_jpegs([EncodedJpeg(data, open_image(data))], torch.device("cpu"), SETTINGS)
    assert all(height * width <= image.EXACT_RESIZE_PIXELS for height, width in resized), resized
    wanted = F.pil_to_tensor(decode_image(open_image(data), 256, 224))
    assert picture.shape == wanted.shape == (3, 224, 224)
    assert (picture.int() - wanted.int()).abs().max() <= 1


@pytest.fixture(scope="module")
def resnet(image_sample, tmp_path_factory):
    store = tmp_path_factory.mktemp("gpu-paths") / "model-store"
    return package_resnet(image_sample, store, config_text="batchSize: 4\nmaxBatchDelay: 50\n")


def rows(bodies):
    return [{"body": bytearray(b)} for b in bodies]


def test_a_batch_through_the_device_path_answers_as_the_pil_path(resnet, jpegs):
    """The whole handler, its JPEGs left encoded by decode and decoded in preprocess (the GPU's path, on the
    CPU's device: the instance's switch turned on), against the same handler's PIL path."""
    bodies = jpegs[:3] + [jpegs[3][: len(jpegs[3]) // 2]]  # the last one cut short: PIL's 400
    with InProcessHandler(resnet, batch_size=4) as model:
        handler = model.handler
        assert handler.decode_on_gpu is False  # a CPU worker keeps PIL's path
        headers = [{"Content-Type": "image/jpeg"}] * len(bodies)
        want = [(r.status, r.json()) for r in model.predict_rows(rows(bodies), headers)]
        handler.decode_on_gpu = True
        got = [(r.status, r.json()) for r in model.predict_rows(rows(bodies), headers)]
    assert [s for s, _ in got] == [s for s, _ in want] == [200, 200, 200, 400]
    assert got[3] == want[3] and "truncated" in got[3][1]["message"]
    for (_, answer), (_, wanted) in zip(got[:3], want[:3]):
        assert answer.keys() == wanted.keys()
        assert max(abs(answer[k] - wanted[k]) for k in answer) <= golden_format.DEFAULT_ATOL


@pytest.mark.parametrize("precision", ["fp16", pytest.param("bf16", marks=pytest.mark.matrix)])  # bf16: 30 s
def test_half_precision_answers_within_its_tolerance_and_verify_checks_at_it(image_sample, jpegs, tmp_path, precision):
    """fp32's golden answers (package --golden) replayed by 'tsctl verify --golden-from' on the same weights in
    half precision pass at that precision's tolerance; the answers did move (the setting works)."""
    store, photos = tmp_path / "model-store", tmp_path / "golden"
    photos.mkdir()
    for index, data in enumerate(jpegs[:2]):
        (photos / f"photo{index}.jpg").write_bytes(data)
    config = tmp_path / "full.yaml"
    config.write_text("batchSize: 2\n")
    done = CliRunner().invoke(
        main,
        [
            "package",
            "--model-name",
            "full",
            "--handler",
            "image_classifier",
            "--serialized-file",
            str(image_sample / "resnet18.pt"),
            "--model-file",
            str(image_sample / "model.py"),
            "--extra-files",
            str(image_sample / "index_to_name.json"),
            "--config-file",
            str(config),
            "--export-path",
            str(store),
            "--golden",
            str(photos),
        ],
    )
    assert done.exit_code == 0, done.output
    half = package_resnet(image_sample, store, name="half", config_text=f"handler:\n  precision: {precision}\n")
    done = CliRunner().invoke(main, ["verify", str(half), "--golden-from", str(store / "full.mar"), "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["checked"] == 2
    with LocalModel(store / "full.mar") as full, LocalModel(half) as halved:
        wanted, got = (
            m.predict([RequestInput(jpegs[0], {"Content-Type": "image/jpeg"})])[0].json() for m in (full, halved)
        )
    moved = max(abs(got[k] - wanted[k]) for k in wanted)
    assert 0 < moved <= golden_format.PRECISION_ATOL[precision] and got.keys() == wanted.keys(), (moved, got, wanted)


OOM_HANDLER = '''
import torch
from handlers.image import ImageClassifier, entry_point


class Greedy(ImageClassifier):
    """The model runs out of GPU memory on a batch holding a 1x1 JPEG, as a too-large batch would."""

    def inference(self, batch, *args, **kwargs):
        if (batch.flatten(2).std(dim=2).amax(dim=1) == 0).any():  # a 1x1 JPEG, resized: one flat colour
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return super().inference(batch)


handle = entry_point(Greedy)
'''


def test_out_of_memory_in_one_batch_is_that_requests_507_and_the_worker_serves_on(image_sample, jpegs, tmp_path):
    handler = tmp_path / "greedy.py"
    handler.write_text(OOM_HANDLER)
    archive = package_resnet(
        image_sample, tmp_path / "model-store", name="greedy", handler=str(handler), config_text="batchSize: 4\n"
    )
    flat = io.BytesIO()
    Image.new("RGB", (1, 1), (200, 30, 90)).save(flat, "JPEG")
    flat = flat.getvalue()
    with LocalModel(archive, batch_size=4) as model:
        pid = model.pid
        batch = (jpegs[0], flat, jpegs[1], jpegs[2])
        answers = model.predict([RequestInput(b, {"Content-Type": "image/jpeg"}) for b in batch])
        assert [r.status for r in answers] == [200, 507, 200, 200], [r.json() for r in answers]
        assert "out of memory" in answers[1].json()["message"].lower()
        again = model.predict([RequestInput(jpegs[3], {"Content-Type": "image/jpeg"})])
        assert again[0].status == 200 and model.pid == pid
