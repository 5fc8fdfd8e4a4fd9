"""One replica's capacity and what autoscalers do with it: ``tsctl bench`` (bench.py), ``bench --capacity``
(sweep.py, replica.py, cgroup_limits.py), ``tsctl simulate`` (simulate.py over autoscale_sim.py) and their
plots (plotting.py).
"""
