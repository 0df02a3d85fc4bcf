"""The API client the benchmark watchers share (notice-watch.py, repair-watch.py): the admin identity of a
`scripts/k8s-cluster.sh up` directory, GET, a condition lookup, and a list-then-watch loop that lists again
when its stream breaks. Stdlib only.
"""
import json
import os
import ssl
import sys
import time
import urllib.request


class Api:
    def __init__(self, cluster_dir):
        self.server = None
        with open(os.path.join(cluster_dir, "kubeconfig")) as f:
            for line in f:
                if "server:" in line:
                    self.server = line.split("server:", 1)[1].strip()
        self.ctx = ssl.create_default_context(cafile=os.path.join(cluster_dir, "pki/ca.crt"))
        self.ctx.load_cert_chain(os.path.join(cluster_dir, "pki/admin.crt"),
                                 os.path.join(cluster_dir, "pki/admin.key"))

    def get(self, path, timeout=10):
        with urllib.request.urlopen(self.server + path, context=self.ctx, timeout=timeout) as r:
            return json.load(r)

    def watch(self, path, note, stop, who, retry_s):
        """Lists PATH, calls note(obj, deleted, now) for each item, then for each watch event, until the
        threading.Event STOP is set; on a broken stream, says so on stderr as WHO and lists again."""
        while not stop.is_set():
            try:
                lst = self.get(path)
                rv = lst["metadata"]["resourceVersion"]
                for o in lst["items"]:
                    note(o, False, time.time())
                sep = "&" if "?" in path else "?"
                req = urllib.request.urlopen(
                    self.server + f"{path}{sep}watch=1&resourceVersion={rv}&timeoutSeconds=600",
                    context=self.ctx, timeout=700)
                for line in req:
                    if stop.is_set():
                        return
                    ev = json.loads(line)
                    if ev.get("type") in ("MODIFIED", "DELETED", "ADDED"):
                        note(ev["object"], ev["type"] == "DELETED", time.time())
            except Exception as e:  # a broken stream: list again
                print(f"{who}: watch {path}: {e}", file=sys.stderr)
                time.sleep(retry_s)


def cond(obj, type_):
    """The condition TYPE_ of OBJ's status ({} if none)."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c
    return {}
