#!/usr/bin/env python3
"""Draws docs/figures/tier-costs.png: what one host of a tier pays as the tier grows from 3 to
1,000 hosts (10 shards each), from foqs-sim's summaries (the real assignment and peer
fan-out code, seed 1) and, when given, the real-etcd tier test's lines.

    python3 scripts/plot-tier.py SIM_JSONL [TIER_ETCD_JSONL ...] --out docs/figures/tier-costs.png

SIM_JSONL: foqs-sim's output (its event lines, each run ending in its summary line), both
assignments, any sizes.
TIER_ETCD_JSONL: the lines `scripts/tier-etcd.sh` prints (`{"etcd_requests": ..}` with
"hosts" and "step"), one file per build, labelled by its file name.
Run through `bash scripts/plot-tier.sh`, which makes the inputs and installs matplotlib
in .run/plot-venv.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    args = sys.argv[1:]
    out = "docs/figures/tier-costs.png"
    if "--out" in args:
        i = args.index("--out")
        out = args[i + 1]
        del args[i : i + 2]
    if not args:
        sys.exit(__doc__)
    lines = [json.loads(l) for l in open(args[0]) if l.strip().startswith("{")]
    sims = [s for s in lines if s.get("summary")]
    # The worst join, leave or crash per run (events precede their run's summary line).
    worst, run = [], []
    for l in lines:
        if l.get("summary"):
            hosts_moves = [e["scores_per_host"] for e in run if e["kind"] in ("join", "leave", "crash")]
            worst.append(max(hosts_moves, default=0))
            run = []
        else:
            run.append(l)
    for s, w in zip(sims, worst):
        s["scores_membership_max"] = w
    etcd_files = args[1:]

    panels = 3 if etcd_files else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.4))

    def series(kind):
        rows = sorted(
            (s for s in sims if s["assignment"].startswith(kind)), key=lambda s: s["hosts"]
        )
        return [s["hosts"] for s in rows], rows

    hosts, now = series("from")
    ax = axes[0]
    ax.plot(hosts, [h - 1 for h in hosts], "o--", color="grey", label="all-to-all (before): hosts - 1")
    ax.plot(hosts, [s["polls_out_max"] for s in now], "o-", label="ring fan-out: peers polled (max)")
    ax.plot(hosts, [s["polls_in_max"] for s in now], "s-", label="ring fan-out: hosts polling one (max)")
    ax.set_title("peer polls per host per peer_poll_ms")
    decorate(ax)

    ax = axes[1]
    hs, stateless = series("stateless")
    ax.plot(hs, [s["scores_membership_max"] for s in stateless], "o--", color="grey",
            label="stateless assignment (before)")
    ax.plot(hosts, [s["scores_membership_max"] for s in now], "o-",
            label="from the current owners")
    ax.set_title("assignment scores per host, worst join/leave/crash")
    decorate(ax)

    if etcd_files:
        ax = axes[2]
        for f in etcd_files:
            rows = [json.loads(l) for l in open(f) if l.strip().startswith("{")]
            label = os.path.splitext(os.path.basename(f))[0]
            for step, mark in (("crash", "o"), ("join", "s")):
                # Per host, per host that crashed or joined (a tenth of the tier: the
                # crash step's line counts the nine tenths left, the join's all).
                changed = lambda r: r["hosts"] / (9 if r["step"] == "crash" else 10)
                pts = sorted(
                    (r["hosts"], r["etcd_sent_bytes"] / r["hosts"] / changed(r) / 1024)
                    for r in rows if r["step"] == step
                )
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], mark + "-",
                            label=f"{label}: {step} of a tenth")
        ax.set_title("KB etcd sends each host per host crashed/joined")
        decorate(ax)

    fig.suptitle("per-host costs as the tier grows (10 shards per host)")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    print(out)


def decorate(ax):
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("hosts in the tier")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


if __name__ == "__main__":
    main()
