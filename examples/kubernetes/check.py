#!/usr/bin/env python3
"""Checks a gang's manifests before `kubectl apply`: renders the overlay with
`kubectl kustomize`, then runs every Pod's exact command line and environment through
`ganglion serve --check-config` and compares the identity ganglion derives with what
the StatefulSet controller will give that Pod.

    GANGLION=build/bin/ganglion examples/kubernetes/check.py [OVERLAY_DIR]

OVERLAY_DIR defaults to this folder. The overlay is rendered from a temporary copy of the
repository's k8s/ and the overlay, with a throwaway token and API key when
k8s/base/secrets/rdzv-token or k8s/base/secrets/api-key do not exist yet, so nothing in
your tree is written (and your secrets are never read). The model, token and API-key
paths are Pod paths; the check replaces them with a tiny model made by `ganglion mkmodel`
with the same TP/PP divisibility and the throwaway secrets.

Per Pod it checks: check-config exits 0; node index == StatefulSet ordinal; --nnodes ==
replicas; the coordinator is NAME-0.SERVICE.NAMESPACE.svc.cluster.local:RDZV_PORT;
the advertised address is the Pod IP; GPUs requested == --nproc-per-node; the Pod passes
--api-key-file (the inference API needs a key) and --token-file, each a file of a
mounted Secret.
Environment: GANGLION (default `ganglion` on PATH), KUBECTL (default kubectl on PATH or in
ganglion's tools venv). Exit status: 0 all good, 1 a check failed, 77 kubectl or PyYAML
missing.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def find_kubectl():
    cands = [os.environ.get("KUBECTL", ""), shutil.which("kubectl") or "",
             "/opt/ganglion-venv/bin/kubectl",
             os.path.expanduser("~/.cache/ganglion/venv/bin/kubectl")]
    return next((c for c in cands if c and os.access(c, os.X_OK)), None)


def render(kubectl, overlay, tmp):
    """Renders overlay from a copy of the tree under tmp; returns the list of objects."""
    import yaml
    rel = os.path.relpath(os.path.abspath(overlay), REPO)
    if rel.startswith(".."):
        sys.exit("check: %s is not inside %s (the copy keeps the path to k8s/base)"
                 % (overlay, REPO))
    shutil.copytree(os.path.join(REPO, "k8s"), os.path.join(tmp, "k8s"))
    shutil.copytree(os.path.abspath(overlay), os.path.join(tmp, rel), dirs_exist_ok=True)
    # Throwaway secrets, always: the copy's own, never the operator's.
    for name, value in (("rdzv-token", "check-only-token-not-a-secret-0123456789\n"),
                        ("api-key", "check-only-api-key-not-a-secret-9876543210\n")):
        with open(os.path.join(tmp, "k8s", "base", "secrets", name), "w") as f:
            f.write(value)
    r = subprocess.run([kubectl, "kustomize", os.path.join(tmp, rel)], capture_output=True,
                       text=True, timeout=120)
    if r.returncode != 0:
        sys.exit("check: kubectl kustomize failed:\n" + r.stderr)
    return [o for o in yaml.safe_load_all(r.stdout) if o]


def flag(args, name):
    for i, a in enumerate(args):
        if a.startswith("--%s=" % name):
            return a.split("=", 1)[1]
        if a == "--" + name and i + 1 < len(args):
            return args[i + 1]
    return None


def set_flag(args, name, value):
    out = [a for a in args if not a.startswith("--%s=" % name)]
    return out + ["--%s=%s" % (name, value)]


def secret_mount(container, volumes, path):
    """The Secret name whose volume holds the Pod path `path` (read-only), else None."""
    for m in container.get("volumeMounts") or []:
        mp = m["mountPath"].rstrip("/")
        if path.startswith(mp + "/") and m.get("readOnly"):
            v = volumes.get(m["name"]) or {}
            if "secret" in v:
                return v["secret"]["secretName"]
    return None


def pod_env(sts, container, configmaps, index, ip):
    """The container's environment in Pod `index`, as the kubelet would set it."""
    meta = sts["spec"]["template"]["metadata"]
    name = "%s-%d" % (sts["metadata"]["name"], index)
    fields = {"metadata.name": name, "metadata.namespace": sts["metadata"].get("namespace",
                                                                               "default"),
              "status.podIP": ip}
    for k, v in (meta.get("labels") or {}).items():
        fields["metadata.labels['%s']" % k] = v
    env = {}
    for src in container.get("envFrom") or []:
        ref = (src.get("configMapRef") or {}).get("name")
        env.update(configmaps.get(ref, {}))
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)),
                                    str(e["value"]))
        elif "fieldRef" in (e.get("valueFrom") or {}):
            env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def main():
    overlay = sys.argv[1] if len(sys.argv) > 1 else HERE
    ganglion = shutil.which(os.environ.get("GANGLION", "ganglion"))
    if ganglion is None:
        print("check: ganglion not found: set GANGLION=path/to/ganglion")
        return 1
    kubectl = find_kubectl()
    if kubectl is None:
        print("SKIP: kubectl not found (scripts/install-deps.sh installs it)")
        return 77
    try:
        import yaml  # noqa: F401
    except ImportError:
        print("SKIP: PyYAML missing (apt-get install python3-yaml)")
        return 77
    failures = 0
    with tempfile.TemporaryDirectory(prefix="ganglion-k8s-check-") as tmp:
        objs = render(kubectl, overlay, tmp)
        configmaps = {o["metadata"]["name"]: o.get("data") or {}
                      for o in objs if o["kind"] == "ConfigMap"}
        for sts in (o for o in objs if o["kind"] == "StatefulSet"):
            c = sts["spec"]["template"]["spec"]["containers"][0]
            args = (c.get("command") or [])[2:] + [str(a) for a in c.get("args") or []]
            tp, pp = int(flag(args, "tp") or 1), int(flag(args, "pp") or 1)
            model = os.path.join(tmp, "model")
            if not os.path.exists(model):
                subprocess.run([ganglion, "mkmodel", "--out", model, "--layers", str(2 * pp),
                                "--hidden", str(32 * tp), "--heads", str(2 * tp),
                                "--kv-heads", str(tp), "--ffn", str(32 * tp), "--vocab", "256"],
                               check=True, stdout=subprocess.DEVNULL, timeout=60)
            volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"].get("volumes") or []}
            secrets_bad = []
            for fl in ("token-file", "api-key-file"):
                where = flag(args, fl)
                if not where:
                    secrets_bad.append("no --%s" % fl)
                elif secret_mount(c, volumes, where) is None:
                    secrets_bad.append("--%s %s is not on a read-only Secret volume"
                                       % (fl, where))
            secrets = os.path.join(tmp, "k8s", "base", "secrets")
            args = set_flag(set_flag(set_flag(args, "model", model), "token-file",
                                     os.path.join(secrets, "rdzv-token")),
                            "api-key-file", os.path.join(secrets, "api-key"))
            replicas = sts["spec"]["replicas"]
            gpus = int(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
            ns = sts["metadata"].get("namespace", "default")
            for i in range(replicas):
                ip = "10.0.0.%d" % (i + 1)
                env = pod_env(sts, c, configmaps, i, ip)
                env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
                r = subprocess.run([ganglion, "serve"] + args + ["--check-config"], env=env,
                                   capture_output=True, text=True, timeout=60)
                name = "%s-%d" % (sts["metadata"]["name"], i)
                if r.returncode != 0:
                    print("FAIL %s: check-config exit %d: %s" % (name, r.returncode,
                                                                 r.stderr.strip()))
                    failures += 1
                    continue
                values = dict(line.split("=", 1) for line in r.stdout.splitlines()
                              if "=" in line and not line.startswith("#"))
                m = re.search(r"^# identity: node (\d+) of (\d+) from (\S+); coordinator (\S+)$",
                              r.stdout, re.M)
                want = "%s-0.%s.%s.svc.cluster.local:%s" % (
                    sts["metadata"]["name"], env.get("GANGLION_SERVICE"), ns, values["rdzv-port"])
                bad = list(secrets_bad)
                if m is None:
                    bad.append("no identity line")
                else:
                    if int(m.group(1)) != i:
                        bad.append("node %s, expected %d" % (m.group(1), i))
                    if int(m.group(2)) != replicas:
                        bad.append("%s nodes, but %d replicas" % (m.group(2), replicas))
                    if m.group(4) != want:
                        bad.append("coordinator %s, expected %s" % (m.group(4), want))
                if values.get("advertise-address") != ip:
                    bad.append("advertises %s, not the Pod IP" % values.get("advertise-address"))
                if gpus and gpus != int(values["nproc-per-node"]):
                    bad.append("%d GPUs per Pod, --nproc-per-node %s"
                               % (gpus, values["nproc-per-node"]))
                if bad:
                    print("FAIL %s: %s" % (name, "; ".join(bad)))
                    failures += 1
                else:
                    print("ok   %s: node %d of %d, coordinator %s, tp %s x pp %s, %s GPU(s), "
                          "token and API key from Secrets"
                          % (name, i, replicas, want, values["tp"], values["pp"],
                             values["nproc-per-node"]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
