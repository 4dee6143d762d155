#!/usr/bin/env bash
# Installs the Debian packages that are missing: those the build and `voxmux serve` need
# (scripts/debian-packages.txt) and, with the argument "test", also those only the tests need
# (scripts/debian-packages-test.txt). When every package is there it runs no apt at all. When
# another apt or dpkg holds its lock (unattended upgrades on a fresh machine, say), it waits up to
# $VOXMUX_APT_LOCK_TIMEOUT seconds (default 600) for it instead of failing.
set -euo pipefail
dir=$(dirname "$0")
lists=("$dir/debian-packages.txt")
case "${1:-}" in
  "") ;;
  test) lists+=("$dir/debian-packages-test.txt") ;;
  *) echo "usage: $0 [test]" >&2; exit 2 ;;
esac
missing=()
while read -r pkg cmd _; do
  [ -n "$pkg" ] || continue
  if [ -n "${cmd:-}" ] && command -v "$cmd" >/dev/null; then continue; fi
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done < <(sed 's/#.*//' "${lists[@]}")
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
export DEBIAN_FRONTEND=noninteractive
timeout=${VOXMUX_APT_LOCK_TIMEOUT:-600}
deadline=$((SECONDS + timeout))
errs=$(mktemp)
trap 'rm -f "$errs"' EXIT

# apt_get runs apt-get, waiting while another process holds the dpkg or package-list lock: apt
# waits for the dpkg lock itself (DPkg::Lock::Timeout); the loop also covers the locks it fails on
# at once, and says what it waits for.
apt_get() {
  while :; do
    local left=$((deadline - SECONDS))
    ((left > 0)) || left=0
    local rc=0
    $sudo apt-get -o DPkg::Lock::Timeout="$left" "$@" 2>"$errs" || rc=$?
    cat "$errs" >&2
    ((rc != 0)) || return 0
    if ! grep -qiE 'could not get lock|unable to acquire|unable to lock' "$errs"; then
      return $rc
    fi
    if ((SECONDS >= deadline)); then
      echo "install-deps: another apt or dpkg still holds its lock after ${timeout}s (VOXMUX_APT_LOCK_TIMEOUT); try again when it is done" >&2
      return $rc
    fi
    echo "install-deps: another apt or dpkg holds its lock; waiting (up to ${timeout}s in all)" >&2
    sleep 5
  done
}
apt_get update -qq
apt_get install -y -qq --no-install-recommends "${missing[@]}"
