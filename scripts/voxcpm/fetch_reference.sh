#!/usr/bin/env bash
# Copies OpenBMB/VoxCPM's `src/voxcpm` package (the reference implementation that
# scripts/voxcpm/parity.py and scripts/voxcpm/baseline.py import) into the git-ignored `.ref/`.
# Only the package is taken, so the folder stays small enough to travel with the work tree.
#
#   usage: scripts/voxcpm/fetch_reference.sh [GIT_DIR|CHECKOUT] [REV]
#
# GIT_DIR is a (bare) clone of https://github.com/OpenBMB/VoxCPM ($VOXCPM_GIT by default), REV a
# commit (HEAD by default). The folder it writes: .ref/src/voxcpm, plus .ref/VOXCPM_COMMIT.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
src=${1:-${VOXCPM_GIT:?give a VoxCPM clone as the first argument or in VOXCPM_GIT}}
rev=${2:-HEAD}
dest=$repo/.ref
commit=$(git -C "$src" rev-parse "$rev^{commit}")
rm -rf "$dest/src/voxcpm"
mkdir -p "$dest"
git -C "$src" archive "$commit" src/voxcpm | tar x -C "$dest"
echo "$commit" > "$dest/VOXCPM_COMMIT"
# .ref/ is scratch: keep it out of git without touching the shared .gitignore.
exclude=$(git -C "$repo" rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.ref/' "$exclude" 2>/dev/null || echo '/.ref/' >> "$exclude"
echo "reference $commit in $dest/src/voxcpm ($(du -sh "$dest" | cut -f1))"
