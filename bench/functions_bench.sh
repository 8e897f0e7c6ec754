#!/usr/bin/env bash
# Functions in pipelines (issue 17; docs/benchmarks.md "Functions"): `sluice run` of N change events from a files
# source (two files) into a files sink at parallelism 1 and 2, without a function, with an identity function
# (returns the change) and with the Pix example's TypeScript function (examples/pix, bundled with esbuild after
# npm ci). Prints each run's "FINISHED after" line and /usr/bin/time's wall, CPU and peak RSS (sluice run and its
# workers: the workers are its children). The per-worker figures (events/s, CPU per event, added latency, worker
# RSS) come from build/release/bench/function-bench.
# Usage: bench/functions_bench.sh [SLUICE_BINARY] [N=200000]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
sluice=${1:-$root/build/release/apps/sluice/sluice}
sluice=$(realpath "$sluice")
n=${2:-200000}
dir=$(mktemp -d /tmp/sluice-functions-bench-XXXXXX)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/in"
python3 - "$dir/in" "$n" <<'PY'
import json, sys
files = [open(f"{sys.argv[1]}/changes-{k}.jsonl", "w") for k in range(2)]
for i in range(int(sys.argv[2])):
    e = i % 1000
    files[e % 2].write(json.dumps({"op": "u", "key": {"id": f"ch_{e}"}, "before": None,
                        "after": {"id": f"ch_{e}", "customer_id": f"cus_{e % 97}", "status": "paid", "amount": i + 100,
                                  "pix_key": "12345678000195", "merchant_name": "Cafe Coracao",
                                  "merchant_city": "Belo Horizonte"},
                        "source": {"connector": "postgres", "db": "payments", "collection": "public.charges",
                                   "position": f"0/{i + 1:X}", "ts_ms": 1790000000000, "snapshot": False,
                                   "txn_id": i, "sequence": 0}}) + "\n")
PY
echo 'exports.identity = (c) => c;' > "$dir/id.js"
cp -r "$root/examples/pix/domain" "$root/examples/pix/package.json" "$root/examples/pix/package-lock.json" "$dir/"
for p in 1 2; do
  for v in none identity pix; do
    case $v in
      none) fn="" ;;
      identity) fn="    function: { runtime: node, module: ./id.js, export: identity }" ;;
      pix) fn="    function: { runtime: node, module: ./domain/charges.ts, export: chargeEvent }" ;;
    esac
    cat > "$dir/$v-$p.yaml" <<YAML
pipeline:
  name: bench-$v-$p
  parallelism: $p
  checkpoint: { interval: 1s, storage: "$dir/chk-$v-$p" }
source:
  type: files
  path: $dir/in
transform:
  - match: "payments.public.charges"
    key: key.id
$fn
sink:
  events: { type: files, path: "$dir/out-$v-$p" }
YAML
    if [ "$v" = pix ] && [ ! -d "$dir/node_modules" ]; then (cd "$dir" && npm ci --silent >/dev/null); fi
    (cd "$dir" && /usr/bin/time -f "$v p=$p: wall %e s, user %U s, sys %S s, peak RSS %M KiB" "$sluice" run "$v-$p.yaml" 2>&1 |
      grep -E "FINISHED after|peak RSS" | grep -v '\[sluice\]' | sed "s/^/$v p=$p: /")
    rm -rf "$dir/out-$v-$p" "$dir/chk-$v-$p"
  done
done
