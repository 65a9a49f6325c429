#!/usr/bin/env bash
# The device machine's half of scripts/prepare_torch_parts.py: gathers the parts that successive calls
# carried, checks them, and unpacks the torch they make beside the image's own.
#   bash scripts/torch_parts.sh gather CARRIED...    copy the parts under CARRIED into $PARTS, check each
#                                                    against its MANIFEST, say which are still missing
#   bash scripts/torch_parts.sh install DEST         all parts there: join, check, unpack into DEST, and
#                                                    point DEST/nvidia at the CUDA libraries (below)
#   bash scripts/torch_parts.sh nccl DEST image|carried   which libnccl.so.2 DEST's torch loads
# $PARTS defaults to /tmp/torch-parts (it outlives a call only while the machine stays warm: every call
# gathers first, so a machine that was replaced shows at once as missing parts). $IMAGE_PYTHON (default
# python3) is the image's Python, whose site-packages/nvidia holds the CUDA libraries that DEST's torch
# borrows: its RPATH is $ORIGIN/../../nvidia/{cudnn,nvshmem,nccl,cusparselt,cu13}/lib, so DEST/nvidia holds
# one link per library folder, except for a library whose wheel was packed with the torch (torch 2.15 on the
# image needs nvidia-nvshmem-cu13 3.7.2: the image's NVSHMEM lacks nvshmem_selected_device_transport, and
# `import torch` fails). An NCCL wheel packed with the torch lands in DEST/nvidia/nccl; it moves to
# DEST/nccl-carried, and `nccl` chooses between it and the image's.
set -euo pipefail
PARTS=${PARTS:-/tmp/torch-parts}
IMAGE_PYTHON=${IMAGE_PYTHON:-python3}
die() { echo "torch_parts: $*" >&2; exit 2; }

manifest() { ls "$PARTS"/MANIFEST 2>/dev/null || die "no parts gathered in $PARTS yet"; }

check() {  # prints the numbers of the parts present and sound; exit 1 when any is missing
  local m; m=$(manifest); local total; total=$(sed -n 's/^# parts //p' "$m")
  local have=() missing=()
  while read -r sum name; do
    [[ "$sum" == \#* ]] && continue
    if [ -f "$PARTS/$name" ] && [ "$(sha256sum "$PARTS/$name" | cut -d' ' -f1)" = "$sum" ]; then
      have+=("${name#part}")
    else
      missing+=("${name#part}")
    fi
  done < "$m"
  echo "torch_parts: $(sed -n 's/^# wheels //p' "$m"): have ${have[*]:-none} of $total; missing ${missing[*]:-none}"
  [ ${#missing[@]} -eq 0 ]
}

site_nvidia() {
  local site; site=$("$IMAGE_PYTHON" -c 'import site; print(site.getsitepackages()[0])')
  [ -d "$site/nvidia" ] || die "$IMAGE_PYTHON's site-packages ($site) has no nvidia/ folder"
  echo "$site/nvidia"
}

case "${1:-}" in
  gather)
    shift; [ $# -ge 1 ] || die "gather needs the carried folder(s)"
    mkdir -p "$PARTS"
    for dir in "$@"; do
      for f in "$dir"/p*/part* "$dir"/p*/MANIFEST; do
        [ -f "$f" ] && cp -f "$f" "$PARTS/"
      done
    done
    check || true
    ;;
  install)
    dest=${2:?install needs DEST}
    check || die "parts are missing: send them first (docs/install.md)"
    m=$(manifest)
    whole=$(sed -n 's/^# whole //p' "$m")
    got=$(cat "$PARTS"/part* | sha256sum | cut -d' ' -f1)
    [ "$got" = "$whole" ] || die "the joined parts' sha256 is $got, the manifest says $whole"
    rm -rf "$dest"; mkdir -p "$dest"
    cat "$PARTS"/part* | xz -dc | tar -x -C "$dest"
    src=$(site_nvidia)
    if [ -d "$dest/nvidia/nccl" ]; then mkdir -p "$dest/nccl-carried"; mv "$dest/nvidia/nccl" "$dest/nccl-carried/"; fi
    mkdir -p "$dest/nvidia"
    for lib in cudnn nvshmem cusparselt cu13; do
      [ -d "$dest/nvidia/$lib" ] && continue  # packed with the torch: a newer one than the image's
      [ -d "$src/$lib/lib" ] || die "$src/$lib/lib is missing: torch's RPATH needs it"
      ln -s "$src/$lib" "$dest/nvidia/$lib"
    done
    ln -s "$src/nccl" "$dest/nvidia/nccl"
    carried=""; [ -d "$dest/nccl-carried" ] && carried="; carried NCCL in $dest/nccl-carried"
    echo "torch_parts: unpacked into $dest ($(du -sh "$dest" | cut -f1)); CUDA libraries from $src$carried"
    ;;
  nccl)
    dest=${2:?nccl needs DEST}
    case "${3:-}" in
      image) target=$(site_nvidia)/nccl ;;
      carried) target=$dest/nccl-carried/nccl; [ -d "$target" ] || die "no NCCL was carried with this torch" ;;
      *) die "nccl needs 'image' or 'carried'" ;;
    esac
    ln -sfn "$target" "$dest/nvidia/nccl"
    echo "torch_parts: $dest's torch loads $(readlink -f "$dest/nvidia/nccl/lib/libnccl.so.2")"
    ;;
  *) die "usage: torch_parts.sh gather CARRIED... | install DEST | nccl DEST image|carried" ;;
esac
