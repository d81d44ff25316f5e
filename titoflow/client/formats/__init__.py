"""Segments in the shapes trainers take: verl's ``DataProto`` batch (:mod:`.verl`), slime's and
miles' ``Sample`` (:mod:`.slime`), OpenRLHF's ``Experience``s (:mod:`.openrlhf`) and Tinker's
``Datum`` (:mod:`.tinker`). docs/trainer.md maps every field.

Invariant: no converter imports its framework (numpy only, and torch for slime's images); each
returns the plain values and arrays the framework's own constructor takes, with its field names,
dtypes and shapes, which tests/titoflow/client/test_trainer_formats.py checks against an extract of
each published definition. Tokens, masks and logprobs are copied exactly (float32 logprobs stay
float32); a token in the loss without an engine logprob is refused
(:func:`titoflow.client.batch.aligned_arrays`).
"""
