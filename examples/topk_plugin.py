"""An engine that gives only its greedy tokens and top-k log-probabilities (docs/PLUGGING_IN.md), as a Rust engine's
Python binding or a server does; here llama.cpp's high-level API stands in for such an engine."""
import numpy as np
from llama_cpp import Llama, llama_get_logits_ith


class TopKOnly:
    name = "top-k only (llama-cpp-python)"
    capabilities = ("top_logprobs", "text")  # no logits, no tensors, no tokenizer of its own

    def __init__(self, model, n_ctx=2048, n_threads=None):
        self.llm = Llama(model, n_ctx=n_ctx, n_threads=n_threads, verbose=False)
        self.model_info, self.n_vocab, self.n_ctx = {"path": model}, self.llm.n_vocab(), n_ctx

    def generate(self, ids, n_tokens, top_k=0):
        self.llm.reset()
        steps, batch = [], list(ids)
        for _ in range(n_tokens):
            self.llm.eval(batch)
            x = np.ctypeslib.as_array(llama_get_logits_ith(self.llm.ctx, -1), shape=(self.n_vocab,))
            logp = x - x.max() - np.log(np.exp(x - x.max()).sum())
            top = np.argsort(-logp)[:top_k]
            steps.append({"token": int(top[0] if top_k else logp.argmax()),
                          "top_logprobs": [(int(t), float(logp[t])) for t in top]})
            batch = [steps[-1]["token"]]
        return {"steps": steps, "text": self.llm.detokenize([s["token"] for s in steps]).decode(errors="replace")}

    # what it cannot give: the protocol's members exist and say so
    def tokenize(self, text, add_bos=True): raise NotImplementedError  # noqa: E704
    def detokenize(self, ids): raise NotImplementedError  # noqa: E704
    def reset(self): self.llm.reset()  # noqa: E704
    def prefill(self, ids): raise NotImplementedError  # noqa: E704
    def decode(self, token_id): raise NotImplementedError  # noqa: E704
    def close(self): self.llm.close()  # noqa: E704


def open_engine(target, model, n_ctx=2048, n_threads=None, **options):
    return TopKOnly(model, n_ctx, n_threads)
