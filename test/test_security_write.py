"""Writing dumps, under attack: what any client of the job's TCPStore, a caller's reason, or a link planted in the
dump folder can make frnccl write (docs/reliability.md, "Threat model").

Each test runs real ranks (workers/security_write.py, dist_harness: a real TCPStore hosted by rank 0) and acts as
the attacker from this process: a TCPStore client of its own that publishes requests the way a trigger does
(`frnccl/incident_seq`, `frnccl/incident/<n>`) or writes bad values, and links made in the dump folder.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import fr_backend
from dist_harness import JobThread, Job, run_ranks, wait_for

SEQ_KEY = "frnccl/incident_seq"


class Idle(JobThread):
    """workers/security_write.py as `world` ranks, in a thread; `state` is where the test and the ranks meet."""

    def __init__(self, tmp_path: Path, world: int, env: dict[str, str], timeout: float = 150) -> None:
        self.state = tmp_path / "state"
        self.state.mkdir()
        self.world = world
        super().__init__(lambda: run_ranks("security_write.py", world, str(self.state), timeout=timeout, env=env))
        wait_for(lambda: (self.state / "running").exists(), 120, "the ranks to start", self)

    def store(self) -> Any:
        from torch.distributed import TCPStore

        port = int((self.state / "master_port").read_text())
        return TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10), wait_for_workers=False)

    def ask(self, name: str, text: str = "1") -> None:
        (self.state / name).write_text(text)

    def stop(self) -> Job:
        (self.state / "stop").write_text("1")
        job = self.finish()
        job.assert_ok()
        return job


def env_for(dump_dir: Path, **extra: str) -> dict[str, str]:
    env = {"FRNCCL_DUMP_DIR": str(dump_dir), "FRNCCL_COORD_CHECK_MS": "100", "FRNCCL_DUMP_TIMEOUT_SEC": "10"}
    env.update(extra)
    return env


def publish(store: Any, incident: str, reason: str = "manual", detail: str = "test request") -> int:
    """A job-wide request, as any store client can publish one (the lock, frnccl/active, is not needed), and
    the ranks' wake keys set, as every publisher does (frnccl dump: live_dump.publish)."""
    seq = int(store.add(SEQ_KEY, 1))
    store.set(f"frnccl/incident/{seq}", f"{incident}\n{reason}\n-1\n{detail}")
    wake(store)
    return seq


def wake(store: Any) -> None:
    """Sets every rank's wake key: each rank then reads the store."""
    world = int(store.get("frnccl/world_size"))
    store.multi_set([f"frnccl/wake/{r}" for r in range(world)], ["1"] * world)


def wrote(dump_dir: Path, incident: str, ranks: range) -> bool:
    return all((dump_dir / incident / "compact" / f"frnccl_rank_{r}.json.gz").is_file() for r in ranks)


