#!/usr/bin/env bash
# On a lent NVIDIA machine (the device tool), from the repo root, after scripts/cuda/prepare.py:
# install .whl/, then the portable pass and the benchmarks (benchmarks/: single stream,
# concurrency, a repeated prompt, a prompt beside a stream, the limit, the gap curve, drafts
# replayed) on MLX's CUDA backend, the nearest we get to a Mac's GPU. Logs go to $OUT. Each step
# has its own time limit (NAME_LIMIT=0 skips it) so one that hangs leaves the others their time.
# The demo model's weights are too big to travel: send the tree without them (move them aside)
# and a random-weight stand-in of it takes their place there.
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

DEMO=mlxserve/models/mlxserve-demo-coder
if [ ! -f "$DEMO/model.safetensors" ]; then
    python3 scripts/make_stand_in_model.py --like "$DEMO" --out /tmp/demo-stand-in || exit 1
    cp /tmp/demo-stand-in/model.safetensors* "$DEMO/"
fi

# shellcheck disable=SC2086  # PORTABLE_TESTS: test paths, split on spaces
step portable "${PORTABLE_LIMIT:-240}" python3 -m pytest ${PORTABLE_TESTS:-tests/engine tests/api} \
    -m "not slow and not http_only" -n 8 -q -p no:cacheprovider --timeout 120
python3 scripts/make_stand_in_model.py --like .whl/smollm2 --out /tmp/smollm2-stand-in
step bench "${BENCH_LIMIT:-110}" python3 benchmarks/single_stream.py --model /tmp/smollm2-stand-in
# mlxserve beside mlx_lm.server: concurrency 1, 4, 16 (each row run once unmeasured first, since
# the CUDA backend compiles kernels per batch shape), a repeated 2,000-token prompt, and a running
# stream's gaps while 8,000 tokens prefill
engine_rows() {
    python3 benchmarks/concurrency.py --model /tmp/smollm2-stand-in --warm-rows
    python3 benchmarks/prefix_cache.py repeat --model /tmp/smollm2-stand-in
    python3 benchmarks/prefill_beside_streams.py --model /tmp/smollm2-stand-in \
        --against mlx_lm.server --prompt-tokens 8000
}
export -f engine_rows
step bench_engine "${ENGINE_LIMIT:-110}" bash -c engine_rows
# issue 37's rows: HTTP and the engine in-process against mlx-lm's BatchGenerator at batch 16
# (the first repeat compiles each batch shape's kernels), where the engine thread's time goes, and
# the stream-gap bound against an 8,000-token prefill beside one stream
# over HTTP: clients as threads of one process or a process each, the server's interpreter lock
# switch interval Python's default or mlxserve's
limit_variants() {
    for clients in threads processes; do
        for interval in 5 "${SWITCH_MS:-0.5}"; do
            python3 benchmarks/concurrency.py --against batch-generator \
                --model /tmp/smollm2-stand-in --repeats 3 --clients $clients \
                --switch-interval-ms $interval 2>&1 | grep -E "repeat|HTTP"
        done
    done
}
export -f limit_variants
step probe "${PROBE_LIMIT:-30}" python3 scripts/cuda/probe_quantized_kv.py
step limit "${LIMIT_LIMIT:-150}" bash -c limit_variants
step limit_in_process "${INPROC_LIMIT:-90}" python3 benchmarks/concurrency.py \
    --against batch-generator --model /tmp/smollm2-stand-in --repeats 4 --in-process --profile
# shellcheck disable=SC2086  # CURVE_GAPS: bounds, split on spaces
TAIL=8 step curve "${CURVE_LIMIT:-150}" python3 benchmarks/prefill_beside_streams.py \
    --model /tmp/smollm2-stand-in --prompt-tokens 8000 --gaps ${CURVE_GAPS:-2 3 5 off}
# issue 60: the real SmolLM2's answers (recorded by prepare.py) replayed at this card's step
# times, timed on the stand-in (whose own answers loop: its ratios are a loop's, not a workload's)
if [ -f .whl/speculation_answers.json ]; then
    step speculation "${SPEC_LIMIT:-150}" python3 benchmarks/speculation_replay.py \
        --model /tmp/smollm2-stand-in --runs 3 --max-tokens 400 \
        --answers .whl/speculation_answers.json
fi
tar czf "$OUT/server_logs.tgz" /tmp/mlxserve-*.log 2>/dev/null
