import os
import sys

import pytest

PY = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "python"))
# These tests are about this tree's analyzer: put its sources first, also when a copy of fr_backend
# is installed (a non-editable `pip install .` in site-packages would otherwise shadow them).
if "fr_backend" not in sys.modules and PY not in sys.path:
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
