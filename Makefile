# tsctl: `make demo` runs the whole flow on a sample model; `make test` runs the test suite.
# Everything runs in .venv, exactly the versions uv.lock pins (`uv sync --locked`: uv, not pip, so the
# torch and torchvision pair work together; it fails, changing nothing, when pyproject.toml and the lock
# disagree: `uv lock` then commit both).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV := $(PYTHON) -m uv
SAMPLE := samples/build/resnet18

.PHONY: venv runtimes demo test matrix matrix-tools image-test fuzz bench gpu-check clean
venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml uv.lock
	$(UV) --version >/dev/null 2>&1 || $(PYTHON) -m pip install --quiet 'uv>=0.5'
	@echo "make venv: installing the locked packages into $(VENV) (about 7 GB on a first run: minutes)"
	$(UV) sync --locked --compile-bytecode --extra test
	touch $@

demo: venv
	$(BIN)/python -m samples.image_model $(SAMPLE)
	$(BIN)/tsctl package --model-name resnet18 --version 1.0 --serialized-file $(SAMPLE)/resnet18.pt \
	  --model-file $(SAMPLE)/model.py --handler image_classifier --extra-files $(SAMPLE)/index_to_name.json \
	  --config-file $(SAMPLE)/model-config.yaml --force
	$(BIN)/tsctl inspect model-store/resnet18.mar | tail -n 4
	$(BIN)/tsctl config
	$(BIN)/tsctl serve
	$(BIN)/tsctl predict resnet18 $(SAMPLE)/kitten.jpg $(SAMPLE)/street.jpg; status=$$?; \
	  $(BIN)/tsctl stop; exit $$status

# The suite in TEST_WORKERS processes (pytest-xdist), each test file in one of them with its module's servers;
# TEST_WORKERS=0 runs it in this one process. pytest alone runs it in one process too.
TEST_WORKERS ?= 2
test: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# Venvs standing in for KServe's TorchServe images, MLServer with tsctl's runtime and Seldon Core 1's Python
# wrapper (seldon-core 1.17.1) with tsctl's components (.runtimes/; samples/runtime_env.py); the tests build
# them on demand too.
runtimes: venv
	$(BIN)/python -m samples.runtime_env torchserve-kfs:0.9.0
	$(BIN)/python -m samples.runtime_env mlserver-1.7.1
	$(BIN)/python -m samples.runtime_env seldon-core-1.17.1

# The runtime matrix: every served path on TorchServe 0.9.0 (Python 3.9) and 0.12.0 (Python 3.11), both
# KServe envelopes, through pytorch/serve's kserve_wrapper. `make test` runs one smoke path of each.
# Also the KServe engine: every handler kind on both engines, its predictor image recipe (a fresh venv
# serving the export), and the served hostile suite on it; golden answers verified against servers and on
# start (TorchServe, the KServe engine, a transformer); ONNX archives served next to their originals.
matrix: venv runtimes matrix-tools
	$(BIN)/python -m pytest -m matrix

# Debian's nginx and Prometheus, for the autoscaling checks (real replicas behind nginx, the KEDA queries run
# by Prometheus): installed with apt-get where make runs as root on Debian; elsewhere their tests say why
# they skip.
matrix-tools:
	@if [ -x /usr/sbin/nginx ] && [ -x /usr/bin/prometheus ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "matrix: installing nginx-light and prometheus (apt-get)"; \
	  apt-get install -y -q nginx-light prometheus >/dev/null || \
	  { apt-get update -q >/dev/null && apt-get install -y -q nginx-light prometheus >/dev/null; } || \
	  echo "matrix: apt-get could not install nginx-light prometheus: their tests skip"; \
	else echo "matrix: no nginx or prometheus (apt-get install -y nginx-light prometheus): their tests skip"; fi

# The tsctl engine's KServe runtime image, built and run for real: docs/kserve.md's blocks (a Debian bookworm
# root made with debootstrap as the base, podman build, the container run with the runtime's arguments and
# answered), as root with podman, debootstrap and curl installed; it says why it skips where podman cannot run.
# The root and the base image are kept in /var/cache/tsctl-image, the layers in podman's storage.
# And the model image of `tsctl export kserve --storage oci`, read by skopeo and umoci and served by TorchServe 0.12.
image-test: venv
	$(BIN)/python -m pytest -m matrix -s tests/export/test_kserve_image.py tests/export/test_model_image.py

# The property-based tests with many more examples (about half an hour; not part of `make test`).
fuzz: venv
	TSCTL_FUZZ_EXAMPLES=5000 $(BIN)/python -m pytest -m "matrix or not matrix" tests/security/test_hostile.py

# On a machine with an NVIDIA GPU: workers' GPUs on TorchServe and the engine, answers against the CPU's, served
# throughput (benchmarks/gpu.py; each step bounded, benchmarks/data/gpu/gpu.json written as it goes).
gpu-check: venv
	$(BIN)/python benchmarks/gpu.py

# The figures in BENCHMARKS.md, one script each (several minutes; not part of `make test`).
bench: venv
	$(UV) sync --quiet --locked --compile-bytecode --extra test --extra bench
	$(BIN)/python benchmarks/p1_image.py
	$(BIN)/python benchmarks/p1_profile.py
	$(BIN)/python benchmarks/p2_text.py
	$(BIN)/python benchmarks/p2_profile.py
	$(BIN)/python benchmarks/p3_packaging.py
	$(BIN)/python benchmarks/p4_cold_start.py
	$(BIN)/python benchmarks/p6_streaming.py
	$(BIN)/python benchmarks/kserve_envelopes.py
	$(BIN)/python benchmarks/hostile_load.py
	$(BIN)/python benchmarks/batch_memory.py
	$(BIN)/python benchmarks/signing.py
	$(BIN)/python benchmarks/engine_goals.py
	$(BIN)/python benchmarks/soak.py
	$(BIN)/python benchmarks/kserve_engine.py
	$(BIN)/python benchmarks/p5_kserve_path.py
	$(BIN)/python benchmarks/p5_profile.py
	$(BIN)/python benchmarks/mlserver_engine.py
	$(BIN)/python benchmarks/engine_under_attack.py
	$(BIN)/python benchmarks/fork_server.py
	$(BIN)/python benchmarks/cold_start.py
	$(BIN)/python benchmarks/autoscale_check.py
	$(BIN)/python benchmarks/autoscale_sim.py

clean:
	rm -rf $(VENV) .runtimes .tsctl samples/build logs
