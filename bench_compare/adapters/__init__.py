"""Engines we did not write, reached from outside this process, behind the Engine protocol:

* OpenAI-compatible HTTP servers (``openai:URL``), llama.cpp's own OpenAI server started by the harness
  (``llamacpp-server``), and the serving benchmark and logprob fidelity check that run over them;
* tensor dumps (``dump:DIR``), a command run per request (``cmd:...``) and Hugging Face transformers (``hf:``).

Each engine module has an ``open_engine(target, model, **options)`` factory, registered by scheme in
``bench_compare.engines.ENGINE_SCHEMES``."""
