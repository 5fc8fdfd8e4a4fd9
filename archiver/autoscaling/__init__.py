"""What the exported autoscaling does with load, before a cluster sees it: ``tsctl simulate`` (simulate.py) runs
the autoscalers (autoscalers.py: Knative's KPA, Kubernetes' HPA and KEDA's) with the numbers ``tsctl export
kserve --autoscale`` writes, on one replica's measured capacity (archiver/capacity/), through load traces
(load_traces.py), in autoscale_sim.py.
"""
