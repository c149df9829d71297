# Diagnostic of flash_coopmat_nv on a real GPU, for when the self-check disables it: runs `attnops
# run` on generated f16 inputs with the variant forced and the self-check off, compares with an fp64
# reference and prints which rows, columns and heads are wrong. Usage, on the GPU machine after the
# recipe unpacked .gl: python3 bench/gpu/coopmat_diag.py .gpu/attnops /tmp/diag
import os, subprocess, sys, json
import numpy as np
binary, outdir = sys.argv[1], sys.argv[2]
os.makedirs(outdir, exist_ok=True)
def ref(q, k, v, causal):
    B, Tq, Hq, D = q.shape; Tk, Hkv = k.shape[1], k.shape[2]; g = Hq // Hkv
    q = q.astype(np.float64); k = k.astype(np.float64); v = v.astype(np.float64)
    out = np.zeros((B, Tq, Hq, v.shape[3]))
    for h in range(Hq):
        s = np.einsum('bqd,bkd->bqk', q[:, :, h], k[:, :, h // g]) / np.sqrt(D)
        if causal:
            qi = np.arange(Tq)[:, None] + (Tk - Tq); kj = np.arange(Tk)[None, :]
            s = np.where(kj <= qi, s, -np.inf)
        s = s - s.max(-1, keepdims=True); p = np.exp(s); p /= p.sum(-1, keepdims=True)
        out[:, :, h] = np.einsum('bqk,bkd->bqd', p, v[:, :, h // g])
    return out
def case(name, B, Tq, Tk, Hq, Hkv, D, causal, env, fill=None):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((B, Tq, Hq, D)).astype(np.float16)
    k = rng.standard_normal((B, Tk, Hkv, D)).astype(np.float16)
    v = rng.standard_normal((B, Tk, Hkv, D)).astype(np.float16)
    if fill == 'q0': q[:] = 0
    if fill == 'v1': v[:] = 1
    if fill == 'vcol': v[:] = np.arange(D, dtype=np.float16)[None, None, None, :] / D
    p = lambda n: os.path.join(outdir, n)
    np.save(p('q.npy'), q); np.save(p('k.npy'), k); np.save(p('v.npy'), v)
    e = dict(os.environ, ATTNOPS_VK_SELFTEST='0', **env)
    r = subprocess.run([binary, 'run', '--op', 'flash_attn2', '--backend', 'gpu', '--dtype', 'f16',
                        '--q', p('q.npy'), '--k', p('k.npy'), '--v', p('v.npy'), '--out', p('o.npy'),
                        '--causal' if causal else '--no-causal', '--explain'], env=e, capture_output=True, text=True)
    kern = '?'
    try:
        dec = json.loads(r.stderr.strip().splitlines()[-1]); kern = dec.get('kernel', '?')
    except Exception:
        pass
    if r.returncode != 0:
        print(f'{name}: rc={r.returncode} {r.stderr[-300:]}'); return
    o = np.load(p('o.npy')).astype(np.float64); want = ref(q, k, v, causal)
    err = np.abs(o - want)
    bad = err > 1e-2
    print(f'{name}: kernel={kern} max_err={err.max():.3g} bad={bad.mean():.3f} zeros={np.mean(o == 0):.3f} '
          f'nan={np.isnan(o).mean():.3f} o[0,0,0,:4]={np.round(o[0,0,0,:4],3)} want={np.round(want[0,0,0,:4],3)}')
    if bad.any():
        rows = bad.any(axis=(0, 2, 3)); cols = bad.any(axis=(0, 1, 2)); heads = bad.any(axis=(0, 1, 3))
        print(f'   bad rows {np.flatnonzero(rows)[:12]}.. ({rows.sum()}/{Tq}) cols {np.flatnonzero(cols)[:20]}.. ({cols.sum()}/{D}) heads {np.flatnonzero(heads)}')
        r0 = np.flatnonzero(rows)[0]; print(f'   o[row {r0}, h0, :8]={np.round(o[0,r0,0,:8],3)} want={np.round(want[0,r0,0,:8],3)} ratio={np.round(o[0,r0,0,:8]/want[0,r0,0,:8],3)}')
C = {'ATTNOPS_VK_KERNEL': 'flash_coopmat_nv'}
case('subgroup ref', 1, 128, 128, 4, 4, 64, False, {'ATTNOPS_VK_KERNEL': 'flash_subgroup'})
case('A T128 D64', 1, 128, 128, 4, 4, 64, False, C)
case('B T128 D64 fc=0', 1, 128, 128, 4, 4, 64, False, dict(C, ATTNOPS_VK_FLOAT_CONTROLS='0'))
case('C T16 D64 nsg1', 1, 16, 16, 1, 1, 64, False, C)
case('C2 T16 Tk64 nsg1', 1, 16, 64, 1, 1, 64, False, C)
case('D T256 D128 causal', 1, 256, 256, 8, 2, 128, True, C)
case('E q=0', 1, 128, 128, 4, 4, 64, False, C, 'q0')
case('F v=1', 1, 128, 128, 4, 4, 64, False, C, 'v1')
case('G v=col', 1, 128, 128, 4, 4, 64, False, C, 'vcol')
case('H q=0 v=col', 1, 16, 16, 1, 1, 64, False, C, 'q0')
