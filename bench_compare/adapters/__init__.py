"""Engines reached from outside this process: OpenAI-compatible HTTP servers (``openai:URL``), llama.cpp's own
OpenAI server started by the harness (``llamacpp-server``), and the serving benchmark and logprob fidelity check
that run over them."""
