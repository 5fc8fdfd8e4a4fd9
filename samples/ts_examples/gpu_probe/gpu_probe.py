"""A handler that says which GPU its worker was given: when the worker loads it (TorchServe calls a function
handler with no data then) it prints one line, ``tsctl-gpu-probe model=NAME gpu_id=ID pid=PID visible=...``,
and each answer is ``{"gpu_id": ID, "pid": PID}``. No model, no torch: the placement alone
(tests/engine/test_gpu_placement.py, against TorchServe 0.12 and every tsctl runtime)."""

import os


def handle(data, context):
    gpu = context.system_properties.get("gpu_id")
    if data is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        print(
            f"tsctl-gpu-probe model={context.model_name} gpu_id={gpu} pid={os.getpid()} visible={visible}", flush=True
        )
        return None
    return [{"gpu_id": gpu, "pid": os.getpid()} for _ in data]
