#!/usr/bin/env bash
# Prints the go command that builds voxmux, installing one first when none will do: a `go` on PATH
# of Go 1.21 or later fetches the toolchain go.mod names by itself (GOTOOLCHAIN), so it is used as it
# is; otherwise (no go, or Debian 12's golang-go 1.19) the toolchain go.mod names is installed into
# DIR (default third_party/go) from the Go module proxy, as the module golang.org/toolchain that the
# go command itself downloads, and checked against the checksum database's hash for it.
# Needs curl, unzip and sha256sum. $VOXMUX_GOPROXY replaces the proxy's address.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/third_party/go}
proxy=${VOXMUX_GOPROXY:-https://proxy.golang.org}
want=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$root/go.mod")
[ -n "$want" ] || { echo "install-go: no go line in $root/go.mod" >&2; exit 1; }

# minor prints the minor version of a "go version" line's goX.Y[.Z], or 0.
minor() { sed -n 's/.* go1\.\([0-9]*\).*/\1/p' <<<"$1" | grep . || echo 0; }

if command -v go >/dev/null && [ "$(minor "$(go version 2>/dev/null)")" -ge 21 ]; then
  echo go
  exit 0
fi
# restore_go_mods DIR: a module zip may not hold another module, so the toolchain's zip holds each
# go.mod of Go's tree as _go.mod; the go command copies them back when it installs a toolchain, and
# so does this. Without them voxmux's go.mod would claim third_party/go/src, and `go vet ./...`
# would take Go's own source for voxmux's. src/go.mod, copied last, says the copying is done.
restore_go_mods() {
  [ ! -f "$1/src/go.mod" ] || return 0
  find "$1" -name _go.mod ! -path "$1/src/_go.mod" -exec sh -c 'for f; do cp "$f" "${f%_go.mod}go.mod"; done' sh {} +
  cp "$1/src/_go.mod" "$1/src/go.mod"
}

if [ -x "$dir/bin/go" ] && "$dir/bin/go" version 2>/dev/null | grep -q " go$want "; then
  restore_go_mods "$dir"
  echo "$dir/bin/go"
  exit 0
fi

case $(uname -m) in
  x86_64) arch=amd64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) echo "install-go: no Go toolchain for $(uname -m); install Go $want from https://go.dev/dl/" >&2; exit 1 ;;
esac
mod=golang.org/toolchain
ver=v0.0.1-go$want.linux-$arch
echo "install-go: installing Go $want ($mod@$ver from the Go module proxy) into $dir" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curl -fsSL --retry 3 -o "$tmp/go.zip" "$proxy/$mod/@v/$ver.zip"
sum=$(curl -fsSL --retry 3 "$proxy/sumdb/sum.golang.org/lookup/$mod@$ver" | awk -v m="$mod" -v v="$ver" '$1 == m && $2 == v { print $3 }')
[ -n "$sum" ] || { echo "install-go: the checksum database has no hash for $mod@$ver" >&2; exit 1; }
unzip -q "$tmp/go.zip" -d "$tmp/x"
# The module's hash (dirhash h1): SHA-256 of the sorted "sha256  name" lines of its files.
got=$(cd "$tmp/x" && find . -type f | sed 's|^\./||' | LC_ALL=C sort | tr '\n' '\0' | xargs -0 sha256sum | sha256sum | cut -c1-64)
got="h1:$(printf "$(sed 's/../\\x&/g' <<<"$got")" | base64)"
if [ "$got" != "$sum" ]; then
  echo "install-go: $mod@$ver has hash $got; the checksum database says $sum" >&2
  exit 1
fi
src="$tmp/x/$mod@$ver"
# Module zips keep no file modes: the go command makes these executable itself.
chmod +x "$src"/bin/* "$src"/pkg/tool/*/*
restore_go_mods "$src"
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
mv "$src" "$dir"
"$dir/bin/go" version >&2
echo "$dir/bin/go"
