#!/bin/bash
# Builds crates/chfs-capi/examples/capi_oploop.c against RELEASE_DIR's
# libchfs into OUTDIR/capi_oploop, unless it is there (for
# scripts/opcost.sh, opcost-dhat.sh and opcost-ranks.sh):
#
#   scripts/oploop-build.sh RELEASE_DIR OUTDIR
set -eu
rel=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
if [ ! -x "$out/capi_oploop" ]; then
	ln -sf "$rel/libchfs.so" "$out/libchfs.so.0"
	cc -O2 -g -o "$out/capi_oploop" "$here/../crates/chfs-capi/examples/capi_oploop.c" \
		-I"$here/../crates/chfs-capi/include" -L"$rel" -lchfs -Wl,-rpath,"$out"
fi
