"""A handler in the shape of pytorch/serve's that explain (its image classifier's Captum ``get_insights``,
written for this project without a model): ``BaseHandler.handle`` calls ``explain_handle`` when the
frontend's ``explain`` header says ``True`` (TorchServe's /explanations, KServe's :explain), else
inference and postprocess. Each answer says which ran, the body's length and the ``url_path`` header
(what followed /predictions/NAME/VERSION)."""

from ts.torch_handler.base_handler import BaseHandler


class ExplainHandler(BaseHandler):
    def initialize(self, context):
        self.context = context
        self.initialized = True

    def preprocess(self, data):
        return [row.get("data") or row.get("body") or b"" for row in data]

    def inference(self, bodies, *args, **kwargs):
        return [{"ran": "inference", "bytes": len(body)} for body in bodies]

    def postprocess(self, answers):
        for index, answer in enumerate(answers):
            answer["url_path"] = self.context.get_request_header(index, "url_path")
        return answers

    def explain_handle(self, bodies, raw_data):
        header = self.context.get_request_header
        return [
            {"ran": "explain_handle", "bytes": len(body), "url_path": header(i, "url_path")}
            for i, body in enumerate(bodies)
        ]
