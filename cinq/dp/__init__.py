"""Data parallelism: engine replicas on Ray behind one front end with prefix-aware routing."""
