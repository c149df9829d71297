"""The Python surface as tools read it (declared keywords, type stubs), the flash-attn-style
attnops.attention(), Result unpacking, and per-call settings: they reach the kernels, show in the
decision, and never build another operator (100,000 distinct scales do not grow the process)."""

import ast
import inspect
import os

import numpy as np
import pytest

import attnops
import reference as ref
from attnops import _attnops
from conftest import skip_without

FORWARD_KEYWORDS = {
    "causal": True, "sliding_window": None, "chunk_size": None, "segment_ids_q": None,
    "segment_ids_kv": None, "bias": None, "logits_soft_cap": None, "sinks": None, "mask": None,
    "return_lse": False, "return_weights": False, "profile": False, "backend": None,
    "softmax_scale": None, "runtime_dtype": None, "num_threads": None, "dtype": None,
}


def keyword_defaults(fn):
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def test_attention_signature_lists_its_keywords():
    kw = keyword_defaults(attnops.attention)
    assert kw["op"] == "flash_attn2"
    assert kw["causal"] is True and kw["softmax_scale"] is None and kw["return_lse"] is False
    assert set(kw) >= {"sliding_window", "chunk_size", "logits_soft_cap", "sinks", "bias", "segment_ids_q",
                       "segment_ids_kv", "mask", "backend", "runtime_dtype", "num_threads", "dtype", "config"}
    positional = [p.name for p in inspect.signature(attnops.attention).parameters.values()
                  if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == ["q", "k", "v"]


@pytest.mark.parametrize("method, absent", [
    ("__call__", ()),
    ("explain", ("profile",)),
    ("plan", ("profile",)),
    ("backward", ("return_lse", "return_weights")),
])
def test_operator_methods_declare_their_keywords(method, absent):
    kw = keyword_defaults(getattr(attnops.Operator, method))
    want = {k: v for k, v in FORWARD_KEYWORDS.items() if k not in absent}
    assert {k: kw.get(k, "missing") for k in want} == want
    text = inspect.signature(getattr(attnops.Operator, method)).__str__()
    assert "*, causal" in text  # what help() prints


def test_plan_is_explain_under_its_former_name():
    assert keyword_defaults(attnops.Operator.plan) == keyword_defaults(attnops.Operator.explain)
    op = attnops.registry().get("flash_attn2")
    q = np.random.default_rng(1).standard_normal((1, 7, 2, 8)).astype(np.float32)
    d = op.explain(q, q, q, sliding_window=(3, 0), backend="cpu")
    assert d["backend"] == "cpu" and d["requested"] == "flash_attn2"
    assert op.plan(q, q, q, sliding_window=(3, 0), backend="cpu") == d


def test_paged_methods_declare_their_keywords():
    kw = keyword_defaults(attnops.Operator.paged)
    assert kw["kv_split_tokens"] is None and kw["return_lse"] is False and kw["softmax_scale"] is None
    assert kw["share_prefixes"] is True
    assert set(keyword_defaults(attnops.Operator.explain_paged)) == set(kw)


def test_stubs_parse_and_name_every_public_symbol():
    folder = os.path.dirname(attnops.__file__)
    assert os.path.exists(os.path.join(folder, "py.typed"))
    with open(os.path.join(folder, "_attnops.pyi")) as f:
        tree = ast.parse(f.read())
    declared = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            declared[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        elif isinstance(node, ast.FunctionDef):
            declared[node.name] = None
        elif isinstance(node, ast.AnnAssign):
            declared[node.target.id] = None
    public = [n for n in dir(_attnops) if not n.startswith("__") or n == "__version__"]
    missing = [n for n in public if n not in declared]
    assert not missing, "not in _attnops.pyi: " + ", ".join(missing)
    for name in public:
        obj = getattr(_attnops, name)
        if isinstance(obj, type) and not issubclass(obj, BaseException):
            members = [m for m in vars(obj) if not m.startswith("_") or m in ("__call__", "__iter__")]
            missing = [m for m in members if m not in declared[name]]
            assert not missing, name + " members not in _attnops.pyi: " + ", ".join(missing)


def test_attention_matches_the_oracle():
    rng = np.random.default_rng(3)
    q, k, v = ref.random_inputs(rng, 2, 33, 47, 4, 2, 24, 24, "f32")
    out_ref, lse_ref, _ = ref.attention(q, k, v, softmax_scale=0.41, sliding_window=(20, 0))
    out = attnops.attention(q, k, v, softmax_scale=0.41, sliding_window=(20, 0))
    assert isinstance(out, np.ndarray) and out.shape == (2, 33, 4, 24)
    np.testing.assert_allclose(out, out_ref, atol=2e-5, rtol=0)
    out2, lse = attnops.attention(q, k, v, op="vanilla", softmax_scale=0.41, sliding_window=(20, 0),
                                  return_lse=True, backend="native")
    np.testing.assert_allclose(out2, out_ref, atol=2e-5, rtol=0)
    np.testing.assert_allclose(lse, lse_ref, atol=1e-5, rtol=0)
    with pytest.raises(TypeError):
        attnops.attention(q, k, v, "vanilla")  # op is keyword-only
    with pytest.raises(TypeError, match="did you mean 'softmax_scale'"):
        attnops.registry().get("vanilla")(q, k, v, scale=0.4)


def test_result_unpacks_like_gradients():
    rng = np.random.default_rng(4)
    q, k, v = ref.random_inputs(rng, 1, 8, 8, 2, 2, 8, 8, "f32")
    r = attnops.registry().get("vanilla")(q, k, v, return_lse=True)
    out, lse, weights = r
    assert len(r) == 3 and out is r.out and lse is r.lse and weights is None and r[0] is r.out
    r = attnops.registry().get("vanilla")(q, k, v, return_weights=True)
    assert r[2] is r.weights and r[2].shape == (1, 2, 8, 8) and r[1] is None and r[-3] is r.out
    g = attnops.registry().get("vanilla").backward(q, k, v, out, lse, out)
    assert g[0] is g.dq and g[2] is g.dv and g[3] is None and g[1:3] == (g.dk, g.dv)


@pytest.mark.parametrize("backend", ["native", "cpu", "gpu"])
def test_per_call_settings_reach_the_kernel_and_the_decision(backend):
    skip_without(backend)
    rng = np.random.default_rng(5)
    q, k, v = ref.random_inputs(rng, 1, 24, 40, 4, 2, 16, 16, "f32")
    # One operator whose config prefers native and sets another scale; each call overrides both.
    op = attnops.registry().get("flash_attn2", config={"backend": "native", "softmax_scale": 2.0,
                                                       "gpu": {"allow_software": True}})
    res = op(q, k, v, backend=backend, softmax_scale=0.3, num_threads=1, return_lse=True)
    out_ref, lse_ref, _ = ref.attention(q, k, v, softmax_scale=0.3)
    np.testing.assert_allclose(res.out, out_ref, atol=2e-5, rtol=0)
    np.testing.assert_allclose(res.lse, lse_ref, atol=1e-4, rtol=0)
    assert res.decision["backend"] == backend
    assert res.decision["settings"] == {"softmax_scale": 0.3, "num_threads": 1, "backends": [backend]}
    plain = op(q, k, v)
    assert plain.decision["backend"] == "native" and "settings" not in plain.decision
    np.testing.assert_allclose(plain.out, ref.attention(q, k, v, softmax_scale=2.0)[0], atol=2e-5, rtol=0)
    half = op(q, k, v, runtime_dtype="f16", backend=backend)
    assert half.out.dtype == np.float16 and half.decision["settings"]["runtime_dtype"] == "f16"


@pytest.mark.parametrize("kwargs, error, field", [
    ({"softmax_scale": float("nan")}, attnops.InvalidArgument, "softmax_scale"),
    ({"softmax_scale": 1e38}, attnops.InvalidArgument, "softmax_scale"),
    ({"num_threads": -2}, attnops.InvalidArgument, "num_threads"),
    ({"runtime_dtype": "f64"}, attnops.InvalidArgument, "runtime_dtype"),
    ({"backend": "cuda"}, attnops.InvalidArgument, "backend"),
])
def test_bad_per_call_values_name_the_field(kwargs, error, field):
    q = np.ones((1, 4, 2, 8), np.float32)
    with pytest.raises(error, match=field):
        attnops.registry().get("flash_attn2")(q, q, q, **kwargs)


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_distinct_scales_per_call_do_not_grow_the_process():
    op = attnops.registry().get("flash_attn2")
    q = np.ones((1, 2, 1, 8), np.float32)
    for i in range(2000):  # warm-up: allocator pools, the thread pool, the decision's first dict
        op(q, q, q, softmax_scale=0.5 + i * 1e-6, backend="cpu")
    before = rss_bytes()
    for i in range(100_000):
        op(q, q, q, softmax_scale=0.25 + i * 1e-7, backend="cpu")
    grown = rss_bytes() - before
    # An operator kept per distinct scale costs kilobytes each: hundreds of MiB over these calls.
    assert grown < 16 * 2**20, "the process grew by %.1f MiB" % (grown / 2**20)
