"""Reading a saved :class:`~poskernel_tl.result.ConditionResult` back, file by file, with
every shape, row count and finiteness requirement checked and each problem reported
with the file it is in. Only safe loaders are used (``torch.load(weights_only=True)``,
``np.load(allow_pickle=False)``)."""

import json
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from poskernel_tl import constants as C
from poskernel_tl.errors import ResultFileError
from poskernel_tl.registry import ModelSpec


def _err(path: Path, problem: str):
    return ResultFileError(f"{path}: {problem}")


def _npz(path: Path, keys: list[str]) -> dict[str, np.ndarray]:
    if not path.exists():
        raise _err(path, "missing")
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise _err(path, f"lacks arrays {missing}")
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise _err(path, f"unreadable ({err})") from err


def _torch(path: Path):
    if not path.exists():
        raise _err(path, "missing")
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # torch raises many types for a corrupt archive
        raise _err(path, f"unreadable ({type(err).__name__}: {err})") from err


def _csv(path: Path, columns: list[str], rows: int) -> pd.DataFrame:
    if not path.exists():
        raise _err(path, "missing")
    try:
        df = pd.read_csv(path, float_precision="round_trip")
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as err:
        raise _err(path, f"unreadable ({err})") from err
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise _err(path, f"lacks columns {missing}")
    if len(df) != rows:
        raise _err(path, f"has {len(df)} rows, expected {rows}")
    return df


def _shape(path: Path, name: str, arr: np.ndarray, shape: tuple, finite: bool = False):
    if tuple(arr.shape) != tuple(shape):
        raise _err(path, f"{name} has shape {tuple(arr.shape)}, expected {tuple(shape)}")
    if finite and not np.isfinite(arr).all():
        raise _err(path, f"{name} holds NaN/inf")
    return arr


def _grid(df: pd.DataFrame, path: Path, col: str, L: int, H: int,
          extra: tuple[str, ...] = ()) -> np.ndarray:
    """Values of ``col`` laid out [*extra, layer, head] from the sorted tidy table."""
    order = list(extra) + ["layer", "head"]
    df = df.sort_values(order, kind="stable")
    if df["layer"].min() < 0 or df["layer"].max() >= L or df["head"].max() >= H:
        raise _err(path, f"layer/head indices outside {L} x {H}")
    values = df[col].to_numpy(np.float64)
    return values.reshape(-1, L, H) if extra else values.reshape(L, H)


