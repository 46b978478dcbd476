#!/usr/bin/env bash
# Download, on a machine with PyPI access, the wheels that scripts/gpu_check.sh installs on a GPU machine
# without internet: drivetrain's dependencies that a CUDA PyTorch image usually lacks. Never torch, CUDA or
# numpy (the GPU machine keeps its own). Usage:
#   bash scripts/gpu_wheels.sh [--python-version 3.12] [--out .whl]
# then carry the folder to the GPU machine with the checkout and run `bash scripts/gpu_check.sh OUT_DIR`.
set -euo pipefail
cd "$(dirname "$0")/.."
pyver=3.12
out=.whl
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) pyver="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_wheels: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# What drivetrain imports that a CUDA PyTorch image (numpy, scipy, pyyaml, psutil, tqdm, tensorboard, pytest,
# hypothesis, matplotlib, pillow, opencv-python-headless, scikit-learn already there) does not have:
# the JPEG decoder, the nuScenes devkit (installed without its numpy<2 pin) and the devkit's own extras,
# the exact batched GPU solver behind solve(backend="gpu"), and NVIDIA DALI (about 500 MB with its codecs).
wheels=(
  "simplejpeg==1.9.0"
  "nuscenes-devkit==1.2.0"
  "pyquaternion==0.9.9"
  "descartes==1.1.0"
  "fire==0.7.1"
  "termcolor==3.3.0"
  "shapely==2.0.7"          # the devkit asks for Shapely~=2.0.3
  "pycocotools==2.0.11"
  "cachetools==6.2.1"
  "parameterized==0.9.0"
  "torch-linear-assignment==0.1.0"
  # NVIDIA DALI for data.loader=dali (the CUDA 12 build: CUDA 12 and 13 drivers run it) and what it imports
  "nvidia-dali-cuda120==2.4.0"
  "nvidia-nvimgcodec-cu12==0.9.0.20"
  "nvidia-nvjpeg-cu12==12.4.0.76"
  "nvidia-nvjpeg2k-cu12==0.11.0.51"
  "nvidia-nvtiff-cu12==0.8.0.82"
  "nvidia-libnvcomp-cu12==5.3.0.16"
  "astunparse==1.6.3"
  "gast==0.7.0"
  "libcst==1.9.0"
  "makefun==1.16.0"
  "nvtx==0.2.17"
  "optree==0.20.0"
)
mkdir -p "$out"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any; do
  platforms+=(--platform "$p")
done
python3 -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
  --python-version "$pyver" --implementation cp "${platforms[@]}" -d "$out" "${wheels[@]}" \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
echo "gpu_wheels: $(ls "$out"/*.whl | wc -l) wheels for Python $pyver in $out ($(du -sh "$out" | cut -f1)):"
ls "$out"
