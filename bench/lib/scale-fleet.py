#!/usr/bin/env python3
"""The harness side of bench/scale-real.sh (stdlib only). DIR is a `scripts/k8s-cluster.sh up`
directory: every call here uses its admin client certificate (the harness, never nodekeeper).

    scale-fleet.py nodes DIR FROM TO GROUPS         KWOK nodes nFROM … nTO-1, label karpenter.sh/nodepool=pool-(i % GROUPS) (none if 0)
    scale-fleet.py pods DIR FROM TO PER             PER pods per node in namespace bench, bound with spec.nodeName
    scale-fleet.py wait DIR TO SECONDS              until the agent DaemonSet has a Running pod on n0 … nTO-1, no
                                                    bench pod is Pending (KWOK plays the kubelets), and no Ready
                                                    node still carries the not-ready taint it registered with
    scale-fleet.py tokens DIR FROM TO OUTDIR        OUTDIR/tokens/nI: a TokenRequest of nodekeeper-agent (audience
                                                    nodekeeper, 6 h) bound to the DaemonSet's pod on nI
    scale-fleet.py not-ready DIR TOLERATION NODE…   the kubelets of NODEs post Ready=False (as tests/e2e/support.rs's
                                                    kubelet_reports_not_ready) with one whole-second lastTransitionTime;
                                                    prints `expiry NODE UNIX_NS` (that time + TOLERATION s) per node
    scale-fleet.py watch DIR OUT                    until killed: a Node watch writing `cordon NODE UNIX_NS` (first
                                                    spec.unschedulable seen) and `change SENT_NS UNIX_NS` (an agent
                                                    condition whose message is sent_ns=…, controller_bench's agents)
    scale-fleet.py node-changes DIR SECONDS         a Node watch for SECONDS: which fields the controller's wake filter
                                                    reads changed in each MODIFIED event, and who likely wrote it (the
                                                    newest managedFields entry), as JSON
    scale-fleet.py sample SECONDS OUT LABEL=PID…    samples each PID's RSS and CPU every 0.5 s for SECONDS; OUT (JSON):
                                                    per label rss_mib_start/max/end, cpu_millicores
    scale-fleet.py requests DIR OUT                 kube-apiserver's apiserver_request_total (admin /metrics) by
                                                    verb/resource/subresource, and the HISTOGRAMS below, as JSON
    scale-fleet.py histograms A B                   the HISTOGRAMS' requests between two `requests` files: count and
                                                    the bucket bounds of their p50 / p99
    scale-fleet.py delays A B                       the controller's scheduling delays between two snapshots of its
                                                    /metrics, per probe (runtime, thread): samples, and how many
                                                    were over 0.1 / 0.25 / 0.5 / 1 s
    scale-fleet.py latency EVENTS…                  percentiles of from → to from `notice|expiry NODE NS` lines and the
                                                    watch's `cordon NODE NS` lines, and of the watch's change lines;
                                                    given the controller's JSON log too, also from → its
                                                    `node written` line with a cordon (logged once the PATCH
                                                    returned): acted_p50/p99_ms, which a lagging watch cannot inflate
    scale-fleet.py audit AUDIT_LOG CONTROLLER_LOG EVENTS
                                                    each notice's cordon split by kube-apiserver's audit log (the
                                                    controller's Node PATCHes): client (the controller's took_ms),
                                                    server (received → response complete: APF wait and execution),
                                                    before (PATCH started → received: connection, TLS, sending) and
                                                    after (response complete → logged); the latency annotations of
                                                    the slowest. Before the PATCH, by the controller's `notice
                                                    received` line: delivery (notice → its report's request
                                                    arrived), handler (→ handed to the engine), engine (→ PATCH
                                                    started); the three slowest to their PATCH. Delivery split by
                                                    the agents' simulator's `post NODE START END` line (its report
                                                    carrying the notice): send (notice → the reporter's POST began)
                                                    and wire (→ the request arrived: connection, TLS, accept);
                                                    `rows`: every notice's split, with its time (`at`, Unix s)
    scale-fleet.py gc DIR AUDIT_JSON                (K8S_GODEBUG=gctrace=1) each component's garbage collections from
                                                    its log and its start in DIR/pids, and the notices that came
                                                    while kube-apiserver's was marking against the others, as JSON
"""
import datetime
import http.client
import json
import math
import os
import re
import ssl
import sys
import threading
import time
import urllib.parse

CONC = 16


