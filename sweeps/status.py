"""`aiayn status OUT`: the state of every pair of every sweep under OUT, from the books alone (sweeps/books.py):
completed (with its dev BLEU, and, where `--max-steps` cut it short of its row's budget, capped), running (who holds
it: a local worker's host:pid or a SLURM array task, for how long, and the step of its newest periodic checkpoint of
the steps it plans), failed or diverged (the one-line reason its metrics.json gives), pending. Nothing is trained or
written."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from aiayn.common.errors import UserError
from aiayn.common.options import option
from aiayn.common.text import clock
from aiayn.sweeps import backends, books
from aiayn.sweeps.folders import SweepOut

log = logging.getLogger(__name__)


@dataclass
class StatusOptions:
    """`aiayn status OUT`: the sweeps under OUT, as text or JSON."""

    out: str = option(positional=True, metavar="OUT")
    """the --out of an `aiayn table3` or `aiayn slurm` sweep"""
    json: bool = option(False)
    """print every sweep and pair as JSON, for scripts"""


def status_text(opts: StatusOptions) -> str:
    """What `aiayn status` prints: every sweep's pairs as a table to read, or as JSON."""
    found = sweep_status(opts.out)
    return json.dumps(found, indent=2) + "\n" if opts.json else render(found)


def sweep_status(out: str | Path) -> list[dict]:
    """[{preset, corpus, counts, pairs: [PairState.to_dict(), ...]}, ...] for every sweep under `out`; a UserError
    when `out` holds none."""
    root = SweepOut(out)
    if not root.root.is_dir():
        raise UserError(f"{out} does not exist; pass the --out of an `aiayn table3` or `aiayn slurm` sweep")
    sweeps = books.recorded_sweeps(root)
    if not sweeps:
        records = root.sweep_records()
        what = (
            f"its sweep record{'s' if len(records) > 1 else ''} ({', '.join(p.name for p in records[:3])}) "
            "cannot be read and there are no PRESET/CORPUS/ROW/seedN run directories"
            if records
            else "no sweeps/*.json and no PRESET/CORPUS/ROW/seedN run directories"
        )
        raise UserError(f"{out} holds no sweep ({what}); pass the --out of an `aiayn table3` or `aiayn slurm` sweep")
    claims = backends.status_claims(root)  # every registered back end's books
    found = []
    for sweep in sweeps:
        pairs = books.states(root, sweep.preset, sweep.corpus, sweep.pairs, claims)
        counts = {state: sum(p.state == state for p in pairs) for state in books.STATES}
        found.append(
            {
                "preset": sweep.preset,
                "corpus": sweep.corpus.name,
                "counts": counts,
                "pairs": [p.to_dict() for p in pairs],
            }
        )
    return found


def _age(seconds: float | None) -> str:
    return clock(seconds, with_seconds=False)


def _step(p: dict) -> str:
    """', checkpointed at step 5500 of 7000' for a run that got somewhere; '' otherwise."""
    if p.get("step") is None:
        return ""
    return f", checkpointed at step {p['step']}" + (f" of {p['steps']}" if p.get("steps") else "")


def _capped(p: dict) -> str:
    """'; capped: 60 of its 3000 steps (--max-steps): a look, not the preset's table' for a capped run."""
    if not p.get("capped"):
        return ""
    return f"; capped: {p['steps']} of its {p['budget']} steps (--max-steps): a look, not the preset's table"


def render(found: list[dict]) -> str:
    """The human form: one heading per sweep with its counts, one line per pair."""
    lines = []
    for sweep in found:
        counts = ", ".join(f"{n} {state}" for state, n in sweep["counts"].items() if n)
        lines.append(f"{sweep['preset']} on {sweep['corpus']}: {len(sweep['pairs'])} pairs ({counts})")
        width = max(len(p["row"]) for p in sweep["pairs"])
        for p in sweep["pairs"]:
            changed = (
                f"; its row changed since it ran ({', '.join(p['changed'])}): this result is the old row's, "
                "delete its run directory to train the row anew"
                if p.get("changed")
                else ""
            )
            done = (f"dev BLEU {p['dev_bleu']:.2f}" if p["dev_bleu"] is not None else "") + _capped(p) + changed
            what = {
                "completed": done,
                "short": done + (f"; a sweep that wants {p['wanted']} steps extends it" if p.get("wanted") else ""),
                "running": f"{p['holder']}, for {_age(p['age_s'])}{_step(p)}",
            }.get(p["state"], (p["error"] or "") + _step(p)).removeprefix(", ")  # a pending pair's own words first
            lines.append(f"  {p['row']:<{width}}  seed {p['seed']:<3} {p['state']:<9}  {what}".rstrip())
    return "\n".join(lines) + "\n"
