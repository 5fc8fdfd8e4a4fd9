"""Stand-in for pytorch/serve's examples/image_classifier/mnist/mnist_handler.py (written for tsctl's
conformance suite): TorchServe's built-in ImageClassifier with MNIST's preprocessing, answering the
digit (an int) per image."""

from torchvision import transforms
from ts.torch_handler.image_classifier import ImageClassifier


class DigitClassifier(ImageClassifier):
    """One grayscale image in, the index of the largest log-probability out."""

    image_processing = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])

    def postprocess(self, data):
        return data.argmax(1).tolist()
