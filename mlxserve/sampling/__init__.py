"""Per-sequence sampling on the MLX device: parameters, sampler chain, logprobs."""
