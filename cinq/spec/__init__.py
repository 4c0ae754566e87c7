"""Speculative decoding: proposers guess tokens, the target verifies them in one forward, and rejection
sampling keeps the output distribution exactly the target's.

Proposers in the scheduler (``drafter.py``: n-gram lookup, ``ngram.py``; slot reservation for the others, with
adaptive k in ``adaptive.py``) and in the runner (``proposer.py``: ``draft_model.py``, ``eagle_proposer.py`` over
``eagle.py`` heads, ``medusa_proposer.py`` over ``medusa.py`` heads; loaded by ``proposer_loader.py``).
Verification: ``rejection.py`` (chains) and ``tree.py`` (static and dynamic trees). ``SpeculativeConfig``
(``config.py``) has vLLM's field names.
"""
