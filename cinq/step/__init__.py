"""What one engine step carries: a request's scheduling state (``request.py``), the scheduler's output
(``scheduler_output.py``), the flat inputs a forward runs on (``batch_inputs.py``, rows bucketed by
``shape_buckets.py``) and what the forward hands back (``runner_output.py``, logprobs by ``token_logprobs.py``).

Plain step data, below spec/ and engine/ (vLLM keeps the same objects in ``vllm.v1.request``,
``vllm.v1.core.sched.output`` and ``vllm.v1.outputs``): the engine's scheduler and runner and spec/'s proposers
and verifier all read it, and it reads neither of them.
"""