def cluster(d):
    server = None
    with open(os.path.join(d, "kubeconfig")) as f:
        for line in f:
            if "server:" in line:
                server = line.split("server:", 1)[1].strip()
    ctx = ssl.create_default_context(cafile=os.path.join(d, "pki/ca.crt"))
    ctx.load_cert_chain(os.path.join(d, "pki/admin.crt"), os.path.join(d, "pki/admin.key"))
    return urllib.parse.urlparse(server), ctx


class Api:
    """One keep-alive HTTPS connection (one per thread)."""

    def __init__(self, d):
        self.url, self.ctx = cluster(d)
        self.conn = None

    def call(self, method, path, body=None, ctype="application/json", timeout=60):
        for attempt in range(5):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPSConnection(self.url.hostname, self.url.port, context=self.ctx,
                                                            timeout=timeout)
                data = json.dumps(body).encode() if body is not None else None
                self.conn.request(method, path, body=data, headers={"content-type": ctype} if data else {})
                r = self.conn.getresponse()
                out = r.read()
                if r.status == 429 or r.status >= 500:
                    raise OSError(f"{method} {path}: HTTP {r.status}")
                return r.status, (json.loads(out) if out else {})
            except (OSError, http.client.HTTPException) as e:
                self.conn = None
                if attempt == 4:
                    raise RuntimeError(f"{method} {path}: {e}") from e
                time.sleep(0.5 * (attempt + 1))


def parallel(d, items, fn):
    """fn(api, item) over items with CONC threads, each with its own connection; raises the first error."""
    items, lock, errors = list(items), threading.Lock(), []

    def work():
        api = Api(d)
        while True:
            with lock:
                if not items or errors:
                    return
                item = items.pop()
            try:
                fn(api, item)
            except Exception as e:  # noqa: BLE001 - reported below with its item
                with lock:
                    errors.append(f"{item}: {e}")

    ts = [threading.Thread(target=work) for _ in range(CONC)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        sys.exit(f"scale-fleet: {len(errors)} failed, first: {errors[0]}")


def created(status, out, what):
    if status not in (200, 201, 409):
        raise RuntimeError(f"creating {what}: HTTP {status}: {out.get('message', out)}")


def nodes(d, a, b, groups):
    # The labels a kubelet registers with, the beta OS/arch ones included (else kube-controller-manager's node
    # lifecycle controller adds them, one PATCH per node at its client's 20 QPS: 9 minutes of Node changes at 5,000
    # nodes). Its other PATCH, lifting the `node.kubernetes.io/not-ready` taint admission puts on every new Node,
    # comes as on a real cluster.
    def one(api, i):
        n = f"n{i}"
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": n, "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                             "labels": {"kubernetes.io/hostname": n, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                                        "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64"}},
                "spec": {"providerID": f"kwok://{n}"},
                "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                           "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"}}}
        if groups:
            body["metadata"]["labels"]["karpenter.sh/nodepool"] = f"pool-{i % groups}"
        created(*api.call("POST", "/api/v1/nodes", body), n)
    parallel(d, range(a, b), one)


