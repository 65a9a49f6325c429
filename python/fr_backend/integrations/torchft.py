"""torchft: its replica-group process group (torchft.ProcessGroupGloo), rebuilt at every quorum, as frnccl groups.

    import fr_backend.integrations.torchft as frnccl_torchft
    frnccl_torchft.enable()   # before the Manager's first quorum

From the next quorum on, each group torchft's ProcessGroupGloo builds (`_create_pg`) is wrapped by
`fr_backend.wrap.wrap_process_group`: the cross-replica ops are recorded, and each quorum's group starts a new
frnccl life (torchft aborts the last quorum's group before it builds the next), with the replica rank and the
quorum's replica count as its rank and world size. A failed or timed-out op of these groups is recorded and
opens no incident: a replica that dies is torchft's to handle (it drops the step and forms a new quorum), and a
job-wide dump would only wait for the dead replica. torchft's own calls are unchanged: the same inner Gloo
backend runs every op, and a group frnccl cannot wrap runs as torchft built it (one line on stderr). So do the
groups of a replica group of more than one rank, for now: each of its ranks makes a cross-replica group under
the same store host, and frnccl keys a job by the store's root and the group's ranks (one line on stderr).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

_MARK = "_frnccl_wrapped"
_said_not_wrapped = False


def group_name(quorum_id: Any, group_rank: Any) -> str:
    """The same on every member of one quorum's group: the replicas' ranks of one replica-group rank."""
    return f"torchft_quorum_{quorum_id}_rank_{group_rank if group_rank is not None else 0}"


def _wrapped(create_pg: Callable[..., Any]) -> Callable[..., Any]:
    from ..wrap import wrap_process_group_or_warn

    def _create_pg(self: Any, store: Any, rank: int, world_size: int) -> Any:
        global _said_not_wrapped
        pg = create_pg(self, store, rank, world_size)
        group_world_size = getattr(self, "_group_world_size", None)
        if isinstance(group_world_size, int) and group_world_size > 1:
            # Each rank of a replica group makes its own cross-replica group, all under one store host: frnccl
            # keys a job by the store's root and its ranks, so these would share one key space (two processes
            # as replica rank R). Left as torchft built them until frnccl keys a group by its prefix.
            if not _said_not_wrapped:
                _said_not_wrapped = True
                print(f"frnccl: torchft's groups are not recorded in a replica group of {group_world_size} ranks "
                      "(only of 1 rank for now): they run as torchft built them", file=sys.stderr, flush=True)
            return pg
        return wrap_process_group_or_warn(
            pg, store, rank, world_size, group_name=group_name(self._quorum_id, self._group_rank),
            timeout=self._timeout, global_ranks=self._global_ranks or None, handles_failures=True)

    setattr(_create_pg, _MARK, True)
    _create_pg.__wrapped__ = create_pg  # type: ignore[attr-defined]
    return _create_pg


def enable() -> bool:
    """Makes torchft's ProcessGroupGloo groups frnccl groups in this process (idempotent). False where this
    torchft has no ProcessGroupGloo._create_pg to wrap (then nothing is changed)."""
    from torchft import process_group

    cls = getattr(process_group, "ProcessGroupGloo", None)
    create_pg = getattr(cls, "_create_pg", None)
    if cls is None or create_pg is None:
        return False
    if not getattr(create_pg, _MARK, False):
        cls._create_pg = _wrapped(create_pg)
    return True


def disable() -> None:
    """Puts torchft's own _create_pg back; groups already built stay as they are."""
    from torchft import process_group

    cls = process_group.ProcessGroupGloo
    if getattr(cls._create_pg, _MARK, False):
        cls._create_pg = cls._create_pg.__wrapped__
