"""Users' handler files written against the toolkit before the redesign (issue #30) still work.

``ToolkitHandler`` no longer subclasses TorchServe's ``BaseHandler``; a user's subclass that reads what
``BaseHandler.__init__`` set (``self.mapping``, ``self.map_location``, ``self.explain``...; toolkit
handlers never ran ``BaseHandler.initialize``, so they kept those first values) must still find them."""

import textwrap

from helpers.models import package_resnet
from serving.local_model import LocalModel

# What TorchServe's BaseHandler.__init__ sets (0.9.0 and 0.12.0 alike): what the old ToolkitHandler held.
BASE_HANDLER_FIELDS = {
    "mapping": None,
    "model_pt_path": None,
    "map_location": None,
    "explain": False,
    "target": 0,
    "profiler_args": {},
}

USES_BASE_HANDLER_FIELDS = '''
from handlers.base import entry_point
from handlers.image import ImageClassifier
from handlers.requests import ClientError  # noqa: F401 (users' handlers import it)


class Mine(ImageClassifier):
    """Reads what TorchServe's BaseHandler gave every handler, as pytorch/serve's examples do."""

    def setup(self):
        super().setup()
        self.seen = {name: getattr(self, name) for name in %r}
        assert self.context is not None and self.manifest and self.device is not None

    def postprocess(self, output):
        return [dict(answer, seen=self.seen) for answer in super().postprocess(output)]


handle = entry_point(Mine)
'''


def test_a_subclass_reading_base_handler_attributes_still_runs(image_sample, tmp_path):
    handler = tmp_path / "mine.py"
    handler.write_text(textwrap.dedent(USES_BASE_HANDLER_FIELDS % (tuple(BASE_HANDLER_FIELDS),)))
    archive = package_resnet(image_sample, tmp_path / "store", "mine", "handler:\n  top_k: 2\n", handler=str(handler))
    with LocalModel(archive) as model:
        [answer] = model.predict([(image_sample / "kitten.jpg").read_bytes()])
    assert answer.status == 200, answer.json()
    assert answer.json()["seen"] == BASE_HANDLER_FIELDS