def pods(d, a, b, per):
    api = Api(d)
    s, _ = api.call("GET", "/api/v1/namespaces/bench")
    if s == 404:
        created(*api.call("POST", "/api/v1/namespaces", {"metadata": {"name": "bench"}}), "namespace bench")

    def one(api, ij):
        i, j = ij
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"p-n{i}-{j}", "labels": {"app": "bench"}},
                "spec": {"nodeName": f"n{i}", "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "app", "image": "registry.invalid/app:1",
                                         "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}
        created(*api.call("POST", "/api/v1/namespaces/bench/pods", body), f"pod p-n{i}-{j}")
    parallel(d, [(i, j) for i in range(a, b) for j in range(per)], one)


def agent_pods(api):
    sel = urllib.parse.quote("app.kubernetes.io/name=nodekeeper-agent")
    s, out = api.call("GET", f"/api/v1/namespaces/nodekeeper/pods?labelSelector={sel}")
    if s != 200:
        raise RuntimeError(f"listing the agent DaemonSet's pods: HTTP {s}")
    return {p["spec"].get("nodeName"): p for p in out.get("items", [])}


def wait(d, b, secs):
    api, end = Api(d), time.time() + secs
    want = {f"n{i}" for i in range(b)}
    while True:
        running = {n for n, p in agent_pods(api).items() if p["status"].get("phase") == "Running"}
        missing = len(want - running)
        _, out = api.call("GET", "/api/v1/namespaces/bench/pods?limit=1&fieldSelector=status.phase%3DPending")
        pending = len(out.get("items", []))
        if missing == 0 and pending == 0:
            break
        if time.time() > end:
            sys.exit(f"scale-fleet: after {secs} s, {missing} nodes without a Running agent pod, bench pods Pending: {pending > 0}")
        time.sleep(2)
    # kube-controller-manager removes the not-ready taint a node registers with once it is Ready, within
    # its client's rate limit shared with the DaemonSet controller's pod creations: at 5,000 nodes it is
    # still removing them minutes after every pod runs, and each removal is a Node change the controller
    # must see. The windows measure the cluster after that.
    while True:
        s, out = api.call("GET", "/api/v1/nodes")
        tainted = sum(1 for n in out.get("items", [])
                      if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions") or [])
                      and any(t["key"] == "node.kubernetes.io/not-ready" for t in n["spec"].get("taints") or []))
        if s == 200 and tainted == 0:
            return
        if time.time() > end:
            sys.exit(f"scale-fleet: after {secs} s, {tainted} Ready nodes still carry node.kubernetes.io/not-ready (HTTP {s})")
        time.sleep(5)


def tokens(d, a, b, outdir):
    os.makedirs(os.path.join(outdir, "tokens"), exist_ok=True)
    by_node = agent_pods(Api(d))

    def one(api, i):
        p = by_node.get(f"n{i}")
        if p is None:
            raise RuntimeError(f"no agent pod on n{i}")
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"audiences": ["nodekeeper"], "expirationSeconds": 21600,
                         "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": p["metadata"]["name"],
                                            "uid": p["metadata"]["uid"]}}}
        s, out = api.call("POST", "/api/v1/namespaces/nodekeeper/serviceaccounts/nodekeeper-agent/token", body)
        if s != 201:
            raise RuntimeError(f"TokenRequest: HTTP {s}: {out.get('message', out)}")
        with open(os.path.join(outdir, "tokens", f"n{i}"), "w") as f:
            f.write(out["status"]["token"])
    parallel(d, range(a, b), one)


def not_ready(d, toleration, names):
    api = Api(d)
    ltt = int(time.time())
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ltt))
    for n in names:
        # The label keeps KWOK's node-initialize stage from setting Ready again (scripts/setup-k8s.sh's stages).
        s, out = api.call("PATCH", f"/api/v1/nodes/{n}", {"metadata": {"labels": {"nodekeeper.test/kubelet": "not-ready"}}},
                          ctype="application/merge-patch+json")
        if s != 200:
            raise RuntimeError(f"labelling {n}: HTTP {s}: {out.get('message', out)}")
        st = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                                         "message": "container runtime network not ready: NetworkReady=false",
                                         "lastHeartbeatTime": when, "lastTransitionTime": when}]}}
        s, out = api.call("PATCH", f"/api/v1/nodes/{n}/status", st, ctype="application/strategic-merge-patch+json")
        if s != 200:
            raise RuntimeError(f"Ready=False on {n}: HTTP {s}: {out.get('message', out)}")
        print(f"expiry {n} {(ltt + toleration) * 10**9}", flush=True)
        # When the controller could first see it: on a loaded kube-apiserver the PATCHes may return
        # after the expiry, and then the decision cannot come sooner.
        print(f"posted {n} {time.time_ns()}", flush=True)


def watch(d, out):
    """Changes from now on: the watch starts at the list's resourceVersion (what is already cordoned or
    reported is not news), and resumes from the last event's after a disconnect."""
    url, ctx = cluster(d)
    s, lst = Api(d).call("GET", "/api/v1/nodes")
    if s != 200:
        sys.exit(f"scale-fleet: listing nodes: HTTP {s}")
    rv = lst["metadata"]["resourceVersion"]
    cordoned = {n["metadata"]["name"] for n in lst["items"] if (n.get("spec") or {}).get("unschedulable")}
    # In a cluster grown size by size the Nodes still carry the last size's reported changes: not news to this
    # size's watch (unseeded, it counted them when their Node was next written: 614 s p99 at 5,000 on 2026-12-05).
    seen = {c.get("message") for n in lst["items"] for c in (n.get("status") or {}).get("conditions") or []}
    with open(out, "a", buffering=1) as f:
        while True:
            conn = http.client.HTTPSConnection(url.hostname, url.port, context=ctx, timeout=600)
            conn.request("GET", f"/api/v1/nodes?watch=1&resourceVersion={rv}")
            r = conn.getresponse()
            for line in r:
                now = time.time_ns()
                ev = json.loads(line)
                node = ev.get("object") or {}
                rv = node.get("metadata", {}).get("resourceVersion", rv)
                name = node.get("metadata", {}).get("name")
                if (node.get("spec") or {}).get("unschedulable") and name not in cordoned:
                    cordoned.add(name)
                    f.write(f"cordon {name} {now}\n")
                for c in (node.get("status") or {}).get("conditions") or []:
                    m = c.get("message") or ""
                    if m.startswith("sent_ns=") and m not in seen:
                        seen.add(m)
                        f.write(f"change {m[8:]} {now}\n")
            conn.close()


