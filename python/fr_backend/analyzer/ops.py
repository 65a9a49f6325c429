"""What each op name means for matching: which sizes and dtypes must agree across ranks."""

from __future__ import annotations

from typing import Any

# Entries that close a slow-path coalesced group (they share the seq id of the ops before them).
MARKERS = frozenset({"coalesced", "ALLGATHER_coalesced", "REDUCE_SCATTER_coalesced"})

# Sizes legitimately differ per rank, dtypes must agree (every rank sends and receives the same element type).
DTYPE_ONLY = frozenset({
    "all_to_all", "all_to_all_single", "all_to_all_v_single", "alltoall", "alltoall_base",
    "all_gather_v", "reduce_scatter_v",
})
# Nothing to compare but the op: no payload (barrier: a dummy tensor), or not a data transfer.
NO_CHECK = frozenset({"barrier", "all_reduce_barrier", "split", "new_window"})
NO_SIZE_CHECK = DTYPE_ONLY | NO_CHECK
# Only outputs must agree: the root's input of scatter; uneven all_gather (list form) inputs.
OUTPUT_ONLY = frozenset({"scatter", "all_gather", "allgather"})
# Only inputs must agree: gather's outputs exist on the root only; uneven reduce_scatter (list form) outputs.
INPUT_ONLY = frozenset({"gather", "reduce_scatter"})

# torch spells the same thing several ways; canonical names for people.
CANONICAL = {
    "_all_gather_base": "all_gather_into_tensor",
    "allgather_base": "all_gather_into_tensor",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_base": "reduce_scatter_tensor",
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "_broadcast_oop": "broadcast",
    "_reduce_oop": "reduce",
}


def split_name(profiling_name: Any) -> tuple[str, str]:
    """'nccl:send 0->1' -> ('send', '0->1'); 'gloo:all_reduce' -> ('all_reduce', '')."""
    s = str(profiling_name)
    _, sep, rest = s.partition(":")
    if not sep:
        rest = s
    op, _, meta = rest.partition(" ")
    return op, meta


def is_marker(op: str) -> bool:
    return op in MARKERS


def canonical(op: str) -> str:
    return CANONICAL.get(op, op)


def family(op: str) -> str:
    """Which sizes must agree across ranks: "both", "in", "out", "dtype" (no sizes, but the dtypes)
    or "none" (neither)."""
    if op in DTYPE_ONLY:
        return "dtype"
    if op in NO_CHECK:
        return "none"
    if op in OUTPUT_ONLY:
        return "out"
    if op in INPUT_ONLY:
        return "in"
    return "both"
