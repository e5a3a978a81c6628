#!/usr/bin/env bash
# Installs chfs-rs the way HPC libraries install:
#   PREFIX/bin/chfsd and the other chfs tools, PREFIX/lib/libchfs.so*,
#   PREFIX/include/chfs.h, PREFIX/lib/pkgconfig/chfs.pc
# so that `pkg-config --cflags --libs chfs` is all a C build needs.
#
# usage: scripts/install-capi.sh [--from DIR] PREFIX
#   without --from: builds the workspace in release mode and installs that;
#   --from DIR: installs what is already built in DIR (e.g. target/debug).
set -euo pipefail

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; }

from=""
prefix=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --from) from="${2:?--from needs a directory}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "install-capi.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
        *) [[ -z "$prefix" ]] || { usage >&2; exit 2; }; prefix="$1"; shift ;;
    esac
done
[[ -n "$prefix" ]] || { usage >&2; exit 2; }

root="$(cd "$(dirname "$0")/.." && pwd)"
capi="$root/crates/chfs-capi"
version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' "$root/Cargo.toml")"
[[ -n "$version" ]] || { echo "install-capi.sh: no version in Cargo.toml" >&2; exit 1; }
major="${version%%.*}"
# The soname is libchfs.so.0 whatever our own version is (binary drop-in for CHFS).
soname="libchfs.so.0"

if [[ -z "$from" ]]; then
    (cd "$root" && cargo build --release --workspace)
    from="${CARGO_TARGET_DIR:-$root/target}/release"
fi
[[ -f "$from/libchfs.so" ]] || { echo "install-capi.sh: $from/libchfs.so not found (cargo build -p chfs-capi)" >&2; exit 1; }
[[ -x "$from/chfsd" ]] || { echo "install-capi.sh: $from/chfsd not found (cargo build -p chfs-server)" >&2; exit 1; }

mkdir -p "$prefix"
prefix="$(cd "$prefix" && pwd)"
install -d "$prefix/bin" "$prefix/lib/pkgconfig" "$prefix/include"

# Tools: every ch* executable that was built (chfsd, chfsctl, chstagein, ...).
find -L "$from" -maxdepth 1 -type f -perm -u+x -name 'ch*' ! -name '*.so*' ! -name '*.d' -print0 |
    while IFS= read -r -d '' exe; do
        install -m 755 "$exe" "$prefix/bin/"
    done

real="libchfs.so.$version"
[[ "$major" == "0" ]] || real="libchfs.so.0.$version"
install -m 755 "$from/libchfs.so" "$prefix/lib/$real"
ln -sfn "$real" "$prefix/lib/$soname"
ln -sfn "$soname" "$prefix/lib/libchfs.so"
install -m 644 "$capi/include/chfs.h" "$prefix/include/chfs.h"
sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" "$capi/chfs.pc.in" \
    > "$prefix/lib/pkgconfig/chfs.pc"
chmod 644 "$prefix/lib/pkgconfig/chfs.pc"

echo "installed chfs-rs $version under $prefix"
echo "  export PKG_CONFIG_PATH=$prefix/lib/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}"
