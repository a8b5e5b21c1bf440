#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, run on a machine that has one (and torch, but no
# Rust toolchain): the cuda-ipc crate's test binaries, the Python tests that touch CUDA,
# and the CUDA sharing benchmark. Build here first, then run this there:
#
#   scripts/device-check.sh build            # -> .devcheck/{wheel,bin}, git-ignored locally
#   scripts/device-check.sh run [.devcheck]  # on the GPU machine, from the repository root
#
# Logs go to $OUT (or /tmp/device-check). Each step has its own time limit, so a hang in
# one still leaves the others' results.
set -u
mode=${1:-run}
dir=${2:-.devcheck}

if [ "$mode" = build ]; then
    set -e
    rm -rf "$dir" && mkdir -p "$dir/bin"
    maturin build --release -m bindings/python/Cargo.toml -o "$dir/wheel"
    cargo test --release -p tensorwire-cuda-ipc --no-run --message-format=json \
        | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        shutil.copy(m["executable"], sys.argv[1] + "/bin/cuda_ipc_" + m["target"]["name"])
' "$dir"
    ls -la "$dir"/*
    exit 0
fi

out=${OUT:-/tmp/device-check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# Peers for the benchmark (e.g. shared-tensor), where `$dir/peers` holds their wheels.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$dir"/wheel/*.whl \
    $(ls "$dir"/peers/*.whl 2>/dev/null) || exit 1
export PYTHONPATH=/tmp/site
python3 -c 'import torch, tensorwire.ipc as i; print("torch", torch.__version__, torch.cuda.get_device_name(0), "| tensorwire sees CUDA:", i.cuda_available())'

status=0
for bin in "$dir"/bin/*; do
    echo "== $(basename "$bin")"
    timeout 120 "$bin" --test-threads 4 --nocapture >"$out/$(basename "$bin").log" 2>&1 || status=1
    grep -E "^test .*(FAILED|ok)$|test result|panicked|skipped" "$out/$(basename "$bin").log" | grep -v " ok$" | sort | uniq -c | tail -n 20
done

echo "== pytest (CUDA)"
(cd bindings/python && timeout 240 python3 -m pytest -q -p no:cacheprovider -rs \
    tests/test_gpu.py tests/test_ipc.py tests/test_torch.py 2>&1) | tee "$out/pytest-gpu.log" | tail -n 60
[ "${PIPESTATUS[0]}" = 0 ] || status=1

if [ "${BENCH:-1}" = 1 ]; then
    echo "== bench_ipc_share.py --device cuda"
    timeout 120 python3 benches/python/bench_ipc_share.py --device cuda --reps "${REPS:-21}" 2>&1 \
        | tee "$out/bench-ipc-share-cuda.log" | tail -n 30
fi
exit $status
