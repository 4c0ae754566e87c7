"""Tensor parallelism: the rank's place in the group and its collectives (parallel_state.py), and the worker
process main loop of ranks 1..N-1 (worker.py)."""
