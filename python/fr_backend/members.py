"""A process group's members as the pg_config "members" text (dump_keys.def).

Comma-separated runs, each ``R`` or ``START:STOP`` or ``START:STOP:STEP`` (Python's range), in group-rank
order: the default group is ``0:N``, a DeviceMesh dimension or a new_subgroups group one run, any other
group its ranks one by one. The C++ writer (CompactEncoding::members) makes the same text as ``encode``;
a dump's size no longer grows with the world size."""

from __future__ import annotations

from collections.abc import Sequence

MAX_TEXT = 1 << 24  # a longer text is no frnccl writer's: refused before it is split


class MembersError(ValueError):
    """The text is not a members text, or names more ranks than allowed; the message says which."""


def encode(ranks: Sequence[int]) -> str:
    """Runs of three or more ranks a constant non-zero step apart as START:STOP[:STEP], others one by one."""
    out: list[str] = []
    n, i = len(ranks), 0
    while i < n:
        k = i + 1
        step = ranks[k] - ranks[i] if k < n else 0
        while step and k < n and ranks[k] - ranks[k - 1] == step:
            k += 1
        if k - i >= 3:
            stop = ranks[k - 1] + step
            out.append(f"{ranks[i]}:{stop}" if step == 1 else f"{ranks[i]}:{stop}:{step}")
            i = k
        else:
            out.append(str(ranks[i]))
            i += 1
    return ",".join(out)


def _int(s: str) -> int:
    digits = s[1:] if s[:1] == "-" else s
    if not digits or not digits.isascii() or not digits.isdigit() or len(digits) > 19:
        raise MembersError(f"{_shown(s)} is not a rank")
    return int(s)


def decode(text: str, limit: int) -> list[int]:
    """The ranks ``text`` names, in its order; MembersError when it is malformed or names more than
    ``limit`` ranks (counted before any list is made, so "0:9999999999" costs nothing)."""
    if type(text) is not str or len(text) > MAX_TEXT:
        raise MembersError("not a members text" if type(text) is not str else "members text too long")
    if not text:
        return []
    runs: list[range] = []
    count, at = 0, 0
    while at <= len(text):  # item by item, not split(): a hostile text stops at its first bad or excess item
        end = text.find(",", at)
        end = len(text) if end < 0 else end
        item, at = text[at:end], end + 1
        parts = item.split(":", 3)
        if len(parts) > 3:
            raise MembersError(f"{_shown(item)} is not a run")
        nums = [_int(p) for p in parts]
        if len(nums) == 1:
            run = range(nums[0], nums[0] + 1)
        else:
            if len(nums) == 3 and nums[2] == 0:
                raise MembersError(f"{_shown(item)} has step 0")
            run = range(*nums)
        count += len(run)
        if count > limit:
            raise MembersError(f"names more than {limit} ranks")
        runs.append(run)
    out: list[int] = []
    for run in runs:
        out.extend(run)
    return out


def _shown(s: str) -> str:
    return repr(s if len(s) <= 24 else s[:24] + "...")
