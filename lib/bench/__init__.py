"""Measuring, and the facts every layer needs: the lowest package of lib.

- `lib.bench.paths`     where data lives, the model file's size and sha256, and `check_smollm2` that holds the file to them
- `lib.bench.threads`   torch's threads sized to this process's share of the CPU (cgroup quota, affinity, load), applied
  when lib is imported
- `lib.bench.roofline`  FLOPs, bytes and the roofline; this machine's FLOP/s and bandwidth; `sync` (week 16, benchmarks)
- `lib.bench.timing`    timing that knows when it is disturbed: interleaved repeats, load, warnings (notebooks, benchmarks)
- `lib.bench.records`   results as data: each benchmark's record of what it measured, where and when
"""
