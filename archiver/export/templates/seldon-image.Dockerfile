# Seldon Core 2's MLServer with tsctl's runtime (serving.runtimes.mlserver_runtime.ArchiveModel): the image
# server.yaml's mlserver container runs, started as Seldon's mlserver image starts (the ServerConfig sets
# its ports and MLSERVER_MODELS_DIR), through serving/runtimes/mlserver_start.py: no REST model repository load or
# unload (Seldon's agent uses gRPC's), request bodies bounded. From the directory DEPLOY.md is in:
#   docker build -t ${image} ${context} && docker push ${image}
FROM ${base}
ARG TORCH_INDEX=${torch_index}
RUN useradd --uid 1000 --create-home mlserver
COPY requirements.txt ${runtime}/requirements.txt
RUN pip install --no-cache-dir --extra-index-url "$$TORCH_INDEX" -r ${runtime}/requirements.txt
COPY handlers/ ${runtime}/handlers/
COPY serving/ ${runtime}/serving/
ENV PYTHONPATH=${runtime} PYTHONUNBUFFERED=1 MLSERVER_MODELS_DIR=/mnt/agent/models
USER 1000
CMD ["sh", "-c", "exec python -m serving.runtimes.mlserver_start start \"$$MLSERVER_MODELS_DIR\""]
