# Seldon Core 1's Python wrapper (seldon-core 1.17.1, Apache-2.0) with tsctl's components
# (serving/runtimes/seldon_components.py): the image every container of seldondeployment.yaml runs, its unit's class and
# service type from the container's env (MODEL_NAME, SERVICE_TYPE), as Seldon builds a wrapped model
# (doc/source/python/python_wrapping_docker.md). From the directory DEPLOY.md is in:
#   docker build -t ${image} ${context} && docker push ${image}
FROM ${base}
ARG TORCH_INDEX=${torch_index}
RUN useradd --uid 1000 --create-home seldon
COPY requirements.txt ${runtime}/requirements.txt
RUN pip install --no-cache-dir --extra-index-url "$$TORCH_INDEX" -r ${runtime}/requirements.txt
COPY handlers/ ${runtime}/handlers/
COPY serving/ ${runtime}/serving/
ENV PYTHONPATH=${runtime} PYTHONUNBUFFERED=1 MODEL_NAME=serving.runtimes.seldon_components.Model SERVICE_TYPE=MODEL GRPC_WORKERS=0
WORKDIR ${runtime}
USER 1000
EXPOSE 9000
CMD ["sh", "-c", "exec seldon-core-microservice \"$$MODEL_NAME\" --service-type \"$$SERVICE_TYPE\""]
