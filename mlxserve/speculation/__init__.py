"""Speculative decoding: drafts (prompt lookup; a draft model) that the target model verifies."""
