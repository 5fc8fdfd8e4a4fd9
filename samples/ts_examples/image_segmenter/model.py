"""Stand-in for pytorch/serve's examples/image_segmenter/fcn/model.py (written for tsctl's
conformance suite): FCN with a dilated ResNet-50 backbone and an auxiliary head (torchvision's
fcn_resnet50 with ``aux_loss=True``; the example uses ResNet-101 and downloads its weights), built
from torchvision's own pieces with no downloaded weights."""

from torchvision.models import resnet
from torchvision.models._utils import IntermediateLayerGetter
from torchvision.models.segmentation.fcn import FCN, FCNHead


class FCNImageSegmenter(FCN):
    def __init__(self, num_classes=21):
        backbone = resnet.resnet50(weights=None, replace_stride_with_dilation=[False, True, True])
        backbone = IntermediateLayerGetter(backbone, return_layers={"layer4": "out", "layer3": "aux"})
        super().__init__(backbone, FCNHead(2048, num_classes), FCNHead(1024, num_classes))