def node_changes(d, secs):
    """For `secs` seconds, which fields of the Nodes change and who wrote them: each MODIFIED event is
    diffed against the node's previous version over what the controller's wake filter reads (labels, its
    own annotations and Karpenter's do-not-disrupt, unschedulable, taints, each condition's status and
    lastTransitionTime, bootID), and attributed to the managedFields entry with the newest time (a hint only:
    the times are whole seconds, and a status heartbeat in the same second hides a spec write). JSON."""
    url, ctx = cluster(d)
    s, lst = Api(d).call("GET", "/api/v1/nodes")
    if s != 200:
        sys.exit(f"scale-fleet: listing nodes: HTTP {s}")
    prev = {n["metadata"]["name"]: n for n in lst["items"]}
    rv = lst["metadata"]["resourceVersion"]

    def visible(n):
        m, spec, st = n["metadata"], n.get("spec") or {}, n.get("status") or {}
        out = {f"label {k}": v for k, v in (m.get("labels") or {}).items()}
        out.update({f"annotation {k}": v for k, v in (m.get("annotations") or {}).items()
                    if k.startswith("nodekeeper.io/") or k == "karpenter.sh/do-not-disrupt"})
        out["unschedulable"] = spec.get("unschedulable")
        for t in spec.get("taints") or []:
            out[f"taint {t['key']}"] = (t.get("value"), t["effect"])
        for c in st.get("conditions") or []:
            out[f"condition {c['type']} status"] = c["status"]
            out[f"condition {c['type']} lastTransitionTime"] = c.get("lastTransitionTime")
        out["bootID"] = (st.get("nodeInfo") or {}).get("bootID")
        return out

    def writer(n):
        mf = n["metadata"].get("managedFields") or []
        if not mf:
            return "?"
        w = max(mf, key=lambda e: e.get("time") or "")
        return f'{w.get("manager")} {w.get("operation")} {w.get("subresource") or "-"}'

    events, seen_by, by_field, by_writer, all_writers = 0, 0, {}, {}, {}
    t_end = time.time() + secs
    conn = http.client.HTTPSConnection(url.hostname, url.port, context=ctx, timeout=secs + 30)
    conn.request("GET", f"/api/v1/nodes?watch=1&resourceVersion={rv}&timeoutSeconds={math.ceil(secs)}")
    r = conn.getresponse()
    if r.status != 200:
        sys.exit(f"scale-fleet: watching nodes: HTTP {r.status}: {r.read()[:300]!r}")
    for line in r:
        if time.time() > t_end:
            break
        ev = json.loads(line)
        n = ev.get("object") or {}
        name = n.get("metadata", {}).get("name")
        if ev.get("type") != "MODIFIED" or name not in prev:
            if name:
                prev[name] = n
            continue
        events += 1
        w = writer(n)
        all_writers[w] = all_writers.get(w, 0) + 1
        a, b = visible(prev[name]), visible(n)
        changed = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        if changed:
            seen_by += 1
            by_writer[w] = by_writer.get(w, 0) + 1
            for k in changed:
                by_field[k] = by_field.get(k, 0) + 1
        prev[name] = n
    conn.close()
    top = lambda m: dict(sorted(m.items(), key=lambda kv: -kv[1])[:20])
    print(json.dumps({"secs": secs, "nodes": len(prev), "modified": events, "modified_by_writer": top(all_writers),
                      "visible": seen_by, "visible_by_writer": top(by_writer), "visible_by_field": top(by_field)}))


