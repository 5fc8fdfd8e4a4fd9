"""TorchServe's gRPC management API on the tsctl engine (``management.proto``'s ``ManagementAPIsService``,
ts_grpc.py's docstring has the rules): ``ListModels`` and ``DescribeModel`` from the engine's models;
``RegisterModel``, ``UnregisterModel``, ``ScaleWorker`` and ``SetDefault`` through the REST management API's
calls (``ModelApi``, with ``enable_model_api=true``) or refused as TorchServe refuses them with the model API
disabled (``ReadOnlyModels``)."""

import json
from typing import Optional

import grpc

from ..worker.ts_wire import RequestInput
from . import management as management_api
from . import ts_protos as pb
from .management import model_url
from .ts_grpc_errors import (
    INTERNAL_SERVER,
    MODEL_EXCEPTION,
    MODEL_NOT_FOUND,
    VERSION_NOT_FOUND,
    ApiError,
    find,
    grpc_status,
    pretty,
)


class ReadOnlyModels:
    """What the management RPCs answer from while the engine has no management module: its models as
    they are, and TorchServe's answers with the model API disabled to every call that would change
    them. The seam: a management module gives the engine a ``grpc_management`` with these methods."""

    def __init__(self, engine):
        self.engine = engine

    def list_models(self, limit: int, page_token: int) -> dict:
        """TorchServe's ``ApiUtils.getModelList``: names sorted, ``limit`` above 100 or below 0 is 100
        (0 stays 0), ``nextPageToken`` whenever the page ends at or before the last model."""
        limit = 100 if limit > 100 or limit < 0 else limit
        page_token = max(page_token, 0)
        names = sorted(self.engine.defaults)
        answer, last = {}, page_token + limit
        if last > len(names):
            last = len(names)
        else:
            answer["nextPageToken"] = str(last)
        answer["models"] = [
            {"modelName": name, "modelUrl": model_url(self.engine.defaults[name])} for name in names[page_token:last]
        ]
        return answer

    async def describe(self, name: str, version: Optional[str], customized: bool) -> list:
        from .management import describe_model

        if version == "all":
            found = list(self.engine.versions.get(name, {}).values())
            if not found:
                raise ApiError(grpc.StatusCode.NOT_FOUND, f"Model not found: {name}", MODEL_NOT_FOUND)
            return [describe_model(model) for model in found]
        model = find(self.engine, name, version, grpc.StatusCode.NOT_FOUND)
        described = describe_model(model)
        if customized:
            described.update(await self.customized(model))
        return [described]

    @staticmethod
    async def customized(model) -> dict:
        """The handler's own metadata (``describe_handle``), as TorchServe asks for it: a request with
        the header ``describe: True`` and no input; a JSON object is kept, anything else is ``{}``."""
        answer = await model.submit(RequestInput(b"", {"describe": "True"}, []))
        if answer.error:
            raise ApiError.of(answer)
        try:
            metadata = json.loads(answer.body or b"null")
        except ValueError:
            return {"customizedMetadata": {}}
        if metadata is None:
            return {}
        return {"customizedMetadata": metadata if isinstance(metadata, dict) else {}}

    async def register(self, request) -> str:
        raise ApiError(grpc.StatusCode.PERMISSION_DENIED, "Model API disabled", MODEL_EXCEPTION)

    async def unregister(self, request) -> str:
        raise ApiError(grpc.StatusCode.PERMISSION_DENIED, "Model API disabled", MODEL_EXCEPTION)

    async def scale(self, request) -> str:
        find(self.engine, request.model_name, request.model_version, grpc.StatusCode.NOT_FOUND)
        raise ApiError(grpc.StatusCode.PERMISSION_DENIED, "Model API disabled", MODEL_EXCEPTION)

    async def set_default(self, request) -> str:
        if request.model_name not in self.engine.versions:
            raise ApiError(grpc.StatusCode.NOT_FOUND, f"Model not found: {request.model_name}", MODEL_NOT_FOUND)
        if request.model_version not in self.engine.versions[request.model_name]:
            message = f"Model version {request.model_version} does not exist for model {request.model_name}"
            raise ApiError(grpc.StatusCode.NOT_FOUND, message, VERSION_NOT_FOUND)
        raise ApiError(grpc.StatusCode.PERMISSION_DENIED, "Model API disabled", MODEL_EXCEPTION)


