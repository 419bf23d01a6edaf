"""Corpus KLD like llama-perplexity: windows, the per-token quantities, llama.cpp's summary formulas, the top-k base
side, the noise-floor gate, and the printout with llama-perplexity's names."""

from __future__ import annotations

import math

import numpy as np
import pytest
from validation_fakes import InterruptedAt

from inference_engine.engine import OurEngine
from inference_engine.errors import GGUFParityError
from validation.corpus_kld import (
    TOP_K,
    BaseTopK,
    TokenStats,
    corpus_kld,
    format_report,
    log_softmax,
    windows,
)
from validation.corpus_text import BUILTIN_NAME, builtin_text, load_text
from validation.free_running import NOISE_FACTOR
from validation.metrics import KLD_MEAN_MAX_GGML, thresholds_for


def random_base(seed: int, n: int, spread: float) -> tuple[np.ndarray, np.ndarray, BaseTopK]:
    """Normal logits (``n`` positions, spread ``spread``) over 4 x TOP_K tokens (top-k keeps a quarter), random next
    tokens, and the top-k base side built from them."""
    rng = np.random.default_rng(seed)
    v = 4 * TOP_K
    logits = rng.normal(0, spread, size=(n, v)).astype(np.float32)
    nxt = rng.integers(0, v, size=n)
    base = BaseTopK()
    base.add(logits, nxt)
    return logits, nxt, base


def scored(q_logits: np.ndarray, nxt: np.ndarray, base: BaseTopK) -> TokenStats:
    """``q_logits`` scored against ``base`` as one window."""
    stats = TokenStats()
    stats.add(q_logits, nxt, base, 0)
    return stats


def test_windows_like_llama_perplexity():
    ids = list(range(10, 31))  # 21 tokens
    assert windows(ids, 8, bos=1) == [[1] + list(range(11, 18)), [1] + list(range(19, 26))]
    assert windows(ids, 8, bos=None)[1][0] == 18
    with pytest.raises(GGUFParityError, match="fewer than --ctx 32"):
        windows(ids, 32, bos=1)


def test_token_stats_match_a_direct_computation():
    rng = np.random.default_rng(0)
    n, v = 300, 40  # a small vocabulary: top-k keeps every token, so the KLD is exact
    base_logits = rng.normal(0, 2, size=(n, v)).astype(np.float32)
    q_logits = (base_logits + rng.normal(0, 0.3, size=(n, v))).astype(np.float32)
    nxt = rng.integers(0, v, size=n)
    base = BaseTopK()
    base.add(base_logits, nxt)
    r = scored(q_logits, nxt, base).report()
    lp, lq = log_softmax(base_logits), log_softmax(q_logits)
    p = np.exp(lp)
    kld = np.where(lp > -16, p * (lp - lq), 0).sum(1)
    nll, nll_base = -lq[np.arange(n), nxt], -lp[np.arange(n), nxt]
    assert r["scored_positions"] == n
    assert r["KLD"]["Mean"] == pytest.approx(kld.mean(), rel=1e-6)
    assert r["KLD"]["Mean unc"] == pytest.approx(kld.std() / math.sqrt(n - 1), rel=1e-4)
    assert r["KLD"]["Maximum"] == pytest.approx(kld.max(), rel=1e-5)
    assert r["KLD"]["Median"] == pytest.approx(np.median(kld), rel=1e-5)
    assert r["KLD"]["99.0%"] == pytest.approx(np.percentile(kld, 99), rel=1e-4)
    assert r["PPL(Q)"] == pytest.approx(math.exp(nll.mean()), rel=1e-6)
    assert r["PPL(base)"] == pytest.approx(math.exp(nll_base.mean()), rel=1e-6)
    assert r["Cor(ln(PPL(Q)), ln(PPL(base)))"] == pytest.approx(np.corrcoef(nll, nll_base)[0, 1], rel=1e-4)
    assert r["PPL(Q)/PPL(base)"] == pytest.approx(math.exp(nll.mean() - nll_base.mean()), rel=1e-6)
    dp = np.exp(-nll) - np.exp(-nll_base)
    assert r["Δp"]["Mean"] == pytest.approx(dp.mean(), rel=1e-5)
    assert r["Δp"]["RMS"] == pytest.approx(math.sqrt((dp * dp).mean()), rel=1e-5)
    assert r["Same top p"] == pytest.approx((base_logits.argmax(1) == q_logits.argmax(1)).mean())


