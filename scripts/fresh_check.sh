#!/usr/bin/env bash
# fresh_check.sh: runs the README's first command on a plain Debian 12 (a debootstrap root, nothing from this
# machine's image in it) as root with a clean environment, so that an install step missing from
# scripts/setup.sh fails here and not on a user's new machine.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/fresh_check.sh [--both] [--help]

Clones the checkout's committed HEAD into a throwaway copy of a plain Debian 12 root filesystem and runs,
as root with a clean environment, the README's first command:

  scripts/setup.sh && build/apps/flowrun train configs/quickstart.yaml

then reports each step's time. With --both, the README's second command (scripts/test.sh, the whole suite:
about half an hour more on 2 cores) runs after it in the same root. Needs root (chroot, mounts) and
Debian's package mirror.

The root filesystem is made once with debootstrap (--variant=minbase) and kept, pristine, in the cache; each
run works on an overlay of it that is thrown away. The cache also keeps the downloaded .deb files and a
ccache of its own, so later runs download and compile only what changed. The CUDA toolkit is bind-mounted
read-only where the host has /usr/local/cuda.

Environment:
  FLOWRUN_FRESH_CACHE   the cache (default /var/cache/flowrun-fresh; never inside the checkout)
  FLOWRUN_FRESH_MIRROR  the Debian mirror (default http://deb.debian.org/debian)
Exit status: 0 passed, 1 failed, 77 skipped (not root).
USAGE
}
COMMAND="scripts/setup.sh && build/apps/flowrun train configs/quickstart.yaml"
for arg in "$@"; do
  case "$arg" in
    --help | -h) usage; exit 0 ;;
    --both) COMMAND="$COMMAND && scripts/test.sh" ;;
    *) echo "fresh_check.sh: unknown argument: $arg" >&2; usage >&2; exit 2 ;;
  esac
done

# scripts/test.sh inside the fresh root (--both) would run this check again, in a root of its own.
if [[ -e /etc/flowrun-fresh-root ]]; then
  echo "fresh_check.sh: skipped: this is already a fresh root" >&2
  exit 77
fi
if [[ "$(id -u)" -ne 0 ]]; then
  echo "fresh_check.sh: skipped: needs root (chroot and mounts)" >&2
  exit 77
fi
for tool in debootstrap unshare git; do
  command -v "$tool" >/dev/null || { echo "fresh_check.sh: $tool is missing (scripts/setup.sh installs it)" >&2; exit 1; }
done

