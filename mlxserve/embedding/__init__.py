"""Embedding models: token ids in, one vector per input out (encoders such as BERT, and
decoders that mlx-lm loads, pooled as each model's sentence-transformers config says)."""
