#!/usr/bin/env bash
# Download the wheels `measure.py --suite peft` needs on the GPU machine, whose image has torch
# and transformers but not peft, accelerate or bitsandbytes (and no network): into wheels/
# beside this script (ignored by git; the device call carries it, 64 MiB at most in all).
# measure.py unpacks them into a temporary folder appended to sys.path when the image lacks one.
# psutil: accelerate and peft import it (an abi3 wheel, any CPython >= 3.6). torchtune: only
# its activation-offloading module is read from the wheel (not unpacked: it needs torchao).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="$here/wheels"
mkdir -p "$dest"
pip download --no-deps --only-binary=:all: --dest "$dest" \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 \
  --python-version 3.12 --implementation cp --abi abi3 --abi cp312 --abi none \
  peft==0.21.2 accelerate==1.15.0 bitsandbytes==0.50.2 psutil==7.2.2 torchtune==0.6.1
ls -l "$dest"
total=$(du -cb "$dest"/*.whl | tail -1 | cut -f1)
echo "wheels: $total bytes (the device call carries at most 64 MiB = 67108864)"
if [ "$total" -gt 67108864 ]; then
  echo "too large to carry" >&2
  exit 1
fi
