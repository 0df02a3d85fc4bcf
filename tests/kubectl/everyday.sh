#!/usr/bin/env bash
# Everyday kubectl commands against any cluster, as a new user would type them (validation on):
#
#   tests/kubectl/everyday.sh KUBECONFIG
#
# Needs two nodes to be schedulable and their pods to run: it creates everyday-a and everyday-b
# (tests/kubectl/everyday-nodes.yaml; KWOK plays their kubelet on a real cluster) and the namespace
# `everyday`, and deletes them at the end. Prints one line per step on stdout,
#   <step> exit=<kubectl's exit code> [fact=value ...]
# with the facts that must hold on every Kubernetes API (not byte-for-byte output); each command and
# its output go to stderr. tests/sim/kubectl_everyday.rs runs it against the sim and a real control plane
# and compares the lines. KUBECTL overrides the kubectl binary (default: .cache/venv/bin/kubectl).
set -u
KC=${1:?usage: $0 KUBECONFIG}
HERE=$(cd "$(dirname "$0")" && pwd)
KUBECTL=${KUBECTL:-$HERE/../../.cache/venv/bin/kubectl}
NS=everyday
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

k() { "$KUBECTL" --kubeconfig "$KC" "$@"; }

# run STEP ARGS...: runs kubectl ARGS; $OUT, $ERR and $CODE hold what it did.
run() {
  STEP=$1
  shift
  k "$@" >"$TMP/out" 2>"$TMP/err"
  CODE=$?
  OUT=$(cat "$TMP/out")
  ERR=$(cat "$TMP/err")
  {
    echo "\$ kubectl $*"
    [ -n "$OUT" ] && echo "$OUT"
    [ -n "$ERR" ] && echo "$ERR"
    echo "(exit $CODE)"
  } >&2
}
# report FACT...: the step's line (also into the log, to find a step's commands there).
report() {
  echo "$STEP exit=$CODE${*:+ $*}"
  echo "== $STEP exit=$CODE${*:+ $*}" >&2
}
# has TEXT: yes when kubectl's output (stdout or stderr) contains TEXT.
has() { if grep -qF -- "$1" <<<"$OUT$ERR"; then echo yes; else echo no; fi; }
# count TEXT: lines of stdout containing TEXT; count_err: of stderr.
count() { grep -cF -- "$1" <<<"$OUT"; }
count_err() { grep -cF -- "$1" <<<"$ERR"; }
# jp ARGS... JSONPATH: a value read back with kubectl get -o jsonpath (quietly).
jp() {
  local path=${*: -1}
  k get "${@:1:$#-1}" -o "jsonpath=$path" 2>/dev/null
}
# until_true SECONDS CMD...: retries CMD every second until it succeeds; yes or no.
until_true() {
  local deadline=$((SECONDS + $1))
  shift
  while ! "$@"; do
    [ $SECONDS -ge $deadline ] && { echo no; return; }
    sleep 1
  done
  echo yes
}
running() { [ "$(k get pods -n $NS --field-selector=status.phase=Running -o name 2>/dev/null | wc -l)" = "$1" ]; }
on_node() { k get pods -n $NS --field-selector="spec.nodeName=$1" -o name 2>/dev/null | wc -l | tr -d ' '; }
ns_gone() { ! k get namespace $NS >/dev/null 2>&1; }
no_pods() { [ "$(k get pods -n $NS -o name 2>/dev/null | wc -l)" = 0 ]; }

# Leftovers of an interrupted run.
k delete namespace $NS --ignore-not-found --wait=true --timeout=60s >/dev/null 2>&1
k delete node everyday-a everyday-b --ignore-not-found >/dev/null 2>&1

# --- nodes ----------------------------------------------------------------------------------
run create-nodes create -f "$HERE/everyday-nodes.yaml"
report created=$(count "created")
run wait-nodes wait --for=condition=Ready node/everyday-a node/everyday-b --timeout=60s
report met=$(count "condition met")
run get-nodes get nodes everyday-a everyday-b -o wide
report rows=$(count everyday-) ready=$(count " Ready ")
run get-nodes-selector get nodes -l example.com/pool=everyday -o name
report names="$(echo $OUT)"

