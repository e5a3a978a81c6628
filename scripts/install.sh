#!/usr/bin/env bash
# Installs chfs-rs the way HPC software installs:
#   PREFIX/bin/        chfsd chfuse chfsctl chlist chmkdir chrmdir chfind
#                      chstagein chfs (and, with --benches, chfs-bench,
#                      whose subcommands are every benchmark: demo, fuse,
#                      store, store-servers, store-rss, cache)
#   PREFIX/share/man/  a manual page for each of them (man1, chfsd in man8)
#   PREFIX/share/doc/chfs-rs/  the doc/ pages and io500-chfind.sh (IO500's
#                      find phase, doc/io500.md)
#   PREFIX/lib/libchfs.so*, PREFIX/include/chfs.h, PREFIX/lib/pkgconfig/chfs.pc
#   PREFIX/lib/libchfs_preload.so (the LD_PRELOAD interposer: unmodified
#                      programs reach the pool under CHFS_MOUNTPOINT)
# so that `pkg-config --cflags --libs chfs` is all a C build needs and
# `man chfsctl` works once PREFIX/bin is on the PATH.
#
# usage: scripts/install.sh [--from DIR] [--benches] PREFIX
#   without --from: builds the workspace in release mode and installs that;
#   --from DIR: installs what is already built in DIR (e.g. target/debug);
#     what DIR lacks is skipped and named on standard error;
#   --benches: the benchmark programs too.
# scripts/install-capi.sh is the same script under its former name.
set -euo pipefail

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }

# The programs installed, each with its manual section.
programs=(chfsd:8 chfuse:1 chfsctl:1 chlist:1 chmkdir:1 chrmdir:1 chfind:1 chstagein:1 chfs:1)
benches=(chfs-bench:1)

from=""
prefix=""
with_benches=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --from) from="${2:?--from needs a directory}"; shift 2 ;;
        --benches) with_benches=1; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "install.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
        *) [[ -z "$prefix" ]] || { usage >&2; exit 2; }; prefix="$1"; shift ;;
    esac
done
[[ -n "$prefix" ]] || { usage >&2; exit 2; }
[[ $with_benches == 0 ]] || programs+=("${benches[@]}")

root="$(cd "$(dirname "$0")/.." && pwd)"
capi="$root/crates/chfs-capi"
version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' "$root/Cargo.toml")"
[[ -n "$version" ]] || { echo "install.sh: no version in Cargo.toml" >&2; exit 1; }
major="${version%%.*}"
# The soname is libchfs.so.0 whatever our own version is (binary drop-in for CHFS).
soname="libchfs.so.0"

partial=0
if [[ -z "$from" ]]; then
    (cd "$root" && cargo build --release --workspace)
    from="${CARGO_TARGET_DIR:-$root/target}/release"
else
    [[ -d "$from" ]] || { echo "install.sh: $from: no such directory" >&2; exit 1; }
    partial=1
fi

# What is there to install: with --from, whatever DIR has of the list.
install_progs=()
missing=()
for p in "${programs[@]}"; do
    if [[ -f "$from/${p%%:*}" && -x "$from/${p%%:*}" ]]; then
        install_progs+=("$p")
    else
        missing+=("${p%%:*}")
    fi
done
have_lib=0
if [[ -f "$from/libchfs.so" ]]; then have_lib=1; else missing+=(libchfs.so); fi
have_preload=0
if [[ -f "$from/libchfs_preload.so" ]]; then have_preload=1; else missing+=(libchfs_preload.so); fi
if [[ ${#missing[@]} -gt 0 ]]; then
    if [[ $partial == 0 ]]; then
        echo "install.sh: not built in $from: ${missing[*]}" >&2
        exit 1
    fi
    echo "install.sh: not in $from, not installed: ${missing[*]}" >&2
fi
[[ ${#install_progs[@]} -gt 0 || $have_lib == 1 || $have_preload == 1 ]] || { echo "install.sh: nothing to install in $from" >&2; exit 1; }

mkdir -p "$prefix"
prefix="$(cd "$prefix" && pwd)"
install -d "$prefix/bin" "$prefix/share/man/man1" "$prefix/share/man/man8" "$prefix/share/doc/chfs-rs"

for p in "${install_progs[@]}"; do
    install -m 755 "$from/${p%%:*}" "$prefix/bin/"
done

# Documents, then a manual page per program from its --help, naming the
# others and its document.
install -m 644 "$root"/doc/*.md "$prefix/share/doc/chfs-rs/"
# IO500's find phase script (doc/io500.md).
install -m 755 "$root/scripts/io500-chfind.sh" "$prefix/share/doc/chfs-rs/io500-chfind.sh"
see_also=""
for p in "${install_progs[@]}"; do
    see_also="${see_also:+$see_also, }${p%%:*}(${p##*:})"
done
for p in "${install_progs[@]}"; do
    name="${p%%:*}"
    sec="${p##*:}"
    doc=""
    [[ -f "$prefix/share/doc/chfs-rs/$name.md" ]] && doc="$prefix/share/doc/chfs-rs/$name.md"
    others="$(printf '%s' "$see_also" | sed -e "s/\(^\|, \)$name($sec)//" -e 's/^, //')"
    page="$prefix/share/man/man$sec/$name.$sec"
    if ! sh "$root/scripts/manpage.sh" "$prefix/bin/$name" "$sec" "$version" "$others" "$doc" > "$page.tmp"; then
        rm -f "$page.tmp"
        echo "install.sh: no manual page for $name" >&2
        exit 1
    fi
    mv -f "$page.tmp" "$page"
done

if [[ $have_lib == 1 ]]; then
    install -d "$prefix/lib/pkgconfig" "$prefix/include"
    real="libchfs.so.$version"
    [[ "$major" == "0" ]] || real="libchfs.so.0.$version"
    install -m 755 "$from/libchfs.so" "$prefix/lib/$real"
    ln -sfn "$real" "$prefix/lib/$soname"
    ln -sfn "$soname" "$prefix/lib/libchfs.so"
    install -m 644 "$capi/include/chfs.h" "$prefix/include/chfs.h"
    sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" "$capi/chfs.pc.in" \
        > "$prefix/lib/pkgconfig/chfs.pc"
    chmod 644 "$prefix/lib/pkgconfig/chfs.pc"
fi

# The LD_PRELOAD interposer, beside libchfs.
if [[ $have_preload == 1 ]]; then
    install -d "$prefix/lib"
    install -m 755 "$from/libchfs_preload.so" "$prefix/lib/libchfs_preload.so"
fi

echo "installed chfs-rs $version under $prefix"
echo "  export PATH=$prefix/bin:\$PATH            # man finds the pages through it"
echo "  export MANPATH=$prefix/share/man:         # if man does not (the last : keeps the system's pages)"
[[ $have_lib == 0 ]] || echo "  export PKG_CONFIG_PATH=$prefix/lib/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}"
[[ $have_preload == 0 ]] || echo "  LD_PRELOAD=$prefix/lib/libchfs_preload.so CHFS_MOUNTPOINT=/chfs PROGRAM ...   # paths under /chfs go to the pool"
