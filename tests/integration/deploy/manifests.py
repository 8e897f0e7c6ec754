#!/usr/bin/env python3
"""Reads manifests rendered from deploy/helm/sluice (tests/integration/deploy/helm_chart_test.sh).

  manifests.py check FILE [--jobmanagers N] [--taskmanagers N] [--slots N] [--ha] [--etcd] [--env NAME ...]
                         [--configmap NAME]
      Checks what the chart promises beyond the schema: the objects there are, replicas, slots, probes on /health,
      resource requests, the pipeline ConfigMap mounted in every pod, secrets as env, the same -D options on every
      process. Prints each failed check; exit 1 if any.
  manifests.py exec FILE COMPONENT --binary PATH --pod-ip IP --pipeline-dest PATH [--host NAME=ADDR ...]
      Runs the container of the `COMPONENT` (jobmanager, taskmanager) Deployment as the kubelet would: its env
      (fieldRef status.podIP -> --pod-ip, secretKeyRef and envFrom -> the rendered Secrets' stringData), $(VAR) in
      its args expanded from that env, the pipeline ConfigMap written to --pipeline-dest (its mount path in the args
      replaced by it), `command` replaced by --binary, and each NAME of --host replaced by ADDR (no cluster DNS).
"""
import argparse
import os
import re
import sys

import yaml

MOUNT = "/etc/sluice/pipeline.yaml"


