"""Peak memory of `attnscope heads` on inputs of any size: a large corpus, or one long line.

    python scripts/bench_streaming.py --shape line --megabytes 50
    python scripts/bench_streaming.py --shape corpus --megabytes 1024 --seconds 420

Writes a deterministic input (English-like sentences cycled from the bundled sample texts, each sentence numbered so
that no two texts are alike) into a temporary folder, runs `attnscope heads --model demo --file FILE --json -q` in a
child process, and samples the child's resident memory (VmRSS in /proc) every 0.2 s. With `--seconds`, the run is
interrupted (SIGINT, as Ctrl-C) after that long: enough to show whether memory grows with the input read. Prints a
JSON summary: peak RSS (the kernel's high-water mark, VmHWM), a timeline (seconds, MB, and how far the input file has
been read, from its offset in /proc/PID/fdinfo: the check reads it once, the analysis a second time), the exit status
and the wall time; `--timeline-every` thins the timeline. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SAMPLE_FOLDER = Path(__file__).resolve().parent.parent / "attnscope" / "sample_texts"


def sentences() -> list[str]:
    """The bundled sample texts' sentences, in file order."""
    words = " ".join(path.read_text(encoding="utf-8") for path in sorted(SAMPLE_FOLDER.glob("*.txt"))).split()
    return [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]


def write_input(path: Path, shape: str, megabytes: float) -> int:
    """A corpus of paragraphs separated by blank lines (`corpus`), or one line with no line break (`line`)."""
    target = int(megabytes * 2**20)
    pool = sentences()
    written = 0
    with path.open("w", encoding="utf-8") as file:
        number = 0
        while written < target:
            paragraph = " ".join(f"{pool[(number + k) % len(pool)]} ({number + k})." for k in range(8))
            chunk = paragraph + ("\n\n" if shape == "corpus" else " ")
            file.write(chunk)
            written += len(chunk.encode("utf-8"))
            number += 8
    return path.stat().st_size


def memory_mb(pid: int, field: str = "VmRSS") -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def read_position(pid: int, path: Path) -> int | None:
    """Where the child's open file `path` is being read (its file offset, /proc/PID/fdinfo), None if not open."""
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            if os.readlink(fd) == str(path):
                for line in Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text().splitlines():
                    if line.startswith("pos:"):
                        return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["corpus", "line"], required=True)
    parser.add_argument("--megabytes", type=float, required=True)
    parser.add_argument("--seconds", type=float, default=None, help="interrupt the run after this long")
    parser.add_argument("--timeline-every", type=float, default=10.0, help="seconds between timeline points shown")
    parser.add_argument("--folder", default=None, help="where to write the input (default: a temporary folder)")
    args = parser.parse_args()
    folder = Path(args.folder or tempfile.mkdtemp(prefix="attnscope-stream-"))
    path = folder / f"{args.shape}-{args.megabytes:g}MB.txt"
    size = path.stat().st_size if path.exists() else write_input(path, args.shape, args.megabytes)
    command = [sys.executable, "-m", "attnscope", "heads", "--model", "demo", "--file", str(path), "--json", "-q"]
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    timeline, peak_seen, high_water = [], 0.0, None
    reading, passes, last_position = 0, 0, -1  # the input is read twice: checked, then analysed
    interrupted = False
    while child.poll() is None:
        elapsed = time.perf_counter() - started
        rss = memory_mb(child.pid)
        high_water = memory_mb(child.pid, "VmHWM") or high_water
        position = read_position(child.pid, path)
        if position is not None:
            if position < last_position or passes == 0:
                passes += 1
            reading, last_position = position, position
        if rss is not None:
            peak_seen = max(peak_seen, rss)
            if not timeline or elapsed - timeline[-1][0] >= args.timeline_every:
                timeline.append((round(elapsed, 1), round(rss), passes, round(100 * reading / size, 1)))
        if args.seconds is not None and elapsed > args.seconds and not interrupted:
            child.send_signal(signal.SIGINT)
            interrupted = True
        time.sleep(0.2)
    stdout, stderr = child.communicate()
    wall = time.perf_counter() - started
    summary = {
        "command": " ".join(command[1:]),
        "input": {"shape": args.shape, "bytes": size},
        "exit_status": child.returncode,
        "interrupted_after_s": args.seconds if interrupted else None,
        "wall_s": round(wall, 1),
        "peak_rss_mb": round(max(peak_seen, high_water or 0.0)),
        # seconds:MB resident:pass:percent of the input read in that pass (the pass counts the reads of the file
        # seen: a check too short to be sampled is not seen, and the analysis is then pass 1)
        "timeline_s_mb_pass_percent": " ".join(f"{t:g}:{mb}:{k}:{pc:g}" for t, mb, k, pc in timeline),
        "last_read": {"pass": passes, "percent": round(100 * reading / size, 1)},
        "stderr_tail": stderr.strip().splitlines()[-3:],
    }
    if child.returncode == 0:
        result = json.loads(stdout)
        summary["inputs"] = {key: result["input"][key] for key in ("n_texts", "n_windows", "n_tokens")}
        summary["tokens_per_s"] = round(result["input"]["n_tokens"] / wall)
    print(json.dumps(summary, indent=1))
    if args.folder is None:
        path.unlink()
        os.rmdir(folder)


if __name__ == "__main__":
    main()
