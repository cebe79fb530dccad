#!/usr/bin/env bash
# On a lent NVIDIA machine (the device tool), from the repo root, after scripts/cuda/prepare.py:
# install .whl/, then the portable pass and the decode benchmarks on MLX's CUDA backend, the
# nearest we get to a Mac's GPU. Logs go to $OUT. Each step has its own time limit so one that
# hangs leaves the others their time.
set -uo pipefail
OUT=${OUT:-/tmp/mlxserve-cuda}
SITE=/tmp/site
mkdir -p "$OUT" "$SITE"

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/deps/*.whl || exit 1
tar xJf .whl/mlx_cuda_13.tar.xz -C "$SITE" || exit 1  # after pip: --upgrade replaces mlx/
NVIDIA=$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])")
ln -sfn "$NVIDIA" "$SITE/nvidia"  # libmlx.so's rpath: $ORIGIN/../../nvidia/*/lib
export PYTHONPATH="$SITE:$PWD" MLXSERVE_PORTABLE=1 PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if ! python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device(), \
        (mx.ones((256, 256)) @ mx.ones((256, 256))).sum().item())"; then
    ldd "$SITE/mlx/lib/libmlx.so" | grep "not found"
    exit 1
fi

step() {  # step NAME SECONDS COMMAND...: run, log to $OUT/NAME.log, say how long it took
    local name=$1 limit=$2
    shift 2
    [ "$limit" = 0 ] && { echo "== $name: skipped"; return; }
    local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log" | tail -n "${TAIL:-25}"
    echo "== $name: exit ${PIPESTATUS[0]} in $((SECONDS - start)) s"
}

step portable "${PORTABLE_LIMIT:-240}" python3 -m pytest tests/engine tests/api \
    -m "not slow and not http_only" -n 8 -q -p no:cacheprovider --timeout 120
python3 scripts/make_stand_in_model.py --like .whl/smollm2 --out /tmp/smollm2-stand-in
step bench "${BENCH_LIMIT:-110}" python3 scripts/bench.py --model /tmp/smollm2-stand-in \
    --skip-engine --skip-distributed
step bench_engine "${ENGINE_LIMIT:-110}" python3 scripts/bench.py \
    --model /tmp/smollm2-stand-in --engine-only --warm-rows
tar czf "$OUT/server_logs.tgz" /tmp/mlxserve-*.log 2>/dev/null
