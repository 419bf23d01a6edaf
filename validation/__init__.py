"""Validation against llama.cpp: per-tensor capture and diff, logits, logit lens, tokenizer parity, greedy smoke."""
