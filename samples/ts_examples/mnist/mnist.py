"""Stand-in for pytorch/serve's examples/image_classifier/mnist/mnist.py (written for tsctl's
conformance suite): the MNIST CNN, with the parameter names pytorch/serve's ``Net`` has, so the same
state_dict loads into either."""

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    """28x28 grayscale -> 10 log-probabilities: two 3x3 convolutions, max-pool, two linear layers."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, kernel_size=3, stride=1)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3, stride=1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(12 * 12 * 64, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(self.conv2(x), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)
