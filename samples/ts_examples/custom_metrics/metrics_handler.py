"""Stand-in for pytorch/serve's examples/custom_metrics/mnist_handler.py (written for tsctl's
conformance suite): the MNIST classifier of the mnist case, emitting custom metrics of every type
(counter, gauge, histogram) through every call of TorchServe's metrics cache (``context.metrics``,
ts/metrics/metric_cache_abstract.py): ``add_metric_to_cache`` + ``get_metric(...).add_or_update``,
``add_metric``, ``add_counter``, ``add_time``, ``add_size``, ``add_percent``. Each emits a
``[METRICS]NAME.UNIT:VALUE|#dims|#type:TYPE|...`` line on the worker's metrics logger.

As the example's, it needs its metrics.yaml (beside it) as TorchServe's ``metrics_config``:
``ConformanceBatchSize`` is declared there only, and ``get_metric`` fails without it
(MetricsCacheKeyError). ``ConformancePreprocessTime`` and the HISTOGRAM ``ConformanceDigitShare`` are
not declared: TorchServe exports them with ``model_metrics_auto_detect=true``."""

import time

from torchvision import transforms
from ts.metrics.dimension import Dimension
from ts.metrics.metric_type_enum import MetricTypes
from ts.torch_handler.image_classifier import ImageClassifier


class MetricsDigitClassifier(ImageClassifier):
    image_processing = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])

    def initialize(self, context):
        super().initialize(context)
        metrics = context.metrics
        self.requests = metrics.add_metric_to_cache(
            metric_name="ConformanceRequests", unit="count", dimension_names=[], metric_type=MetricTypes.COUNTER
        )
        metrics.add_metric(name="ConformanceLoads", value=1, unit="count", metric_type=MetricTypes.COUNTER)

    def preprocess(self, data):
        started = time.time()
        metrics = self.context.metrics
        self.requests.add_or_update(value=len(data), dimension_values=[])
        batch = metrics.get_metric(metric_name="ConformanceBatchSize", metric_type=MetricTypes.GAUGE)
        batch.add_or_update(value=len(data), dimension_values=[self.context.model_name])
        for index, row in enumerate(data):
            body = row.get("data") or row.get("body") or b""
            metrics.add_size(
                name="ConformanceImageBytes",
                value=len(body),
                idx=index,
                unit="B",
                dimensions=[],
                metric_type=MetricTypes.HISTOGRAM,
            )
        tensors = super().preprocess(data)
        elapsed = (time.time() - started) * 1000
        metrics.add_time(
            name="ConformancePreprocessTime",
            value=elapsed,
            unit="ms",
            dimensions=[Dimension(name="MethodName", value="preprocess")],
        )
        return tensors

    def postprocess(self, data):
        digits = data.argmax(1).tolist()
        metrics = self.context.metrics
        metrics.add_counter(name="ConformancePostprocessCalls", value=1, dimensions=[])
        share = 100.0 * sum(1 for d in digits if d == digits[0]) / len(digits)
        metrics.add_percent(name="ConformanceDigitShare", value=share, dimensions=[], metric_type=MetricTypes.HISTOGRAM)
        return digits
