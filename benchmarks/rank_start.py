"""What a new rank process costs before and during a tiny run: its own CPU time and memory.

Three 2-rank runs of three reports each, ``warm=False`` (new processes every time), on a
throwaway embedded cluster; each rank reads its own CPU time (``/proc/self/stat``) and RSS
at the end of the training function. Compare checkouts with ``PYTHONPATH=<checkout>``.

    python benchmarks/rank_start.py
"""

from __future__ import annotations

import time

from _own_cluster import own_cluster

RUNS = 3


def train() -> tuple[float, float]:
    import os

    import nbtrain

    for step in range(1, 4):
        nbtrain.report(step=step, loss=1.0 / step)
    with open("/proc/self/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    with open("/proc/self/statm") as statm:
        rss_mb = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), rss_mb


def main() -> None:
    with own_cluster("nbtrain-rank-start-", num_cpus=4):
        import nbtrain

        print(f"nbtrain from {nbtrain.__file__}")
        for index in range(RUNS):
            started = time.monotonic()
            run = nbtrain.launch(train, workers=2, warm=False, name=f"rank-start-{index}")
            run.wait(raise_on_failure=True)
            ranks = ", ".join(f"{cpu:.2f} CPU-s / {rss:.0f} MB" for cpu, rss in run.result)
            print(f"run {index}: launch -> end {time.monotonic() - started:.1f} s; each rank: {ranks}", flush=True)


if __name__ == "__main__":
    main()
