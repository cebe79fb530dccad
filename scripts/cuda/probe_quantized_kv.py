"""Which quantized-KV attention shapes this backend's quantized matmul implements: queries
against packed keys (transposed) and the scores against packed values, for the head sizes and
group sizes `--kv-bits` serves, in float32 and bfloat16. Prints one line per shape."""

import mlx.core as mx

for dtype in (mx.float32, mx.bfloat16):
    for head in (32, 64, 128):
        for group in (32, 64, 128):
            if head % group:
                continue
            for bits in (4, 8):
                for keys in (2, 33, 300):
                    q = mx.ones((1, 2, 1, head), dtype=dtype)
                    k = mx.ones((1, 2, keys, head), dtype=dtype)
                    try:
                        wq, s, b = mx.quantize(k, group_size=group, bits=bits)
                        scores = mx.quantized_matmul(q, wq, s, b, True, group, bits)
                        v = mx.quantize(k, group_size=group, bits=bits)
                        out = mx.quantized_matmul(scores, *v, False, group, bits)
                        mx.eval(out)
                        result = "ok"
                    except Exception as error:
                        result = str(error)[:90]
                    print(f"{dtype} head {head} group {group} bits {bits} keys {keys}: {result}")
