"""The dump schema, read from ``dump_keys.def`` (the same file the C++ writers include).

Also fixes where dumps live on disk, so writers, loaders and the CLI agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

FORMAT_NAME = "frnccl"
FORMAT_VERSION = "3.0"

# <FRNCCL_DUMP_DIR>/<incident_id>/compact/frnccl_rank_<R>.json.gz   (columns, gzip'ed: fr_backend/compact.py)
# <FRNCCL_DUMP_DIR>/<incident_id>/pickle/frnccl_rank_<R>   (torch's fr_trace reads this folder as is)
# <FRNCCL_DUMP_DIR>/<incident_id>/json/frnccl_rank_<R>.json
# <FRNCCL_DUMP_DIR>/<incident_id>/chrome/frnccl_rank_<R>.trace.json
# <FRNCCL_DUMP_DIR>/<incident_id>/verdict.json   (on the rank that judged it: backend/VerdictFile.cpp)
RANK_FILE_PREFIX = "frnccl_rank_"
VERDICT_FILE_NAME = "verdict.json"
VERDICT_SCHEMA = "frnccl-verdict"
VERDICT_VERSION = 1
FORMAT_SUBDIRS = {"compact": ("compact", ".json.gz"), "pickle": ("pickle", ""), "json": ("json", ".json"), "chrome": ("chrome", ".trace.json")}

_KEY_LINE = re.compile(r'^FR_KEY\((\w+),\s*"([^"]*)",\s*(\w+),\s*"((?:[^"\\]|\\.)*)"\)\s*$')


@dataclass(frozen=True)
class DumpKey:
    ident: str
    key: str
    scope: str
    meaning: str


@lru_cache(maxsize=1)
def dump_keys() -> tuple[DumpKey, ...]:
    text = (Path(__file__).with_name("dump_keys.def")).read_text()
    keys = []
    for line in text.splitlines():
        match = _KEY_LINE.match(line.strip())
        if match:
            keys.append(DumpKey(*match.groups()))
    return tuple(keys)


def keys_in(scope: str) -> dict[str, DumpKey]:
    return {k.key: k for k in dump_keys() if k.scope == scope}


def rank_file_name(fmt: str, rank: int) -> str:
    subdir, suffix = FORMAT_SUBDIRS[fmt]
    return f"{subdir}/{RANK_FILE_PREFIX}{rank}{suffix}"
