#!/usr/bin/env python3
"""JobManager failover with keyed state on S3 (issue 15, docs/benchmarks.md "Cluster mode: JobManager failover with
a standby"): kill -9 of the leader JobManager -> the standby leads -> the job RUNNING -> the first record processed
by the restored job, with --state-mb MiB of keyed state in checkpoints on S3. With --kill taskmanager (issue 21,
"Cluster mode: recovery after kill -9 of a TaskManager"): kill -9 of a TaskManager running tasks -> the JobManager
restarts the job on the remaining TaskManagers and a spare -> the first record processed by the restored tasks.

It starts, under a fresh directory of its own (printed; kept with --keep): a private etcd (scripts/services/etcd,
SLUICE_ETCD_MEMBERS members) and a private S3 server (scripts/services/s3, moto) through SLUICE_SERVICES_DIR, so the
shared instances are untouched and moto's memory is returned when it stops; two `sluice jobmanager`s (HA on etcd)
and --taskmanagers `sluice taskmanager`s of --slots slots. The pipeline:

    datagen (count 0, --rate records/s over E entities) -> transform (key: RPAD(after.id, --key-bytes, '.'))
    -> key_by -> entity-version (keyed ValueState<int64> per entity) -> print (the processes' stdout, read here)

A pipeline holds keyed state only through `entity-version` (docs/pipelines.md), one count per entity; the key padded
to --key-bytes makes each entry ~--key-bytes + 12 bytes in a checkpoint, so E = state-mb MiB / that, and the state's
entry count is the same order as `sluice-bench checkpoint state`'s (1 KiB values). Checkpoints go to
s3://<bucket>/ha-bench every --interval.

One run: wait for every entity to have been written once (E records out of the sinks) and for a completed checkpoint
triggered after that with state_size >= 90 % of the target (REST /jobs/:id/checkpoints of the leader); SIGKILL the
leader and time, from the kill, the standby's "is the leader" log line, its "RUNNING" line, and the first record a
sink prints after a TaskManager logged "attempt N deployed" for the new leader (every process's stdout and stderr
is one pipe read here on a thread of its own, each line stamped on arrival). Then the killed JobManager is started
again as the standby, the new leader completes a checkpoint of the restored state, and the next run kills it.
CPU-seconds (utime + stime from /proc) of each process over kill -> first record, and each process's VmHWM (peak
RSS) at the end, are printed beside the times; the load average at each kill too.

    bench/cluster_ha_failover.py --sluice build/release/apps/sluice/sluice --state-mb 100 --runs 5
    bench/cluster_ha_failover.py --sluice build/release/apps/sluice/sluice --state-mb 1024 --runs 3
    bench/cluster_ha_failover.py --sluice build/release/apps/sluice/sluice --state-mb 100 --runs 5 \
        --kill taskmanager --storage local

Needs: etcd (Debian's etcd-server), moto (scripts/services/s3 installs it into its cache dir once), curl.
Exit code 0 when every run completed (the target is reported, not asserted).
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def now():
    return time.monotonic()


class Proc:
    """A child process whose stdout and stderr go into one pipe read by a thread: log lines (spdlog's, they start
    with '[') are kept with their arrival time and written to ROLE.log; other lines are sink output, counted."""

    def __init__(self, role, args, env, log_path):
        self.role = role
        self.log = open(log_path, "ab")
        self.lines = []  # (arrival time, text) of log lines
        self.output_lines = 0
        self.lock = threading.Lock()
        self._armed = False  # set by arm(): look for a deployment, then the first output line after it
        self.deployed_at = None
        self.first_output_at = None
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, bufsize=0)
        self.pid = self.p.pid
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def arm(self):
        """From now on: the arrival of the next "attempt N deployed" log line, then of the first output line after
        it in the pipe (the pipe keeps the process's order: that record went through the restored tasks)."""
        with self.lock:
            self.deployed_at = None
            self.first_output_at = None
            self._armed = True

    def _read(self):
        fd = self.p.stdout.fileno()
        rest = b""
        deployed = re.compile(rb"attempt \d+ deployed")
        while True:
            chunk = os.read(fd, 1 << 16)
            t = now()
            if not chunk:
                break
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            logs = []
            with self.lock:
                for line in lines:
                    if line.startswith(b"["):
                        logs.append(line)
                        self.lines.append((t, line.decode("utf-8", "replace")))
                        if self._armed and self.deployed_at is None and deployed.search(line):
                            self.deployed_at = t
                    else:
                        self.output_lines += 1
                        if self._armed and self.deployed_at is not None and self.first_output_at is None:
                            self.first_output_at = t
                            self._armed = False
            if logs:
                self.log.write(b"\n".join(logs) + b"\n")
                self.log.flush()

    def find(self, pattern, after=0.0):
        """(arrival time, match) of the first log line matching `pattern` that arrived at or after `after`."""
        rx = re.compile(pattern)
        with self.lock:
            for t, line in self.lines:
                if t >= after:
                    m = rx.search(line)
                    if m:
                        return t, m
        return None

    def cpu_s(self):
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / CLK_TCK
        except OSError:
            return None

    def hwm_mib(self):
        return status_kib(self.pid, "VmHWM") / 1024 if self.alive() else None

    def alive(self):
        return self.p.poll() is None

    def kill(self, sig=signal.SIGKILL):
        if self.alive():
            os.kill(self.pid, sig)


def status_kib(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def pid_cpu_s(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except OSError:
        return None


def kill_watching(victim, watched):
    """Arms `watched` (see Proc.arm), SIGKILLs `victim` and reaps it; returns the kill's time and a function giving
    the arrival of the first record any watched process printed after its next deployment (None until then)."""
    for t in watched:
        t.arm()
    t_kill = now()
    victim.kill()
    victim.p.wait()

    def first_record():
        firsts = [t.first_output_at for t in watched if t.first_output_at is not None]
        return min(firsts) if firsts else None

    return t_kill, first_record


def wait_until(pred, timeout_s, what, step=0.01, alive=None):
    deadline = now() + timeout_s
    while True:
        r = pred()
        if r:
            return r
        if alive is not None and not alive.alive():
            raise RuntimeError(f"{alive.role} exited (code {alive.p.returncode}) while waiting for {what}: its log "
                               f"says why")
        if now() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(step)  # a benchmark driver's poll interval


def service(script, action, env):
    r = subprocess.run([os.path.join(REPO, "scripts/services", script), action], env=env, capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise RuntimeError(f"scripts/services/{script} {action} failed:\n{r.stderr}")
    return dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)


def http_json(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def fmt_ms(v):
    return f"{v * 1000:,.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sluice", required=True, help="the sluice binary (build/release/apps/sluice/sluice)")
    ap.add_argument("--state-mb", type=int, default=100, help="MiB of keyed state (default 100)")
    ap.add_argument("--runs", type=int, default=3, help="leader kills, one after the other (default 3)")
    ap.add_argument("--key-bytes", type=int, default=1000, help="bytes of each entity's key (default 1000)")
    ap.add_argument("--rate", type=int, default=10000, help="records/s of the source (default 10000)")
    ap.add_argument("--interval", default="2s", help="checkpoint interval (default 2s)")
    ap.add_argument("--checkpoint-timeout", default="2min", help="execution.checkpointing.timeout (default 2min)")
    ap.add_argument("--heartbeat-timeout", default="3s", help="heartbeat.timeout (default 3s, as the HA test's)")
    ap.add_argument("--lease-ttl", type=int, default=2, help="high-availability.etcd.lease-ttl in s (default 2)")
    ap.add_argument("--taskmanagers", type=int, default=2, help="TaskManagers (default 2)")
    ap.add_argument("--slots", type=int, default=1, help="slots per TaskManager = parallelism / TaskManagers")
    ap.add_argument("--storage", default="s3", choices=["s3", "local"], help="checkpoints on s3 (private moto) "
                    "or a local directory (default s3)")
    ap.add_argument("--local-recovery", action="store_true", help="execution.state-recovery.from-local: the "
                    "TaskManagers keep local copies of their state files and restores read them")
    ap.add_argument("--kill", default="jobmanager", choices=["jobmanager", "taskmanager"],
                    help="what each run SIGKILLs: the leader JobManager (default), or a TaskManager running tasks "
                    "(issue 21's TaskManager failover: one spare TaskManager more is started, and a new spare after "
                    "each kill)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs) at the end")
    a = ap.parse_args()
    # SIGTERM / SIGINT end the run through the `finally` below, which stops every process and service it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sluice = os.path.abspath(a.sluice)

    work = tempfile.mkdtemp(prefix="sluice-ha-bench.")
    print(f"work directory {work} (logs of every process: *.log)", flush=True)
    env = dict(os.environ)
    env["SLUICE_SERVICES_DIR"] = os.path.join(work, "services")
    env.setdefault("SLUICE_ETCD_MEMBERS", "3")
    procs = []
    services_started = []
    try:
        etcd = service("etcd", "start", env)
        services_started.append("etcd")
        endpoints = etcd["ETCD_ENDPOINTS"]
        # A checkpoint that cannot complete blocks the next one until execution.checkpointing.timeout (10 min by
        # default; before bb060c7 a failed trigger RPC on a loaded machine did that): a bound keeps a run going.
        config = f"  config:\n    execution.checkpointing.timeout: \"{a.checkpoint_timeout}\"\n"
        if a.local_recovery:
            config += "    execution.state-recovery.from-local: \"true\"\n"
        if a.storage == "s3":
            s3 = service("s3", "start", env)
            services_started.append("s3")
            for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                env[k] = s3[k]
            bucket = f"ha-bench-{os.getpid()}"
            urllib.request.urlopen(urllib.request.Request(f"{s3['S3_ENDPOINT']}/{bucket}", method="PUT"), timeout=10)
            storage = f"s3://{bucket}/ha-bench"
            config += (f"    s3.endpoint: \"{s3['S3_ENDPOINT']}\"\n    s3.path-style-access: \"true\"\n"
                      f"    s3.region: \"{s3['S3_REGION']}\"\n")
            with open(os.path.join(env["SLUICE_SERVICES_DIR"], "s3", "pid")) as f:
                moto_pid = int(f.read().strip())
        else:
            storage = "file://" + os.path.join(work, "chk")
            moto_pid = None
        etcd_pids = []
        for i in range(int(env["SLUICE_ETCD_MEMBERS"])):
            with open(os.path.join(env["SLUICE_SERVICES_DIR"], "etcd", f"m{i}", "pid")) as f:
                etcd_pids.append(int(f.read().strip()))

        entry = a.key_bytes + 12  # varint length + key + namespace + the count, as docs/state-format.md lays out
        entities = max(1, a.state_mb * (1 << 20) // entry)
        target = a.state_mb * (1 << 20)
        parallelism = a.taskmanagers * a.slots
        pipeline = os.path.join(work, "ha-bench.yaml")
        with open(pipeline, "w") as f:
            f.write(f"""pipeline:
  name: ha-failover-bench
  parallelism: {parallelism}
  delivery: at-least-once
  entity-version: true
  checkpoint: {{ interval: {a.interval}, storage: "{storage}" }}
  restart: {{ strategy: fixed-delay, attempts: 5, delay: 200ms }}
{config}source: {{ type: datagen, count: 0, rate: {a.rate}, entities: {entities}, seed: 1 }}
transform:
  - match: "*.*.*"
    key: "RPAD(after.id, {a.key_bytes}, '.')"
    event:
      payload: "after.id AS id, after.revision AS revision"
sink:
  out: {{ type: print }}
""")
        opts = []
        for o in ("heartbeat.interval=250ms", f"heartbeat.timeout={a.heartbeat_timeout}", "cluster.registration.initial-timeout=50ms",
                  "cluster.registration.max-timeout=500ms", "high-availability.type=etcd",
                  f"high-availability.etcd.endpoints={endpoints}", f"high-availability.cluster-id=hab{os.getpid()}",
                  f"high-availability.etcd.lease-ttl={a.lease_ttl}s"):
            opts += ["-D", o]
        n_jm = [0]

        def start_jm():
            n_jm[0] += 1
            p = Proc(f"jobmanager-{n_jm[0]}", [sluice, "jobmanager", pipeline, "--rpc-port", "0", "--rest-port", "0"]
                     + opts, env, os.path.join(work, f"jobmanager-{n_jm[0]}.log"))
            procs.append(p)
            wait_until(lambda: p.find("campaigns for the leadership"), 60, f"{p.role} to campaign")
            return p

        print(f"state: {a.state_mb} MiB target = {entities:,} entities x ~{entry} B; {a.rate} records/s; "
              f"parallelism {parallelism} on {a.taskmanagers} TaskManager(s); checkpoints every {a.interval} on "
              f"{storage}; lease TTL {a.lease_ttl} s; etcd members {env['SLUICE_ETCD_MEMBERS']}", flush=True)
        leader = start_jm()
        wait_until(lambda: leader.find("is the leader of cluster"), 60, "the first leader")
        standby = start_jm()
        n_tm = [0]

        def start_tm():
            n_tm[0] += 1
            p = Proc(f"taskmanager-{n_tm[0]}", [sluice, "taskmanager", pipeline, "--slots", str(a.slots)] + opts, env,
                     os.path.join(work, f"taskmanager-{n_tm[0]}.log"))
            procs.append(p)
            return p

        # A TaskManager kill needs a spare to place the job on again.
        tms = [start_tm() for _ in range(a.taskmanagers + (1 if a.kill == "taskmanager" else 0))]
        wait_until(lambda: leader.find(r"RUNNING: \d+ task"), 120, "the job RUNNING")
        t_start = now()

        def out_lines():
            return sum(t.output_lines for t in tms)

        jms = [leader, standby]

        def replenish():
            """A JobManager that lost its lease on its own (a loaded machine) exits: start another standby, so that
            the job always has a JobManager to go on with."""
            for p in [p for p in jms if not p.alive()]:
                jms.remove(p)
            while len(jms) < 2:
                jms.append(start_jm())

        def filled():
            replenish()
            return out_lines() >= entities

        wait_until(filled, 3600, f"{entities} records (every entity once)", step=0.5)
        t_filled = now()
        print(f"every entity written once after {t_filled - t_start:.1f} s (load average {loadavg()})", flush=True)
        results = []

        def current_leader():
            """The live JobManager that led last (a leader can also lose its lease on its own on a loaded machine:
            the standby takes over, and that counts as an unplanned failover, reported at the end)."""
            best = None
            for p in jms:
                f = p.find("is the leader of cluster") if p.alive() else None
                if f and (best is None or f[0] > best[0]):
                    best = (f[0], p)
            return best[1] if best else None

        def kill_taskmanager(run, leader, ck):
            """SIGKILL of a TaskManager running tasks of the current attempt; times, from the kill, the JobManager's
            RESTARTING (the failure detected), its "starts from checkpoint", the deployments, RUNNING again, and the
            first record a surviving TaskManager prints after its new deployment. A new spare is started after."""
            with leader.lock:
                attempts = [int(m.group(1)) for _, line in leader.lines
                            for m in [re.search(r"RUNNING: \d+ task.*\(attempt (\d+)\)", line)] if m]
            current = attempts[-1] if attempts else 0
            busy = [t for t in tms if t.alive() and t.find(rf"attempt {current} deployed, [1-9]\d* task")]
            if not busy:
                raise RuntimeError(f"no TaskManager runs tasks of attempt {current}")
            victim = busy[(run - 1) % len(busy)]
            survivors = [t for t in tms if t is not victim]
            cpu0 = {p.role: p.cpu_s() for p in procs if p.alive()}
            load = loadavg()
            t_kill, first_record = kill_watching(victim, survivors)

            t_detect = wait_until(lambda: leader.find(r"RESTARTING \(restart", after=t_kill), 120,
                                  "the failure detected", alive=leader)[0]
            t_run = wait_until(lambda: leader.find(r"RUNNING: \d+ task", after=t_kill), 600, "RUNNING again",
                               alive=leader)[0]
            t_first = wait_until(first_record, 600, "the first record after the restore", alive=leader)
            started = leader.find(r"starts from checkpoint (\d+)", after=t_kill)
            with leader.lock:
                deploys = [t for t, line in leader.lines if t >= t_kill and re.search(r"deployed \d+ task", line)]
                restarts = [line for t, line in leader.lines if t >= t_kill and "RESTARTING (restart" in line]
            cpu = {p.role: (p.cpu_s() or 0) - (cpu0.get(p.role) or 0) for p in procs if p.alive()}
            r = {"run": run, "lead": t_detect - t_kill, "running": t_run - t_kill, "first": t_first - t_kill,
                 "checkpoint": ck["id"], "resumed": started[1].group(1) if started else "?",
                 "state_mib": ck["state_size"] / (1 << 20), "ck_ms": ck["end_to_end_duration"], "load": load}
            print(f"run {run}: checkpoint {r['checkpoint']} ({r['state_mib']:.1f} MiB, took {r['ck_ms']:,} ms) "
                  f"completed, {victim.role} SIGKILLed at load average {load}: failure detected (RESTARTING) "
                  f"{fmt_ms(r['lead'])} ms, RUNNING {fmt_ms(r['running'])} ms, first record after the restore "
                  f"{fmt_ms(r['first'])} ms (from checkpoint {r['resumed']}; {len(restarts)} restart(s))", flush=True)
            print(f"  phases (from the kill, ms): restart decided {fmt_ms(r['lead'])}, the checkpoint read and "
                  f"verified (\"starts from checkpoint\") {fmt_ms(started[0] - t_kill) if started else '?'}, deployed "
                  f"(restored) on each TaskManager {', '.join(fmt_ms(t - t_kill) for t in deploys)}", flush=True)
            print("  CPU-s from the kill to the first record: " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()),
                  flush=True)
            print("  VmHWM (peak RSS) MiB: " + ", ".join(f"{p.role} {p.hwm_mib():.0f}" for p in procs
                                                          if p.alive() and p.hwm_mib()), flush=True)
            tms.remove(victim)
            tms.append(start_tm())  # the next spare
            return r

        for run in range(1, a.runs + 1):
            since_ms = int(time.time() * 1000) if run > 1 else int(time.time() * 1000 - (now() - t_filled) * 1000)

            def full_checkpoint():
                replenish()
                lead = current_leader()
                m = lead.find(r"REST API at (http://[0-9.:]+), job id ([0-9a-f]+)") if lead else None
                if m is None:
                    return None
                try:
                    latest = http_json(f"{m[1].group(1)}/jobs/{m[1].group(2)}/checkpoints")["latest"]["completed"]
                except Exception:  # the REST API answers once the job is registered
                    return None
                if latest and latest["trigger_timestamp"] >= since_ms and latest["state_size"] >= 0.9 * target:
                    return lead, latest
                return None

            leader, ck = wait_until(full_checkpoint, 1800, "a completed checkpoint holding the state", step=0.2)
            replenish()
            standby = next(p for p in jms if p is not leader)
            if a.kill == "taskmanager":
                results.append(kill_taskmanager(run, leader, ck))
                continue
            cpu0 = {p.role: p.cpu_s() for p in procs if p.alive()}
            ext0 = {"moto": pid_cpu_s(moto_pid) if moto_pid else None,
                    "etcd": sum(pid_cpu_s(p) or 0 for p in etcd_pids)}
            load = loadavg()
            self_cpu0 = time.process_time()
            leader_hwm = leader.hwm_mib()
            t_kill, first_record = kill_watching(leader, tms)

            t_lead = wait_until(lambda: standby.find("is the leader of cluster", after=t_kill), 120, "a new leader", alive=standby)[0]
            t_run = wait_until(lambda: standby.find(r"RUNNING: \d+ task", after=t_kill), 600, "RUNNING again", alive=standby)[0]
            t_first = wait_until(first_record, 600, "the first record after the restore",
                                 alive=standby)
            resumed = standby.find(r"resumes from checkpoint (\d+)", after=t_kill)
            started = standby.find(r"starts from checkpoint", after=t_kill)
            with standby.lock:
                deploys = [t for t, line in standby.lines if t >= t_kill and re.search(r"deployed \d+ task", line)]
            cpu = {p.role: (p.cpu_s() or 0) - (cpu0.get(p.role) or 0) for p in procs if p.alive()}
            moto_cpu = (pid_cpu_s(moto_pid) - ext0["moto"]) if moto_pid else None
            etcd_cpu = sum(pid_cpu_s(p) or 0 for p in etcd_pids) - ext0["etcd"]
            r = {"run": run, "lead": t_lead - t_kill, "running": t_run - t_kill, "first": t_first - t_kill,
                 "checkpoint": ck["id"], "resumed": resumed[1].group(1) if resumed else "?",
                 "state_mib": ck["state_size"] / (1 << 20), "ck_ms": ck["end_to_end_duration"], "load": load}
            results.append(r)
            hwm = {p.role: p.hwm_mib() for p in procs if p.alive()}
            hwm[leader.role + " (killed)"] = leader_hwm
            print(f"run {r['run']}: checkpoint {r['checkpoint']} ({r['state_mib']:.1f} MiB, took {r['ck_ms']:,} ms) "
                  f"completed, leader {leader.role} SIGKILLed at load average {load}: "
                  f"new leader {fmt_ms(r['lead'])} ms, RUNNING {fmt_ms(r['running'])} ms, first record after the "
                  f"restore {fmt_ms(r['first'])} ms (resumed from checkpoint {r['resumed']})", flush=True)
            print(f"  phases (from the kill, ms): the new leader read and verified the checkpoint (\"starts from "
                  f"checkpoint\") {fmt_ms(started[0] - t_kill) if started else '?'}, deployed (restored) on each "
                  f"TaskManager {', '.join(fmt_ms(t - t_kill) for t in deploys)}", flush=True)
            rx = re.compile(r"restoring vertex \d+ from checkpoint \d+: (\d+) state file\(s\) \((\d+) bytes\) read "
                            r"from local copies.*, (\d+) \((\d+) bytes\) from .*, in (\d+) ms")
            for t in tms:
                with t.lock:
                    restores = [m for tl, line in t.lines if tl >= t_kill for m in [rx.search(line)] if m]
                if restores:
                    n = [sum(int(m.group(i)) for m in restores) for i in (1, 2, 3, 4)]
                    print(f"  {t.role}: {n[0]} state file(s) ({n[1] / (1 << 20):.1f} MiB) read from its local copies, "
                          f"{n[2]} ({n[3] / (1 << 20):.1f} MiB) from {a.storage}, in "
                          f"{max(int(m.group(5)) for m in restores)} ms", flush=True)
            print("  CPU-s from the kill to the first record: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items())
                  + (f", moto {moto_cpu:.2f}" if moto_cpu is not None else "") + f", etcd {etcd_cpu:.2f}"
                  + f", this script {time.process_time() - self_cpu0:.2f}", flush=True)
            print("  VmHWM (peak RSS) MiB: " + ", ".join(f"{k} {v:.0f}" for k, v in hwm.items() if v)
                  + (f", moto {status_kib(moto_pid, 'VmHWM') / 1024:.0f} (now {status_kib(moto_pid, 'VmRSS') / 1024:.0f})"
                     if moto_pid else ""), flush=True)
            # The killed JobManager comes back as the standby; the next run kills the new leader.
            jms.remove(leader)
            jms.append(start_jm())
        lead = [r["lead"] for r in results]
        running = [r["running"] for r in results]
        first = [r["first"] for r in results]

        def summary(v):
            return f"median {fmt_ms(statistics.median(v))} ms (range {fmt_ms(min(v))}-{fmt_ms(max(v))})"

        unplanned = sum(p.find("no longer the leader") is not None for p in procs if p.role.startswith("jobm"))
        print(f"JobManagers that lost their lease on their own (not killed here): {unplanned}", flush=True)
        if a.kill == "taskmanager":
            hb = float(a.heartbeat_timeout.rstrip("s"))
            print(f"summary, TaskManager kills, {a.state_mb} MiB on {a.storage}, {len(results)} runs: failure "
                  f"detected {summary(lead)}; RUNNING {summary(running)}; first record after the restore "
                  f"{summary(first)}; target heartbeat.timeout + 2 s = {(hb + 2) * 1000:,.0f} ms: "
                  f"{'met' if statistics.median(first) <= hb + 2 else 'missed'} by the median, "
                  f"{sum(1 for f in first if f <= hb + 2)} of {len(first)} runs within", flush=True)
            return 0
        print(f"summary, {a.state_mb} MiB on {a.storage}, {len(results)} runs: new leader {summary(lead)}; RUNNING "
              f"{summary(running)}; first record after the restore {summary(first)}; target lease TTL + 3 s = "
              f"{(a.lease_ttl + 3) * 1000:,} ms: {'met' if statistics.median(first) <= a.lease_ttl + 3 else 'missed'} "
              f"by the median, {sum(1 for f in first if f <= a.lease_ttl + 3)} of {len(first)} runs within", flush=True)
        return 0
    finally:
        for p in procs:
            p.kill(signal.SIGTERM)
        for p in procs:
            try:
                p.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.p.wait()
        for s in reversed(services_started):
            try:
                service(s, "stop", env)
            except RuntimeError as e:
                print(e, file=sys.stderr)
        if a.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
