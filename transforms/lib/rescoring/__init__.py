"""Rescoring: rewards recomputed by the user's verifier, reward model or judge (docs/rescoring.md).

verifier.py says which verifier and how it is called, calls.py makes the calls
(in flight, retried), rows.py turns a table into calls and the answers back
into its reward column, store.py keeps the answers inside the output.
"""