def test_top_k_base_drops_only_the_tail():
    base_logits, nxt, base = random_base(seed=1, n=200, spread=4)
    assert base.top_ids[0].shape == (200, TOP_K)
    r = scored(base_logits, nxt, base).report()  # the base against itself
    assert r["KLD"]["Mean"] == 0.0 and r["Same top p"] == 1.0
    assert r["PPL(Q)"] == pytest.approx(r["PPL(base)"], rel=1e-6)  # the next token's log-prob is kept exactly


def test_builtin_text_and_text_files(tmp_path):
    text = builtin_text()
    assert "CHAPTER I" in text and not text.startswith("#") and len(text) > 20000
    assert load_text(None) == (text, BUILTIN_NAME)
    f = tmp_path / "t.txt"
    f.write_text("hello world", encoding="utf-8")
    assert load_text(str(f)) == ("hello world", str(f))
    with pytest.raises(GGUFParityError, match="no such text file"):
        load_text(str(tmp_path / "missing.txt"))
    (tmp_path / "empty.txt").write_text("  ")
    with pytest.raises(GGUFParityError, match="empty"):
        load_text(str(tmp_path / "empty.txt"))


def test_engines_on_a_tiny_model_gate_against_the_floor(tiny_model):
    """numba against numpy (ours as the reference), numpy's f32 numerics against itself as a "variant": every field
    is there with llama-perplexity's names, and the gate follows NOISE_FACTOR x the floor."""
    path = tiny_model("llama")
    ref = OurEngine(path, backend="numpy", numerics="ggml")
    ours = OurEngine(path, backend="numpy", numerics="f32")
    same = OurEngine(path, backend="numpy", numerics="ggml")
    ids = [int(t) for t in np.random.default_rng(2).integers(3, ref.n_vocab, size=260)]
    heard = []
    out = corpus_kld(ours, ref, ids, 64, 1, thresholds_for("ggml"), {"itself": same}, source="test",
                     progress=lambda *a: heard.append(a))
    assert out["windows"] == 4 and out["ours"]["scored_positions"] == 4 * 31
    # each window of each engine (the reference, ours, the variant) as it finishes, from 0 to all of them
    assert heard == [("corpus KLD, 4 windows of 64", done, 12) for done in range(13)]
    assert out["reference_self"]["itself"]["KLD"]["Mean"] == 0.0 and out["kld_mean_floor"] == 0.0
    assert out["kld_mean_limit"] == max(KLD_MEAN_MAX_GGML, NOISE_FACTOR * 0.0)
    assert out["passed"] is bool(out["ours"]["KLD"]["Mean"] <= KLD_MEAN_MAX_GGML)
    lines = format_report("ours vs llama.cpp", out["ours"])
    for name in ("Mean PPL(Q)", "Mean PPL(base)", "Cor(ln(PPL(Q)), ln(PPL(base)))", "Mean ln(PPL(Q)/PPL(base))",
                 "Mean PPL(Q)/PPL(base)", "Mean PPL(Q)-PPL(base)", "Mean    KLD", "Maximum KLD", "99.9%   KLD",
                 "Median  KLD", "0.1%    KLD", "Minimum KLD", "Mean    Δp", "RMS Δp", "Same top p"):
        assert any(line.startswith(name) for line in lines), name
    f32 = corpus_kld(ours, ref, ids, 64, 1, thresholds_for("f32"), {}, source="test")  # gated in every class
    assert f32["gated"] is True and f32["kld_mean_limit"] == KLD_MEAN_MAX_GGML
    assert f32["passed"] is bool(f32["ours"]["KLD"]["Mean"] <= KLD_MEAN_MAX_GGML)


