"""What the embedding doors (OpenAI's /v1/embeddings, Ollama's /api/embed, llama.cpp's
/embedding) share: their inputs as token rows, the engine's vectors, and what each door does
to them (normalising, Matryoshka truncation, base64)."""
