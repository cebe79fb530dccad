"""Encoder architectures in MLX, their parameters named as in Hugging Face checkpoints."""
