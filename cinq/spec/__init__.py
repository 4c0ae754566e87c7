"""Speculative decoding: proposers guess tokens, the target verifies them in one forward, and rejection
sampling keeps the output distribution exactly the target's.

Built so far: the rejection sampler (``rejection.py``), the n-gram / prompt-lookup proposer (``ngram.py``) and
``SpeculativeConfig`` (``config.py``, vLLM's field names). They are not yet wired into the engine: no request
speculates today.
"""
