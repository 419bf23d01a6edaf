"""llama.cpp's own high-level API as a logits-only engine: no capture(), so no tensors (docs/PLUGGING_IN.md)."""
import numpy as np
from llama_cpp import Llama, llama_get_logits_ith


class LlamaLogits:
    name = "llama-cpp-python Llama (defaults)"

    def __init__(self, model, n_ctx=2048, n_threads=None):
        # Llama's own defaults otherwise: F16 K/V cache, flash attention auto
        self.llm = Llama(model, n_ctx=n_ctx, n_threads=n_threads, verbose=False)
        self.model_info = {"path": model, "settings": "llama-cpp-python's Llama defaults"}
        self.n_vocab, self.n_ctx = self.llm.n_vocab(), n_ctx

    def tokenize(self, text, add_bos=True):
        return self.llm.tokenize(text.encode(), add_bos=add_bos, special=True)

    def detokenize(self, ids):
        return self.llm.detokenize(list(ids)).decode(errors="replace")

    def reset(self):
        self.llm.reset()

    def prefill(self, ids):
        self.llm.eval(list(ids))
        return np.ctypeslib.as_array(llama_get_logits_ith(self.llm.ctx, -1), shape=(self.n_vocab,)).copy()

    def decode(self, token_id):
        return self.prefill([token_id])

    def close(self):
        self.llm.close()


def open_engine(target, model, n_ctx=2048, n_threads=None, **options):
    return LlamaLogits(model, n_ctx, n_threads)
