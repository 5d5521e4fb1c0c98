"""S_PE against the measured g(Δ): the three correlations per head, over both signs of Δ
for a bidirectional model."""

from types import SimpleNamespace

import numpy as np
import pytest

from poskernel_tl.analyses import pe_correlation as PC
from poskernel_tl.analyses.spectral.align import pe_spectrum_correlations
from poskernel_tl.analyses.spectral.processing import two_sided_for_spectrum
from poskernel_tl.errors import UserError

T = 48
LAGS = np.arange(1, T)


def kernel(w: float, odd: bool = False, sign: int = 1) -> np.ndarray:
    """cos(wΔ) (or sin for ``odd``) at Δ = sign·(1..T−1), shaped [1, 1, T−1]."""
    f = np.sin if odd else np.cos
    return f(w * sign * LAGS)[None, None]


def test_signed_lags_order():
    fwd, back = np.array([1.0, 2.0, 3.0]), np.array([-1.0, -2.0, -3.0])
    np.testing.assert_array_equal(PC.signed_lags(fwd), fwd)
    np.testing.assert_array_equal(PC.signed_lags(fwd, back), [-3, -2, -1, 1, 2, 3])
    with pytest.raises((UserError, TypeError)):  # jaxtyping's check, where it is on
        PC.signed_lags(fwd, back[:2])


def test_causal_correlations_are_the_spectral_tables():
    rng = np.random.default_rng(0)
    s_pe = rng.standard_normal((2, 3, T - 1)).cumsum(-1)
    g = {"trackA_pooled": s_pe + rng.standard_normal(s_pe.shape),
         "gram_centered": rng.standard_normal(s_pe.shape)}
    out = PC.pe_correlations(s_pe, g)
    for layer in range(2):
        for head in range(3):
            ref = pe_spectrum_correlations(s_pe[layer, head],
                                           {k: v[layer, head] for k, v in g.items()}, T)
            for name in g:
                assert out[f"r_pe_{name}"][layer, head] == pytest.approx(ref[f"r_pe_{name}"],
                                                                         abs=1e-12)
                assert out[f"corr_pe_{name}"][layer, head] == pytest.approx(
                    np.corrcoef(s_pe[layer, head], g[name][layer, head])[0, 1], abs=1e-12)
    assert not out["two_sided_trackA_pooled"].any()


def test_two_sided_sees_the_sign_of_delta():
    """S_PE even (a cosine on both sides); a g equal to it for keys before the query but
    flipped for keys after correlates perfectly on one side and not on both."""
    s_pe, s_back = kernel(0.3), kernel(0.3, sign=-1)
    g = {"trackA_pooled": 2 * s_pe + 1, "gram_raw": s_pe}
    back = {"trackA_pooled": 2 * s_back + 1, "gram_raw": -s_back}
    out = PC.pe_correlations(s_pe, g, s_pe_back=s_back, g_back=back)
    assert out["two_sided_gram_raw"].all()
    np.testing.assert_allclose(out["corr_pe_trackA_pooled"], 1.0, atol=1e-12)
    np.testing.assert_allclose(out["r_pe_trackA_pooled"], 1.0, atol=1e-9)
    assert out["corr_pe_gram_raw"][0, 0] < 0.5
    one_sided = PC.pe_correlations(s_pe, g)
    np.testing.assert_allclose(one_sided["corr_pe_gram_raw"], 1.0, atol=1e-12)
    # an odd kernel: S_PE(−Δ) = −S_PE(Δ); a g that is even misses it on both sides only
    s_odd, s_odd_back = kernel(0.3, odd=True), kernel(0.3, odd=True, sign=-1)
    out = PC.pe_correlations(s_odd, {"gram_raw": s_odd}, s_pe_back=s_odd_back,
                             g_back={"gram_raw": -s_odd_back})
    assert abs(out["corr_pe_gram_raw"][0, 0]) < 0.2


def test_two_sided_spectral_r_is_the_spectral_tables():
    """Two-sided: the spectra of S_PE and g over Δ = −(T−1)..T−1 with Δ = 0 bridged, as
    the spectral analysis takes them (span 2T)."""
    rng = np.random.default_rng(2)
    s_pe, s_back = (rng.standard_normal((1, 2, T - 1)).cumsum(-1) for _ in range(2))
    g, g_back = s_pe + rng.standard_normal(s_pe.shape), rng.standard_normal(s_pe.shape)
    out = PC.pe_correlations(s_pe, {"gram_raw": g}, s_pe_back=s_back,
                             g_back={"gram_raw": g_back})
    for head in range(2):
        ref = pe_spectrum_correlations(
            two_sided_for_spectrum(s_pe, s_back)[0, head],
            {"gram_raw": two_sided_for_spectrum(g, g_back)[0, head]}, 2 * T)
        assert out["r_pe_gram_raw"][0, head] == pytest.approx(ref["r_pe_gram_raw"], abs=1e-12)
        direct = np.corrcoef(np.r_[s_back[0, head, ::-1], s_pe[0, head]],
                             np.r_[g_back[0, head, ::-1], g[0, head]])[0, 1]
        assert out["corr_pe_gram_raw"][0, head] == pytest.approx(direct, abs=1e-12)


def test_missing_back_and_non_finite_g():
    s_pe, s_back = kernel(0.2), kernel(0.2, sign=-1)
    g = {"gram_raw": s_pe.copy()}
    # no g for keys after the query: forward only, and flagged
    out = PC.pe_correlations(s_pe, g, s_pe_back=s_back, g_back={"gram_raw": None})
    assert not out["two_sided_gram_raw"].any()
    np.testing.assert_allclose(out["corr_pe_gram_raw"], 1.0, atol=1e-12)
    nan = PC.pe_correlations(s_pe, {"gram_raw": np.full_like(s_pe, np.nan)})
    assert np.isnan(nan["r_pe_gram_raw"]).all() and np.isnan(nan["corr_pe_gram_raw"]).all()
    with pytest.raises((UserError, TypeError)):
        PC.pe_correlations(s_pe, {"gram_raw": s_pe[..., 1:]})


def test_table_from_a_result():
    rng = np.random.default_rng(1)
    s_pe, s_back = rng.standard_normal((2, 2, T - 1)), rng.standard_normal((2, 2, T - 1))
    fields = dict(model="m", s_pe=s_pe, s_pe_back=s_back, g_pooled=s_pe, g_pooled_back=s_back,
                  g_gram_raw=-s_pe, g_gram_raw_back=-s_back, g_gram=s_pe)
    table = PC.pe_correlation_table(SimpleNamespace(**fields))
    assert list(table[["layer", "head"]].itertuples(index=False, name=None)) == [
        (0, 0), (0, 1), (1, 0), (1, 1)]
    assert set(PC.SPEC.columns) <= set(table.columns)
    np.testing.assert_allclose(table["corr_pe_trackA_pooled"], 1.0, atol=1e-12)
    np.testing.assert_allclose(table["corr_pe_gram_raw"], -1.0, atol=1e-12)
    assert table["two_sided_gram_raw"].all() and not table["two_sided_gram_centered"].any()
    with pytest.raises(UserError, match="no S_PE"):
        PC.pe_correlation_table(SimpleNamespace(model="m", s_pe=None))