def tree(root: Path) -> list[str]:
    """Every path under `root`, links not followed, relative."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ----------------------------------------------------------------------------- 1. incident ids from the store


BAD_IDS = ["../outside", "..", ".", "", "a/b", "/abs", ".hidden", "x" * 129, "esc\x1b[2Jforged", "sp ace"]


def test_bad_incident_ids_from_the_store_write_nothing(tmp_path):
    """Requests whose incident id is not a plain name are ignored, each with one log line (the id escaped), and
    nothing is written, outside the dump folder or in it; the next good request is served as usual (its reason,
    a terminal escape, escaped in the log and whole in the header). Before,
    `../outside` made every rank write next to its dump folder, and `..`/`.`/empty into the dump folder itself."""
    root = tmp_path / "root"
    dump_dir = root / "dumps"
    job = Idle(tmp_path, 2, env_for(dump_dir))
    try:
        store = job.store()
        seqs = [publish(store, bad) for bad in BAD_IDS]
        publish(store, "good-after-bad", reason="manual\x1b[2J")
        wait_for(lambda: wrote(dump_dir, "good-after-bad", range(2)), 60, "the good request's dumps", job)
    finally:
        done = job.stop()
    log = done.describe()
    assert tree(root) == ["dumps", "dumps/good-after-bad", "dumps/good-after-bad/compact",
                          "dumps/good-after-bad/compact/frnccl_rank_0.json.gz",
                          "dumps/good-after-bad/compact/frnccl_rank_1.json.gz"], log
    for r in range(2):
        out = done.ranks[r].output
        ignored = re.findall(rf"^\[frnccl rank {r}\] dump request (\d+) ignored: its incident id \"(.*)\" is not a plain "
                             r"folder name", out, re.M)
        assert [int(seq) for seq, _ in ignored] == seqs, log
        # What the store said reaches the log escaped, and the header whole.
        assert "\x1b" not in out and 'id "esc\\x1b[2Jforged"' in out and "reason manual\\x1b[2J)" in out, log
        header = fr_backend.load_dump(str(dump_dir / "good-after-bad" / "compact" / f"frnccl_rank_{r}.json.gz"))
        assert header["dump_reason"] == "manual\x1b[2J", header["dump_reason"]


# ----------------------------------------------------------------------------- 2. reasons


def test_reason_never_enters_a_path(tmp_path):
    """fr_backend.dump(reason) with a reason that is a path: the incident folder is a plain name inside the dump
    folder, its reason part sanitized; the dump header keeps the reason whole. `frnccl dump --reason` puts its
    text in the header only. Before, dump("x/../../../elsewhere") wrote outside the dump folder and left an empty
    folder behind."""
    from fr_backend import live_dump

    root = tmp_path / "a"
    dump_dir = root / "b" / "dumps"
    reasons = ["x/../../../elsewhere", "line\nbreak\x1b[2J", "/etc/passwd", "...", "\u00e9t\u00e9 " * 40]
    job = Idle(tmp_path, 1, env_for(dump_dir))
    try:
        for i, reason in enumerate(reasons):
            job.ask("dump_0", json.dumps(reason))
            wait_for(lambda: len(list(dump_dir.glob("*/compact/frnccl_rank_0.json.gz"))) > i, 60, f"the dump for reason {i}", job)
        endpoint = f"127.0.0.1:{(job.state / 'master_port').read_text()}"
        cli_reason = "cli/../../../elsewhere\x1b[2J"
        got = live_dump.request_dump(endpoint, cli_reason, 0, 30)
        folder, written, world = got.folder, got.written, got.world
    finally:
        done = job.stop()
    log = done.describe()
    assert (written, world) == (1, 1), log
    assert Path(folder).parent == dump_dir, folder
    local = [json.loads(ln.split(" ", 1)[1]) for ln in done.ranks[0].output.splitlines() if ln.startswith("LOCAL_DUMP ")]
    assert len(local) == len(reasons) and all("folder" in entry for entry in local), log
    for entry, reason in zip(local, reasons):
        path = Path(entry["folder"])
        assert path.parent == dump_dir, (reason, path)
        assert re.fullmatch(r"\d{8}-\d{6}\.\d{3}-job\.[0-9a-f]{8}-[A-Za-z0-9_-]{1,40}-r0(-\d+)?", path.name), (reason, path.name)
        header = fr_backend.load_dump(str(path / "compact" / "frnccl_rank_0.json.gz"))
        assert header["dump_reason"] == reason and header["incident_id"] == path.name, (reason, header["dump_reason"])
    assert "-x_elsewhere-r0" in local[0]["folder"], local[0]
    cli_header = fr_backend.load_dump(str(Path(folder) / "compact" / "frnccl_rank_0.json.gz"))
    assert cli_header["dump_detail"] == cli_reason, cli_header["dump_detail"]
    # Nothing outside the dump folder: no `elsewhere-r0`, no folder left behind.
    assert [p for p in tree(root) if not p.startswith("b/dumps")] == ["b"], tree(root)


# ----------------------------------------------------------------------------- 3. links and existing files


def test_links_and_existing_files_are_never_written_through(tmp_path):
    """Links planted where the incident folder, a format folder or the final file will be are not followed, and
    a file already under the final name is not replaced: each such dump fails with one log line and the target
    is untouched (content, mode). Before, frnccl wrote through every link (a 0600 file it pointed to was filled
    with the dump and made 0640) and replaced the existing file."""
    dump_dir = tmp_path / "dumps"
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("secret")
    victim.chmod(0o600)
    dump_dir.mkdir()
    (dump_dir / "linked-incident").symlink_to(outside)
    (dump_dir / "linked-format").mkdir()
    (dump_dir / "linked-format" / "compact").symlink_to(outside)
    (dump_dir / "linked-file" / "compact").mkdir(parents=True)
    (dump_dir / "linked-file" / "compact" / "frnccl_rank_0.json.gz").symlink_to(victim)
    (dump_dir / "existing" / "compact").mkdir(parents=True)
    (dump_dir / "existing" / "compact" / "frnccl_rank_0.json.gz").write_text("earlier dump")
    planted = ["linked-incident", "linked-format", "linked-file", "existing"]
    if os.geteuid() == 0:  # a folder of another user's can only be made by root
        (dump_dir / "foreign" / "compact").mkdir(parents=True)
        os.chown(dump_dir / "foreign", 65534, 65534)
        planted.append("foreign")
    job = Idle(tmp_path, 1, env_for(dump_dir, FRNCCL_DUMP_MIN_INTERVAL_SEC="0"))
    try:
        store = job.store()
        for incident in planted:
            publish(store, incident)
        publish(store, "good")
        wait_for(lambda: wrote(dump_dir, "good", range(1)), 60, "the good request's dump", job)
    finally:
        done = job.stop()
    log = done.describe()
    assert sorted(p.name for p in outside.iterdir()) == ["victim"], log
    assert victim.read_text() == "secret" and stat.S_IMODE(victim.stat().st_mode) == 0o600, log
    assert (dump_dir / "existing" / "compact" / "frnccl_rank_0.json.gz").read_text() == "earlier dump", log
    assert os.readlink(dump_dir / "linked-file" / "compact" / "frnccl_rank_0.json.gz") == str(victim)
    out = done.ranks[0].output
    not_written = dict(re.findall(r"^\[frnccl rank 0\] dump (\S+) NOT written: (.+)$", out, re.M))
    assert set(not_written) == set(planted), log
    assert not_written["linked-incident"] == f"refusing to write into {dump_dir}/linked-incident: it is a symbolic link or not a folder"
    assert not_written["linked-format"] == f"refusing to write into {dump_dir}/linked-format/compact: it is a symbolic link or not a folder"
    assert not_written["linked-file"] == f"{dump_dir}/linked-file/compact/frnccl_rank_0.json.gz already exists; not replaced"
    assert not_written["existing"] == f"{dump_dir}/existing/compact/frnccl_rank_0.json.gz already exists; not replaced"
    if "foreign" in not_written:
        assert not_written["foreign"].startswith(f"refusing to write into {dump_dir}/foreign: it belongs to user 65534")
    # No temporary file is left anywhere (the formats are independent: a JSON file whose name was free is written).
    assert not [p for p in tree(dump_dir) if ".partial" in p], tree(dump_dir)


# ----------------------------------------------------------------------------- 4. dump storms


def test_dump_storm_is_bounded_and_a_real_timeout_still_dumps(tmp_path):
    """300 requests published at once make each rank write one dump, not 300 (FRNCCL_DUMP_MIN_INTERVAL_SEC,
    default 10 s), with a few log lines that count what was dropped; a real timeout right after (rank 0's
    watchdog) is still dumped by every rank. Before, every rank wrote all 300."""
    dump_dir = tmp_path / "dumps"
    storm = 300
    job = Idle(tmp_path, 2, env_for(dump_dir, SEC_PG_TIMEOUT="3"))
    try:
        store = job.store()
        for i in range(storm):
            publish(store, f"storm-{i:03d}")
        job.ask("hang_0")
        wait_for(lambda: any(wrote(dump_dir, p.name, range(2)) for p in dump_dir.glob("*-timeout-r0*")), 90,
                 "the timeout's dump on both ranks", job)
    finally:
        done = job.stop()
    log = done.describe()
    # The ranks read the requests while they are published: which one each admits depends on when it looked.
    for r in range(2):
        storm_files = list(dump_dir.glob(f"storm-*/compact/frnccl_rank_{r}.json.gz"))
        assert len(storm_files) == 1, (r, sorted(p.name for p in dump_dir.iterdir()), log)
    timeouts = [p for p in dump_dir.iterdir() if "-timeout-r0" in p.name]
    assert len(timeouts) == 1, log
    timeout = timeouts[0]
    for r in range(2):
        header = fr_backend.load_dump(str(timeout / "compact" / f"frnccl_rank_{r}.json.gz"))
        assert header["dump_reason"] == "timeout" and header["trigger_rank"] == 0, header["dump_reason"]
        out = done.ranks[r].output
        drops = re.findall(rf"^\[frnccl rank {r}\] dump request \d+ \(incident storm-\d+, reason manual\) dropped: this "
                           r"process wrote a job-wide non-failure dump [0-9.]+ s ago \(FRNCCL_DUMP_MIN_INTERVAL_SEC=10\); "
                           r"(\d+) dropped since the last such line$", out, re.M)
        assert 1 <= len(drops) <= 10, log
    assert "OUTCOME 0 raised" in done.ranks[0].output, log


# ----------------------------------------------------------------------------- 5. bad store values


def test_poisoned_store_is_survived_and_the_culprit_still_dumps(tmp_path):
    """`frnccl/incident_seq` set to text is read without add() (the store server fails an add() on it and drops
    the connection), and said once. A count of writers that is not a number then makes the server fail every
    rank's add() and drop its connection; once it is repaired, each rank connects again, and a real timeout on
    rank 0 is dumped by rank 1 (the culprit: it never called the op). A jump of the request number to 10^12
    costs one grace (10 s), not 10 s per number. Before, the first bad value marked the store lost for good on
    every rank: the timeout was dumped by rank 0 alone."""
    dump_dir = tmp_path / "dumps"
    job = Idle(tmp_path, 2, env_for(dump_dir, SEC_PG_TIMEOUT="5", FRNCCL_DUMP_MIN_INTERVAL_SEC="0"))
    try:
        store = job.store()
        seq = str(store.add(SEQ_KEY, 0))
        store.set(SEQ_KEY, "not-a-number")
        # Wakes each rank, which reads the bad value. Nothing outside the ranks shows that they did; a shorter
        # wait could only make the checks below pass where they should fail.
        wake(store)
        time.sleep(1.0)
        store.set(SEQ_KEY, seq)
        store.set("frnccl/written/poison-1", "not a count")
        publish(store, "poison-1")
        wait_for(lambda: wrote(dump_dir, "poison-1", range(2)), 60, "the poisoned request's dumps", job)
        store.delete_key("frnccl/written/poison-1")
        job.ask("hang_0")
        wait_for(lambda: any(wrote(dump_dir, p.name, range(2)) for p in dump_dir.glob("*-timeout-r0*")), 90,
                 "the timeout's dump on both ranks", job)
        jumped = int(store.add(SEQ_KEY, 10**12))
        store.set(f"frnccl/incident/{jumped}", "after-jump\nmanual\n-1\nafter a jump")
        wake(store)
        wait_for(lambda: wrote(dump_dir, "after-jump", range(2)), 30, "the request after the jump", job)
    finally:
        done = job.stop()
    log = done.describe()
    timeout = [p for p in dump_dir.glob("*-timeout-r0*")]
    assert len(timeout) == 1 and not timeout[0].name.endswith("-local"), log
    culprit = fr_backend.load_dump(str(timeout[0] / "compact" / "frnccl_rank_1.json.gz"))
    assert culprit["dump_reason"] == "timeout" and culprit["trigger_rank"] == 0, culprit["dump_reason"]
    # A rank loses its connection when its add() to the bad count reaches the server; one whose add() came after
    # the repair (it wrote its file, the test saw it and deleted the key, then it counted) had nothing to restore.
    lost = [r for r in range(2) if f"[frnccl rank {r}] store unreachable" in done.ranks[r].output]
    assert lost, f"no rank lost its connection to the poisoned count\n{log}"
    for r in range(2):
        out = done.ranks[r].output
        assert r not in lost or f"[frnccl rank {r}] store connection restored" in out, log
        assert f'[frnccl rank {r}] frnccl/incident_seq holds "not-a-number", not a request number' in out, log
        assert re.search(rf"\[frnccl rank {r}\] frnccl/incident_seq went from \d+ to {jumped}", out), log


# Makes O_TMPFILE unsupported, as on filesystems without it, so that frnccl writes a named temporary file.
NO_TMPFILE_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
typedef int (*openat_fn)(int, const char*, int, ...);
static int forward(const char* name, int dir, const char* path, int flags, unsigned mode) {
  if ((flags & O_TMPFILE) == O_TMPFILE) { errno = EOPNOTSUPP; return -1; }
  openat_fn real = (openat_fn)dlsym(RTLD_NEXT, name);
  return real(dir, path, flags, mode);
}
#define MODE unsigned mode = 0; if (flags & (O_CREAT | O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, unsigned); va_end(ap); }
int openat(int dir, const char* path, int flags, ...) { MODE return forward("openat", dir, path, flags, mode); }
int openat64(int dir, const char* path, int flags, ...) { MODE return forward("openat64", dir, path, flags, mode); }
"""