def proc(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
        return rss / 1024, (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, IndexError):
        return None


def machine():
    """The machine's CPU time so far (all, idle + iowait, steal: the hypervisor ran something else on our
    virtual CPUs; clock ticks) and how many tasks are runnable now."""
    with open("/proc/stat") as f:
        lines = f.read().splitlines()
    ticks = [int(x) for x in lines[0].split()[1:]]
    running = next(int(l.split()[1]) for l in lines if l.startswith("procs_running "))
    return sum(ticks), ticks[3] + ticks[4], running, ticks[7] if len(ticks) > 7 else 0


def sample(secs, out, specs):
    """RSS and CPU of each LABEL=PID over secs, and the machine's: its CPU busy over the whole window and
    at most in one 0.5 s tick, and its runnable tasks per tick (p50, max; the sampler is one of them); the
    steal (counted as busy above) over the window, at most in one tick, and the ticks with 10 % or more
    (their end, s since the epoch), to place a stall that slows every process at once."""
    pids = dict(s.split("=", 1) for s in specs)
    first = {k: proc(p) for k, p in pids.items()}
    peak = {k: (v[0] if v else 0) for k, v in first.items()}
    m0 = last = machine()
    busiest, runnable, steal_max, steal_ticks = 0.0, [], 0.0, []
    t0 = time.time()
    while time.time() - t0 < secs:
        time.sleep(0.5)
        for k, p in pids.items():
            v = proc(p)
            if v:
                peak[k] = max(peak[k], v[0])
        m = machine()
        if m[0] > last[0]:
            busiest = max(busiest, 1 - (m[1] - last[1]) / (m[0] - last[0]))
            stolen = (m[3] - last[3]) / (m[0] - last[0])
            steal_max = max(steal_max, stolen)
            if stolen >= 0.1:
                steal_ticks.append([round(time.time(), 2), round(100 * stolen, 1)])
        runnable.append(m[2])
        last = m
    el = time.time() - t0
    res = {}
    for k, p in pids.items():
        a, b = first[k], proc(p)
        if a and b:
            res[k] = {"rss_mib_start": round(a[0], 1), "rss_mib_max": round(peak[k], 1), "rss_mib_end": round(b[0], 1),
                      "cpu_millicores": round((b[1] - a[1]) / el * 1000)}
    res["seconds"] = round(el, 1)
    res["loadavg"] = open("/proc/loadavg").read().split()[:3]
    total = last[0] - m0[0]
    res["machine"] = {"busy_pct": round(100 * (1 - (last[1] - m0[1]) / total), 1) if total else None,
                      "busy_pct_max_tick": round(100 * busiest, 1),
                      "runnable_p50": pct(runnable, 0.5), "runnable_max": max(runnable, default=None),
                      "steal_pct": round(100 * (last[3] - m0[3]) / total, 1) if total else None,
                      "steal_pct_max_tick": round(100 * steal_max, 1), "steal_ticks": steal_ticks}
    with open(out, "w") as f:
        json.dump(res, f)


# Latency histograms kept by `requests` (cumulative buckets), for where a Node write's time goes:
# APF's queue wait and execution time of the controller's flows, every Node PATCH's whole duration in
# kube-apiserver, and etcd's calls for Nodes.
HISTOGRAMS = (
    ("apiserver_flowcontrol_request_wait_duration_seconds_bucket", lambda kv: kv.get("flow_schema", "").startswith("nodekeeper")),
    ("apiserver_flowcontrol_request_execution_seconds_bucket", lambda kv: kv.get("flow_schema", "").startswith("nodekeeper")),
    ("apiserver_request_duration_seconds_bucket",
     lambda kv: kv.get("verb") == "PATCH" and kv.get("resource") == "nodes" and not kv.get("subresource")),
    ("etcd_request_duration_seconds_bucket", lambda kv: kv.get("resource") == "nodes" and kv.get("operation") == "update"),
    # kube-apiserver's goroutines: how long each waited, runnable, for one of its GOMAXPROCS threads (the Go
    # runtime's /sched/latencies; buckets of 10.5 ms and 117 ms at the top).
    ("go_sched_latencies_seconds_bucket", lambda kv: True),
)


def labels_of(text):
    kv = dict(p.split("=", 1) for p in text.split('",') if "=" in p)
    return {k: v.strip('"') for k, v in kv.items()}


def samples(text):
    """The labelled samples of a Prometheus text exposition: (name, labels text, value); labels_of parses
    the labels of those a caller keeps."""
    for line in text.splitlines():
        if "{" not in line or line.startswith("#"):
            continue
        name, rest = line.split("{", 1)
        labels, val = rest.rsplit("} ", 1)
        yield name, labels, float(val)


def requests(d, out):
    api = Api(d)
    conn = api.conn = http.client.HTTPSConnection(api.url.hostname, api.url.port, context=api.ctx, timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    tot, hist = {}, {}
    for name, labels, val in samples(text):
        if name == "apiserver_request_total":
            kv = labels_of(labels)
            key = f"{kv.get('verb')} {kv.get('resource')}{'/' + kv['subresource'] if kv.get('subresource') else ''}"
            tot[key] = tot.get(key, 0) + val
            continue
        for metric, keep in HISTOGRAMS:
            if name != metric:
                continue
            kv = labels_of(labels)
            if not keep(kv):
                continue
            le = kv.pop("le")
            series = name[:-len("_bucket")] + "{" + ",".join(f"{k}={v}" for k, v in sorted(kv.items())) + "}"
            hist.setdefault(series, {})[le] = val
    with open(out, "w") as f:
        json.dump({"t": time.time(), "total": tot, "histograms": hist}, f)


def histograms(a_file, b_file):
    """Each kept histogram's requests between two `requests` files, with the bucket bounds under which
    half and 99 % of them finished (`le`: the true percentile is at most that)."""
    a, b = (json.load(open(f)).get("histograms", {}) for f in (a_file, b_file))
    res = {}
    for series, buckets in b.items():
        before = a.get(series, {})
        delta = sorted(((float(le), c - before.get(le, 0)) for le, c in buckets.items()), key=lambda x: x[0])
        n = delta[-1][1] if delta else 0
        if n <= 0:
            continue
        def bound(p):
            return next((le for le, c in delta if c >= p * n), float("inf"))
        res[series] = {"n": round(n), "p50_le_s": bound(0.5), "p99_le_s": bound(0.99)}
        if series.startswith("go_sched"):
            # Its buckets are too coarse for a p99 to say much: how many waited longer than the top two.
            res[series]["over_s"] = {str(le): round(n - c) for le, c in delta[-3:-1]}
    print(json.dumps(res))


def delays(a_file, b_file):
    """The controller's scheduling delays (`nodekeeper_scheduling_delay_seconds`, two snapshots of its
    /metrics): per probe, the samples between them and how many were later than 0.1, 0.25, 0.5 and 1 s."""
    def buckets(fn):
        out = {}
        with open(fn) as f:
            for name, labels, val in samples(f.read()):
                if name == "nodekeeper_scheduling_delay_seconds_bucket":
                    kv = labels_of(labels)
                    out.setdefault(kv["probe"], {})[kv["le"]] = val
        return out
    a, b = buckets(a_file), buckets(b_file)
    res = {}
    for probe, bs in sorted(b.items()):
        d = {le: c - a.get(probe, {}).get(le, 0) for le, c in bs.items()}
        n = d.get("+Inf", 0)
        res[probe] = {"n": round(n), **{f"over_{le}s": round(n - d.get(le, 0)) for le in ("0.1", "0.25", "0.5", "1")}}
    print(json.dumps(res))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round((len(xs) - 1) * p))] if xs else float("nan")


