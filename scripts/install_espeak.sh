#!/usr/bin/env bash
# Install espeak-ng, which the text-to-speech corpus (workbench.data.tts) needs.
# Installs it with apt-get when running as root on a machine with apt; otherwise says how, and exits 0
# (the TTS corpus and its tests then report that espeak-ng is missing). Usage: scripts/install_espeak.sh
set -euo pipefail

if command -v espeak-ng >/dev/null 2>&1; then
    echo "espeak-ng is already installed: $(command -v espeak-ng)"
    exit 0
fi

if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing espeak-ng with apt-get"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends espeak-ng; then
        apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends espeak-ng
    fi
    command -v espeak-ng >/dev/null 2>&1 && { echo "espeak-ng installed: $(command -v espeak-ng)"; exit 0; }
    echo "apt-get ran but espeak-ng is still missing" >&2
    exit 1
fi

cat <<'MSG'
espeak-ng is not installed and this script cannot install it here (it needs root and apt-get).
Install it yourself, then rerun:
  Debian/Ubuntu:  sudo apt-get install -y espeak-ng
  Fedora:         sudo dnf install -y espeak-ng
  macOS:          brew install espeak-ng
  conda:          conda install -c conda-forge espeak-ng
Without it, the text-to-speech corpus is unavailable and its tests are skipped.
MSG
exit 0
