"""Run the README's tour as written, line by line, and time each line (a check, not a test: it takes minutes).

    python3 tools/readme_tour.py [--readme README.md] [--timeout 900] [--only TEXT]

Every command line of the fenced blocks under "## A tour" runs through `bash -c`, in order, in one fresh temporary
folder (later lines use what earlier ones wrote: `decode.logos`, `build/tiny`), with the tools on PATH as installed.
A line whose comment says it needs something this machine may lack (a model in the Hugging Face cache) is skipped,
saying why. Prints each line's exit status and seconds; exits 1 if any line failed. The README states the time of
every line slower than a few seconds, from this script's figures.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_NEEDS = {"needs the model in the cache first": "the hub model must be in the local Hugging Face cache"}
_COMMAND = re.compile(r"^(logos-|echo |printf )")


def tour_lines(readme: str) -> list[str]:
    """The command lines of the fenced blocks between '## A tour' and the next '## ' heading."""
    start = readme.index("## A tour")
    end = readme.find("\n## ", start + 1)
    section = readme[start : end if end != -1 else len(readme)]
    lines: list[str] = []
    for block in re.findall(r"```\n(.*?)```", section, flags=re.S):
        lines += [line for line in block.splitlines() if _COMMAND.match(line)]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", default=str(Path(__file__).resolve().parent.parent / "README.md"))
    parser.add_argument("--timeout", type=int, default=900, help="seconds a line may take")
    parser.add_argument("--only", help="run only the lines containing this text (and none before them)")
    args = parser.parse_args()
    lines = tour_lines(Path(args.readme).read_text(encoding="utf-8"))
    failed = 0
    with tempfile.TemporaryDirectory(prefix="logos-tour-") as folder:
        for line in lines:
            if args.only and args.only not in line:
                continue
            command = line.split("  #")[0].rstrip()
            skip = next((why for mark, why in _NEEDS.items() if mark in line), None)
            if skip:
                print(f"skipped  {command}\n         ({skip})", flush=True)
                continue
            began = time.perf_counter()
            try:
                done = subprocess.run(
                    ["bash", "-c", command],
                    cwd=folder,
                    capture_output=True,
                    text=True,
                    timeout=args.timeout,
                    stdin=subprocess.DEVNULL if "|" not in command else None,
                )
                status = str(done.returncode)
                failed += done.returncode != 0
                tail = done.stderr.strip().splitlines()[-1:] if done.returncode else []
            except subprocess.TimeoutExpired:
                status, tail = "timeout", []
                failed += 1
            seconds = time.perf_counter() - began
            print(f"{seconds:7.1f} s  exit {status:>3}  {command}", flush=True)
            for text in tail:
                print(f"         {text}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
