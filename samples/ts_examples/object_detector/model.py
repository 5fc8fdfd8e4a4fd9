"""Stand-in for pytorch/serve's examples/object_detector/fast-rcnn/model.py (written for tsctl's
conformance suite): Faster R-CNN on a ResNet-50 FPN backbone, as the example, built without any
downloaded weights. One change for two CPU cores: the detector's own resize targets 256-320 pixels
instead of 800-1333 (``min_size``/``max_size``), so an image takes ~0.3 s instead of ~7 s; the
layers and the state_dict are the example's."""

from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
from torchvision.models.detection.faster_rcnn import FasterRCNN


class FRCNNObjectDetector(FasterRCNN):
    def __init__(self, num_classes=91, **kwargs):
        backbone = resnet_fpn_backbone(backbone_name="resnet50", weights=None)
        kwargs.setdefault("min_size", 256)
        kwargs.setdefault("max_size", 320)
        super().__init__(backbone, num_classes, **kwargs)
