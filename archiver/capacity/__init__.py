"""One replica's capacity: ``tsctl bench`` (bench.py), ``bench --capacity`` (sweep.py, replica.py,
cgroup_limits.py) and its plots (plotting.py). What autoscalers do with it is archiver/autoscaling/.
"""
