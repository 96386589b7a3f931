"""The wiring of `ganglion router` in a kustomization (issue #26), for tests/k8s/validate.py.

A target with a Deployment whose container runs `ganglion router` puts the router in front
of its gangs. Then, besides the schemas:
  * every argument is `--flag=value` with a flag `ganglion router --help` lists;
  * --replicas-dns names headless Services of the target (NAME[.NAMESPACE[.svc.DOMAIN]],
    $(POD_NAMESPACE) from the Downward API) that publish only Ready addresses and select
    exactly Pod 0 (the coordinator) of every gang, on a port the Service has;
  * the container's http port is --http-port, its readiness probe /readyz and its liveness
    probe /healthz on it, and it runs the gangs' image;
  * the client Services select exactly the router Pods (clients reach the router, which
    reaches the gangs), never a gang Pod.
self_test() breaks a rendered router target in those ways and checks each is reported.
"""
import contextlib
import copy
import io
import os
import re
import subprocess

_FLAGS = {}


def router_flags(bin_path):
    """The flags `ganglion router --help` lists (cached per binary)."""
    if bin_path not in _FLAGS:
        r = subprocess.run([bin_path, "router", "--help"], capture_output=True, text=True,
                           timeout=30)
        _FLAGS[bin_path] = set(re.findall(r"^\s+--([a-z0-9-]+)", r.stdout + r.stderr, re.M))
    return _FLAGS[bin_path]


def routers_of(objs):
    """[(Deployment, container)] of the containers that run `ganglion router`."""
    out = []
    for o in objs:
        if o.get("kind") != "Deployment":
            continue
        for c in o["spec"]["template"]["spec"].get("containers") or []:
            cmd = (c.get("command") or []) + (c.get("args") or [])
            if len(cmd) >= 2 and os.path.basename(cmd[0]) == "ganglion" and cmd[1] == "router":
                out.append((o, c))
    return out


def _selects(sel, labels):
    return bool(sel) and all(labels.get(k) == v for k, v in sel.items())


def _probe_ok(c, kind, path, port):
    p = (c.get(kind) or {}).get("httpGet") or {}
    want = {port} | {q.get("name") for q in c.get("ports") or [] if q.get("containerPort") == port}
    return p.get("path") == path and p.get("port") in want


def _check_dns(value, services, gangs, ns, domain, where, out):
    """One --replicas-dns list: every NAME:PORT a Service selecting exactly every Pod 0."""
    pod0 = {g.pods[0].name for g in gangs}
    for item in value.split(","):
        name, _, port = item.rpartition(":")
        name = name.replace("$(POD_NAMESPACE)", ns)
        parts = name.split(".")
        if not port.isdigit() or (len(parts) > 1 and parts[1] != ns) or \
                (len(parts) > 2 and ".".join(parts[2:]) != "svc." + domain):
            out.err("%s: --replicas-dns %r is not NAME[.%s[.svc.%s]]:PORT"
                    % (where, item, ns, domain))
            continue
        svc = services.get(parts[0])
        if svc is None:
            out.err("%s: --replicas-dns names Service %r, which the kustomization does not "
                    "create" % (where, parts[0]))
            continue
        s = svc["spec"]
        if s.get("clusterIP") != "None":
            out.err("%s: Service/%s must be headless (one address per replica)" % (where, parts[0]))
        if s.get("publishNotReadyAddresses") is True:
            out.err("%s: Service/%s publishes not-Ready addresses: a restarting gang would stay "
                    "a replica" % (where, parts[0]))
        picked = {p.name for g in gangs for p in g.pods if _selects(s.get("selector"), p.labels)}
        if picked != pod0:
            out.err("%s: Service/%s selects %s; the router needs exactly Pod 0 of every gang %s"
                    % (where, parts[0], sorted(picked), sorted(pod0)))
        if int(port) not in {p.get("port") for p in s.get("ports") or []}:
            out.err("%s: Service/%s has no port %s" % (where, parts[0], port))
        else:
            out.ok("%s: --replicas-dns %s selects Pod 0 of %d gangs" % (where, item, len(pod0)))


