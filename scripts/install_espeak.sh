#!/bin/sh
# Install espeak-ng, which the text-to-speech corpus (workbench.data.tts) needs. POSIX sh (dash runs it).
# As root on a machine with apt-get it installs the package; elsewhere it says how and exits 0, so that
# `make test` goes on (the text-to-speech tests then skip, saying espeak-ng is missing). It exits 1 only
# when apt-get ran and failed (a network or mirror problem): `make` stops and says so, and the next
# `make` tries again. Usage: sh scripts/install_espeak.sh
set -eu

how_to_install() {
    cat <<'MSG'
Install espeak-ng yourself, then rerun:
  Debian/Ubuntu:  sudo apt-get install -y espeak-ng
  Fedora:         sudo dnf install -y espeak-ng
  macOS:          brew install espeak-ng
  conda:          conda install -c conda-forge espeak-ng
Without it, the text-to-speech corpus is unavailable and its tests are skipped.
MSG
}

if command -v espeak-ng >/dev/null 2>&1; then
    echo "espeak-ng is already installed: $(command -v espeak-ng)"
    exit 0
fi

if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing espeak-ng with apt-get"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends espeak-ng; then
        apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends espeak-ng || true
    fi
    if command -v espeak-ng >/dev/null 2>&1; then
        echo "espeak-ng installed: $(command -v espeak-ng)"
        exit 0
    fi
    echo "apt-get could not install espeak-ng (see its messages above)." >&2
    how_to_install >&2
    echo "To go on without it: make SKIP_ESPEAK=1 ..." >&2
    exit 1
fi

echo "espeak-ng is not installed and this script cannot install it here (it needs root and apt-get)."
how_to_install
exit 0
