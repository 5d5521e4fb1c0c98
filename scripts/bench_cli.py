"""Benchmark: how fast the command line answers what needs no model.

Times whole commands, each a fresh process, in turn over several rounds (so that the
machine's drift touches them alike), and prints each one's median and range of wall
time against the target of 1 s:

  poskernel --help                      the top-level help
  poskernel run --lenght 32             a mistyped flag (argparse's one line, exit 2)
  poskernel run --length 1e3            a bad value (argparse's one line, exit 2)
  poskernel run --length 99999          a length past the model's context (exit 2)
  poskernel run --out /proc/…           a folder that cannot be made (exit 2)

and, for comparison, what every command that does run pays first: importing the
commands (torch, transformers, TransformerLens; ``import poskernel_tl.apps.commands``).

Usage: python scripts/bench_cli.py [--rounds 5]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

TARGET_S = 1.0


UNWRITABLE = "/proc/poskernel-bench/out"  # no process may make a folder there, root neither


def commands(poskernel: list[str]) -> dict[str, list[str]]:
    return {
        "--help": [*poskernel, "--help"],
        "run --lenght 32 (a mistyped flag)": [*poskernel, "run", "--lenght", "32"],
        "run --length 1e3": [*poskernel, "run", "--length", "1e3"],
        "run --length 99999": [*poskernel, "run", "--length", "99999"],
        "run --out /proc/… (cannot be made)": [*poskernel, "run", "--out", UNWRITABLE],
        "import of the commands (torch, transformers, TransformerLens)":
            [sys.executable, "-c", "import poskernel_tl.apps.commands"],
    }


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    exe = shutil.which("poskernel")
    poskernel = [exe] if exe else [sys.executable, "-m", "poskernel_tl.apps.cli"]
    cmds = commands(poskernel)
    times: dict[str, list[float]] = {name: [] for name in cmds}
    wall(cmds["--help"])  # warm the file cache
    for _ in range(args.rounds):
        for name, cmd in cmds.items():
            times[name].append(wall(cmd))
    print(f"{args.rounds} rounds, wall seconds (median, min–max); target ≤ {TARGET_S:.0f} s "
          "for the commands that need no model")
    for name, ts in times.items():
        med = statistics.median(ts)
        verdict = "" if name.startswith("import") else \
            f"   {med / TARGET_S:.2f} of the target ({'met' if med <= TARGET_S else 'MISSED'})"
        print(f"  {name:<62} {med:6.2f} s ({min(ts):.2f}–{max(ts):.2f}){verdict}")


if __name__ == "__main__":
    main()
