#!/usr/bin/env bash
# The Kubernetes deployment (deploy/helm/sluice, deploy/kubernetes/; docs/kubernetes.md), checked with tools that run
# here (no Kubernetes cluster and no container engine):
#   1. helm lint --strict of the chart with several values combinations;
#   2. helm template of each, validated against Kubernetes' JSON schemas (kubernetes-validate --strict: unknown
#      fields, wrong types, missing required fields) and checked by manifests.py beside this file (replicas, slots,
#      probes, requests, the pipeline ConfigMap, secrets as env, the same -D options on every process); values the
#      chart must refuse (two JobManagers without high availability, high availability without etcd, ...);
#   3. deploy/kubernetes/*.yaml are what the chart renders (deploy/kubernetes/render --check);
#   4. the rendered JobManager and TaskManager containers run: their command lines, env and pipeline file, as the
#      kubelet would start them (manifests.py exec), with the real `sluice` against the S3 server of
#      scripts/services/s3 on loopback: the job runs on two TaskManagers, the JobManager's and TaskManagers' /health
#      answer 200, a checkpoint completes on S3, a TaskManager's /health answers 503 once its JobManager is gone, and
#      a JobManager rendered with restoreFrom = the job's checkpoint directory starts from its latest checkpoint;
#      an upgrade with a savepoint (sluice stop, then restoreFrom) checked by sluice verify;
#   5. with high availability on a private etcd: two JobManagers, a leader and a standby (its RPC port open for the
#      liveness probe, no /health), TaskManagers finding the leader through etcd; kill -9 of the leader: the standby
#      resumes the same job from the checkpoint pointer and the TaskManagers register with it.
# Usage: tests/integration/deploy/helm_chart_test.sh SLUICE_BINARY   (S3_ENDPOINT from scripts/services/run-with s3)
# Exit 77 (ctest: skipped) when helm or kubernetes-validate is not installed: scripts/setup installs both.
set -euo pipefail
sluice=$1
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
chart="$root/deploy/helm/sluice"
# shellcheck source=deploy/kubernetes/tools.sh
. "$root/deploy/kubernetes/tools.sh"
if ! helm="$(sluice_find_helm)"; then
  echo "SKIPPED: helm is not installed (scripts/setup installs helm $SLUICE_HELM_VERSION into $SLUICE_TOOLS_DIR)"
  exit 77
fi
if ! validate="$(sluice_find_k8s_validate)"; then
  echo "SKIPPED: kubernetes-validate is not installed (scripts/setup installs it into $SLUICE_TOOLS_DIR)"
  exit 77
fi
python="$(dirname "$validate")/python"  # the validator's virtualenv has PyYAML
[ -x "$python" ] || python=python3
work="$(mktemp -d /tmp/sluice-helm-test.XXXXXX)"
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${etcd_dir:-}" ]; then SLUICE_SERVICES_DIR="$etcd_dir" "$root/scripts/services/etcd" stop >/dev/null 2>&1 || true; fi
  if [ $rc = 0 ] && [ -z "${SLUICE_KEEP_TEST_DIR:-}" ]; then rm -rf "$work"; else echo "kept $work (logs, rendered manifests)"; fi
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
echo "helm: $("$helm" version --short); kubernetes-validate $("$validate" --version 2>&1 | tail -1)"

# --- 1-2: lint, render, validate, check each values combination ------------------------------------------------
cat >"$work/values-existing-etcd.yaml" <<'YAML'
etcd: { enabled: false }
highAvailability: { etcdEndpoints: "http://etcd-0.etcd:2379,http://etcd-1.etcd:2379,http://etcd-2.etcd:2379", clusterId: payments }
taskmanager: { replicas: 5, numberOfTaskSlots: 4 }
s3: { endpoint: "http://minio.storage:9000", pathStyleAccess: true, region: eu-west-1, existingSecret: s3-credentials }
secrets:
  env: { POSTGRES_URL: "postgresql://app:secret@db:5432/shop" }
  existingSecrets: [kafka-credentials]
