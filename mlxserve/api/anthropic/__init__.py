"""Anthropic's Messages API: /v1/messages and /v1/messages/count_tokens."""
