"""``tsctl export``: a model store as a platform deploys it, each target in its own modules over one core.

kserve.py, kserve_deploy.py    export kserve: the PVC tree, the InferenceService (and graph), DEPLOY.md
targets.py                     what export kserve writes for the runtime in the pod (--engine torchserve|tsctl)
tsctl_image.py                 --engine tsctl: its (Cluster)ServingRuntime and OUT/predictor-image/
seldon.py, seldon_plan.py      export seldon: the checks, the plan of Models it writes
seldon_manifests.py            the Server, Models, Experiment, Pipeline and NetworkPolicy
seldon_image.py                OUT/server-image/: MLServer with tsctl's runtime
seldon_deploy.py               its DEPLOY.md
core.py                        what both share: the claim, the copy pod, archives, inputs, DEPLOY.md's templates
bodies.py                      the request bodies DEPLOY.md builds, by the kind of input a handler takes
images.py                      what both image recipes share: pins, archive requirements, tsctl's packages
options.py                     each export's flags; out_dir.py OUT itself; kube.py names and quantities;
crds.py                        validation against the vendored CRDs (crds/)
templates/*.md                 DEPLOY.md's sections (string.Template: $name filled in, $$ a shell $)
templates/*.Dockerfile         the images' Dockerfiles, the same way (core.render)
"""