config: { heartbeat.timeout: "10s", execution.checkpointing.tolerable-failed-checkpoints: "3" }
restoreFrom: "s3://sluice/savepoints/savepoint-abc"
restAuth: { existingSecret: sluice-rest-tokens, readToken: true }
YAML
cat >"$work/values-own-configmap.yaml" <<'YAML'
pipeline: { existingConfigMap: my-pipeline, file: "" }
jobmanager: { replicas: 1, podDisruptionBudget: { enabled: false } }
highAvailability: { enabled: false }
etcd: { enabled: false }
s3: { accessKeyId: AKIAEXAMPLE, secretAccessKey: example-secret }
checkpoints: { dir: "", savepointDir: "" }
YAML
# name | helm arguments | manifests.py check arguments
combos=(
  "defaults||--jobmanagers 2 --taskmanagers 2 --slots 2 --ha --etcd"
  "no-ha|-f $root/deploy/kubernetes/values-no-ha.yaml|--jobmanagers 1 --taskmanagers 2 --slots 2"
  "existing-etcd|-f $work/values-existing-etcd.yaml|--jobmanagers 2 --taskmanagers 5 --slots 4 --ha --env POSTGRES_URL --env AWS_SECRET_ACCESS_KEY"
  "own-configmap|-f $work/values-own-configmap.yaml --set taskmanager.replicas=3|--jobmanagers 1 --taskmanagers 3 --slots 2 --env AWS_ACCESS_KEY_ID --configmap my-pipeline"
)
for combo in "${combos[@]}"; do
  IFS='|' read -r name args checks <<<"$combo"
  # shellcheck disable=SC2086
  "$helm" lint --strict "$chart" $args >"$work/lint-$name.log" 2>&1 || { cat "$work/lint-$name.log"; fail "helm lint ($name)"; }
  # shellcheck disable=SC2086
  "$helm" template sluice "$chart" --namespace sluice $args >"$work/$name.yaml" 2>"$work/template-$name.log" ||
    { cat "$work/template-$name.log"; fail "helm template ($name)"; }
  "$validate" --strict --quiet "$work/$name.yaml" >"$work/validate-$name.log" 2>&1 ||
    { cat "$work/validate-$name.log"; fail "kubernetes-validate ($name)"; }
  # shellcheck disable=SC2086
  "$python" "$root/tests/integration/deploy/manifests.py" check "$work/$name.yaml" $checks || fail "manifest checks ($name)"
  echo "ok: $name: lint, template ($(grep -c '^kind:' "$work/$name.yaml") objects), schema, checks"
done

# Values the chart must refuse, with a message saying why.
refuse() {  # what expected-message helm-args...
  local what=$1 msg=$2
  shift 2
  if "$helm" template sluice "$chart" "$@" >"$work/refused.log" 2>&1; then fail "helm template accepted $what"; fi
  grep -q "$msg" "$work/refused.log" || { cat "$work/refused.log"; fail "refusing $what does not say '$msg'"; }
  echo "ok: refused $what"
}
refuse "2 JobManagers without high availability" "needs highAvailability.enabled" --set highAvailability.enabled=false
refuse "high availability without etcd" "needs highAvailability.etcdEndpoints" --set etcd.enabled=false
refuse "an S3 access key without its secret" "s3.secretAccessKey goes with s3.accessKeyId" --set s3.accessKeyId=A

# --- 3: the committed manifests are current -----------------------------------------------------------------------
HELM="$helm" "$root/deploy/kubernetes/render" --check || fail "deploy/kubernetes/ is not current"
for f in "$root"/deploy/kubernetes/sluice*.yaml; do
  "$validate" --strict --quiet "$f" || fail "kubernetes-validate $f"
done
echo "ok: deploy/kubernetes/ is what the chart renders, and validates"

# --- 4: the rendered containers run ------------------------------------------------------------------------------
[ -n "${S3_ENDPOINT:-}" ] || fail "S3_ENDPOINT is not set: run under scripts/services/run-with s3"
free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
jm_rpc=$(free_port); jm_rest=$(free_port)
bucket="sluice-deploy-test"
prefix="run-$(date +%s)-$$"
curl -sf -X PUT "$S3_ENDPOINT/$bucket" >/dev/null || curl -sf "$S3_ENDPOINT/$bucket" >/dev/null ||
  fail "cannot create bucket $bucket on $S3_ENDPOINT"
cat >"$work/pipeline.yaml" <<'YAML'
pipeline:
  name: helm-chart-test
  parallelism: 4
  checkpoint: { interval: 500ms }
  delivery: exactly-once
