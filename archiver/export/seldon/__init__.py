"""``tsctl export seldon``: a model store as Seldon Core 2 serves it on MLServer with tsctl's runtime, or as
Seldon Core 1's graph (``--core 1``).

export.py     the command's one function (``export``); plan.py what it decides before it writes
manifests.py  the Server, Models, Experiment, Pipeline and NetworkPolicy; image.py OUT/server-image/
mirror.py     --mirror: the shadow Experiment gated by tsctl shadow; deploy.py DEPLOY.md
core1.py      --core 1: the SeldonDeployment and its units' image
"""
