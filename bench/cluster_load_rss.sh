#!/bin/bash
# Peak RSS of a cluster JobManager and two TaskManagers running a small checkpointed pipeline (issue 15 item 4: the
# Helm chart's resource requests are sized from these figures; docs/benchmarks.md, "Cluster mode: memory under a
# small pipeline"). Starts `sluice jobmanager` and two `sluice taskmanager` (SLOTS slots each) on free ports with a
# datagen (RATE changes/s over ENTITIES keys) -> key_by -> exactly-once files pipeline at parallelism 2*SLOTS with a
# checkpoint every second, lets it run SECONDS, then prints per process VmHWM (peak RSS), VmRSS (anon / file-backed)
# and threads from /proc, the number of completed checkpoints and the records written, and stops them (sleep is the run time, not a synchronisation).
#   bench/cluster_load_rss.sh build/release/apps/sluice/sluice          # RATE=20000 ENTITIES=10000 SLOTS=2 SECONDS=30
#   STORAGE=s3://bucket/prefix bench/cluster_load_rss.sh ...            # checkpoints on S3 (s3.* from -D in DOPTS)
set -u
sluice=$1
rate=${RATE:-20000}
entities=${ENTITIES:-10000}
slots=${SLOTS:-2}
seconds=${SECONDS_RUN:-30}
d=$(mktemp -d /tmp/sluice-load-rss.XXXX)
storage=${STORAGE:-$d/ckpt}
cat > $d/p.yaml <<YAML
pipeline:
  name: rss-load
  parallelism: $((2 * slots))
  checkpoint: { interval: 1s, storage: "$storage" }
  delivery: exactly-once
source: { type: datagen, count: 0, rate: $rate, entities: $entities, seed: 7 }
transform:
  - match: "*.*.*"
    key: after.id
    event:
      payload: "after.id AS id, after.revision AS revision"
sink:
  out: { type: files, path: "$d/out" }
YAML
# shellcheck disable=SC2086
$sluice jobmanager $d/p.yaml --rpc-port 0 --rest-port 0 ${DOPTS:-} > $d/jm.log 2>&1 &
jm=$!
for _ in $(seq 100); do grep -q "JobManager REST API at" $d/jm.log && break; sleep 0.2; done
addr=$(grep -o "JobManager RPC at [0-9.:]*" $d/jm.log | head -1 | awk '{print $4}')
rest=$(grep -o "REST API at http://[0-9.:]*" $d/jm.log | head -1 | awk '{print $4}')
# shellcheck disable=SC2086
$sluice taskmanager $d/p.yaml --jobmanager $addr --slots $slots ${DOPTS:-} > $d/tm1.log 2>&1 &
tm1=$!
# shellcheck disable=SC2086
$sluice taskmanager $d/p.yaml --jobmanager $addr --slots $slots ${DOPTS:-} > $d/tm2.log 2>&1 &
tm2=$!
for _ in $(seq 150); do grep -q "RUNNING" $d/jm.log && break; sleep 0.2; done
sleep "$seconds"  # a benchmark's run time, not a synchronisation
for p in $jm $tm1 $tm2; do
  case $p in $jm) name=JM ;; $tm1) name=TM1 ;; *) name=TM2 ;; esac
  hwm=$(awk '/VmHWM/{print $2}' /proc/$p/status); rss=$(awk '/VmRSS/{print $2}' /proc/$p/status)
  anon=$(awk '/RssAnon/{print $2}' /proc/$p/status); file=$(awk '/RssFile/{print $2}' /proc/$p/status)
  thr=$(awk '/Threads/{print $2}' /proc/$p/status)
  cpu=$(awk '{printf "%.1f", ($14+$15)/100}' /proc/$p/stat)
  echo "$name VmHWM $hwm kB VmRSS $rss kB (RssAnon $anon, RssFile $file) threads $thr CPU-s $cpu"
done
jobs_json=$(curl -s "$rest/jobs")
id=$(echo "$jobs_json" | grep -o '"id":"[0-9a-f]*"' | head -1 | cut -d'"' -f4)
echo "checkpoints: $(curl -s "$rest/jobs/$id/checkpoints" | grep -o '"completed":[0-9]*' | head -1)"
echo "records written (in-progress part files included): $(find $d/out -type f -exec cat {} + | wc -l)"
kill $tm1 $tm2 $jm 2>/dev/null
wait 2>/dev/null
echo "logs in $d"