source: { type: datagen, count: 0, rate: 200, entities: 50, seed: 3 }
transform:
  - match: "*.*.*"
    key: after.id
    event:
      payload: "after.id AS id, after.revision AS revision"
sink:
  out: { type: files, path: "${SINK_DIR}", rolling-policy: { rollover-interval: 300ms } }
YAML
# Both TaskManagers run on this machine: each gets its own ports (one pod IP each on Kubernetes). The secret key
# must not show in any log.
secret_key="deploy-test-$RANDOM$RANDOM"
render_run() {  # file tm_rpc tm_data tm_http
  "$helm" template sluice "$chart" --namespace sluice -f "$root/deploy/kubernetes/values-no-ha.yaml" \
    --set-file pipeline.file="$work/pipeline.yaml" \
    --set jobmanager.rpcPort="$jm_rpc",jobmanager.restPort="$jm_rest" \
    --set taskmanager.rpcPort="$2",taskmanager.dataPort="$3",taskmanager.httpPort="$4" \
    --set checkpoints.dir="s3://$bucket/$prefix/checkpoints",checkpoints.savepointDir="s3://$bucket/$prefix/savepoints" \
    --set s3.endpoint="$S3_ENDPOINT",s3.pathStyleAccess=true,s3.region=us-east-1 \
    --set s3.accessKeyId=deploy-test-key,s3.secretAccessKey="$secret_key" \
    --set secrets.env.SINK_DIR="$work/out" >"$1"
}
tm_ports=()
for i in 1 2; do
  tm_ports[$i]="$(free_port) $(free_port) $(free_port)"
  # shellcheck disable=SC2086
  render_run "$work/run-tm$i.yaml" ${tm_ports[$i]}
