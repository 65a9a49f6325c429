#!/usr/bin/env python3
"""Packs a torch wheel (and, optionally, an NCCL wheel) into parts small enough for one device call each.

The device machine has no network and takes at most 64 MiB a call, working tree included, while a CUDA
torch wheel is over 500 MB. Most of that is GPU code for every architecture torch supports; a run on one
kind of card needs only its own. So this script:

1. unpacks each wheel (a wheel is its install tree: unpacking it is what `pip install --no-deps --target`
   does, less the RECORD rewrite, which a throw-away tree does not need);
2. zeroes, in every ELF file's fatbins (`.nv_fatbin`, `__nv_relfatbin`), the payload of each entry built for
   another architecture than --arch; headers stay, so the CUDA runtime still sees a well-formed fatbin and
   picks the one entry that matches the card. Zeros compress to nothing;
3. writes one tar.xz stream of the tree, cut into numbered parts of --part-mib, each in its own folder
   (OUT/p1, OUT/p2, ...) so that one call carries one folder, plus MANIFEST (sha256 of every part and of
   the whole) and the unpack command.

    python3 scripts/prepare_torch_parts.py --wheel torch-2.15.0-...whl [--wheel nvidia_nccl_cu13-...whl] \\
        [--wheel nvidia_nvshmem_cu13-...whl --drop 'nvidia/nvshmem/lib/*.bc' --drop 'nvidia/nvshmem/lib/*.a'] \\
        --arch 90 --out .parts

--drop leaves out files that nothing loads at run time (NVSHMEM's device-link bitcode and archives: 148 MB of
its wheel's 201 MB unpacked).

docs/install.md ("torch 2.15 on the device machine") gives the whole sequence; on the device,
scripts/torch_parts.sh gathers, checks and unpacks the parts.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTIONS = (b".nv_fatbin", b"__nv_relfatbin")


def _sections(data: bytes | bytearray) -> dict[bytes, tuple[int, int]]:
    """Name -> (file offset, size) of a 64-bit little-endian ELF file's sections."""
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = heads[shstrndx][4]
    out = {}
    for name_off, _type, _flags, _addr, off, size in heads:
        start = names_at + name_off
        out[bytes(data[start:data.index(b"\0", start)])] = (off, size)
    return out


def zero_other_archs(data: bytearray, arch: int) -> tuple[int, int]:
    """Zeroes the payload of every fatbin entry not built for `arch`; returns (bytes kept, bytes zeroed).

    A fatbin section is a run of containers (magic, version, header size, body size), each a run of entries:
    kind (1 PTX, 2 ELF), header size, padded payload size, and at byte 28 the architecture (90 = sm_90).
    Containers are 8-byte aligned, with padding between them, so the walk steps over anything else."""
    kept = zeroed = 0
    secs = _sections(data)
    for name in FATBIN_SECTIONS:
        if name not in secs:
            continue
        off, size = secs[name]
        pos, end = off, off + size
        while pos + 16 <= end:
            magic, _ver, head, body = struct.unpack_from("<IHHQ", data, pos)
            if magic != FATBIN_MAGIC:
                pos += 8
                continue
            entry, stop = pos + head, pos + head + body
            if stop > end:
                raise ValueError(f"fatbin container at {pos:#x} runs past its section")
            while entry < stop:
                _kind, _v, ehead, payload = struct.unpack_from("<HHIQ", data, entry)
                entry_arch = struct.unpack_from("<I", data, entry + 28)[0]
                if ehead == 0 or entry + ehead + payload > stop:
                    raise ValueError(f"fatbin entry at {entry:#x} is malformed")
                if entry_arch == arch:
                    kept += payload
                else:
                    data[entry + ehead:entry + ehead + payload] = bytes(payload)
                    zeroed += payload
                entry += ehead + payload
            pos = stop
    return kept, zeroed