class ModelApi(ReadOnlyModels):
    """The management RPCs that change state, with ``enable_model_api=true`` (the engine's
    ``grpc_management`` then): the REST API's calls (serving/engine/management.py), one at a time with
    them, their answers as TorchServe's ManagementImpl gives them (the status message; an error's status
    code from its HTTP status, its details the message and the Java exception's name). A field of the
    request left at its default (0, "") is absent, as TorchServe's GRPCUtils.getRegisterParam reads it."""

    async def change(self, work):
        try:
            async with self.engine.changing:
                message, _ = await work()
        except management_api.ApiError as exc:
            raise ApiError(grpc_status(exc.status), exc.message, JAVA_EXCEPTIONS.get(exc.kind, INTERNAL_SERVER))
        return message

    async def register(self, request) -> str:
        fields = ("url", "model_name", "batch_size", "max_batch_delay", "initial_workers", "response_timeout")
        params = {key: str(getattr(request, key)) for key in fields if getattr(request, key)}
        params["synchronous"] = "true" if request.synchronous else "false"  # proto3: false unless sent
        return await self.change(lambda: management_api.register(self.engine, params))

    async def unregister(self, request) -> str:
        version = request.model_version or None
        return await self.change(lambda: management_api.unregister(self.engine, request.model_name, version))

    async def scale(self, request) -> str:
        params = {key: str(getattr(request, key)) for key in ("min_worker", "max_worker") if getattr(request, key)}
        params["synchronous"] = "true" if request.synchronous else "false"
        version = request.model_version or None
        return await self.change(lambda: management_api.scale(self.engine, request.model_name, version, params))

    async def set_default(self, request) -> str:
        return await self.change(
            lambda: settled(management_api.set_default(self.engine, request.model_name, request.model_version))
        )


JAVA_EXCEPTIONS = {  # the canonical names of the exceptions TorchServe's management API raises
    "ModelNotFoundException": MODEL_NOT_FOUND,
    "ModelVersionNotFoundException": VERSION_NOT_FOUND,
    "InvalidModelException": "org.pytorch.serve.archive.model.InvalidModelException",
    "DownloadArchiveException": "org.pytorch.serve.archive.DownloadArchiveException",
    "BadRequestException": "org.pytorch.serve.http.BadRequestException",
    "ConflictStatusException": "org.pytorch.serve.http.ConflictStatusException",
    "InvalidModelVersionException": "org.pytorch.serve.http.InvalidModelVersionException",
    "InternalServerException": INTERNAL_SERVER,
}


class Management:
    """``ManagementAPIsService``, each call answered by the engine's ``grpc_management`` (``ReadOnlyModels``)."""

    def __init__(self, engine):
        self.engine = engine

    @property
    def models(self):
        return getattr(self.engine, "grpc_management", None) or ReadOnlyModels(self.engine)

    async def call(self, context, answer) -> "pb.ManagementResponse":
        try:
            message = await answer
        except ApiError as exc:
            await context.abort(exc.code, exc.details)
        return pb.ManagementResponse(msg=message)

    async def DescribeModel(self, request, context):
        async def described():
            return pretty(await self.models.describe(request.model_name, request.model_version, request.customized))

        return await self.call(context, described())

    async def ListModels(self, request, context):
        async def listed():
            return pretty(self.models.list_models(request.limit, request.next_page_token))

        return await self.call(context, listed())

    async def RegisterModel(self, request, context):
        return await self.call(context, self.models.register(request))

    async def UnregisterModel(self, request, context):
        return await self.call(context, self.models.unregister(request))

    async def ScaleWorker(self, request, context):
        return await self.call(context, self.models.scale(request))

    async def SetDefault(self, request, context):
        return await self.call(context, self.models.set_default(request))


async def settled(value):
    """``value``, awaitable: a call answered at once where the others are awaited."""
    return value
