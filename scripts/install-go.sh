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
if [ -x "$dir/bin/go" ] && "$dir/bin/go" version 2>/dev/null | grep -q " go$want "; then
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
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
mv "$src" "$dir"
"$dir/bin/go" version >&2
echo "$dir/bin/go"
