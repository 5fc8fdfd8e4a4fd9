"""Stand-in for pytorch/serve's examples/image_classifier/resnet_18/model.py (written for tsctl's
conformance suite): torchvision's ResNet-18 layout as the one class of a model file."""

from torchvision.models.resnet import BasicBlock, ResNet


class ImageClassifier(ResNet):
    def __init__(self):
        super().__init__(BasicBlock, [2, 2, 2, 2])
