#!/usr/bin/env bash
# Builds a Consul agent (v1.20.6) into a git-ignored folder, for the tests that register voxmux
# against a real `consul agent -dev`. Debian ships no consul package and only the Go module proxy
# is reachable, so it is built from the module: download github.com/hashicorp/consul@v1.20.6, copy
# it out of the read-only module cache, delete its `replace` directives (they point at nested
# modules that are not in the module zip; the versions go.mod pins are on the proxy) and build.
# That takes about 7 minutes on 2 cores and makes a ~125 MB binary.
#
#   usage: scripts/install-consul.sh [DEST]     (DEST defaults to third_party/consul)
#
# A no-op when `consul` is already on PATH or DEST/consul exists.
set -euo pipefail

VERSION=v1.20.6
MODULE=github.com/hashicorp/consul

case "${1:-}" in -h|--help) sed -n '2,11p' "$0"; exit 0 ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/third_party/consul}
GO=${GO:-go}

if command -v consul >/dev/null; then
  echo "install-consul: using $(command -v consul)"
  exit 0
fi
if [ -x "$dest/consul" ]; then
  exit 0
fi

mkdir -p "$dest"
dest=$(cd "$dest" && pwd) # the build runs in another folder
# Outside the repository, so `go mod download` does not see voxmux's go.mod.
work=$(mktemp -d "${TMPDIR:-/tmp}/consul-build.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

echo "install-consul: downloading $MODULE@$VERSION from the Go module proxy"
dir=$(cd "$work" && "$GO" mod download -json "$MODULE@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -n "$dir" ] && [ -d "$dir" ] || { echo "install-consul: module download gave no directory" >&2; exit 1; }

src=$work/src
cp -r "$dir" "$src"
chmod -R u+w "$src"
cd "$src"
# Drop the replace directives so the pinned versions of the nested modules come from the proxy.
sed -i -e '/^replace (/,/^)/d' -e '/^replace /d' go.mod
if "$GO" mod edit -json | grep -q '"Replace": \['; then
  echo "install-consul: could not remove the replace directives from go.mod" >&2; exit 1
fi

echo "install-consul: building consul $VERSION (about 7 minutes on 2 cores)"
start=$(date +%s)
# -mod=mod lets go add the go.sum lines of the formerly replaced modules.
GOFLAGS=-mod=mod "$GO" build -trimpath -buildvcs=false -ldflags "-s -w" -o "$work/consul" . &
pid=$!
while kill -0 "$pid" 2>/dev/null; do
  sleep 30
  kill -0 "$pid" 2>/dev/null && echo "install-consul: still building ($(( $(date +%s) - start ))s)"
done
wait "$pid"
mv "$work/consul" "$dest/consul.tmp" && mv "$dest/consul.tmp" "$dest/consul"
echo "install-consul: built $dest/consul in $(( $(date +%s) - start ))s: $("$dest/consul" version | head -n1)"