# --- typed create commands (protobuf bodies) -------------------------------------------------
run create-namespace create namespace $NS
report says=$(has "namespace/$NS created") phase=$(jp namespace $NS '{.status.phase}')
run create-deployment create deployment web --image=registry.invalid/web:1 --replicas=4 --port=80 -n $NS
report says=$(has "deployment.apps/web created") replicas=$(jp deployment web -n $NS '{.spec.replicas}') \
  port=$(jp deployment web -n $NS '{.spec.template.spec.containers[0].ports[0].containerPort}')
run create-configmap create configmap web-config --from-literal=mode=demo --from-literal=level=2 -n $NS
report says=$(has "configmap/web-config created") mode=$(jp configmap web-config -n $NS '{.data.mode}') \
  level=$(jp configmap web-config -n $NS '{.data.level}')
run create-secret create secret generic web-secret --from-literal=token=s3cr3t -n $NS
report says=$(has "secret/web-secret created") token=$(jp secret web-secret -n $NS '{.data.token}') \
  type=$(jp secret web-secret -n $NS '{.type}')
run create-existing create namespace $NS
report already=$(has "AlreadyExists")

# --- create -f / apply -f with validation (the default) --------------------------------------
run create-invalid create -f "$HERE/everyday-invalid.yaml"
report unknown=$(has 'unknown field "spec.replicax"') stored=$(jp deployment broken -n $NS '{.metadata.name}')
run apply-new apply -f "$HERE/everyday-app.yaml"
report created=$(count "created") annotation=$(jp deployment api -n $NS '{.metadata.annotations.kubectl\.kubernetes\.io/last-applied-configuration}' | grep -c '"replicas":3')
run apply-unchanged apply -f "$HERE/everyday-app.yaml"
report unchanged=$(count "unchanged")
sed -e 's/replicas: 3/replicas: 4/' -e 's/greeting: hello/greeting: hi/' "$HERE/everyday-app.yaml" >"$TMP/app.yaml"
run apply-changed apply -f "$TMP/app.yaml"
report configured=$(count "configured") unchanged=$(count "unchanged") \
  replicas=$(jp deployment api -n $NS '{.spec.replicas}') greeting=$(jp configmap api-config -n $NS '{.data.greeting}') \
  env=$(jp deployment api -n $NS '{.spec.template.spec.containers[0].env[0].valueFrom.configMapKeyRef.key}')
run create-file-existing create -f "$HERE/everyday-app.yaml"
report already=$(count_err "AlreadyExists")

# --- get / describe ------------------------------------------------------------------------
STEP=pods-running CODE=0
report all=$(until_true 90 running 8)
run get-pods get pods -n $NS -o wide
report rows=$(count " Running ")
run get-all get all -n $NS -o name
report pods=$(count pod/) deployments=$(count deployment.apps/) replicasets=$(count replicaset.apps/)
run get-pods-label get pods -n $NS -l app=api -o name
report pods=$(count pod/api-)
run get-all-kinds get deployments,replicasets,configmaps,poddisruptionbudgets -n $NS -o name
report deployments=$(count deployment.apps/) replicasets=$(count replicaset.apps/) \
  configmaps=$(grep -cE 'configmap/(web|api)-config' <<<"$OUT") pdbs=$(count poddisruptionbudget.policy/)
run get-missing get pod nope -n $NS
report notfound=$(has 'pods "nope" not found')
run describe-node describe node everyday-a
report name=$(has "everyday-a") pods=$(has "Non-terminated Pods:") allocated=$(has "Allocated resources:")
run describe-deployment describe deployment web -n $NS
report replicas=$(has "4 desired") image=$(has "registry.invalid/web:1")
run describe-namespace describe namespace $NS
report active=$(has "Active") quota=$(has "No resource quota")
run describe-pod describe pods -n $NS -l app=api
report pods=$(grep -c '^Name:' <<<"$OUT") node=$(has "Node:")
run explain explain deployment.spec.replicas
report field=$(has "replicas")