def ts_ns(text):
    """RFC 3339 (with up to nanoseconds) as Unix ns."""
    base, _, frac = text.rstrip("Z").partition(".")
    t = datetime.datetime.fromisoformat(base + "+00:00")
    return int(t.timestamp()) * 10**9 + int((frac + "000000000")[:9])


def latency(files):
    start, cordon, acted, change, posted = {}, {}, {}, [], {}
    for fn in files:
        with open(fn) as f:
            for line in f:
                if line.startswith("{"):
                    # the controller's JSON log: "node written" with a cordon, once its PATCH returned
                    try:
                        j = json.loads(line)
                    except ValueError:
                        continue
                    if cordon_written(j) and j.get("node") not in acted:
                        acted[j["node"]] = ts_ns(j["timestamp"])
                    continue
                w = line.split()
                if len(w) == 3 and w[0] in ("notice", "expiry"):
                    start[w[1]] = (w[0], int(w[2]))
                elif len(w) == 3 and w[0] == "posted":
                    posted[w[1]] = int(w[2])
                elif len(w) == 3 and w[0] == "cordon":
                    cordon[w[1]] = int(w[2])
                elif len(w) == 3 and w[0] == "change":
                    change.append((int(w[2]) - int(w[1])) / 1e6)
    res = {}
    for kind in ("notice", "expiry"):
        nodes = [n for n, (k, _) in start.items() if k == kind]
        ms = [(cordon[n] - start[n][1]) / 1e6 for n in nodes if n in cordon]
        by_ctl = [(acted[n] - start[n][1]) / 1e6 for n in nodes if n in acted]
        res[kind] = {"sent": len(nodes), "cordoned": len(ms), "p50_ms": round(pct(ms, 0.5), 1),
                     "p99_ms": round(pct(ms, 0.99), 1), "max_ms": round(max(ms), 1) if ms else None,
                     "acted_p50_ms": round(pct(by_ctl, 0.5), 1), "acted_p99_ms": round(pct(by_ctl, 0.99), 1)}
    # Ready=False PATCHes that returned after their node's expiry: by how much (the bench's own lag; the
    # decision's latency then includes it).
    late = [(posted[n] - t) / 1e6 for n, (k, t) in start.items() if k == "expiry" and n in posted and posted[n] > t]
    res["expiry"]["posted_late"] = len(late)
    res["expiry"]["posted_late_max_ms"] = round(max(late), 1) if late else 0
    res["change"] = {"seen": len(change), "p50_ms": round(pct(change, 0.5), 1), "p99_ms": round(pct(change, 0.99), 1)}
    print(json.dumps(res))


