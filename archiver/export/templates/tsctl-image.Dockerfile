# The image of a tsctl export's serving runtime: the tsctl engine serving /mnt/models/model-store as
# /mnt/models/config/config.properties says (serving/engine.py). Build and push it, then apply
# servingruntime.yaml and inferenceservice.yaml:   docker build -t ${image} . && docker push ${image}
FROM python:${python}-slim
ARG TORCH_INDEX=${torch_index}
RUN useradd --uid ${uid} --create-home model
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir --extra-index-url "$$TORCH_INDEX" -r requirements.txt
COPY handlers/ handlers/
COPY serving/ serving/
USER ${uid}
ENV PYTHONUNBUFFERED=1
EXPOSE ${http_port} ${grpc_port}
ENTRYPOINT ["python", "-m", "serving.engine"]
CMD [${args}]
