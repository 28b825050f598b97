#!/usr/bin/env bash
# Prepare a node's container images (images). Idempotent; a no-op run takes well
# under a second.
#
#  * installs, via apt only, debootstrap (builds images from Debian's packages), skopeo
#    and umoci (unpack OCI archives and `docker save` tarballs: `corral images import`)
#    and busybox-static (the tests' small parent image), skipping packages already
#    installed; `apt-get update` runs only when something must be installed. Set
#    CORRAL_IMAGES_SKIP_APT=1 to skip this part;
#  * builds the default `python` image (about a minute; see docs/images.md) and the `data`
#    image (python with numpy, pandas, matplotlib, Pillow, scipy, scikit-learn, seaborn...:
#    E2B's code-interpreter templates; two to three minutes) unless images of those names
#    are already in the images dir.
#
# The images dir is CORRAL_IMAGES_DIR if set (point several checkouts or CI runs at one
# shared cache), else $CORRAL_DATA_DIR/images, else var/images.
#
# Usage: scripts/setup-images.sh
#        CORRAL_IMAGES_DIR=/srv/corral-images scripts/setup-images.sh
set -euo pipefail

cd "$(dirname "$0")/.."

PACKAGES=(debootstrap skopeo umoci busybox-static)
IMAGES_DIR="${CORRAL_IMAGES_DIR:-${CORRAL_DATA_DIR:-var}/images}"
PYTHON="${PYTHON:-.venv/bin/python}"

if [[ "${CORRAL_IMAGES_SKIP_APT:-0}" != "1" ]]; then
    scripts/apt-ensure setup-images "${PACKAGES[@]}"
fi

# An image named python: its name file points at a digest whose image.json exists.
has_image() {
    local name_file="$IMAGES_DIR/names/$1" hex
    [[ -f "$name_file" ]] || return 1
    hex=$(sed -n 's/.*"digest": *"sha256:\([0-9a-f]\{64\}\)".*/\1/p' "$name_file")
    [[ -n "$hex" && -f "$IMAGES_DIR/$hex/image.json" ]]
}

for name in python data; do
    if has_image "$name"; then
        echo "setup-images: image $name already in $IMAGES_DIR"
        continue
    fi
    if [[ $(id -u) -ne 0 ]]; then
        echo "setup-images: must run as root to build the $name image (debootstrap)" >&2
        exit 1
    fi
    echo "setup-images: building the $name image into $IMAGES_DIR"
    CORRAL_IMAGES_DIR="$IMAGES_DIR" "$PYTHON" -m app images build "$name"
done

echo "setup-images: done"