def test_named_temporary_is_never_a_planted_link(tmp_path):
    """Where O_TMPFILE is not supported (here: made so with an LD_PRELOAD shim), the temporary file is opened
    with O_CREAT|O_EXCL|O_NOFOLLOW under a name of this process's: a link planted under that name fails the dump
    (one log line) and its target is untouched; the next dump is written through a temporary file and leaves
    none behind. Before, the temporary `.<name>.partial` was opened with O_TRUNC through the link."""
    import shutil
    import subprocess

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler for the O_TMPFILE shim")
    shim_src = tmp_path / "no_tmpfile.c"
    shim_src.write_text(NO_TMPFILE_SHIM)
    shim = tmp_path / "no_tmpfile.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(shim), str(shim_src), "-ldl"], check=True)
    dump_dir = tmp_path / "dumps"
    victim = tmp_path / "victim"
    victim.write_text("secret")
    victim.chmod(0o600)
    job = Idle(tmp_path, 1, env_for(dump_dir, FRNCCL_DUMP_MIN_INTERVAL_SEC="0", LD_PRELOAD=str(shim)))
    try:
        pid = int((job.state / "pid_0").read_text())
        folder = dump_dir / "planted-temp" / "compact"
        folder.mkdir(parents=True)
        for name in (f".frnccl_rank_0.json.gz.{pid}.partial", ".frnccl_rank_0.json.gz.partial"):
            (folder / name).symlink_to(victim)
        store = job.store()
        publish(store, "planted-temp")
        publish(store, "good")
        wait_for(lambda: wrote(dump_dir, "good", range(1)), 60, "the good request's dump", job)
    finally:
        done = job.stop()
    log = done.describe()
    assert victim.read_text() == "secret" and stat.S_IMODE(victim.stat().st_mode) == 0o600, log
    assert not (folder / "frnccl_rank_0.json.gz").exists(), log
    assert re.search(rf"^\[frnccl rank 0\] dump planted-temp NOT written: cannot write {folder}/\.frnccl_rank_0\.json\.gz\.{pid}"
                     r"\.partial: File exists$", done.ranks[0].output, re.M), log
    good = dump_dir / "good" / "compact" / "frnccl_rank_0.json.gz"
    assert not good.is_symlink() and fr_backend.load_dump(str(good))["incident_id"] == "good", log
    assert sorted(p.name for p in (dump_dir / "good" / "compact").iterdir()) == ["frnccl_rank_0.json.gz"], log
