"""Engines we did not write, behind the Engine protocol: tensor dumps (``dump:DIR``), a command run per request
(``cmd:...``) and Hugging Face transformers (``hf:``). Each module has an ``open_engine(target, model, **options)``
factory, registered by scheme in ``bench_compare.engines.ENGINE_SCHEMES``."""