SRC="$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)"
CACHE="${FLOWRUN_FRESH_CACHE:-/var/cache/flowrun-fresh}"
MIRROR="${FLOWRUN_FRESH_MIRROR:-http://deb.debian.org/debian}"
case "$(realpath -m "$CACHE")/" in
  "$SRC"/*) echo "fresh_check.sh: FLOWRUN_FRESH_CACHE ($CACHE) must lie outside the checkout" >&2; exit 2 ;;
esac
mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
flock 9  # one check at a time per cache

START=$SECONDS
step_start=$SECONDS
report() { printf 'fresh_check: %-52s %5ds\n' "$1" $((SECONDS - step_start)); step_start=$SECONDS; }

ROOTFS="$CACHE/bookworm"
if [[ ! -f "$ROOTFS.done" ]]; then
  rm -rf "$ROOTFS" "$ROOTFS.tmp"
  echo "fresh_check: debootstrap bookworm from $MIRROR (once; kept in $CACHE)"
  debootstrap --variant=minbase bookworm "$ROOTFS.tmp" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 || {
    tail -30 "$CACHE/debootstrap.log" >&2
    echo "fresh_check.sh: debootstrap failed (log: $CACHE/debootstrap.log)" >&2
    exit 1
  }
  mv "$ROOTFS.tmp" "$ROOTFS"
  touch "$ROOTFS.done"
  report "root filesystem made (debootstrap --variant=minbase)"
else
  report "root filesystem (cached, $ROOTFS)"
fi

RUN="$(mktemp -d "$CACHE/run.XXXXXX")"
trap 'rm -rf "$RUN"' EXIT
mkdir -p "$RUN"/{upper,work,root} "$CACHE/apt-archives/partial" "$CACHE/ccache"
# The compiler is installed anew in every overlay: hash it by content, not by its file's mtime.
echo "compiler_check = content" >"$CACHE/ccache/ccache.conf"
M="$RUN/root"

git clone -q --no-local "$SRC" "$RUN/flowrun"
COMMIT="$(git -C "$RUN/flowrun" rev-parse --short HEAD)"
report "cloned $COMMIT"

CUDA=""
[[ -d /usr/local/cuda/bin ]] && CUDA="$(readlink -f /usr/local/cuda)"

# Everything below runs in mount and PID namespaces of its own: the mounts vanish with it, and so does any
# daemon a package's maintainer script might start.
export M RUN CUDA MIRROR CACHE COMMAND
unshare --mount --pid --fork --propagation private bash -euo pipefail -c '
  mount -t overlay overlay -o "lowerdir=$CACHE/bookworm,upperdir=$RUN/upper,workdir=$RUN/work" "$M"
  mount -t proc proc "$M/proc"
  mount --rbind /dev "$M/dev"
  # With its submounts: slurmd (the slurm tests of --both) needs /sys/fs/cgroup.
  mount --rbind /sys "$M/sys"
  mount -t tmpfs tmpfs "$M/tmp"
  mount --bind "$CACHE/apt-archives" "$M/var/cache/apt/archives"
  mkdir -p "$M/root/.cache/ccache" "$M/root/flowrun"
  mount --bind "$CACHE/ccache" "$M/root/.cache/ccache"
  mount --bind "$RUN/flowrun" "$M/root/flowrun"
  if [[ -n "$CUDA" ]]; then
    mkdir -p "$M$CUDA"
    mount --bind "$CUDA" "$M$CUDA" && mount -o remount,bind,ro "$M$CUDA"
    [[ "$CUDA" == /usr/local/cuda ]] || ln -sfn "$CUDA" "$M/usr/local/cuda"
  fi
  # The name service a Debian installation has (minbase writes no /etc/hosts; Slurm and munge need
  # localhost and the host name to resolve).
  cp /etc/resolv.conf "$M/etc/resolv.conf"
  printf "127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n" "$(hostname)" >"$M/etc/hosts"
  touch "$M/etc/flowrun-fresh-root"
  # The sources of a Debian 12 installation; minbase writes only the release itself.
  printf "deb %s bookworm main\ndeb %s bookworm-updates main\ndeb http://deb.debian.org/debian-security bookworm-security main\n" \
    "$MIRROR" "$MIRROR" >"$M/etc/apt/sources.list"
  # apt keeps what it downloads (the shared archive above); a minbase root has no rule against it.
  echo "Binary::apt::APT::Keep-Downloaded-Packages \"true\";" >"$M/etc/apt/apt.conf.d/01keep-debs"
  exec chroot "$M" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c "cd /root/flowrun && $COMMAND"
' 2>&1 | while IFS= read -r line; do printf '%6d %s\n' $((SECONDS - step_start)) "$line"; done | tee "$RUN/log" &&
  rc=0 || rc=${PIPESTATUS[0]}
cp "$RUN/log" "$CACHE/last.log"

# The phases of the first command, from the log's elapsed seconds.
at() { awk -v pat="$1" 'index($0, pat) { print $1; exit }' "$RUN/log"; }
t_cmake="$(at 'The CXX compiler identification')"
t_build="$(at 'Build files have been written')"
t_train="$(at 'training configs/quickstart.yaml')"
t_done="$(at 'done: ')"
t_end="$(tail -1 "$RUN/log" | awk '{print $1}')"
[[ -n "$t_cmake" ]] && printf 'fresh_check: %-52s %5ds\n' "  scripts/setup.sh: missing packages installed" "$t_cmake"
[[ -n "$t_cmake" && -n "$t_build" ]] && printf 'fresh_check: %-52s %5ds\n' "  scripts/setup.sh: cmake configure" $((t_build - t_cmake))
[[ -n "$t_build" && -n "$t_train" ]] && printf 'fresh_check: %-52s %5ds\n' "  scripts/setup.sh: build" $((t_train - t_build))
[[ -n "$t_train" ]] && printf 'fresh_check: %-52s %5ds\n' "  flowrun train configs/quickstart.yaml" \
  $((${t_done:-$t_end} - t_train))
[[ "$COMMAND" == *test.sh && -n "$t_done" ]] &&
  printf 'fresh_check: %-52s %5ds\n' "  scripts/test.sh" $((t_end - t_done))
report "$COMMAND (exit $rc)"

if [[ $rc -ne 0 ]]; then
  echo "fresh_check.sh: FAILED: '$COMMAND' exited $rc on a plain Debian 12 (log: $CACHE/last.log)" >&2
  exit 1
fi
grep -q 'done: .*val_accuracy' "$RUN/log" || { echo "fresh_check.sh: FAILED: the quickstart printed no result" >&2; exit 1; }
echo "fresh_check: passed in $((SECONDS - START))s"
