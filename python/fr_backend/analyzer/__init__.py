"""Cross-rank analysis of flight-recorder dumps (frnccl 3.x and torch 2.x).

Pipeline: load (safe, streamed, compact) -> match (per PG, by seq / p2p pair) ->
findings (root cause first) -> report (text, JSON), trace (Chrome), html.
"""

from .load import InputError, load_dump

__all__ = ["InputError", "load_dump"]