# --- label, annotate, taint, cordon -----------------------------------------------------------
run label label node everyday-a example.com/tier=front
report says=$(has "labeled") value=$(jp node everyday-a '{.metadata.labels.example\.com/tier}')
run label-conflict label node everyday-a example.com/tier=back
report value=$(jp node everyday-a '{.metadata.labels.example\.com/tier}')
run label-overwrite label node everyday-a example.com/tier=back --overwrite
report value=$(jp node everyday-a '{.metadata.labels.example\.com/tier}')
run label-remove label node everyday-a example.com/tier-
report value=$(jp node everyday-a '{.metadata.labels.example\.com/tier}')
run annotate annotate node everyday-a example.com/note=hello
report value=$(jp node everyday-a '{.metadata.annotations.example\.com/note}')
run annotate-pods annotate pods -n $NS -l app=web example.com/owner=team
report annotated=$(count "annotated")
run taint taint node everyday-b example.com/dedicated=infra:NoSchedule
report says=$(has "tainted") taint=$(jp node everyday-b '{.spec.taints[?(@.key=="example.com/dedicated")].effect}')
run untaint taint node everyday-b example.com/dedicated:NoSchedule-
report says=$(has "untainted") taint=$(jp node everyday-b '{.spec.taints[?(@.key=="example.com/dedicated")].effect}')
run cordon cordon everyday-b
report unschedulable=$(jp node everyday-b '{.spec.unschedulable}')
run get-cordoned get node everyday-b
report disabled=$(has "SchedulingDisabled")
run uncordon uncordon everyday-b
report unschedulable=$(jp node everyday-b '{.spec.unschedulable}')

# --- drain (evictions, the PDB of api) ------------------------------------------------------
BEFORE=$(on_node everyday-a)
run drain drain everyday-a --ignore-daemonsets --delete-emptydir-data --timeout=120s
report cordoned=$(has "cordoned") evicting=$(has "evicting pod $NS/") drained=$(has "node/everyday-a drained") \
  had_pods=$([ "$BEFORE" -gt 0 ] && echo yes || echo no) left=$(on_node everyday-a) \
  unschedulable=$(jp node everyday-a '{.spec.unschedulable}')
STEP=rescheduled CODE=0
report all=$(until_true 90 running 8) on_a=$(on_node everyday-a)
run uncordon-drained uncordon everyday-a
report unschedulable=$(jp node everyday-a '{.spec.unschedulable}')

# --- scale (the /scale subresource) --------------------------------------------------------
run scale scale deployment web --replicas=2 -n $NS
report says=$(has "deployment.apps/web scaled") replicas=$(jp deployment web -n $NS '{.spec.replicas}')
STEP=scaled-down CODE=0
report all=$(until_true 90 running 6)
run scale-precondition scale deployment web --replicas=5 --current-replicas=3 -n $NS
report mismatch=$(has "Expected replicas to be 3, was 2") replicas=$(jp deployment web -n $NS '{.spec.replicas}')

# --- events ---------------------------------------------------------------------------------
run get-events get events -n $NS
report scheduled=$(has "Scheduled") created=$(has "SuccessfulCreate") scaled=$(has "ScalingReplicaSet")
run get-events-selector get events -n $NS --field-selector reason=Scheduled -o name
report some=$([ -n "$OUT" ] && echo yes || echo no)

# --- delete -----------------------------------------------------------------------------------
run delete-secret delete secret web-secret -n $NS
report says=$(has 'secret "web-secret" deleted')
run delete-configmap delete configmap web-config -n $NS
report says=$(has 'configmap "web-config" deleted') gone=$(jp configmap web-config -n $NS '{.metadata.name}')
run delete-file delete -f "$HERE/everyday-app.yaml"
report deleted=$(count "deleted")
run delete-deployment delete deployment web -n $NS
report says=$(has 'deployment.apps "web" deleted')
STEP=pods-gone CODE=0
report all=$(until_true 90 no_pods)
run delete-missing delete deployment web -n $NS
report notfound=$(has "NotFound")
run delete-namespace delete namespace $NS --timeout=90s
report says=$(has "namespace \"$NS\" deleted") gone=$(until_true 30 ns_gone)
run get-deleted-namespace get namespace $NS
report notfound=$(has "NotFound")
run delete-nodes delete node everyday-a everyday-b
report deleted=$(count "deleted")
