"""`cinq plan`: what serving a model on a device takes and gives, from arithmetic alone (nothing is loaded).

shapes.py (a model's shape: a known name, a config.json or a folder) -> memory.py (weights, KV, activations,
fit, tensor-parallel degree) -> roofline.py (decode / prefill tokens/s, compute-bound crossover, all-reduce
cost) -> cost.py ($ per 1M tokens), put together by planner.py and printed by report.py (table, markdown, JSON).
devices.py holds the device table, probe.py measures this machine (--measure), and calibration.py sets the
roofline against cinq's measured benchmark rows on this machine (--calibrate).
"""