def load_condition(cls, out: Path, model: str, dataset: str, length: int):
    from poskernel_tl.result import HEAD_ARRAYS_A

    path = lambda suffix: C.result_path(out, model, dataset, length, suffix)
    cfg_path = path(C.CFG)
    try:
        meta = json.loads(cfg_path.read_text())
        spec = ModelSpec.from_dict(meta["spec"])
        n, T, centered = int(meta["n_eval"]), int(meta["length"]), bool(meta["centered"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise _err(cfg_path, f"unreadable ({err})") from err
    L, H, Hkv, d = spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_head

    g_path = path(C.G_ARRAYS)
    g = _npz(g_path, ["seq_id", "trackA_per_seq", "trackA_pooled", "gram_centered",
                      "gram_raw", "r2_split"])
    _shape(g_path, "seq_id", g["seq_id"], (n,))
    _shape(g_path, "trackA_per_seq", g["trackA_per_seq"], (n, L, H, T - 1))
    for key in ("trackA_pooled", "gram_raw"):
        _shape(g_path, key, g[key], (L, H, T - 1), finite=True)
    _shape(g_path, "gram_centered", g["gram_centered"], (L, H, T - 1), finite=centered)
    if g["r2_split"].shape[1:] != (L, H):
        raise _err(g_path, f"r2_split has shape {g['r2_split'].shape}")

    a_path = path(C.TRACK_A_CSV)
    a = _csv(a_path, ["layer", "head", "seq_id", "R2_per_seq", "R2_per_seq_nosink",
                      *HEAD_ARRAYS_A.values()], n * L * H)
    if not np.array_equal(np.sort(a["seq_id"].unique()), np.sort(g["seq_id"])):
        raise _err(a_path, f"seq_id values disagree with {g_path.name}")
    rank = {int(s): i for i, s in enumerate(g["seq_id"])}
    a = a.assign(_seq=a["seq_id"].map(rank))
    per_seq = {c: _grid(a, a_path, c, L, H, ("_seq",))
               for c in ("R2_per_seq", "R2_per_seq_nosink")}
    first = a[a["_seq"] == 0]
    heads = {attr: _grid(first, a_path, col, L, H) for attr, col in HEAD_ARRAYS_A.items()}
    if not np.isfinite(heads["r2_pooled"]).all():
        raise _err(a_path, "R2_pooled holds NaN/inf")

    b_path = path(C.TRACK_B_CSV)
    b = _csv(b_path, ["layer", "head", "R2_gram", "R2_gram_raw", "R2_gram_half", "centered"],
             L * H)
    r2_raw = _grid(b, b_path, "R2_gram_raw", L, H)
    r2_gram = _grid(b, b_path, "R2_gram", L, H) if centered else np.full((L, H), np.nan)
    whitened = (_grid(b, b_path, "R2_gram_whitened", L, H)
                if "R2_gram_whitened" in b.columns else None)

    fields = dict(
        model=model, dataset=dataset, length=T, spec=spec, seq_id=g["seq_id"],
        r2_per_seq=per_seq["R2_per_seq"], r2_per_seq_nosink=per_seq["R2_per_seq_nosink"],
        g_per_seq=g["trackA_per_seq"], g_pooled=g["trackA_pooled"],
        r2_split=g["r2_split"], **heads, centered=centered, r2_gram=r2_gram,
        g_gram=g["gram_centered"], r2_gram_raw=r2_raw, g_gram_raw=g["gram_raw"],
        r2_gram_half=_grid(b, b_path, "R2_gram_half", L, H),
        n_centering=int(meta.get("n_centering", 0)),
        n_centering_half=int(meta.get("n_centering_half", 0)),
        r2_gram_whitened=whitened, config=meta.get("config", {}),
        provenance=meta.get("provenance", {}))

    if centered:
        m_path = path(C.CENTERING_MEANS)
        means = _torch(m_path)
        shapes = {"mean_q": (L, H, T, d), "mean_k": (L, Hkv, T, d),
                  "mean_q_half": (L, H, T, d), "mean_k_half": (L, Hkv, T, d)}
        for key, shape in shapes.items():
            if key in means:
                fields[key] = _shape(m_path, key, means[key].numpy(), shape, finite=True)
        if "mean_q" not in fields:
            raise _err(m_path, "lacks mean_q/mean_k")
    for name in ("gram_raw", "gram_centered"):
        p = path(f"{name}.pt")
        if p.exists():
            fields[name] = _shape(p, name, _torch(p).numpy(), (L, H, T, T))
    if spec.pe == "rope" and path(C.FREQ_USAGE).exists():
        f_path = path(C.FREQ_USAGE)
        fu = _npz(f_path, ["q_pair_norm", "k_pair_norm", "pair_first", "pair_second"])
        fields["q_pair_norm"] = _shape(f_path, "q_pair_norm", fu["q_pair_norm"],
                                       (L, H, d // 2), finite=True)
        fields["k_pair_norm"] = _shape(f_path, "k_pair_norm", fu["k_pair_norm"],
                                       (L, Hkv, d // 2), finite=True)
        fields["pair_first"], fields["pair_second"] = fu["pair_first"], fu["pair_second"]
    if path(C.PE_KERNEL).exists():
        p = path(C.PE_KERNEL)
        fields["s_pe"] = _shape(p, "s_pe", _npz(p, ["s_pe"])["s_pe"], (L, H, T - 1),
                                finite=True)
    if path(C.PERM_NULL).exists():
        p = path(C.PERM_NULL)
        z = _npz(p, ["r2_perm_null", "r2_perm_same_seqs"])
        if z["r2_perm_null"].shape[1:] != (L, H):
            raise _err(p, f"r2_perm_null has shape {z['r2_perm_null'].shape}")
        fields["r2_perm_null"] = z["r2_perm_null"]
        fields["r2_perm_same_seqs"] = _shape(p, "r2_perm_same_seqs", z["r2_perm_same_seqs"],
                                             (L, H))
    logits = {}
    for sid in meta.get("logits_saved", []):
        p = path(C.VIS_DIR) / f"seq_{sid}.pt"
        logits[int(sid)] = _shape(p, "logits", _torch(p).numpy(), (L, H, T, T))
    fields["logits"] = logits
    return cls(**fields)
