#!/usr/bin/env bash
# Installs the Debian packages loom and its tests need (libxml2-dev: test_plot reads the SVG
# back; jq: the MPI and CLI test scripts read metrics.jsonl), only those missing. Safe to run
# again.
set -euo pipefail
packages=(cmake gcc make pkg-config libopenblas-openmp-dev libopenmpi-dev openmpi-bin
          libjansson-dev libutf8proc-dev libglpk-dev libxml2-dev jq fortunes python3)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: all packages present"
    exit 0
fi
echo "setup: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
