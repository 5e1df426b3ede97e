#!/usr/bin/env sh
# Fetch the wheels a GPU host without network needs (Python 3.12, x86-64) into .whl/ (git-ignored).
set -e
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  lhotse==1.33.0 intervaltree audioread cytoolz soundfile cffi pycparser orjson isal lilcom
du -sh .whl
