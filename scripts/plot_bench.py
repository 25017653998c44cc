#!/usr/bin/python3
"""Draws the hand-off figures of scripts/bench_redis.sh as SVG: p50 and p99 against clients.

Usage: scripts/plot_bench.py JSONL [OUT_DIR]   (OUT_DIR defaults to the JSONL's directory)

Reads the JSON lines bench_redis.sh wrote (its OUT file) and writes one SVG per pinning,
handoff-<server CPU>-<client CPU>.svg: on the left the hand-off p50 and p99 of distlock's
`contended` workload and of the raw direct hand-off (`raw-handoff`) against the number of
clients, on the right the client and server CPU per acquire + release pair of both. Each
point is the median over the rounds; the bars span the rounds' range. Needs Debian's
python3-matplotlib (scripts/bootstrap.sh installs it), hence /usr/bin/python3 (a python3
earlier on PATH, a virtualenv or pyenv, may not see it).
"""
import json
import os
import statistics
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)


def load(path):
    """(pinning, workload, clients) -> list of the rounds' rows."""
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            j = json.loads(line)
            if j.get("workload") not in ("contended", "raw-handoff") or not j.get("round"):
                continue
            out.setdefault((j.get("pinning", "?"), j["workload"], j["clients"]), []).append(j)
    return out


def series(rows, pinning, workload, field):
    """Clients, medians, and the distances down and up to the rounds' min and max."""
    xs, med, lo, hi = [], [], [], []
    for (pin, w, n), rs in sorted(rows.items(), key=lambda kv: kv[0][2]):
        if pin != pinning or w != workload:
            continue
        vals = [r[field] for r in rs if field in r]
        if not vals:
            continue
        m = statistics.median(vals)
        xs.append(n)
        med.append(m)
        lo.append(m - min(vals))
        hi.append(max(vals) - m)
    return xs, med, [lo, hi]


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    path = sys.argv[1]
    out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(os.path.abspath(path))
    rows = load(path)
    pinnings = sorted({k[0] for k in rows})
    if not pinnings:
        print(f"plot_bench.py: no contended or raw-handoff lines in {path}", file=sys.stderr)
        return 1
    os.makedirs(out_dir, exist_ok=True)
    names = {"contended": "distlock", "raw-handoff": "raw direct hand-off"}
    for pin in pinnings:
        server, client = pin.split(":")
        fig, (lat, cpu) = plt.subplots(1, 2, figsize=(11, 4.5))
        for workload, style in (("contended", "-"), ("raw-handoff", "--")):
            for field, marker in (("p50_us", "o"), ("p99_us", "^")):
                xs, ys, err = series(rows, pin, workload, field)
                if xs:
                    lat.errorbar(xs, ys, yerr=err, linestyle=style, marker=marker, capsize=3,
                                 label=f"{names[workload]} {field[:3]}")
            for field, marker in (("cpu_us_per_pair", "o"), ("server_cpu_us_per_pair", "s")):
                xs, ys, err = series(rows, pin, workload, field)
                if xs:
                    who = "client" if field == "cpu_us_per_pair" else "server"
                    cpu.errorbar(xs, ys, yerr=err, linestyle=style, marker=marker, capsize=3,
                                 label=f"{names[workload]}, {who}")
        where = "everything on CPU " + server if server == client else f"server on CPU {server}, clients on CPU {client}"
        lat.set_title(f"hand-off latency ({where})")
        lat.set_xlabel("clients on one lock")
        lat.set_ylabel("microseconds")
        lat.set_yscale("log")
        cpu.set_title("CPU per acquire + release pair")
        cpu.set_xlabel("clients on one lock")
        cpu.set_ylabel("microseconds of CPU")
        counts = sorted({k[2] for k in rows if k[0] == pin})
        for ax in (lat, cpu):
            ax.set_xscale("log", base=2)
            ax.set_xticks(counts, [str(n) for n in counts])
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize="small")
        fig.text(0.01, 0.01, "medians over interleaved rounds, bars = the rounds' range; "
                 "measured on a shared, busy machine", fontsize="small")
        fig.tight_layout(rect=(0, 0.04, 1, 1))
        target = os.path.join(out_dir, f"handoff-{server}-{client}.svg")
        fig.savefig(target)
        plt.close(fig)
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