def _is_elf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def strip_tree(root: Path, arch: int) -> None:
    total_kept = total_zeroed = 0
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.is_symlink() or path.stat().st_size < 1 << 20 or not _is_elf(path):
            continue
        data = bytearray(path.read_bytes())
        kept, zeroed = zero_other_archs(data, arch)
        if zeroed:
            path.write_bytes(data)
            print(f"  {path.relative_to(root)}: kept {kept / 1e6:.1f} MB of sm_{arch} code, zeroed {zeroed / 1e6:.1f} MB")
        total_kept += kept
        total_zeroed += zeroed
    if total_kept == 0 and total_zeroed:
        sys.exit(f"prepare_torch_parts: no fatbin entry for sm_{arch}: the tree would not run on that card")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wheel", action="append", required=True, help="a wheel to pack (repeat for more)")
    p.add_argument("--arch", type=int, default=90, help="the architecture whose GPU code stays (90: H100/H200)")
    p.add_argument("--out", type=Path, required=True, help="folder for the parts (emptied first)")
    p.add_argument("--part-mib", type=int, default=58, help="size of each part (a call carries 64 MiB in all)")
    p.add_argument("--drop", action="append", default=[], metavar="GLOB",
                   help="leave out the unpacked files whose path (relative to the tree) matches GLOB (repeat for more)")
    p.add_argument("--xz-level", default="9", help="xz preset (9 takes ~5 min of 2 cores for torch)")
    args = p.parse_args()
    for w in args.wheel:
        if not zipfile.is_zipfile(w):
            sys.exit(f"prepare_torch_parts: {w} is not a wheel")
    if shutil.which("xz") is None:
        sys.exit("prepare_torch_parts: xz is not installed")

    with tempfile.TemporaryDirectory(prefix="torch-parts-") as tmp:
        tree = Path(tmp) / "tree"
        for w in args.wheel:
            print(f"unpacking {Path(w).name}")
            with zipfile.ZipFile(w) as z:
                z.extractall(tree)
        for path in sorted(tree.rglob("*")):
            rel = str(path.relative_to(tree))
            if path.is_file() and any(fnmatch.fnmatch(rel, g) for g in args.drop):
                path.unlink()
                print(f"  left out {rel}")
        print(f"zeroing GPU code for architectures other than sm_{args.arch}")
        strip_tree(tree, args.arch)
        if args.out.exists():
            shutil.rmtree(args.out)
        args.out.mkdir(parents=True)
        stream = Path(tmp) / "tree.tar.xz"
        print(f"compressing (xz -{args.xz_level})")
        with open(stream, "wb") as f:
            tar = subprocess.Popen(["tar", "-C", str(tree), "-cf", "-", "."], stdout=subprocess.PIPE)
            subprocess.run(["xz", f"-{args.xz_level}", "-T0", "-c"], stdin=tar.stdout, stdout=f, check=True)
            if tar.wait() != 0:
                sys.exit("prepare_torch_parts: tar failed")
        whole = hashlib.sha256()
        lines = []
        size = args.part_mib << 20
        with open(stream, "rb") as f:
            n = 0
            while chunk := f.read(size):
                n += 1
                whole.update(chunk)
                folder = args.out / f"p{n}"
                folder.mkdir()
                (folder / f"part{n:02d}").write_bytes(chunk)
                lines.append(f"{hashlib.sha256(chunk).hexdigest()}  part{n:02d}")
        # The manifest travels with every part, so each call can check what the machine already holds.
        manifest = "\n".join(lines) + f"\n# parts {n}\n# whole {whole.hexdigest()}\n# wheels " + \
            " ".join(Path(w).name for w in args.wheel) + f"\n# arch sm_{args.arch}\n"
        for i in range(1, n + 1):
            (args.out / f"p{i}" / "MANIFEST").write_text(manifest)
        print(f"{stream.stat().st_size / 2**20:.1f} MiB in {n} parts under {args.out}: "
              + ", ".join(f"{args.out}/p{i}" for i in range(1, n + 1)))


if __name__ == "__main__":
    main()
