#!/usr/bin/env python3
"""Draws training curves from one or several megatrain metrics files (logging.metrics_file) into a PNG.

Four panels against the iteration: train loss (lines) with validation loss (dashed, dots) and test
loss (stars), learning rate, tokens/s, gradient norm. Several files are overlaid, one colour each,
to compare layouts or recipes. Needs matplotlib (Debian: python3-matplotlib).

  scripts/plot_metrics.py runs/quickstart/metrics.jsonl -o curves.png
  scripts/plot_metrics.py a/metrics.jsonl b/metrics.jsonl --label "tp1" --label "tp2" -o cmp.png
"""
import argparse
import json
import math
import os
import sys


def die(msg):
    print(f"plot_metrics.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def number(v):
    """A JSON number, or NaN for null (a skipped iteration's loss, a non-finite validation loss)."""
    return float(v) if isinstance(v, (int, float)) else math.nan


def read_metrics(path):
    """Train, validation and test records of one metrics file; the last record of an iteration wins."""
    train, val, test = {}, {}, {}
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    j = json.loads(line)
                except json.JSONDecodeError as e:
                    die(f"{path}:{n}: not a JSON line ({e.msg}); is this a megatrain metrics file?")
                if not isinstance(j, dict) or "iteration" not in j:
                    die(f"{path}:{n}: a record without \"iteration\"; is this a megatrain metrics file?")
                it = int(j["iteration"])
                if "val_loss" in j:
                    val[it] = number(j["val_loss"])
                elif "test_loss" in j:
                    test[it] = number(j["test_loss"])
                elif "loss" in j:
                    train[it] = j
    except OSError as e:
        die(f"{path}: cannot read ({e.strerror})")
    if not train and not val:
        die(f"{path}: no training or validation records")
    return train, val, test


def series(records, key):
    its = sorted(records)
    return its, [number(records[i].get(key)) for i in its]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("metrics", nargs="+", help="metrics.jsonl files (logging.metrics_file)")
    ap.add_argument("-o", "--output", required=True, help="PNG file to write")
    ap.add_argument("--label", action="append", default=[],
                    help="legend label of each file, in order (default: the file's folder name)")
    ap.add_argument("--title", default="", help="figure title")
    ap.add_argument("--width", type=float, default=12.0, help="figure width in inches (100 pixels each)")
    ap.add_argument("--height", type=float, default=8.0, help="figure height in inches (100 pixels each)")
    args = ap.parse_args()
    if args.label and len(args.label) != len(args.metrics):
        die(f"{len(args.label)} --label for {len(args.metrics)} metrics files; give one per file or none")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        # Debian's python3-matplotlib belongs to /usr/bin/python3; a PATH may put another Python first (pyenv).
        system = "/usr/bin/python3"
        if os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system):
            os.execv(system, [system, os.path.abspath(__file__)] + sys.argv[1:])
        die("matplotlib is missing; install it (Debian: scripts/apt_install_missing.sh python3-matplotlib)")

    runs = [read_metrics(p) for p in args.metrics]
    labels = args.label or [os.path.basename(os.path.dirname(os.path.abspath(p))) or p for p in args.metrics]

    fig, axes = plt.subplots(2, 2, figsize=(args.width, args.height), dpi=100)
    ax_loss, ax_lr, ax_tok, ax_gn = axes[0][0], axes[0][1], axes[1][0], axes[1][1]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, ((train, val, test), label) in enumerate(zip(runs, labels)):
        c = colors[k % len(colors)]
        if train:
            its, loss = series(train, "loss")
            ax_loss.plot(its, loss, color=c, label=f"{label} train")
            ax_lr.plot(*series(train, "lr"), color=c, label=label)
            ax_tok.plot(*series(train, "tokens_per_s"), color=c, label=label)
            ax_gn.plot(*series(train, "grad_norm"), color=c, label=label)
        if val:
            its = sorted(val)
            ax_loss.plot(its, [val[i] for i in its], "o--", color=c, markersize=4, label=f"{label} validation")
        if test:
            its = sorted(test)
            ax_loss.plot(its, [test[i] for i in its], "*", color=c, markersize=12, label=f"{label} test")

    for ax, title, ylabel in ((ax_loss, "loss", "mean token loss (nats)"), (ax_lr, "learning rate", "lr"),
                              (ax_tok, "throughput", "tokens/s"), (ax_gn, "gradient norm", "global L2 norm")):
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    out_dir = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(out_dir, exist_ok=True)
    fig.savefig(args.output, format="png")
    print(f"plot_metrics.py: wrote {args.output} ({len(runs)} run(s))")


if __name__ == "__main__":
    main()
