#!/usr/bin/env bash
# Functions on Node.js workers (issue 17; docs/benchmarks.md): `sluice run` of N change events from a files source
# into a files sink, without a function, with an identity function (defaults), and with batch-size 2048 /
# max-in-flight 4. Prints each run's "FINISHED after" line and /usr/bin/time's wall, CPU and peak RSS.
# Usage: bench/functions_bench.sh [SLUICE_BINARY] [N=200000]
set -euo pipefail
sluice=${1:-build/release/apps/sluice/sluice}
sluice=$(realpath "$sluice")
n=${2:-200000}
dir=$(mktemp -d /tmp/sluice-functions-bench-XXXXXX)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/in"
python3 - "$dir/in/changes.jsonl" "$n" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        e = i % 1000
        f.write(json.dumps({"op": "u", "key": {"id": f"ch_{e}"}, "before": None,
                            "after": {"id": f"ch_{e}", "status": "paid", "amount": i, "customer_id": f"cus_{e % 97}"},
                            "source": {"connector": "postgres", "db": "payments", "collection": "public.charges",
                                       "position": f"0/{i + 1:X}", "ts_ms": 1790000000000, "snapshot": False,
                                       "txn_id": i, "sequence": 0}}) + "\n")
PY
echo 'exports.identity = (c) => c.after;' > "$dir/id.js"
for v in none fn fn2; do
  case $v in
    none) fn="" ;;
    fn) fn="    function: { runtime: node, module: ./id.js, export: identity }" ;;
    fn2) fn="    function: { runtime: node, module: ./id.js, export: identity, batch-size: 2048, max-in-flight: 4 }" ;;
  esac
  cat > "$dir/$v.yaml" <<YAML
pipeline:
  name: bench-$v
  parallelism: 1
  checkpoint: { interval: 1s, storage: "$dir/chk-$v" }
source:
  type: files
  path: $dir/in
transform:
  - match: "payments.public.charges"
    key: key.id
$fn
sink:
  events: { type: files, path: "$dir/out-$v" }
YAML
  (cd "$dir" && /usr/bin/time -f "$v: wall %e s, user %U s, sys %S s, peak RSS %M KiB" "$sluice" run "$v.yaml" 2>&1 |
    grep -E "FINISHED after|peak RSS" | grep -v '\[sluice\]')
done
