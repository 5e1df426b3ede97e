#!/usr/bin/env sh
# Fetch what a GPU host without network needs into .whl/ (wheels, Python 3.12, x86-64; transformers for the
# Hugging Face adapters), .whl-nemo/ (NeMo
# 3.0.0's, for the decoding-nemo stage only) and .espeak/ (Debian packages of espeak-ng); all git-ignored.
set -e
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  lhotse==1.33.0 intervaltree audioread cytoolz soundfile cffi pycparser orjson isal lilcom \
  transformers==5.24.0 huggingface-hub==2.4.0 tokenizers==0.23.3 safetensors==0.8.0 regex typer click \
  shellingham rich markdown-it-py mdurl pygments hf-xet httpx2 httpcore2 truststore h11 anyio sniffio certifi idna faker
# NeMo's wheels, apart: gpu_run.sh puts them on the path of the decoding-nemo stage only
if [ -f ../shared/tools/fetch_nemo_wheels.sh ]; then bash ../shared/tools/fetch_nemo_wheels.sh .whl-nemo
else echo "note: no ../shared/tools/fetch_nemo_wheels.sh: NeMo's wheels not fetched (stage decoding-nemo needs them)"; fi
# espeak-ng and the libraries it loads, as Debian packages that gpu_run.sh unpacks into /tmp/espeak
mkdir -p .espeak && cd .espeak && apt-get download espeak-ng espeak-ng-data libespeak-ng1 libpcaudio0 libsonic0 \
  libasound2 libasound2-data libasyncns0 libbsd0 libcap2 libdbus-1-3 libflac12 libgcrypt20 libgpg-error0 \
  liblz4-1 liblzma5 libmd0 libmp3lame0 libmpg123-0 libogg0 libopus0 libpulse0 libsndfile1 libsystemd0 \
  libvorbis0a libvorbisenc2 libx11-6 libx11-data libx11-xcb1 libxau6 libxcb1 libxdmcp6 libzstd1 && cd ..
du -sh .whl .espeak
