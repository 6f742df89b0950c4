#!/usr/bin/env python3
"""Reads megatrain's TensorBoard event files with TensorBoard's own EventAccumulator and prints
every scalar tag (count, first and last step and value). Exits 1 when no scalar is found or a tag
given with --expect is missing. Needs the tensorboard package; CI does not use this script (its
test reads the event files with a reader written from the format: test/observe/test_tensorboard.cpp).

  scripts/check_tensorboard.py runs/x/tensorboard
  scripts/check_tensorboard.py runs/x/tensorboard --expect "lm loss" --expect "lm loss validation" --all
"""
import argparse
import glob
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="logging.tensorboard_dir (or one events.out.tfevents.* file)")
    ap.add_argument("--expect", action="append", default=[], help="a tag that must be present (repeatable)")
    ap.add_argument("--all", action="store_true", help="print every (step, value) of every tag")
    args = ap.parse_args()
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        print("check_tensorboard.py: error: the tensorboard package is missing (pip install tensorboard)", file=sys.stderr)
        return 1
    files = [args.dir] if os.path.isfile(args.dir) else sorted(glob.glob(os.path.join(args.dir, "events.out.tfevents.*")))
    if not files:
        print(f"check_tensorboard.py: error: no events.out.tfevents.* file in {args.dir}", file=sys.stderr)
        return 1
    # The whole directory at once, as TensorBoard loads a run (a resumed run's SessionLog START
    # drops what an earlier file logged from that step on); size_guidance 0 keeps every point.
    acc = EventAccumulator(args.dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags().get("scalars", [])
    print(f"{len(files)} event file(s), {len(tags)} scalar tag(s) in {args.dir}")
    for tag in sorted(tags):
        ev = acc.Scalars(tag)
        print(f"  {tag!r:34} {len(ev):5d} points  step {ev[0].step} = {ev[0].value:.6g}  ...  "
              f"step {ev[-1].step} = {ev[-1].value:.6g}")
        if args.all:
            for e in ev:
                print(f"      {e.step:8d} {e.value:.9g}")
    missing = [t for t in args.expect if t not in tags]
    if missing or not tags:
        print(f"check_tensorboard.py: error: missing tag(s): {missing or 'any scalar'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