def test_too_few_scored_positions_is_a_user_error_before_any_window(tiny_model):
    path = tiny_model("llama")
    never = InterruptedAt(OurEngine(path, backend="numpy"), "capture", 0)  # any window it were asked for would be Ctrl-C
    with pytest.raises(GGUFParityError, match="llama-perplexity needs 100"):
        corpus_kld(never, never, list(range(3, 40)), 16, 1, thresholds_for("ggml"))


def test_ctrl_c_keeps_the_windows_every_engine_finished(tiny_model):
    path = tiny_model("llama")
    ref, ours = OurEngine(path, backend="numpy"), OurEngine(path, backend="numpy", numerics="f32")
    ids = [int(t) for t in np.random.default_rng(6).integers(3, ref.n_vocab, size=8 * 64)]
    heard = []
    stopped = corpus_kld(InterruptedAt(ours, "capture", 5), ref, ids, 64, 1, thresholds_for("f32"), source="test",
                         progress=lambda *a: heard.append(a[1]))  # Ctrl-C in ours's sixth window
    first_five = corpus_kld(ours, ref, ids[:5 * 64], 64, 1, thresholds_for("f32"), source="test")
    assert stopped["interrupted"] is True and (stopped["windows"], stopped["windows_planned"]) == (5, 8)
    assert stopped["ours"]["KLD"] == first_five["ours"]["KLD"]  # those five windows' statistics, exactly
    assert stopped["ours"]["scored_positions"] == 5 * 31 and heard[-1] == 11  # the reference's sixth window done
    assert first_five["passed"] is True and stopped["passed"] is None  # a part passing is no verdict on the text
    # one window finished: fewer positions than llama-perplexity's statistics take; said, not computed
    early = corpus_kld(InterruptedAt(ours, "capture", 1), ref, ids, 64, 1, thresholds_for("f32"), source="test")
    assert early["interrupted"] is True and early["passed"] is None and "ours" not in early
    assert early["skipped"].startswith("interrupted (Ctrl-C) after 1 of 8 windows: 31 scored positions")


def test_ctrl_c_after_a_failing_part_still_fails(tiny_model):
    ref = OurEngine(tiny_model("llama"), backend="numpy")
    other = OurEngine(tiny_model("llama", seed=1), backend="numpy")
    ids = [int(t) for t in np.random.default_rng(3).integers(3, ref.n_vocab, size=8 * 64)]
    stopped = corpus_kld(InterruptedAt(other, "capture", 4), ref, ids, 64, 1, thresholds_for("ggml"),
                         {"itself": ref})
    assert stopped["interrupted"] is True and stopped["windows"] == 4 and stopped["passed"] is False


def test_a_different_model_fails_the_gate(tiny_model):
    ref = OurEngine(tiny_model("llama"), backend="numpy")
    other = OurEngine(tiny_model("llama", seed=1), backend="numpy")
    ids = [int(t) for t in np.random.default_rng(3).integers(3, ref.n_vocab, size=260)]
    out = corpus_kld(other, ref, ids, 64, 1, thresholds_for("ggml"), {"itself": ref}, source="test")
    assert out["ours"]["KLD"]["Mean"] > out["kld_mean_limit"] and out["passed"] is False


def test_top_k_kld_is_never_negative_and_never_above_the_full_kld():
    """q moves mass from p's tail onto p's top-k: without the lumped tail term the sum over the top-k alone is
    negative; with it, the per-token KLD lies between 0 and the full-vocabulary KLD."""
    p_logits, nxt, base = random_base(seed=4, n=150, spread=1)
    q_logits = p_logits.copy()
    rows = np.arange(150)[:, None]
    q_logits[rows, base.top_ids[0]] += 0.5  # q favours p's top-k over p's tail
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    full = (np.exp(lp) * (lp - lq)).sum(1)
    kld = scored(q_logits, nxt, base).kld[0]
    assert (kld >= 0).all() and (kld <= full + 1e-9).all()
