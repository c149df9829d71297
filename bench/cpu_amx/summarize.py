#!/usr/bin/env python3
"""Summary of bench/cpu_amx/on_device.sh's results (its $OUT directory): per bench row the old and
new binary's GFLOP/s in each round, new / old, and each against the best GEMM of the new run of the
same round (f32 and f16 rows: the better f32 GEMM; bf16 rows: the best of all, as `attnops bench`
computes vs_gemm); per serving row the KV GB/s of the paged and the dense call against the run's
read bandwidth, the paged call's GFLOP/s, and dense/pag = the dense call's time over the paged one's
(the paged prefill's target: >= 0.95)."""
import csv
import glob
import json
import os
import sys


def ceilings(rows):
    c = {}
    for r in rows:
        if r["operator"] in ("eigen_sgemm", "onednn_f32", "onednn_bf16") and r["gflops"]:
            c[r["operator"]] = (float(r["gflops"]), r["kernel"])
    return c


def best_for(c, dtype):
    names = ["eigen_sgemm", "onednn_f32"] + (["onednn_bf16"] if dtype == "bf16" else [])
    got = [(c[n][0], n) for n in names if n in c]
    return max(got) if got else (float("nan"), "-")


def key(r):
    return (r["operator"], r["dtype"], r["causal"], r["pass"], "T%s:%s D%s" % (r["Tq"], r["Tk"], r["D"]))


def bench_tables(out):
    files = glob.glob(os.path.join(out, "*_new_r*.csv"))
    for new in sorted(files):
        old = new.replace("_new_", "_old_")
        name = os.path.basename(new)[:-4]
        nrows = list(csv.DictReader(open(new)))
        orows = list(csv.DictReader(open(old))) if os.path.exists(old) else []
        c = ceilings(nrows)
        print("\n== %s (threads in the name; ceilings of the new run: %s)" % (
            name.replace("_new", ""), ", ".join("%s %.0f GF/s [%s]" % (k, v[0], v[1]) for k, v in sorted(c.items()))))
        oldby = {key(r): r for r in orows if r["operator"] not in ("eigen_sgemm", "onednn_f32", "onednn_bf16")}
        print("%-12s %-5s %-6s %-4s %-16s %9s %9s %8s %8s %8s  %s" % (
            "operator", "dtype", "causal", "pass", "shape", "old_GF/s", "new_GF/s", "new/old", "old_vs", "new_vs",
            "ceiling"))
        for r in nrows:
            if r["operator"] in ("eigen_sgemm", "onednn_f32", "onednn_bf16"):
                continue
            k = key(r)
            g_new = float(r["gflops"]) if r["gflops"] else float("nan")
            o = oldby.get(k)
            g_old = float(o["gflops"]) if o and o["gflops"] else float("nan")
            best, which = best_for(c, r["dtype"])
            print("%-12s %-5s %-6s %-4s %-16s %9.1f %9.1f %8.2f %8.3f %8.3f  %s" % (
                k[0], k[1], k[2], k[3], k[4], g_old, g_new, g_new / g_old if g_old == g_old else float("nan"),
                g_old / best, g_new / best, which))


def serving_tables(out):
    for new in sorted(glob.glob(os.path.join(out, "serving_*_new_r*.json"))):
        old = new.replace("_new_", "_old_")
        print("\n== %s (paged = ragged_paged, dense = the dense call on the same data)" %
              os.path.basename(new)[:-5].replace("_new", ""))
        print("%-6s %-12s %-5s %9s %9s %9s %9s %9s %10s %9s" % (
            "which", "label", "dtype", "read_GB/s", "paged_GBs", "dense_GBs", "paged_vsbw", "dense_vsbw",
            "paged_GF/s", "dense/pag"))
        for which, path in (("old", old), ("new", new)):
            if not os.path.exists(path):
                continue
            j = json.load(open(path))
            bw = j["read_bandwidth"]["gbps"]
            for r in j["rows"]:
                if r.get("error"):
                    print("%-6s %-12s %-5s error: %s" % (which, r["label"], r["dtype"], r["error"]))
                    continue
                ms, dms, gbps = r["median_ms"], r.get("dense_ms"), r["kv_gbps"]
                dgbps = gbps * ms / dms if dms else float("nan")
                print("%-6s %-12s %-5s %9.1f %9.2f %9.2f %9.3f %9.3f %10.1f %9.2f" % (
                    which, r["label"], r["dtype"], bw, gbps, dgbps, gbps / bw, dgbps / bw, r["gflops"] or float("nan"),
                    r["vs_dense"] if r.get("vs_dense") is not None else float("nan")))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/cpu_amx"
    bench_tables(out)
    serving_tables(out)


if __name__ == "__main__":
    main()
