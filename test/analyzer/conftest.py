import importlib.util
import os
import sys
from pathlib import Path

import pytest

PY = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "python"))


def _installed_is_this_tree() -> bool:
    """Whether the fr_backend that imports now (found, not imported) has this tree's Python sources."""
    spec = importlib.util.find_spec("fr_backend")
    if spec is None or not spec.origin:
        return False
    src, inst = Path(PY, "fr_backend"), Path(spec.origin).parent
    if src.resolve() == inst.resolve():
        return True
    for f in src.rglob("*.py"):
        twin = inst / f.relative_to(src)
        if not twin.is_file() or twin.read_bytes() != f.read_bytes():
            return False
    return True


# These tests are about this tree's analyzer: put its sources first where the installed copy (a non-editable
# `pip install .` in site-packages) differs from them. Where it has the same sources, it stays: the session's
# other tests need its native module, which the source folder has not.
if "fr_backend" not in sys.modules and PY not in sys.path and not _installed_is_this_tree():
    sys.path.insert(0, PY)

from fr_backend.analyzer.load import guard_address_space  # noqa: E402
from fr_backend.analyzer.report import Analysis, run  # noqa: E402
from fr_backend.analyzer.synth import Job  # noqa: E402


@pytest.fixture(autouse=True)
def address_space_guarded():
    """The analyzer's command line reads dumps under an address-space limit; these tests read them in the
    test process, which does nothing else meanwhile."""
    guard_address_space(True)
    yield
    guard_address_space(False)


def analyse(job: Job, tmp_path, fmt: str = "pickle", ranks=None, **kw) -> Analysis:
    d = job.write(tmp_path / "dumps", fmt, ranks=ranks)
    return run([str(d)], jobs=1, **kw)


def kinds(a: Analysis) -> list[str]:
    return [f.kind for f in a.findings]


def faults(a: Analysis):
    return [f for f in a.findings if f.severity != "info"]


@pytest.fixture
def job8() -> Job:
    return Job(8)
