"""The registry mirrored (names, aliases, config from a YAML path / dict / Config), the decision as
a dict (codes, plan without running, the backward's), attnops.info() and python3 -m attnops.info."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import attnops

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
q = np.random.default_rng(0).uniform(-1, 1, (1, 16, 2, 8)).astype(np.float32)


def test_names_aliases_and_lookup():
    reg = attnops.registry()
    assert reg.names() == ["blocksparse", "flash_attn2", "ragged_paged", "vanilla"]
    assert reg.aliases("blocksparse") == ["splash"] and reg.canonical("flash") == "flash_attn2"
    assert "splash" in reg and "nope" not in reg and list(reg) == reg.names()
    op = reg.get("splash")
    assert op.name == "blocksparse" and op.aliases == ["splash"]
    assert reg.defaults("blocksparse")["fallbacks"] == {"decode": True, "non_causal": True, "seq_multiple": True,
                                                        "seq_multiple_of": 128}


def test_config_from_yaml_path_dict_and_config_object():
    path = os.path.join(ROOT, "config", "default.yaml")
    for cfg in (path, attnops.load_config(path), {"backend": ["native"], "softmax_scale": 0.5}):
        op = attnops.registry().get("blocksparse", config=cfg)
        assert isinstance(op, attnops.Operator)
    op = attnops.registry().get("flash_attn2", config={"backend": ["native"], "softmax_scale": 0.5,
                                                        "operators": {"flash": {"blocksize_q": 32}}})
    md = op.metadata
    assert md["backends"] == ["native"] and md["softmax_scale"] == 0.5 and md["blocksize_q"] == 32
    assert op(q, q, q).decision["backend"] == "native"
    # attn_mechanism picks the operator when no name is given (EasyDeL style).
    assert attnops.registry().get(config={"attn_mechanism": "splash"}).name == "blocksparse"
    assert attnops.parse_config("backend: cpu\n").source == "<string>"


def test_decision_is_a_dict_with_codes():
    op = attnops.registry().get("blocksparse", config={"backend": ["cpu"]})
    d = op(q[:, :1], q, q).decision  # q_len 1: the decode fallback to vanilla
    assert d["requested"] == "blocksparse" and d["operator"] == "vanilla" and d["backend"] == "cpu"
    assert [r["code"] for r in d["reasons"]][:2] == ["decode", "seq_multiple"]
    assert d["pass"] == "forward" and d["bytes_copied"] == 0 and "kernel" in d
    json.dumps(d)  # JSON-serialisable
    assert json.loads(op(q, q, q).decision_json)["operator"] == "vanilla"
    # plan: the same choice, without running (no kernel reported)
    p = op.plan(q[:, :1], q, q)
    assert (p["operator"], p["backend"]) == ("vanilla", "cpu") and "kernel" not in p
    # per-call backend override, as the CLI's --backend
    assert op(q, q, q, backend="native").decision["backend"] == "native"
    assert op(q, q, q, backend=["native", "cpu"]).decision["backend"] == "native"


def test_result_and_gradients_objects():
    op = attnops.registry().get("vanilla")
    r = op(q, q, q, return_lse=True)
    assert r.weights is None and r.lse.shape == (1, 2, 16)
    assert "decision" in repr(r)
    g = op.backward(q, q, q, r.out, r.lse, np.ones_like(r.out))
    assert len(g) == 5 and g[3] is None and g[4] is None and g.dsinks is None
    assert g.decision["pass"] == "backward"


def test_profile_adds_timings():
    d = attnops.registry().get("vanilla", config={"backend": "cpu"})(q, q, q, profile=True).decision
    assert "kernel" in d  # the cpu backend reports its tier; timings are the gpu's (README)


def test_top_level_attention_helper():
    out = attnops.attention(q, q, q, op="flash", causal=False, backend="cpu")
    assert isinstance(out, np.ndarray) and out.shape == q.shape
    with pytest.raises(TypeError):
        attnops.attention(q, q, q, op=attnops.registry().get("vanilla"), config={})


def test_info_as_data():
    data = attnops.info()
    assert set(data) >= {"cpu", "gpu_devices", "operators", "version"}
    assert data["cpu"]["tier"] in ("baseline", "avx2", "avx512", "avx512bf16", "amx")
    rows = {(r["operator"], r["backend"]): r for r in data["operators"]}
    assert len(rows) == 4 * len(attnops.registry().names())  # native, cpu, gpu, tpu per operator
    cpu = rows[("vanilla", "cpu")]
    assert cpu["available"] and cpu["tried"] and cpu["implements_backward"] and cpu["order"] == 2
    tpu = rows[("blocksparse", "tpu")]
    assert not tpu["tried"] and tpu["order"] == 0 and "not in the candidate order" in tpu["why_not"]
    # With software devices allowed, lavapipe (when installed) qualifies.
    soft = attnops.info(allow_software=True)
    assert soft["gpu_settings"]["allow_software"] is True
    soft_gpu = [r for r in soft["operators"] if r["operator"] == "vanilla" and r["backend"] == "gpu"][0]
    assert soft_gpu["available"] == any(d["qualifies"] for d in soft["gpu_devices"])


def test_python_m_attnops_info():
    env = dict(os.environ)
    text = subprocess.run([sys.executable, "-m", "attnops.info"], capture_output=True, text=True, env=env,
                          check=True).stdout
    assert "CPU kernels: ISA tier" in text and "flash_attn2  cpu" in text
    data = json.loads(subprocess.run([sys.executable, "-m", "attnops.info", "--json"], capture_output=True,
                                     text=True, env=env, check=True).stdout)
    assert len(data["operators"]) == 4 * len(attnops.registry().names())


def test_the_core_never_imports_torch():
    code = ("import sys, numpy as np, attnops; q = np.ones((1, 4, 1, 8), np.float32); "
            "attnops.attention(q, q, q); attnops.info(); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