def cordon_written(j):
    """Whether a line of the controller's JSON log is its "node written" with a cordon (logged once the
    PATCH returned)."""
    return j.get("message") == "node written" and "cordon" in j.get("changes", "").split(",")


def json_lines(fn):
    """The JSON objects of a file of JSON lines (other lines skipped)."""
    with open(fn) as f:
        for line in f:
            if line.startswith("{"):
                try:
                    yield json.loads(line)
                except ValueError:
                    pass


def audit(audit_log, controller_log, events):
    notices = {}  # node -> the notice's time (the agents' simulator's)
    posts = {}  # node -> when its reporter began the POST carrying the notice (the simulator's)
    with open(events) as f:
        for line in f:
            w = line.split()
            if len(w) == 3 and w[0] == "notice":
                notices[w[1]] = int(w[2])
            elif len(w) == 4 and w[0] == "post":
                posts[w[1]] = int(w[2])
    written = {}  # node -> (PATCH started, logged), the first cordon's
    received = {}  # node -> (its report's request arrived, notice handed to the engine), the first's
    turns = {}  # node -> the fast path's (queued, decided) ms, the first's (controllers since 2026-12-05)
    for j in json_lines(controller_log):
        n = j.get("node")
        if cordon_written(j) and n in notices and n not in written:
            end = ts_ns(j["timestamp"])
            written[n] = (end - int(j["took_ms"]) * 10**6, end)
        elif j.get("message") == "notice received" and n in notices and n not in received:
            at = ts_ns(j["timestamp"])
            received[n] = (at - int(j["waited_ms"]) * 10**6, at)
        elif j.get("message") == "notice acted on" and n in notices and n not in turns:
            turns[n] = (int(j["queued_us"]) / 1e3, int(j["decided_us"]) / 1e3)
    patches = {}  # node -> [(received, complete, annotations)]
    for e in json_lines(audit_log):
        ref = e.get("objectRef") or {}
        if (e.get("stage") == "ResponseComplete" and e.get("verb") == "patch" and ref.get("resource") == "nodes"
                and not ref.get("subresource") and ref.get("name") in written):
            lat = {k.rsplit("/", 1)[-1]: v for k, v in (e.get("annotations") or {}).items()
                   if k.startswith("apiserver.latency.k8s.io/")}
            patches.setdefault(ref["name"], []).append(
                (ts_ns(e["requestReceivedTimestamp"]), ts_ns(e["stageTimestamp"]), lat))
    rows = []
    for n, (start, end) in written.items():
        # the cordon's PATCHes (more than one after a conflict): those received while it was being written
        # (the log's took_ms is whole ms, so 1 ms of slack)
        ps = sorted(p for p in patches.get(n, []) if start - 10**6 <= p[0] <= end)
        if not ps:
            continue
        row = {"node": n, "at": round(notices[n] / 1e9, 3) if n in notices else None,
               "client": (end - start) / 1e6, "server": sum(b - a for a, b, _ in ps) / 1e6,
               "before": (ps[0][0] - start) / 1e6, "after": (end - ps[-1][1]) / 1e6, "latency": ps[-1][2]}
        if n in received:
            # before the PATCH: the notice to its report's request (the agent's send, the network),
            # the request to the engine (authentication, parsing, the node's previous report), the
            # engine to the PATCH (the fast path's lane and decision)
            arrived, handed = received[n]
            row.update(delivery=(arrived - notices[n]) / 1e6, handler=(handed - arrived) / 1e6,
                       engine=(start - handed) / 1e6)
            if n in posts:
                row.update(send=(posts[n] - notices[n]) / 1e6, wire=(arrived - posts[n]) / 1e6)
            if n in turns:
                # the engine's turn split: the notice's way to the fast path's task (the engine's
                # notice channel, its task spawned), the task waiting for a worker and the node's
                # lane, and its decision (the cached node, the interruption flow)
                queued, decided = turns[n]
                row.update(hop=round(row["engine"] - queued - decided, 3), queued=queued, decided=decided)
        rows.append(row)
    res = {"cordons": len(written), "matched": len(rows)}
    # absent with a controller without the `notice received` line, a simulator without `post` lines
    optional = ("delivery", "handler", "engine", "send", "wire", "hop", "queued", "decided")
    for k in ("client", "server", "before", "after") + optional:
        xs = [r[k] for r in rows if k in r]
        if not xs and k in optional:
            continue
        res[k] = {"p50_ms": round(pct(xs, 0.5), 1), "p99_ms": round(pct(xs, 0.99), 1)}
    res["slowest"] = sorted(rows, key=lambda r: -r["client"])[:3]
    res["rows"] = sorted(rows, key=lambda r: r["at"] or 0)  # every notice's, by its time
    # the notices slowest to their PATCH (delivery + handler + engine)
    res["slowest_before_patch"] = sorted((r for r in rows if "engine" in r),
                                         key=lambda r: -(r["delivery"] + r["handler"] + r["engine"]))[:3]
    print(json.dumps(res))


