"""Compares layout=auto with the zoo transformer's hand-written layouts: parameter and optimizer bytes
per device from `meshrun plan` (shapes only, nothing allocated), on each mesh where a hand-written
layout applies. Target (issue 17): auto within 15% of transformer_tp on 1x8 and of transformer_fsdp
on 8x1 (with layout.fsdp=true).

    python scripts/auto_layout_bytes.py                       # the 7b preset on 1x8, 2x4 and 8x1
    python scripts/auto_layout_bytes.py --preset 1b --out auto_layout_bytes.json
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

import benchlib
from meshrun.wording import format_bytes

# (mesh, auto with fsdp?, the hand-written layout it stands beside)
PAIRS = (
    ("1x8", False, "transformer_tp"),
    ("2x4", False, "transformer_tp"),
    ("2x4", True, "transformer_2d"),
    ("8x1", True, "transformer_fsdp"),
    ("8x1", False, "replicated"),
)


def plan(preset: str, mesh: str, layout_overrides: list[str]) -> dict:
    """`meshrun plan --json` of the transformer preset on `mesh` with `layout_overrides`."""
    done, found = benchlib.plan(
        ["model=transformer", f"model.preset={preset}", f"mesh={mesh}", *layout_overrides]
    )
    if done.returncode or found is None:
        raise SystemExit(f"meshrun plan failed: {done.stderr.strip()}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="7b")
    parser.add_argument("--out", default=None, help="also write the rows as JSON here")
    args = parser.parse_args()

    rows = []
    for mesh, fsdp, hand in PAIRS:
        auto = plan(args.preset, mesh, ["layout=auto", f"layout.fsdp={str(fsdp).lower()}"])
        written = plan(args.preset, mesh, [f"layout={hand}"])
        rows.append(
            {
                "mesh": mesh,
                "auto": "auto, fsdp" if fsdp else "auto",
                "hand_written": hand,
                "auto_bytes": auto["per_device"]["total_bytes"],
                "hand_bytes": written["per_device"]["total_bytes"],
                "auto_params_bytes": auto["per_device"]["params_bytes"],
                "hand_params_bytes": written["per_device"]["params_bytes"],
                "auto_rules": len({v["rule"] for v in auto["variables"] if v.get("rule")}),
            }
        )

    table = benchlib.table(
        f"transformer {args.preset}: parameters + optimizer state per device, layout=auto vs hand-written",
        ("mesh", "auto", "bytes", "hand-written", "bytes", "auto / hand", "auto rules"),
        left=("mesh", "auto", "hand-written"),
    )
    for row in rows:
        table.add_row(
            row["mesh"],
            row["auto"],
            format_bytes(row["auto_bytes"]),
            row["hand_written"],
            format_bytes(row["hand_bytes"]),
            f"{row['auto_bytes'] / row['hand_bytes']:.3f}",
            str(row["auto_rules"]),
        )
    Console(width=None if sys.stdout.isatty() else 120).print(table)
    if args.out:
        benchlib.write_json(args.out, {"preset": args.preset, "rows": rows})


if __name__ == "__main__":
    main()