done
start() {  # name file component
  "$python" "$root/tests/integration/deploy/manifests.py" exec "$2" "$3" --binary "$sluice" --pod-ip 127.0.0.1 \
    --pipeline-dest "$work/$1-pipeline.yaml" --host sluice-jobmanager=127.0.0.1 >"$work/$1.log" 2>&1 &
  pids+=($!)
}
wait_for() {  # what seconds command...
  local what=$1 deadline=$((SECONDS + $2))
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { tail -n 20 "$work"/*.log; fail "timed out waiting for $what"; }
    sleep 0.2  # polling a condition with a deadline
  done
}
http_status() { curl -s -o /dev/null -w '%{http_code}' "$1"; }
is_status() { [ "$(http_status "$1")" = "$2" ]; }

start jm "$work/run-tm1.yaml" jobmanager
jm_pid=${pids[-1]}
wait_for "the JobManager's REST API" 30 curl -sf "http://127.0.0.1:$jm_rest/jobs"
is_status "http://127.0.0.1:$jm_rest/health" 503 || fail "JobManager /health is not 503 before any TaskManager"
read -r _ _ tm1_http <<<"${tm_ports[1]}"
read -r _ _ tm2_http <<<"${tm_ports[2]}"
start tm1 "$work/run-tm1.yaml" taskmanager
start tm2 "$work/run-tm2.yaml" taskmanager
wait_for "TaskManager 1's /health 200 (registered)" 30 is_status "http://127.0.0.1:$tm1_http/health" 200
wait_for "TaskManager 2's /health 200 (registered)" 30 is_status "http://127.0.0.1:$tm2_http/health" 200
curl -s "http://127.0.0.1:$tm1_http/metrics" | grep -q '^sluice_taskmanager_slots{.*} 2$' || fail "TaskManager /metrics"
wait_for "the job RUNNING with /health 200" 60 is_status "http://127.0.0.1:$jm_rest/health" 200
job=$(curl -s "http://127.0.0.1:$jm_rest/jobs" | "$python" -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["id"])')
completed() {
  curl -s "http://127.0.0.1:$jm_rest/jobs/$job/checkpoints" |
    "$python" -c 'import json,sys; d=json.load(sys.stdin); sys.exit(0 if d["counts"]["completed"] >= 1 else 1)'
}
wait_for "a completed checkpoint" 60 completed
path=$(curl -s "http://127.0.0.1:$jm_rest/jobs/$job/checkpoints" |
  "$python" -c 'import json,sys; print(json.load(sys.stdin)["latest"]["completed"]["external_path"])')
case "$path" in "s3://$bucket/$prefix/checkpoints/"*) ;; *) fail "checkpoint at $path, not on S3" ;; esac
# Older checkpoints are deleted as newer ones complete (execution.checkpointing.num-retained): list the bucket.
curl -sf "$S3_ENDPOINT/$bucket?list-type=2&prefix=$prefix/checkpoints/" | grep -q "/chk-[0-9]*/_metadata</Key>" ||
  fail "no chk-<n>/_metadata in s3://$bucket/$prefix/checkpoints/"
echo "ok: the rendered JobManager and 2 TaskManagers run the job; checkpoint at $path"

# The JobManager goes away: a TaskManager's /health turns 503 (its readiness probe fails) and says why.
kill -TERM "$jm_pid"
wait_for "TaskManager 1's /health 503 without its JobManager" 30 is_status "http://127.0.0.1:$tm1_http/health" 503
curl -s "http://127.0.0.1:$tm1_http/health" | grep -q "not registered with a JobManager" || fail "TaskManager /health reason"
! grep -l "$secret_key" "$work"/*.log || fail "the S3 secret key is in a log"
! grep "is not an engine option" "$work"/jm.log "$work"/tm1.log || fail "a rendered -D option is not known"
grep -q "REST API at http://0.0.0.0:$jm_rest" "$work/jm.log" || fail "the REST API is not bound to rest.address 0.0.0.0"
echo "ok: TaskManager /health 503 once the JobManager is gone; no secret in the logs"

# restoreFrom (execution.state-recovery.path, the upgrade path of docs/kubernetes.md) with the job's checkpoint
# directory: a new JobManager starts from its latest checkpoint and the waiting TaskManagers register with it.
"$helm" template sluice "$chart" --namespace sluice -f "$root/deploy/kubernetes/values-no-ha.yaml" \
  --set-file pipeline.file="$work/pipeline.yaml" --set jobmanager.rpcPort="$jm_rpc",jobmanager.restPort="$jm_rest" \
  --set checkpoints.dir="s3://$bucket/$prefix/checkpoints2" --set restoreFrom="s3://$bucket/$prefix/checkpoints/$job" \
  --set s3.endpoint="$S3_ENDPOINT",s3.pathStyleAccess=true,s3.region=us-east-1 \
  --set s3.accessKeyId=deploy-test-key,s3.secretAccessKey="$secret_key" \
  --set secrets.env.SINK_DIR="$work/out" >"$work/run-restore.yaml"
start jm-restore "$work/run-restore.yaml" jobmanager
wait_for "the restored job RUNNING with /health 200" 60 is_status "http://127.0.0.1:$jm_rest/health" 200
grep -q "starts from checkpoint [0-9]* (s3://$bucket/$prefix/checkpoints/$job/chk-" "$work/jm-restore.log" ||
  fail "the JobManager with restoreFrom did not start from the job's latest checkpoint"
echo "ok: restoreFrom: $(grep -o "starts from checkpoint [0-9]*" "$work/jm-restore.log")"

# Upgrade with a savepoint (docs/kubernetes.md): sluice stop with a savepoint on S3, then the new version rendered
# with restoreFrom = the savepoint and a changed pipeline file (which replaces the TaskManagers too). Its JobManager starts from the stop's savepoint; stopped with a savepoint in turn, the committed output of
# the three runs holds every change once, per key in order (sluice verify).
job=$(curl -s "http://127.0.0.1:$jm_rest/jobs" | "$python" -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["id"])')
stop_with_savepoint() {  # prints the savepoint's path
  "$sluice" stop -m "127.0.0.1:$jm_rest" --savepoint-dir "s3://$bucket/$prefix/savepoints" --timeout 60 "$1" \
    >"$work/stop-$1.log" 2>&1 || { cat "$work/stop-$1.log"; fail "sluice stop $1"; }
  sed -n 's/^Savepoint completed. Path: //p' "$work/stop-$1.log"
}
savepoint=$(stop_with_savepoint "$job")
case "$savepoint" in "s3://$bucket/$prefix/savepoints/savepoint-"*) ;; *) fail "savepoint at '$savepoint'" ;; esac
# Version 2 of the pipeline: a higher rate, the same parallelism (sluice verify reads each subtask's files in name
# order, so a key must stay in one subtask's files for its order to be checked; rescaling is cluster_savepoint_test's).
sed 's/rate: 200/rate: 300/' "$work/pipeline.yaml" >"$work/pipeline-v2.yaml"
upgrade_render() {  # file tm_rpc tm_data tm_http
  "$helm" template sluice "$chart" --namespace sluice -f "$root/deploy/kubernetes/values-no-ha.yaml" \
    --set-file pipeline.file="$work/pipeline-v2.yaml" --set jobmanager.rpcPort="$jm_rpc",jobmanager.restPort="$jm_rest" \
    --set taskmanager.rpcPort="$2",taskmanager.dataPort="$3",taskmanager.httpPort="$4" \
    --set checkpoints.dir="s3://$bucket/$prefix/checkpoints3" --set restoreFrom="$savepoint" \
    --set checkpoints.savepointDir="s3://$bucket/$prefix/savepoints" \
    --set s3.endpoint="$S3_ENDPOINT",s3.pathStyleAccess=true,s3.region=us-east-1 \
    --set s3.accessKeyId=deploy-test-key,s3.secretAccessKey="$secret_key" \
    --set secrets.env.SINK_DIR="$work/out" >"$1"
}
# shellcheck disable=SC2046
upgrade_render "$work/run-v2-tm1.yaml" $(free_port) $(free_port) $(free_port)
# shellcheck disable=SC2046
upgrade_render "$work/run-v2-tm2.yaml" $(free_port) $(free_port) $(free_port)
jm_gone() { ! curl -s -o /dev/null "http://127.0.0.1:$jm_rest/jobs"; }
# The job ends FINISHED once its sinks committed; then the JobManager exits (within 10 s, docs/cluster.md).
wait_for "the stopped JobManager to exit" 30 jm_gone
for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done  # the old TaskManagers
start jm-v2 "$work/run-v2-tm1.yaml" jobmanager
start tm-v2-1 "$work/run-v2-tm1.yaml" taskmanager
start tm-v2-2 "$work/run-v2-tm2.yaml" taskmanager
wait_for "the upgraded job RUNNING with /health 200" 60 is_status "http://127.0.0.1:$jm_rest/health" 200
grep -q "starts from stop-with-savepoint [0-9]* ($savepoint" "$work/jm-v2.log" ||
  fail "the upgraded JobManager did not start from the savepoint $savepoint"
job=$(curl -s "http://127.0.0.1:$jm_rest/jobs" | "$python" -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["id"])')
wait_for "a completed checkpoint of the upgraded job" 60 completed
# A part file is committed by the first checkpoint after the rolling policy finished it (rollover-interval 300 ms);
# a stop without drain leaves the in-progress file to the next run. Each run here lasts well under a second, so on
# a fast machine every checkpoint of the three runs could come before a rollover and nothing would be committed
# (seen: `sluice verify` found no record, 1 run in 8). The upgraded job runs until one part file is committed.
committed_part_file() { compgen -G "$work/out/part-*" >/dev/null; }
wait_for "a committed part file" 60 committed_part_file
final=$(stop_with_savepoint "$job")
wait_for "the upgraded JobManager to exit" 30 jm_gone
"$sluice" verify --files "$work/out" --id-field id --key-field entity --seq-field payload.revision \
  >"$work/verify.log" 2>&1 || { cat "$work/verify.log"; fail "sluice verify of the output across the upgrade"; }
echo "ok: upgrade with a savepoint from $savepoint, final savepoint $final;" \
  "$(grep -E '^(records|duplicated|missing):' "$work/verify.log" | tr -s ' ' | tr '\n' ' ')"
# --- 5: with high availability: two JobManagers on etcd, a leader and a standby --------------------------------
# A private one-member etcd (scripts/services/etcd with its own services dir), the default values' HA options
# pointing at it, a lease of 2 s. Each JobManager and TaskManager runs with its own ports (its own pod IP on
# Kubernetes). The standby binds its RPC port (the liveness probe) and serves no REST API (never ready); after
# kill -9 of the leader it leads, resumes the job from the checkpoint pointer and the TaskManagers register there.
etcd_dir="$work/services"
SLUICE_SERVICES_DIR="$etcd_dir" SLUICE_ETCD_MEMBERS=1 "$root/scripts/services/etcd" start >"$work/etcd-start.log" 2>&1 ||
  { cat "$work/etcd-start.log"; fail "etcd"; }
endpoints=$(SLUICE_SERVICES_DIR="$etcd_dir" "$root/scripts/services/etcd" env | sed -n 's/^ETCD_ENDPOINTS=//p')
[ -n "$endpoints" ] || fail "no etcd endpoints"
render_ha() {  # file jm_rpc jm_rest tm_rpc tm_data tm_http
  "$helm" template sluice "$chart" --namespace sluice \
    --set etcd.enabled=false --set highAvailability.etcdEndpoints="$endpoints" \
    --set highAvailability.clusterId="deploy-test-$$" --set highAvailability.leaseTtl=2s \
    --set-file pipeline.file="$work/pipeline.yaml" \
    --set jobmanager.rpcPort="$2",jobmanager.restPort="$3" \
    --set taskmanager.rpcPort="$4",taskmanager.dataPort="$5",taskmanager.httpPort="$6" \
    --set checkpoints.dir="s3://$bucket/$prefix-ha/checkpoints",checkpoints.savepointDir="s3://$bucket/$prefix-ha/savepoints" \
    --set s3.endpoint="$S3_ENDPOINT",s3.pathStyleAccess=true,s3.region=us-east-1 \
    --set s3.accessKeyId=deploy-test-key,s3.secretAccessKey="$secret_key" \
    --set secrets.env.SINK_DIR="$work/out-ha" >"$1"
}
declare -A rest_of rpc_of
for n in a b; do
  rpc_of[$n]=$(free_port); rest_of[$n]=$(free_port)
  render_ha "$work/ha-jm-$n.yaml" "${rpc_of[$n]}" "${rest_of[$n]}" 1 1 1
done
"$python" "$root/tests/integration/deploy/manifests.py" check "$work/ha-jm-a.yaml" --ha || fail "HA manifest checks"
for i in 1 2; do
  read -r r d h <<<"$(free_port) $(free_port) $(free_port)"
  tm_http_ha[$i]=$h
  render_ha "$work/ha-tm$i.yaml" 1 1 "$r" "$d" "$h"
done
start jm-a "$work/ha-jm-a.yaml" jobmanager; pid_of_a=${pids[-1]}
wait_for "JobManager a leading (REST API up)" 30 curl -sf "http://127.0.0.1:${rest_of[a]}/jobs"
start jm-b "$work/ha-jm-b.yaml" jobmanager; pid_of_b=${pids[-1]}
port_open() { "$python" -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 1)" "$1"; }
wait_for "the standby's RPC port (its liveness probe)" 30 port_open "${rpc_of[b]}"
is_status "http://127.0.0.1:${rest_of[b]}/health" 000 || fail "the standby serves /health: it would be ready"
start tm-ha1 "$work/ha-tm1.yaml" taskmanager
start tm-ha2 "$work/ha-tm2.yaml" taskmanager
wait_for "the HA job RUNNING with /health 200" 60 is_status "http://127.0.0.1:${rest_of[a]}/health" 200
for i in 1 2; do is_status "http://127.0.0.1:${tm_http_ha[$i]}/health" 200 || fail "HA TaskManager $i not registered"; done
jm_rest=${rest_of[a]}
job=$(curl -s "http://127.0.0.1:$jm_rest/jobs" | "$python" -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["id"])')
wait_for "a completed checkpoint (HA)" 60 completed
kill -KILL "$pid_of_a"
wait "$pid_of_a" 2>/dev/null || true  # reaped here, so the shell reports no "Killed"
jm_rest=${rest_of[b]}
wait_for "the standby leading, the job RUNNING again" 60 is_status "http://127.0.0.1:$jm_rest/health" 200
job_b=$(curl -s "http://127.0.0.1:$jm_rest/jobs" | "$python" -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["id"])')
[ "$job_b" = "$job" ] || fail "the new leader runs job $job_b, not the job $job it took over"
for i in 1 2; do
  wait_for "HA TaskManager $i registered with the new leader" 30 is_status "http://127.0.0.1:${tm_http_ha[$i]}/health" 200
done
grep -q "resumes from checkpoint" "$work/jm-b.log" || fail "the new leader did not resume from the checkpoint pointer"
echo "ok: with high availability: standby not ready but live, took over job $job after kill -9 of the leader"

echo "helm_chart_test: all checks passed"
