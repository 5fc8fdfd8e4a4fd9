"""``tsctl export kserve``: the tree for the pod and the manifests that serve it.

export.py       the command's one function (``export``): every check, then the tree and the InferenceService
storage.py      where the pod finds the tree (--storage pvc|oci); deploy.py DEPLOY.md and its curl lines
targets.py      the runtime in the pod (--engine torchserve|tsctl); tsctl_image.py the tsctl engine's image
autoscale.py    --autoscale knative|keda|hpa; measured_notes.py what --from-bench measured
canary.py       --canary: the rollout gated by tsctl shadow
"""