GC_LINE = re.compile(r"gc (\d+) @([\d.]+)s \d+%: ([\d.+]+) ms clock, ([\d.+/]+) ms cpu, (\d+)->\d+->(\d+) MB")


def gc(cdir, audit_json):
    """The control plane's garbage collections (`K8S_GODEBUG=gctrace=1`: a line per cycle in each component's
    log, timed from its start in DIR/pids) and the notices that came while kube-apiserver's was marking: per
    component the cycles, their wall time (the concurrent mark, during which the Go runtime's mark workers take
    every core its idle threads leave) and CPU; per notice set (inside / outside), client and delivery p50 / max."""
    tck = os.sysconf("SC_CLK_TCK")
    btime = next(int(l.split()[1]) for l in open("/proc/stat") if l.startswith("btime "))
    cycles = []  # (start, end, component, cpu ms)
    for line in open(f"{cdir}/pids"):
        w = line.split()
        if len(w) < 3:
            continue
        started = btime + int(w[2]) / tck
        try:
            with open(f"{cdir}/logs/{w[0]}.log", errors="replace") as f:
                for l in f:
                    m = GC_LINE.search(l)
                    if m:
                        at = started + float(m.group(2))
                        wall = sum(float(x) for x in m.group(3).split("+")) / 1000
                        cpu = sum(float(x) for x in re.split("[+/]", m.group(4)))
                        cycles.append((at, at + wall, w[0], cpu))
        except FileNotFoundError:
            continue
    rows = json.load(open(audit_json)).get("rows", [])
    t0 = min((r["at"] for r in rows if r.get("at")), default=None)
    t1 = max((r["at"] for r in rows if r.get("at")), default=None)
    res = {"components": {}}
    for name in sorted({c[2] for c in cycles}):
        cs = [c for c in cycles if c[2] == name]
        during = [c for c in cs if t0 is not None and c[1] >= t0 and c[0] <= t1]
        res["components"][name] = {
            "cycles": len(cs), "wall_ms_p50": round(1000 * pct([c[1] - c[0] for c in cs], 0.5)),
            "wall_ms_max": round(1000 * max(c[1] - c[0] for c in cs)),
            "cpu_ms_p50": round(pct([c[3] for c in cs], 0.5)), "cpu_ms_max": round(max(c[3] for c in cs)),
            "in_notices": len(during)}
    marking = [c for c in cycles if c[2] == "kube-apiserver"]
    inside = [r for r in rows if r.get("at") and any(a <= r["at"] <= b for a, b, _, _ in marking)]
    outside = [r for r in rows if r.get("at") and r not in inside]
    for label, rs in (("inside", inside), ("outside", outside)):
        res[label] = {"n": len(rs)}
        for k in ("client", "delivery"):
            xs = [r[k] for r in rs if k in r]
            if xs:
                res[label][k] = {"p50_ms": round(pct(xs, 0.5), 1), "max_ms": round(max(xs), 1)}
    print(json.dumps(res))


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "nodes":
        nodes(args[0], int(args[1]), int(args[2]), int(args[3]))
    elif cmd == "pods":
        pods(args[0], int(args[1]), int(args[2]), int(args[3]))
    elif cmd == "wait":
        wait(args[0], int(args[1]), float(args[2]))
    elif cmd == "tokens":
        tokens(args[0], int(args[1]), int(args[2]), args[3])
    elif cmd == "not-ready":
        not_ready(args[0], int(args[1]), args[2:])
    elif cmd == "watch":
        watch(args[0], args[1])
    elif cmd == "node-changes":
        node_changes(args[0], float(args[1]))
    elif cmd == "sample":
        sample(float(args[0]), args[1], args[2:])
    elif cmd == "requests":
        requests(args[0], args[1])
    elif cmd == "latency":
        latency(args)
    elif cmd == "histograms":
        histograms(args[0], args[1])
    elif cmd == "delays":
        delays(args[0], args[1])
    elif cmd == "audit":
        audit(args[0], args[1], args[2])
    elif cmd == "gc":
        gc(args[0], args[1])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
