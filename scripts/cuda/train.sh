#!/usr/bin/env bash
# Fine-tune the demo model on a lent NVIDIA machine (the device tool), from the repo root, after
# scripts/cuda/prepare.py and scripts/cuda/prepare_training.py packed .whl/send1..N.
# One call per .whl/sendK (carry it); each call keeps what it brought, as the machine stays warm
# between calls:
#   train.sh smoke                 call 1: install MLX, a few steps on a random same-shape model
#   train.sh stash                 the middle calls: keep the part
#   train.sh train STEPS [ARGS]    the last part: train, export, quantize; the result comes back
#                                  in 16 MiB pieces, as many as one call returns
#   train.sh fetch                 the rest of the pieces
# Reassemble here: cat result.tar.* | tar x  (a folder in mlx-lm's layout, quantized as shipped).
set -uo pipefail
OUT=${OUT:-/tmp/mlxserve-train-out}
KEEP=/root/mlxserve-train
SITE=/tmp/site
PIECES_PER_CALL=3
mkdir -p "$OUT" "$KEEP/parts" "$KEEP/result"
mode=${1:?smoke, stash, train or fetch}
shift

for part in .whl/send*/train.tar.*; do
    [ -e "$part" ] && cp -n "$part" "$KEEP/parts/"
done
ls -l "$KEEP/parts"

send_pieces() {  # the next pieces of the result into $OUT
    local sent=0
    for piece in "$KEEP"/result/result.tar.*; do
        [ -e "$piece" ] || break
        [ "$sent" -ge "$PIECES_PER_CALL" ] && break
        mv "$piece" "$OUT/" && sent=$((sent + 1))
    done
    echo "pieces left for the next call: $(ls "$KEEP/result" | wc -l)"
}
[ "$mode" = stash ] && exit 0
[ "$mode" = fetch ] && { send_pieces; exit 0; }

rm -rf "$KEEP/x" && mkdir -p "$KEEP/x"
cat "$KEEP"/parts/train.tar.* | tar x -C "$KEEP/x" 2>/dev/null  # a partial tar: its whole members
DATA=$KEEP/x/train
if ! [ -d "$SITE/mlx_lm" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$DATA"/wheels/*.whl || exit 1
    tar xJf "$DATA/mlx_cuda_13.tar.xz" -C "$SITE" || exit 1
    ln -sfn "$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])")" "$SITE/nvidia"
fi
export PYTHONPATH="$SITE:$PWD" MLXSERVE_PORTABLE=1 PYTHONUNBUFFERED=1
mkdir -p "$KEEP/python3.11" && tar xJf "$DATA/stdlib.tar.xz" -C "$KEEP/python3.11"
export DEMO_STDLIB=$KEEP/python3.11
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device(), mx.device_info())" \
    || { ldd "$SITE/mlx/lib/libmlx.so" | grep "not found"; exit 1; }

quantize() {  # quantize MODEL_DIR TARGET_DIR: as package_demo_model.py ships it
    mkdir -p "$2" && python3 -c "
import sys; from pathlib import Path
sys.path.insert(0, 'scripts')
from package_demo_model import quantize
quantize(Path(sys.argv[1]), Path(sys.argv[2]))" "$1" "$2"
}

FIXED=(--batch 16 --context 1024 --spm-from-step 0 --checkpoint-every 1000000)
if [ "$mode" = smoke ]; then
    start=$SECONDS
    python3 scripts/make_stand_in_model.py --like "$DATA/smollm2" --out /tmp/stand-in || exit 1
    rm -rf /tmp/smoke && mkdir -p /tmp/smoke && cp "$DATA/streams.npz" /tmp/smoke/
    python3 scripts/finetune_demo_model.py --base /tmp/stand-in --out /tmp/smoke "${FIXED[@]}" \
        --steps 12 --stop-after 12 --warmup 2 --eval-every 6 "$@" 2>&1 | tr '\r' '\n' \
        | tee "$OUT/smoke.log" | grep -v "^ *$" | tail -n 30
    tail -n 12 /tmp/smoke/loss_log.jsonl
    quantize /tmp/smoke/model /tmp/smoke/q && ls -l /tmp/smoke/q
    echo "smoke: $((SECONDS - start)) s"
    exit 0
fi

[ "$mode" = train ] || { echo "unknown mode $mode"; exit 2; }
steps=${1:?steps}
shift
start=$SECONDS
rm -rf "$KEEP/run" && mkdir -p "$KEEP/run" && cp "$DATA/streams.npz" "$KEEP/run/"
python3 scripts/finetune_demo_model.py --base "$DATA/base" --out "$KEEP/run" "${FIXED[@]}" \
    --steps "$steps" --stop-after "$steps" "$@" 2>&1 | tr '\r' '\n' | tee "$OUT/train.log" \
    | grep -v "^ *$" | awk 'NR % 25 == 1' | tail -n 40
tail -n 3 "$KEEP/run/loss_log.jsonl"
echo "training: $((SECONDS - start)) s"
rm -rf "$KEEP/q" && quantize "$KEEP/run/model" "$KEEP/q" || exit 1
cp "$KEEP/run/model/training.json" "$KEEP/run/model/loss_log.jsonl" "$KEEP/q/"
cp "$KEEP/run/model/training.json" "$OUT/"
tar cf - -C "$KEEP" q | split -b 16M -d - "$KEEP/result/result.tar."
ls -l "$KEEP/result"
send_pieces
echo "all: $((SECONDS - start)) s"
