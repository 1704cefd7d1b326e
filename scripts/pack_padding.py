"""How many positions a pack's stacked step computes against its seeds' own batches: each seed's batch padded to the
step's largest sentence count and lengths (what `stack_batches` does), over the first steps of an epoch, with each
seed's own batch order and with the pack's one order (`--batch-order-seed`, the first seed's).

    python scripts/pack_padding.py --preset evidence --k 4 8 --steps 200

Counts only: no training (BENCHMARKS.md, "A pack's batch order"). Data comes from the preset's corpus, prepared
under AIAYN_CACHE as a run prepares it.
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import replace

from aiayn.lightning_modules.run.options import TrainOptions
from aiayn.lightning_modules.run.pack import PackData, seed_options
from aiayn.lightning_modules.run.spec import spec_of
from aiayn.lightning_modules.run.train import build_datamodule


def positions(each: list[TrainOptions], steps: int) -> tuple[int, int]:
    """(stacked positions, the seeds' own positions) over the first `steps` steps of a pack of these seeds' options,
    its batches as the pack's trainer draws them (`PackData`)."""
    dms = [build_datamodule(o, spec_of(o)) for o in each]
    data = PackData(dms)
    for dm in dms:
        dm.prepare_data()
    data.setup("fit")
    stacked = own = 0
    for batches, *_ in itertools.islice(data.train_dataloader(), steps):
        B, S, T = (max(b[key].shape[i] for b in batches) for key, i in (("src", 0), ("src", 1), ("tgt_out", 1)))
        stacked += len(batches) * B * (S + T)
        own += sum(b["src"].numel() + b["tgt_out"].numel() for b in batches)
    return stacked, own


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="evidence")
    ap.add_argument("--k", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    alone = TrainOptions(row="base", preset=args.preset, accelerator="cpu")
    for K in args.k:
        seeds = tuple(range(K))
        own_order = [replace(alone, seed=s) for s in seeds]
        for name, each in (
            ("each seed's own order", own_order),
            ("the pack's one order", [seed_options(alone, s, seeds) for s in seeds]),
        ):
            stacked, own = positions(each, args.steps)
            print(
                f"K={K}, {name}: stacked positions {stacked / own:.2f}x the seeds' own batches over {args.steps} steps"
            )


if __name__ == "__main__":
    main()
