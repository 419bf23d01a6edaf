"""An OpenAI-compatible server for our engine: continuous batching over a paged KV cache with prefix reuse.

``runner.py`` (one forward over rows of several sequences), ``scheduler.py`` (the serving loop on its own
thread), ``app.py`` (the FastAPI routes and request checks), ``responses.py`` (OpenAI's response shapes),
``schemas.py`` (request bodies), ``text.py`` (stop strings, log-probabilities), ``metrics.py`` (Prometheus),
``serve.py`` (building it all and running uvicorn with a bounded drain on SIGINT/SIGTERM). ``bench-compare serve``
only parses flags and calls :func:`inference_engine.server.serve.serve`.
"""
