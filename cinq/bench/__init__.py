"""`cinq bench`: every benchmark of the repository, one implementation each, with the engine's own flags.

One module per kind (``throughput``, ``latency``, ``serve``, ``prefix``, ``spec``), each with a
``run_<kind>(config: EngineConfig, options, progress) -> BenchResult`` that measures its baseline in the same run;
``report`` prints and writes the result. ``cinq/commands/bench.py`` and the scripts in ``benchmarks/`` call them."""
