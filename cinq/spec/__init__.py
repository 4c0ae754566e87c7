"""Speculative decoding: proposers guess tokens, the target verifies them in one forward, and rejection
sampling keeps the output distribution exactly the target's.

Built so far: the rejection sampler (``rejection.py``, used by the runner to verify drafts), the n-gram /
prompt-lookup proposer (``ngram.py``) with its drafter (``drafter.py``, called by the scheduler), and
``SpeculativeConfig`` (``config.py``, vLLM's field names). ``method: ngram`` works in the engine today; draft
models, Medusa and EAGLE heads are not built yet.
"""
