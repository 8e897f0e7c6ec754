#!/bin/bash
# Idle RSS of a cluster JobManager and TaskManager with one small pipeline deployed (issue 21; docs/benchmarks.md,
# "Cluster processes: idle memory"). Starts `sluice jobmanager` and one `sluice taskmanager` (1 slot) on free ports with
# a datagen (10 records/s) -> files pipeline without checkpoints, waits until the job runs plus 10 s, and prints per
# process VmRSS (anon / file-backed), Pss and private memory from /proc, then stops both.
#   bench/cluster_idle_rss.sh build/release/apps/sluice/sluice [VAR=value ...]   # e.g. MALLOC_ARENA_MAX=1
set -u
sluice=$1; shift
d=$(mktemp -d /tmp/sluice-idle-rss.XXXX)
cat > $d/p.yaml <<YAML
pipeline:
  name: rss-idle
  parallelism: 1
  checkpoint: { interval: 0 }
source: { type: datagen, count: 0, rate: 10, entities: 10, seed: 7 }
transform:
  - match: "*.*.*"
    key: after.id
sink:
  out:
    type: files
    path: "$d/out"
YAML
env "$@" $sluice jobmanager $d/p.yaml --rpc-port 0 --rest-port 0 > $d/jm.log 2>&1 &
jm=$!
for i in $(seq 100); do grep -q "JobManager RPC at" $d/jm.log && break; sleep 0.2; done
addr=$(grep -o "JobManager RPC at [0-9.:]*" $d/jm.log | awk '{print $4}')
env "$@" $sluice taskmanager $d/p.yaml --jobmanager $addr --slots 1 > $d/tm.log 2>&1 &
tm=$!
for i in $(seq 150); do grep -q "RUNNING" $d/jm.log && break; sleep 0.2; done
sleep 10
for p in $jm $tm; do
  name=$([ $p = $jm ] && echo JM || echo TM)
  rss=$(awk '/VmRSS/{print $2}' /proc/$p/status); thr=$(awk '/Threads/{print $2}' /proc/$p/status)
  anon=$(awk '/RssAnon/{print $2}' /proc/$p/status); file=$(awk '/RssFile/{print $2}' /proc/$p/status)
  pss=$(awk '/^Pss:/{print $2}' /proc/$p/smaps_rollup); priv=$(awk '/^Private_(Clean|Dirty):/{s+=$2} END{print s}' /proc/$p/smaps_rollup)
  echo "$name VmRSS ${rss} kB (RssAnon $anon, RssFile $file) Pss $pss kB Private $priv kB threads $thr"
done
cp /proc/$tm/smaps $d/tm.smaps 2>/dev/null; cp /proc/$jm/smaps $d/jm.smaps 2>/dev/null
kill $tm $jm 2>/dev/null; wait 2>/dev/null
echo "smaps of both in $d"
