"""``tsctl export``: a model store as a platform deploys it, each platform in a package of its own over one core.

kserve/        export kserve: the PVC or OCI tree, the InferenceService (and graph), the runtime in the pod
               (--engine torchserve|tsctl), autoscaling, the canary, DEPLOY.md
seldon/        export seldon: Seldon Core 2's Server, Models, Experiment and Pipeline on MLServer with tsctl's
               runtime (server-image/), or Seldon Core 1's graph (--core 1), DEPLOY.md
core.py        what both share: the claim, the copy pod, archives, inputs, DEPLOY.md's templates
model_image.py the tree as a model image (--storage oci), for both
bodies.py      the request bodies DEPLOY.md builds, by the kind of input a handler takes
images.py      what both image recipes share: pins, archive requirements, tsctl's packages
options.py     each export's flags; out_dir.py OUT itself; kube.py names and quantities;
crds.py        validation against the vendored CRDs (crds/)
templates/*.md         DEPLOY.md's sections (string.Template: $name filled in, $$ a shell $)
templates/*.Dockerfile the images' Dockerfiles, the same way (core.render)
"""
