# The image of a tsctl export's serving runtime: the tsctl engine serving /mnt/models/model-store as
# /mnt/models/config/config.properties says (serving/engine/app.py). Build and push it, then apply
# servingruntime.yaml and inferenceservice.yaml:   docker build -t ${image} . && docker push ${image}
# BASE_IMAGE: any image with python${python} and its venv module (--build-arg BASE_IMAGE=...: a Debian
# bookworm root of your own, as docs/kserve.md builds one); the engine and its packages go in /opt/tsctl.
ARG BASE_IMAGE=python:${python}-slim
FROM $${BASE_IMAGE}
ARG TORCH_INDEX=${torch_index}
RUN useradd --uid ${uid} --create-home model
WORKDIR /app
COPY requirements.txt .
RUN python3 -m venv /opt/tsctl && \
    /opt/tsctl/bin/pip install --no-cache-dir --extra-index-url "$$TORCH_INDEX" -r requirements.txt
ENV PATH=/opt/tsctl/bin:$$PATH
COPY handlers/ handlers/
COPY serving/ serving/
USER ${uid}
ENV PYTHONUNBUFFERED=1
EXPOSE ${http_port} ${grpc_port}
ENTRYPOINT ["python", "-m", "serving.engine"]
CMD [${args}]
