#!/usr/bin/env python3
"""The real node's OCI runtime on these sandbox machines (scripts/k8s-node.sh): runc, less what the sandbox
cannot grant. Test-only; docs/dev/testing.md "The real node" says why each edit is needed:
  - no CAP_SYS_RESOURCE in the bounding set: a negative oomScoreAdj (CRI-O's -998 for infra containers,
    -997 for system-node-critical pods) fails with "failed to update /proc/self/oom_score_adj", and
    privileged containers ask for capabilities the sandbox does not have ("unable to apply caps");
  - runc 1.1 cannot set v1 hugetlb limits on this hybrid cgroup host;
  - rlimits above the current hard limit cannot be raised.
On `create`, edits the bundle's config.json accordingly (on `exec`, the process file), then execs runc with the
same arguments."""
import json
import os
import resource
import sys

RUNC = "/usr/sbin/runc"
args = sys.argv[1:]


def bounding_set():
    for line in open("/proc/self/status"):
        if line.startswith("CapBnd:"):
            mask = int(line.split()[1], 16)
    names = {}
    # linux/capability.h order
    for i, n in enumerate("CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP "
                          "LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER "
                          "SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE "
                          "SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP "
                          "MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF "
                          "CHECKPOINT_RESTORE".split()):
        names["CAP_" + n] = bool(mask >> i & 1)
    return names


def fix_process(proc):
    if proc.get("oomScoreAdj", 0) < 0:
        proc["oomScoreAdj"] = 0
    for rl in proc.get("rlimits", []):
        kind = getattr(resource, rl["type"], None)
        if kind is not None:
            _, hard = resource.getrlimit(kind)
            if hard != resource.RLIM_INFINITY:
                rl["hard"] = min(rl["hard"], hard)
                rl["soft"] = min(rl["soft"], rl["hard"])
    caps = bounding_set()
    for kind, names in proc.get("capabilities", {}).items():
        proc["capabilities"][kind] = [n for n in names if caps.get(n, False)]


def rewrite(path, edit):
    doc = json.load(open(path))
    edit(doc)
    tmp = path + ".nk-tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def fix_bundle(spec):
    fix_process(spec.get("process", {}))
    spec.get("linux", {}).get("resources", {}).pop("hugepageLimits", None)


if "create" in args:
    bundle = args[args.index("--bundle") + 1] if "--bundle" in args else "."
    rewrite(os.path.join(bundle, "config.json"), fix_bundle)
elif "exec" in args and "--process" in args:
    rewrite(args[args.index("--process") + 1], fix_process)
os.execv(RUNC, [RUNC] + args)
