#!/usr/bin/env bash
# Fine-tune the demo model on a lent NVIDIA machine (the device tool), from the repo root, after
# scripts/demo_corpus.py, scripts/cuda/prepare.py and scripts/cuda/prepare_training.py packed
# .whl/send1..N (the shipped weights moved out of the tree for every call: they do not fit).
# One call per .whl/sendK (carry it); each call keeps what it brought, as the machine stays warm
# between calls:
#   train.sh stash                 the calls before the last part's: keep the part
#   train.sh smoke                 optional: a few steps on a random same-shape model
#   train.sh train STEPS MINUTES [ARGS]
#                                  the last part: train (at most MINUTES of wall time), choose the
#                                  blend on held-out package files (choose_demo_blend.py), pack it;
#                                  the first pieces of the result come back
#   train.sh eval                  the card's evaluation of the chosen blend and of the model the
#                                  run started from, then the rest of the pieces
#   train.sh fetch                 any pieces still left
# Reassemble here: cat result.tar.* | tar x  (a folder in mlx-lm's layout, quantized as shipped).
set -uo pipefail
OUT=${OUT:-/tmp/mlxserve-train-out}
KEEP=${KEEP:-/root/mlxserve-train}
SITE=${SITE:-/tmp/site}
PIECES_PER_CALL=3
mkdir -p "$OUT" "$KEEP/parts" "$KEEP/result"
mode=${1:?stash, smoke, train, eval or fetch}
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

DATA=$KEEP/x/train
if ! [ -d "$DATA/start" ]; then
    rm -rf "$KEEP/x" && mkdir -p "$KEEP/x"
    cat "$KEEP"/parts/train.tar.* | tar x -C "$KEEP/x" 2>/dev/null  # a partial tar: whole members
    mkdir -p "$DATA/start" "$DATA/corpus" "$KEEP/python3.11"
    tar xJf "$DATA/start.tar.xz" -C "$DATA/start" || exit 1
    # the shipped model's other files travel in the tree (a base brought its own)
    [ -f "$DATA/start/config.json" ] || cp -n mlxserve/models/mlxserve-demo-coder/* "$DATA/start/"
    tar xJf "$DATA/corpus.tar.xz" -C "$DATA/corpus" || exit 1
    tar xJf "$DATA/stdlib.tar.xz" -C "$KEEP/python3.11" || exit 1
fi
if ! [ -d "$SITE/mlx_lm" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$DATA"/wheels/*.whl || exit 1
    tar xJf "$DATA/mlx_cuda_13.tar.xz" -C "$SITE" || exit 1
    ln -sfn "$(python3 -c "import nvidia; print(list(nvidia.__path__)[0])")" "$SITE/nvidia"
fi
export PYTHONPATH="$SITE:$PWD" MLXSERVE_PORTABLE=${MLXSERVE_PORTABLE:-1} PYTHONUNBUFFERED=1
export DEMO_STDLIB=$KEEP/python3.11 DEMO_CORPUS=$DATA/corpus
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device(), mx.device_info())" \
    || { ldd "$SITE/mlx/lib/libmlx.so" | grep "not found"; exit 1; }

FIXED=(--spm-from-step 0 --checkpoint-every 1000000)
if [ "$mode" = smoke ]; then
    start=$SECONDS
    python3 scripts/make_stand_in_model.py --like "$DATA/start" --out /tmp/stand-in || exit 1
    rm -rf /tmp/smoke && mkdir -p /tmp/smoke
    python3 scripts/finetune_demo_model.py --base /tmp/stand-in --out /tmp/smoke "${FIXED[@]}" \
        --steps 12 --stop-after 12 --warmup 2 --eval-every 6 "$@" 2>&1 | tr '\r' '\n' \
        | tee "$OUT/smoke.log" | grep -v "^ *$" | tail -n 30
    echo "smoke: $((SECONDS - start)) s"
    exit 0
fi

if [ "$mode" = eval ]; then  # the card's figures, on the card's 200 standard-library tasks
    start=$SECONDS
    card=$KEEP/card/mlxserve-demo-coder  # eval.json names the folder: the shipped one's name
    rm -rf "$KEEP/card" && mkdir -p "$KEEP/card" && cp -r "$KEEP/blends/chosen" "$card"
    evaluate() {  # evaluate NAME MODEL [ARGS]: scripts/eval_demo_model.py into $OUT/NAME.json
        local name=$1 model=$2
        shift 2
        timeout "${EVAL_LIMIT:-150}" python3 scripts/eval_demo_model.py --model "$model" \
            --tasks "${EVAL_TASKS:-200}" --json "$OUT/$name.json" "$@" 2>&1 | grep -v "^\[" | tail -n 3
        echo "== $name: $((SECONDS - start)) s"
    }
    send_pieces  # first: the weights come back even if the call runs out of time
    evaluate eval "$card" --windows 100 --chat
    evaluate eval_start "$DATA/start" --windows 100 --no-bigram --chat
    evaluate eval_1024 "$card" --windows 0 --no-bigram --prompt-tokens 1024
    [ -z "${ALL:-}" ] || evaluate eval_start_1024 "$DATA/start" --windows 0 --no-bigram \
        --prompt-tokens 1024
    exit 0
fi

[ "$mode" = train ] || { echo "unknown mode $mode"; exit 2; }
steps=${1:?steps}
minutes=${2:?minutes}
shift 2
start=$SECONDS
rm -rf "$KEEP/run" && mkdir -p "$KEEP/run"
python3 scripts/finetune_demo_model.py --base "$DATA/start" --out "$KEEP/run" "${FIXED[@]}" \
    --steps "$steps" --stop-after "$steps" --stop-after-minutes "$minutes" "$@" 2>&1 \
    | tr '\r' '\n' | tee "$OUT/train.log" | grep -v "^ *$" | awk 'NR % 50 == 1' | tail -n 30
tail -n 2 "$KEEP/run/loss_log.jsonl"
echo "training: $((SECONDS - start)) s"
[ -f "$KEEP/run/model/training.json" ] || exit 1
cp "$KEEP/run/model/training.json" "$OUT/"
python3 scripts/choose_demo_blend.py "$KEEP/run/model" --anchor "$DATA/start" \
    --alphas ${ALPHAS:-1.0 0.7} --tasks "${TASKS:-100}" --deadline "${DEADLINE:-150}" \
    --out "$KEEP/blends" 2>&1 | grep -v "^\[" | cut -c1-400 | tee "$OUT/choice.log"
[ -d "$KEEP/blends/chosen" ] || exit 1
cp "$KEEP/blends/choice.json" "$OUT/"
rm -f "$KEEP"/result/*
tar cf - -C "$KEEP/blends" chosen | split -b 16M -d - "$KEEP/result/result.tar."
ls -l "$KEEP/result"
send_pieces
echo "all: $((SECONDS - start)) s"
