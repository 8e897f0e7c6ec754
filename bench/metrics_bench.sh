#!/bin/bash
# Nexmark q0 and q5 with the metrics registry off and on (the job registered and scraped every 100 ms), alternating
# in one run: 3 x (off, on) per query. docs/benchmarks.md "Metrics registry".
# Usage: bench/metrics_bench.sh [path/to/sluice-bench] [events]
B=${1:-build/release/bench/sluice-bench}
N=${2:-5000000}
for q in q0 q5; do
  for i in 1 2 3; do
    for m in 0 100; do
      printf "%s scrape=%s " "$q" "$m"
      "$B" --log-level error nexmark --query "$q" --events "$N" --parallelism 2 --metrics-scrape-ms "$m"
    done
  done
done