def load(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def find(docs, kind, suffix):
    for d in docs:
        if d["kind"] == kind and d["metadata"]["name"].endswith(suffix):
            return d
    return None


def container(docs, component):
    dep = find(docs, "Deployment", "-" + component)
    if dep is None:
        sys.exit(f"no Deployment *-{component} in the manifests")
    return dep, dep["spec"]["template"]["spec"]["containers"][0]


def secrets(docs):
    return {d["metadata"]["name"]: d.get("stringData", {}) for d in docs if d["kind"] == "Secret"}


def d_options(args):
    return [args[i + 1] for i, a in enumerate(args) if a == "-D"]


def check(a):
    docs = load(a.file)
    errors = []

    def expect(cond, what):
        if not cond:
            errors.append(what)

    jm_dep, jm = container(docs, "jobmanager")
    tm_dep, tm = container(docs, "taskmanager")
    expect(jm_dep["spec"]["replicas"] == a.jobmanagers, f"JobManager replicas {jm_dep['spec']['replicas']} != {a.jobmanagers}")
    expect(tm_dep["spec"]["replicas"] == a.taskmanagers, f"TaskManager replicas {tm_dep['spec']['replicas']} != {a.taskmanagers}")
    expect(jm["args"][:2] == ["jobmanager", MOUNT], f"JobManager args start {jm['args'][:2]}")
    expect(tm["args"][:2] == ["taskmanager", MOUNT], f"TaskManager args start {tm['args'][:2]}")
    slots = tm["args"][tm["args"].index("--slots") + 1] if "--slots" in tm["args"] else None
    expect(slots == str(a.slots), f"TaskManager --slots {slots} != {a.slots}")
    cm = find(docs, "ConfigMap", "-pipeline")
    if a.configmap:  # the user's own ConfigMap: the chart renders none
        expect(cm is None, "a pipeline ConfigMap is rendered although pipeline.existingConfigMap is set")
        cm_name = a.configmap
    else:
        expect(cm is not None and "pipeline.yaml" in cm["data"], "no ConfigMap *-pipeline with pipeline.yaml")
        if cm is not None:
            yaml.safe_load(cm["data"]["pipeline.yaml"])  # the pipeline file is YAML
        cm_name = (cm or {}).get("metadata", {}).get("name")
    for name, (dep, c) in {"JobManager": (jm_dep, jm), "TaskManager": (tm_dep, tm)}.items():
        # Readiness on /health for both; liveness on /health for TaskManagers, on the RPC port for JobManagers (a
        # standby serves no HTTP: it binds its RPC port, then campaigns).
        probes = ("readinessProbe", "livenessProbe") if name == "TaskManager" else ("readinessProbe",)
        for probe in probes:
            path = c.get(probe, {}).get("httpGet", {}).get("path")
            expect(path == "/health", f"{name} {probe} is not an httpGet of /health: {c.get(probe)}")
        if name == "JobManager":
            expect(c.get("livenessProbe", {}).get("tcpSocket", {}).get("port") == "rpc",
                   f"JobManager livenessProbe is not a tcpSocket on rpc: {c.get('livenessProbe')}")
        req = c.get("resources", {}).get("requests", {})
        expect("memory" in req and "cpu" in req, f"{name} has no cpu and memory requests")
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        expect(mounts.get("/etc/sluice") == "pipeline", f"{name} does not mount the pipeline at /etc/sluice")
        vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        expect(vols.get("pipeline", {}).get("configMap", {}).get("name") == cm_name,
               f"{name}'s pipeline volume is not the ConfigMap {cm_name}")
        env = {e["name"] for e in c.get("env", [])}
        for ref in c.get("envFrom", []):
            env |= set(secrets(docs).get(ref["secretRef"]["name"], {}).keys())
        for want in a.env:
            expect(want in env, f"{name} lacks the environment variable {want}")
        expect(c["securityContext"].get("readOnlyRootFilesystem") is True, f"{name} root filesystem is writable")
    # Every process gets the same options (the job graph fingerprint and engine options must match).
    common_jm = [o for o in d_options(jm["args"])
                 if not o.startswith(("jobmanager.", "rest.", "execution.state-recovery."))]
    common_tm = [o for o in d_options(tm["args"]) if not o.startswith("taskmanager.")]
    expect(common_jm == common_tm, f"-D options differ: JobManager {common_jm}, TaskManager {common_tm}")
    ha = [o for o in common_jm if o.startswith("high-availability.")]
    if a.ha:
        expect("high-availability.type=etcd" in ha, "high availability is not on")
        expect(any(o.startswith("high-availability.etcd.endpoints=http") for o in ha), "no etcd endpoints")
        expect("--jobmanager" not in tm["args"], "a TaskManager with high availability has a fixed --jobmanager")
    else:
        expect(not ha, f"high-availability options without high availability: {ha}")
        expect("--jobmanager" in tm["args"], "a TaskManager without high availability has no --jobmanager")
    svc = find(docs, "Service", "-jobmanager")
    expect(svc is not None and {p["name"] for p in svc["spec"]["ports"]} == {"rest", "rpc"},
           "no Service *-jobmanager with the rest and rpc ports")
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    expect(any(p["metadata"]["name"].endswith("-taskmanager") for p in pdbs), "no TaskManager PodDisruptionBudget")
    etcd = find(docs, "StatefulSet", "-etcd")
    expect((etcd is not None) == a.etcd, f"the chart's etcd StatefulSet {'missing' if a.etcd else 'rendered'}")
    for e in errors:
        print(f"{a.file}: {e}")
    return 1 if errors else 0


def run(a):
    docs = load(a.file)
    _, c = container(docs, a.component)
    cm = find(docs, "ConfigMap", "-pipeline")
    with open(a.pipeline_dest, "w", encoding="utf-8") as f:
        f.write(cm["data"]["pipeline.yaml"])
    sec = secrets(docs)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    for ref in c.get("envFrom", []):
        env.update(sec[ref["secretRef"]["name"]])
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e["valueFrom"].get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[e["name"]] = a.pod_ip
        elif "secretKeyRef" in e["valueFrom"]:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = sec[ref["name"]][ref["key"]]
        else:
            sys.exit(f"env {e['name']}: {e['valueFrom']} is not emulated")
    hosts = dict(h.split("=", 1) for h in a.host)

    def expand(arg):
        arg = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), arg)
        for name, addr in hosts.items():
            arg = arg.replace(name + ":", addr + ":")
        return a.pipeline_dest if arg == MOUNT else arg

    argv = [a.binary] + [expand(x) for x in c["args"]]
    print("exec:", " ".join(argv), flush=True)
    os.execve(a.binary, argv, env)


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("file")
    c.add_argument("--jobmanagers", type=int, default=2)
    c.add_argument("--taskmanagers", type=int, default=2)
    c.add_argument("--slots", type=int, default=2)
    c.add_argument("--ha", action="store_true")
    c.add_argument("--etcd", action="store_true")
    c.add_argument("--env", action="append", default=[])
    c.add_argument("--configmap", help="the pipeline ConfigMap is the user's, of this name")
    e = sub.add_parser("exec")
    e.add_argument("file")
    e.add_argument("component")
    e.add_argument("--binary", required=True)
    e.add_argument("--pod-ip", required=True)
    e.add_argument("--pipeline-dest", required=True)
    e.add_argument("--host", action="append", default=[])
    a = p.parse_args()
    return check(a) if a.cmd == "check" else run(a)


if __name__ == "__main__":
    sys.exit(main())
