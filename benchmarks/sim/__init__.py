"""A discrete-event simulator of a rollout cluster that drives the real scheduler.

Only engines (`gpu.SimGPU`, cost in `cost.ClusterCost`), environments (`workload`) and the
clock (`clock.EventLoop`) are simulated; lifecycle tracking, forecasting, role allocation and
routing are the classes from `scheduler/` (`cluster.Cluster` wires them). Same seed, same
result: every random draw comes from per-trajectory seeded generators and every tie in the
event heap is broken by insertion order.
"""
