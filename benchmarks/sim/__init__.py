"""A discrete-event simulator of a rollout cluster that drives the real scheduler.

Only engines (`gpu.SimGPU`; their step and transfer costs in `cost.ClusterCost`, built on the
GPU figures fitted to H200 measurements in `hardware` — see README.md), environments (`workload`) and the
clock (`clock.EventLoop`) are simulated; lifecycle tracking, forecasting, role allocation and
routing are the classes from `scheduler/` (`cluster.Cluster` wires them). Same seed, same
result: every random draw comes from per-trajectory seeded generators and every tie in the
event heap is broken by insertion order.
"""