def check_routers(bin_path, objs, gangs, services, gang_image, ns, domain, out):
    """Checks every router of objs (see the module's text). Returns False when there is no
    router (the caller then checks the client Service against the gangs)."""
    routers = routers_of(objs)
    if not routers:
        return False
    known = router_flags(bin_path)
    router_pods = []
    for dep, c in routers:
        where = "Deployment/%s" % dep["metadata"]["name"]
        router_pods.append(dep["spec"]["template"]["metadata"].get("labels") or {})
        flags = {}
        for a in (c.get("command") or [])[2:] + (c.get("args") or []):
            name, eq, val = a[2:].partition("=") if a.startswith("--") else (a, "", "")
            if not a.startswith("--") or not eq or name not in known:
                out.err("%s: argument %r is not --FLAG=VALUE with a flag of ganglion router"
                        % (where, a))
            flags[name] = val
        if "$(POD_NAMESPACE)" in " ".join(flags.values()) and not any(
                e.get("name") == "POD_NAMESPACE" and
                ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") ==
                "metadata.namespace" for e in c.get("env") or []):
            out.err("%s: $(POD_NAMESPACE) is used but not set from metadata.namespace" % where)
        if not flags.get("replicas") and not flags.get("replicas-dns"):
            out.err("%s: neither --replicas nor --replicas-dns: the router knows no replica"
                    % where)
        if flags.get("replicas-dns"):
            _check_dns(flags["replicas-dns"], services, gangs, ns, domain, where, out)
        port = int(flags.get("http-port") or 8000)
        if port not in {p.get("containerPort") for p in c.get("ports") or []}:
            out.err("%s: --http-port %d is not a containerPort" % (where, port))
        for kind, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
            if not _probe_ok(c, kind, path, port):
                out.err("%s: %s must GET %s on --http-port %d" % (where, kind, path, port))
        if gang_image is not None and c.get("image") != gang_image:
            out.err("%s: image %r is not the gangs' %r" % (where, c.get("image"), gang_image))
        out.ok("%s: router wiring" % where)
    for s in services.values():
        sp = s["spec"]
        if sp.get("clusterIP") == "None" or sp.get("type", "ClusterIP") not in (
                "ClusterIP", "LoadBalancer", "NodePort"):
            continue
        gang_hit = [p.name for g in gangs for p in g.pods if _selects(sp.get("selector"), p.labels)]
        if gang_hit or not all(_selects(sp.get("selector"), lb) for lb in router_pods):
            out.err("client Service/%s must select exactly the router Pods (it selects gang "
                    "Pods %s)" % (s["metadata"]["name"], gang_hit))
        else:
            out.ok("client Service/%s selects the router Pods" % s["metadata"]["name"])
    return True


def self_test(checker, objs, new_out, say):
    """Breaks a rendered router target in known ways (new_out() makes a quiet report);
    returns the ones not reported."""
    def router(o):
        return routers_of(o)[0][1]

    def svc(o, name):
        return next(x for x in o if x["kind"] == "Service" and x["metadata"]["name"] == name)

    def dns_service(o):
        a = next(x for x in router(o)["args"] if x.startswith("--replicas-dns="))
        return svc(o, a.split("=", 1)[1].split(".")[0])

    def client(o):
        return next(x for x in o if x["kind"] == "Service" and x["spec"].get("clusterIP") != "None"
                    and x["spec"].get("selector", {}).get("app.kubernetes.io/component") ==
                    "router")

    mutations = [
        ("replicas Service selects one gang only",
         lambda o: dns_service(o)["spec"]["selector"].update(
             {"app.kubernetes.io/instance": "ganglion-a"}),
         "exactly Pod 0 of every gang"),
        ("replicas Service selects no Pod", lambda o: dns_service(o)["spec"]["selector"].update(
            {"apps.kubernetes.io/pod-index": "1"}), "exactly Pod 0 of every gang"),
        ("replicas Service publishes not-Ready Pods",
         lambda o: dns_service(o)["spec"].update(publishNotReadyAddresses=True),
         "publishes not-Ready"),
        ("unknown router flag", lambda o: router(o)["args"].append("--no-such-flag=1"),
         "not --FLAG=VALUE"),
        ("client Service selects the gangs", lambda o: client(o)["spec"]["selector"].update(
            {"app.kubernetes.io/component": "gang"}), "exactly the router Pods"),
        ("router readiness on /healthz", lambda o: router(o)["readinessProbe"]["httpGet"].update(
            path="/healthz"), "readinessProbe must GET /readyz"),
    ]
    failed = []
    for what, mutate, phrase in mutations:
        o = copy.deepcopy(objs)
        mutate(o)
        out = new_out()
        with contextlib.redirect_stdout(io.StringIO()):
            checker.check(o, out)
        hit = [e for e in out.errors if phrase in e]
        if hit:
            say("  ok   caught: %s: %s" % (what, hit[0][:120]))
        else:
            say("  FAIL not caught: %s (errors: %s)" % (what, out.errors or "none"))
            failed.append(what)
    return failed
