"""OpenAI's routes."""
