#!/usr/bin/env python3
"""Validates ganglion's Kubernetes manifests (k8s/base and every k8s/overlays/*).

For every kustomization this test
  1. renders it with `kubectl kustomize`;
  2. validates every rendered object against the JSON schemas of a current Kubernetes
     version (the kubernetes-validate package, strict: unknown fields are errors). The
     LeaderWorkerSet CRD is not in those schemas: it is validated against
     tests/k8s/schemas/leaderworkerset-v1.json (written from the LWS v1 API types) and
     its Pod templates against Kubernetes' own PodTemplateSpec schema;
  3. checks the wiring that no schema sees: references to ConfigMaps, Secrets and
     ResourceClaimTemplates resolve; Service, PDB, StatefulSet and anti-affinity
     selectors select the Pods they are meant to; the client Service selects exactly
     every gang Pod (each serves the API, members forward to their coordinator);
     replicas == --nnodes, GPUs per Pod == --nproc-per-node, tp x pp == world (ep x pp
     when --ep is a multiple of --tp above it);
     probes, ports and timeouts fit ganglion's own (docs/operations.md);
  4. simulates every Pod of every gang (the name, labels, Downward-API values, the
     variables LeaderWorkerSet injects, service links when enabled, the mounted token
     and API-key Secrets and a model made by `ganglion mkmodel` on the model volume) and
     runs its exact rendered command line and environment through
     `ganglion serve --check-config`, which must accept it and derive the expected
     identity and coordinator address; --api-key-file must be a key of a read-only
     Secret other than the rendezvous token;
  5. self-tests: breaks the base in ways that must be caught and checks that they are.

Exit status: 0 all passed, 1 a check failed, 77 a tool is missing (CTest SKIP_RETURN_CODE;
the reason is printed). scripts/install-k8s-tools.sh installs the tools.
"""
import argparse
import base64
import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import router_checks  # noqa: E402

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
NS = "ganglion-test"  # the namespace the simulated Pods run in
CLUSTER_DOMAIN = "cluster.local"
LWS_GROUP = "leaderworkerset.x-k8s.io"
# Objects the manifests use but do not create: documented prerequisites of the cluster.
EXTERNAL = {("PersistentVolumeClaim", "ganglion-models")}
GPU_RESOURCE = re.compile(r"^nvidia\.com/(gpu|gpu\.shared|mig-\d+g\.\d+gb(\.me)?)$")
TEST_TOKEN = "ganglion-k8s-validate-test-token-not-a-secret-0123456789abcdef"
TEST_API_KEY = "ganglion-k8s-validate-test-api-key-not-a-secret-0123456789"


def say(msg):
    print(msg, flush=True)


def skip(reason):
    say("SKIP k8s-validate: " + reason)
    sys.exit(SKIP)


# --------------------------------------------------------------------------- tools


def venv_candidates():
    out = []
    if os.environ.get("GANGLION_K8S_VENV"):
        out.append(os.environ["GANGLION_K8S_VENV"])
    out.append("/opt/ganglion-venv")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    out.append(os.path.join(cache, "ganglion", "venv"))
    return out


def ensure_python_tools():
    """Imports kubernetes_validate and yaml, re-executing under the tools' venv if needed."""
    try:
        import kubernetes_validate  # noqa: F401
        import yaml  # noqa: F401
        return
    except ImportError:
        pass
    if os.environ.get("GANGLION_K8S_REEXEC") != "1":
        for v in venv_candidates():
            py = os.path.join(v, "bin", "python")
            if os.access(py, os.X_OK):
                probe = subprocess.run([py, "-c", "import kubernetes_validate, yaml"],
                                       capture_output=True)
                if probe.returncode == 0:
                    env = dict(os.environ, GANGLION_K8S_REEXEC="1")
                    os.execve(py, [py, os.path.abspath(__file__)] + sys.argv[1:], env)
    skip("the Python package kubernetes-validate (with PyYAML) is not installed here or in "
         "any of " + ", ".join(venv_candidates()) + ": run scripts/install-k8s-tools.sh")


def find_kubectl():
    cands = []
    if shutil.which("kubectl"):
        cands.append(shutil.which("kubectl"))
    cands += [os.path.join(v, "bin", "kubectl") for v in venv_candidates()]
    for k in cands:
        if os.access(k, os.X_OK):
            r = subprocess.run([k, "kustomize", "--help"], capture_output=True, text=True)
            if r.returncode == 0:
                return k
    skip("no kubectl with `kubectl kustomize` on PATH or in the tools' venv: run "
         "scripts/install-k8s-tools.sh")


# --------------------------------------------------------------------------- schemas


class Schemas:
    """Strict Kubernetes JSON schemas from kubernetes-validate, plus the LWS CRD schema."""

    def __init__(self, version):
        import kubernetes_validate.utils as kvu
        self.kvu = kvu
        import importlib_resources
        import jsonschema
        import referencing
        self.jsonschema = jsonschema
        self.referencing = referencing
        self.version = version or kvu.latest_version()
        self.mm = kvu.major_minor(self.version)
        versions = [v for v in kvu.all_versions() if kvu.major_minor(v) <= self.mm]
        if not versions:
            raise SystemExit("kubernetes-validate has no schemas for Kubernetes %s" % self.version)
        self.dir = importlib_resources.files("kubernetes_validate").joinpath(
            "kubernetes-json-schema", "v%s-local-strict" % versions[-1])
        self.defs = json.loads(self.dir.joinpath("_definitions.json").read_text())
        with open(os.path.join(HERE, "schemas", "leaderworkerset-v1.json")) as f:
            self.lws = json.load(f)

    def _validate_file(self, filename, data):
        """Errors of data against one schema file of the strict set (list of strings)."""
        from referencing import Registry, Resource
        schema = json.loads(self.dir.joinpath(filename).read_text())
        registry = Resource.from_contents(schema) @ Registry()
        registry = Resource.from_contents(self.defs) @ registry
        v = self.jsonschema.validators.Draft202012Validator(schema, registry=registry)
        return ["%s: %s" % (".".join(str(p) for p in e.absolute_path) or "(root)", e.message)
                for e in sorted(v.iter_errors(data), key=lambda e: list(e.absolute_path))]

    def validate(self, obj):
        """Returns (description, errors) for one rendered object."""
        api = obj.get("apiVersion", "")
        kind = obj.get("kind", "")
        if api.split("/")[0] == LWS_GROUP:
            v = self.jsonschema.validators.Draft202012Validator(self.lws)
            errs = ["%s: %s" % (".".join(str(p) for p in e.absolute_path) or "(root)", e.message)
                    for e in v.iter_errors(obj)]
            lwt = obj.get("spec", {}).get("leaderWorkerTemplate", {})
            for key in ("leaderTemplate", "workerTemplate"):
                if key in lwt:
                    errs += ["%s: %s" % (key, e)
                             for e in self._validate_file("podtemplatespec-v1.json", lwt[key])]
            return ("CRD schema tests/k8s/schemas/leaderworkerset-v1.json + Pod templates "
                    "against Kubernetes %s PodTemplateSpec (strict)" % self.mm), errs
        try:
            self.kvu.validate(obj, self.version, strict=True)
            return "Kubernetes %s schema (strict)" % self.mm, []
        except self.kvu.ValidationError as e:
            path = ".".join(str(p) for p in e.path) or "(root)"
            return "Kubernetes %s schema (strict)" % self.mm, ["%s: %s" % (path, e.message)]
        except self.kvu.SchemaNotFoundError as e:
            return "no schema", ["no schema for %s %s in Kubernetes %s: %s" %
                                 (api, kind, self.mm, e.message)]


# --------------------------------------------------------------------------- helpers


def oname(o):
    return "%s/%s" % (o.get("kind"), o.get("metadata", {}).get("name"))


def by_kind(objs, kind):
    return {o["metadata"]["name"]: o for o in objs if o.get("kind") == kind}


def selector_matches(sel, labels):
    """Kubernetes label selector (Service map or LabelSelector) against a label map."""
    if sel is None:
        return False
    if "matchLabels" in sel or "matchExpressions" in sel:
        for k, v in (sel.get("matchLabels") or {}).items():
            if labels.get(k) != v:
                return False
        for e in sel.get("matchExpressions") or []:
            k, op, vals = e["key"], e["operator"], e.get("values") or []
            if op == "In" and labels.get(k) not in vals:
                return False
            if op == "NotIn" and labels.get(k) in vals:
                return False
            if op == "Exists" and k not in labels:
                return False
            if op == "DoesNotExist" and k in labels:
                return False
        return True
    return all(labels.get(k) == v for k, v in sel.items())


def expand(s, env):
    """Kubernetes $(VAR) expansion: defined variables are replaced, $$ escapes, the rest stays."""
    out, i = [], 0
    while i < len(s):
        if s.startswith("$$", i):
            out.append("$")
            i += 2
        elif s.startswith("$(", i):
            j = s.find(")", i + 2)
            if j < 0:
                out.append(s[i:])
                break
            name = s[i + 2:j]
            out.append(env[name] if name in env else s[i:j + 1])
            i = j + 1
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def service_link_env(services):
    """The variables kubelet injects for each ClusterIP Service when enableServiceLinks is on."""
    env = {}
    for i, (name, svc) in enumerate(sorted(services.items())):
        spec = svc.get("spec", {})
        if spec.get("clusterIP") == "None" or spec.get("type") == "ExternalName":
            continue
        ip = "10.96.0.%d" % (10 + i)
        n = name.upper().replace("-", "_")
        ports = spec.get("ports") or []
        if not ports:
            continue
        p0 = ports[0]
        env[n + "_SERVICE_HOST"] = ip
        env[n + "_SERVICE_PORT"] = str(p0["port"])
        env[n + "_PORT"] = "%s://%s:%d" % (p0.get("protocol", "TCP").lower(), ip, p0["port"])
        for p in ports:
            proto = p.get("protocol", "TCP")
            if p.get("name"):
                env[n + "_SERVICE_PORT_" + p["name"].upper().replace("-", "_")] = str(p["port"])
            pre = "%s_PORT_%d_%s" % (n, p["port"], proto)
            env[pre] = "%s://%s:%d" % (proto.lower(), ip, p["port"])
            env[pre + "_PROTO"] = proto.lower()
            env[pre + "_PORT"] = str(p["port"])
            env[pre + "_ADDR"] = ip
    return env


def flag_value(args, flag):
    """Value of --flag in an argv (either --flag=V or --flag V); None when absent."""
    for i, a in enumerate(args):
        if a == "--" + flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--" + flag + "="):
            return a.split("=", 1)[1]
    return None


def probe_port(container, probe):
    p = (probe.get("httpGet") or {}).get("port")
    if isinstance(p, str) and not p.isdigit():
        for cp in container.get("ports") or []:
            if cp.get("name") == p:
                return cp["containerPort"]
        return None
    return int(p) if p is not None else None


def named_port(container, name):
    for cp in container.get("ports") or []:
        if cp.get("name") == name:
            return cp["containerPort"]
    return None


def window_s(probe):
    return probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)


# --------------------------------------------------------------------------- gangs


class Pod:
    """One simulated Pod of a gang: what kubelet and the controller would give it."""

    def __init__(self, name, index, labels, template, injected_env, expect_source,
                 expect_coordinator_host, group):
        self.name = name
        self.index = index  # node index ganglion must derive
        self.labels = labels
        self.template = template
        self.spec = template.get("spec", {})
        self.injected_env = injected_env
        self.expect_source = expect_source
        self.expect_coordinator_host = expect_coordinator_host
        self.group = group
        self.ip = "10.244.%d.%d" % (group, 10 + index)


class Gang:
    def __init__(self, kind, name, obj, nnodes, pods):
        self.kind, self.name, self.obj, self.nnodes, self.pods = kind, name, obj, nnodes, pods

    @property
    def label(self):
        return "%s/%s" % (self.kind, self.name)


def gangs_of(objs):
    gangs = []
    for o in objs:
        md = o.get("metadata", {})
        if o.get("kind") == "StatefulSet":
            spec = o["spec"]
            tpl = spec["template"]
            n = spec.get("replicas", 1)
            pods = []
            for i in range(n):
                labels = dict(tpl.get("metadata", {}).get("labels") or {})
                labels.update({"apps.kubernetes.io/pod-index": str(i),
                               "statefulset.kubernetes.io/pod-name": "%s-%d" % (md["name"], i),
                               "controller-revision-hash": md["name"] + "-5d8c7b9f6"})
                host = "%s-0.%s.%s.svc.%s" % (md["name"], spec.get("serviceName"), NS,
                                              CLUSTER_DOMAIN)
                pods.append(Pod("%s-%d" % (md["name"], i), i, labels, tpl, {}, "statefulset",
                                host, 0))
            gangs.append(Gang("StatefulSet", md["name"], o, n, pods))
        elif o.get("kind") == "LeaderWorkerSet":
            spec = o["spec"]
            lwt = spec["leaderWorkerTemplate"]
            size = lwt.get("size", 1)
            subdomain_policy = (spec.get("networkConfig") or {}).get("subdomainPolicy", "Shared")
            for g in range(min(spec.get("replicas", 1), 2)):
                leader = "%s-%d" % (md["name"], g)
                subdomain = md["name"] if subdomain_policy == "Shared" else leader
                address = "%s.%s.%s" % (leader, subdomain, NS)
                key = hashlib.sha1(("%s/%s" % (NS, leader)).encode()).hexdigest()
                pods = []
                for w in range(size):
                    tpl = lwt.get("leaderTemplate") if w == 0 and lwt.get("leaderTemplate") \
                        else lwt["workerTemplate"]
                    labels = dict(tpl.get("metadata", {}).get("labels") or {})
                    labels.update({"leaderworkerset.sigs.k8s.io/name": md["name"],
                                   "leaderworkerset.sigs.k8s.io/group-index": str(g),
                                   "leaderworkerset.sigs.k8s.io/worker-index": str(w),
                                   "leaderworkerset.sigs.k8s.io/group-key": key})
                    env = {"LWS_LEADER_ADDRESS": address, "LWS_GROUP_SIZE": str(size),
                           "LWS_WORKER_INDEX": str(w)}
                    name = leader if w == 0 else "%s-%d" % (leader, w)
                    pods.append(Pod(name, w, labels, tpl, env, "leaderworkerset", address, g))
                gangs.append(Gang("LeaderWorkerSet", "%s group %d" % (md["name"], g), o, size,
                                  pods))
    return gangs


def ganglion_container(pod_spec):
    for c in pod_spec.get("containers") or []:
        cmd = c.get("command") or []
        if cmd and os.path.basename(cmd[0]) == "ganglion":
            return c
    return None


# --------------------------------------------------------------------------- checker


class Checker:
    def __init__(self, bin_path, tmp):
        self.bin = bin_path
        self.tmp = tmp
        self.models = {}

    # ---- model --------------------------------------------------------------------

    def make_model(self, path, tp, pp, ep=1):
        """Makes a tiny model at path whose shape divides by tp and pp (a Qwen3-MoE one
        with 2 x ep experts when ep > 1); returns an error."""
        if path in self.models:
            return self.models[path]
        kv = max(8, tp)
        heads = 2 * kv
        cmd = [self.bin, "mkmodel", "--out", path, "--layers", str(max(4, pp)),
               "--hidden", str(heads * 8), "--heads", str(heads), "--kv-heads", str(kv),
               "--ffn", str(max(256, 32 * tp)), "--vocab", str(max(256, 32 * tp)),
               "--seed", "1"]
        if ep > 1:
            cmd += ["--arch", "qwen3", "--moe", "qwen3", "--experts", str(2 * ep), "--top-k",
                    "2"]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        err = None
        if r.returncode != 0:
            err = "`%s` failed (exit %d): %s" % (" ".join(cmd), r.returncode,
                                                 (r.stderr + r.stdout).strip())
        self.models[path] = err
        return err

    # ---- the whole target -----------------------------------------------------------

    def check(self, objs, out):
        """Runs every check on the rendered objects of one target; appends to out."""
        cms, secrets = by_kind(objs, "ConfigMap"), by_kind(objs, "Secret")
        services = by_kind(objs, "Service")
        gangs = gangs_of(objs)
        if not gangs:
            out.err("no StatefulSet or LeaderWorkerSet running `ganglion serve`")
            return
        self.check_references(objs, out)
        self.check_images(gangs, out)
        all_pods = [(g, p) for g in gangs for p in g.pods]
        job_names = {}
        for g in gangs:
            self.check_controller(g, objs, services, out)
            for p in g.pods:
                values = self.check_pod(g, p, objs, cms, secrets, services, out)
                if values is not None:
                    job_names.setdefault(values.get("job-name"), set()).add(g.label)
        if any(len(v) > 1 for v in job_names.values()):
            out.err("gangs share a job name: %s" % {k: sorted(v) for k, v in job_names.items()})
        c0 = ganglion_container(gangs[0].pods[0].spec)
        if not router_checks.check_routers(self.bin, objs, gangs, services,
                                           c0.get("image") if c0 else None, NS, CLUSTER_DOMAIN,
                                           out):
            self.check_client_service(all_pods, services, out)
        self.check_pdb(gangs, objs, out)

    def check_references(self, objs, out):
        present = {(o["kind"], o["metadata"]["name"]) for o in objs}

        def need(kind, name, where, optional=False):
            if (kind, name) in present or optional:
                return
            if (kind, name) in EXTERNAL:
                out.note("%s refers to %s/%s, a documented prerequisite the cluster "
                         "provides (docs/operations.md)" % (where, kind, name))
                return
            out.err("%s refers to %s/%s, which the kustomization does not create" %
                    (where, kind, name))

        for o in objs:
            specs = []
            if o["kind"] == "StatefulSet":
                specs.append(o["spec"]["template"]["spec"])
            elif o["kind"] == "LeaderWorkerSet":
                lwt = o["spec"]["leaderWorkerTemplate"]
                specs += [t["spec"] for t in (lwt.get("leaderTemplate"), lwt["workerTemplate"])
                          if t]
            for spec in specs:
                w = oname(o)
                for v in spec.get("volumes") or []:
                    if "secret" in v:
                        need("Secret", v["secret"]["secretName"], w, v["secret"].get("optional"))
                    if "configMap" in v:
                        need("ConfigMap", v["configMap"]["name"], w, v["configMap"].get("optional"))
                    if "persistentVolumeClaim" in v:
                        need("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"], w)
                for rc in spec.get("resourceClaims") or []:
                    if rc.get("resourceClaimTemplateName"):
                        need("ResourceClaimTemplate", rc["resourceClaimTemplateName"], w)
                for c in spec.get("containers") or []:
                    for ef in c.get("envFrom") or []:
                        if "configMapRef" in ef:
                            need("ConfigMap", ef["configMapRef"]["name"], w,
                                 ef["configMapRef"].get("optional"))
                        if "secretRef" in ef:
                            need("Secret", ef["secretRef"]["name"], w,
                                 ef["secretRef"].get("optional"))
                    for e in c.get("env") or []:
                        vf = e.get("valueFrom") or {}
                        if "configMapKeyRef" in vf:
                            need("ConfigMap", vf["configMapKeyRef"]["name"], w,
                                 vf["configMapKeyRef"].get("optional"))
                        if "secretKeyRef" in vf:
                            need("Secret", vf["secretKeyRef"]["name"], w,
                                 vf["secretKeyRef"].get("optional"))

    def check_images(self, gangs, out):
        images = set()
        for g in gangs:
            c = ganglion_container(g.pods[0].spec)
            if c is not None:
                images.add(c.get("image"))
        for im in images:
            if im is None or "/" not in im or ":" not in im.split("/")[-1]:
                out.err("image %r was not set by the kustomization's `images` (registry/name:tag)"
                        % im)
        if len(images) > 1:
            out.err("gangs run different images: %s" % sorted(images))

    def check_controller(self, g, objs, services, out):
        o = g.obj
        if g.kind == "StatefulSet":
            spec = o["spec"]
            if spec.get("podManagementPolicy") != "Parallel":
                out.err("%s: podManagementPolicy must be Parallel (a gang never becomes Ready "
                        "one Pod at a time)" % g.label)
            if (spec.get("updateStrategy") or {}).get("type") != "OnDelete":
                out.err("%s: updateStrategy must be OnDelete (a RollingUpdate stalls on a "
                        "half-updated gang; docs/operations.md)" % g.label)
            tpl_labels = spec["template"]["metadata"].get("labels") or {}
            if not selector_matches(spec.get("selector"), tpl_labels):
                out.err("%s: spec.selector does not match the Pod template's labels" % g.label)
            svc = services.get(spec.get("serviceName"))
            if svc is None:
                out.err("%s: serviceName %r is not a Service of this kustomization" %
                        (g.label, spec.get("serviceName")))
            else:
                s = svc["spec"]
                if s.get("clusterIP") != "None":
                    out.err("Service/%s (serviceName of %s) must be headless (clusterIP None)" %
                            (svc["metadata"]["name"], g.label))
                if s.get("publishNotReadyAddresses") is not True:
                    out.err("Service/%s must publishNotReadyAddresses: Pods are Ready only once "
                            "the gang formed, which needs the names" % svc["metadata"]["name"])
                if not all(selector_matches(s.get("selector"), p.labels) for p in g.pods):
                    out.err("headless Service/%s does not select every Pod of %s" %
                            (svc["metadata"]["name"], g.label))
                ports = {p.get("name"): p for p in s.get("ports") or []}
                for pn in ("rdzv", "http"):
                    if pn not in ports:
                        out.err("headless Service/%s lacks the %s port" %
                                (svc["metadata"]["name"], pn))
        else:
            lwt = o["spec"]["leaderWorkerTemplate"]
            if lwt.get("restartPolicy") != "RecreateGroupOnPodRestart":
                out.err("%s: leaderWorkerTemplate.restartPolicy must be RecreateGroupOnPodRestart"
                        % g.label)
        out.ok("%s: controller wiring (%d Pods)" % (g.label, len(g.pods)))

    def check_client_service(self, all_pods, services, out):
        clients = [s for s in services.values()
                   if s["spec"].get("clusterIP") != "None" and s["spec"].get("type", "ClusterIP")
                   in ("ClusterIP", "LoadBalancer", "NodePort")]
        if not clients:
            out.err("no client (ClusterIP) Service for the inference API")
            return
        for s in clients:
            sel = s["spec"].get("selector")
            picked = {p.name for _, p in all_pods if selector_matches(sel, p.labels)}
            every = {p.name for _, p in all_pods}
            if picked != every:
                out.err("client Service/%s selects %s; it must select exactly every gang Pod "
                        "%s" % (s["metadata"]["name"], sorted(picked), sorted(every)))
            else:
                out.ok("client Service/%s selects exactly every gang Pod (%d)" %
                       (s["metadata"]["name"], len(every)))

    def check_pdb(self, gangs, objs, out):
        pdbs = list(by_kind(objs, "PodDisruptionBudget").values())
        for g in gangs:
            cover = [b for b in pdbs if all(selector_matches(b["spec"].get("selector"), p.labels)
                                            for p in g.pods)]
            if not cover:
                out.err("%s: no PodDisruptionBudget selects every member of the gang" % g.label)
                continue
            b = cover[0]["spec"]
            whole = b.get("maxUnavailable") in (0, "0", "0%") or \
                b.get("minAvailable") in ("100%", g.nnodes)
            if not whole:
                out.err("%s: PodDisruptionBudget/%s lets a member of a serving gang be evicted" %
                        (g.label, cover[0]["metadata"]["name"]))

    # ---- one Pod -------------------------------------------------------------------

    def resolve_env(self, g, p, c, cms, secrets, services, out):
        env = {}
        if p.spec.get("enableServiceLinks", True) is not False:
            env.update(service_link_env(services))
        env.update(p.injected_env)
        for ef in c.get("envFrom") or []:
            prefix = ef.get("prefix", "")
            if "configMapRef" in ef:
                cm = cms.get(ef["configMapRef"]["name"])
                for k, v in ((cm or {}).get("data") or {}).items():
                    env[prefix + k] = v
            if "secretRef" in ef:
                s = secrets.get(ef["secretRef"]["name"])
                for k, v in ((s or {}).get("data") or {}).items():
                    env[prefix + k] = base64.b64decode(v).decode()
        field = {"metadata.name": p.name, "metadata.namespace": NS,
                 "metadata.uid": "00000000-0000-4000-8000-%012d" % p.index,
                 "spec.nodeName": "gpu-node-%d-%d" % (p.group, p.index),
                 "spec.serviceAccountName": p.spec.get("serviceAccountName", "default"),
                 "status.podIP": p.ip, "status.podIPs": p.ip,
                 "status.hostIP": "192.0.2.%d" % (10 + p.index)}
        for e in c.get("env") or []:
            name = e["name"]
            if "value" in e:
                env[name] = expand(str(e["value"]), env)
            elif "valueFrom" in e:
                vf = e["valueFrom"]
                if "fieldRef" in vf:
                    fp = vf["fieldRef"]["fieldPath"]
                    m = re.match(r"^metadata\.(labels|annotations)\['([^']+)'\]$", fp)
                    if m:
                        src = p.labels if m.group(1) == "labels" else \
                            (p.template.get("metadata", {}).get("annotations") or {})
                        if m.group(2) not in src:
                            out.err("%s: env %s refers to %s, which the Pod does not have" %
                                    (p.name, name, fp))
                        env[name] = src.get(m.group(2), "")
                    elif fp in field:
                        env[name] = field[fp]
                    else:
                        out.err("%s: env %s: unsupported fieldRef %s" % (p.name, name, fp))
                elif "configMapKeyRef" in vf:
                    ref = vf["configMapKeyRef"]
                    env[name] = ((cms.get(ref["name"]) or {}).get("data") or {}).get(ref["key"], "")
                elif "secretKeyRef" in vf:
                    ref = vf["secretKeyRef"]
                    v = ((secrets.get(ref["name"]) or {}).get("data") or {}).get(ref["key"])
                    env[name] = base64.b64decode(v).decode() if v else ""
                elif "resourceFieldRef" in vf:
                    env[name] = "1"
        return env

    def mount_volumes(self, target, g, p, c, secrets, cms, out):
        """Lays out this Pod's volumes in the temp dir; returns [(mountPath, hostPath, vol)]."""
        vols = {v["name"]: v for v in p.spec.get("volumes") or []}
        mounts = []
        for m in c.get("volumeMounts") or []:
            v = vols.get(m["name"])
            if v is None:
                out.err("%s: volumeMount %s has no volume" % (p.name, m["name"]))
                continue
            if "persistentVolumeClaim" in v:
                host = os.path.join(self.tmp, "pvc", target,
                                    v["persistentVolumeClaim"]["claimName"])
            else:
                host = os.path.join(self.tmp, "pods", target, g.name.replace(" ", "_"), p.name,
                                    m["name"])
            os.makedirs(host, exist_ok=True)
            if "secret" in v:
                data = (secrets.get(v["secret"]["secretName"]) or {}).get("data") or {}
                for k, val in data.items():
                    with open(os.path.join(host, k), "wb") as f:
                        f.write(base64.b64decode(val))
            if "configMap" in v:
                data = (cms.get(v["configMap"]["name"]) or {}).get("data") or {}
                for k, val in data.items():
                    with open(os.path.join(host, k), "w") as f:
                        f.write(val)
            mounts.append((m["mountPath"].rstrip("/") or "/", host, v, m))
        mounts.sort(key=lambda t: -len(t[0]))
        return mounts

    @staticmethod
    def host_path(path, mounts):
        for mp, host, v, m in mounts:
            if path == mp or path.startswith(mp + "/"):
                return host + path[len(mp):], (v, m)
        return None, None

    def rewrite(self, value, mounts):
        """Maps a Pod path (or --flag=path) onto the temp dir laid out for its volumes."""
        if value.startswith("--") and "=" in value:
            flag, val = value.split("=", 1)
            return flag + "=" + self.rewrite(val, mounts)
        hp, _ = self.host_path(value, mounts)
        return hp if hp is not None else value

    def check_pod(self, g, p, objs, cms, secrets, services, out):
        """Static checks of one Pod and its `ganglion serve --check-config` run."""
        c = ganglion_container(p.spec)
        if c is None:
            out.err("%s: no container whose command is `ganglion serve`" % p.name)
            return None
        cmd = c.get("command") or []
        if cmd[1:2] != ["serve"]:
            out.err("%s: command must be `ganglion serve`, is %s" % (p.name, cmd))
            return None
        env = self.resolve_env(g, p, c, cms, secrets, services, out)
        args = [expand(str(a), env) for a in cmd[2:] + (c.get("args") or [])]
        mounts = self.mount_volumes(out.target, g, p, c, secrets, cms, out)
        # Paths on the Pod's volumes (as --flag=PATH or a separate PATH item) -> temp dir.
        args = [self.rewrite(a, mounts) for a in args]
        for k in list(env):
            if k.startswith("GANGLION_"):
                env[k] = self.rewrite(env[k], mounts)

        # The model: a tiny one made by `ganglion mkmodel` on the model volume.
        tp = int(flag_value(args, "tp") or env.get("GANGLION_TP", "1"))
        pp = int(flag_value(args, "pp") or env.get("GANGLION_PP", "1"))
        model = flag_value(args, "model") or env.get("GANGLION_MODEL")
        if not model:
            out.err("%s: no --model" % p.name)
        else:
            hp, vm = self.host_path_of(model, mounts)
            if hp is None:
                out.err("%s: --model %s is not on a mounted volume" % (p.name, model))
            else:
                ep = int(flag_value(args, "ep") or env.get("GANGLION_EP", "1"))
                e = self.make_model(model, tp, pp, ep)
                if e:
                    out.err(e)
        run_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        run_env.update(env)
        if "GANGLION_HOSTNAME" not in run_env and flag_value(args, "hostname") is None:
            run_env["GANGLION_HOSTNAME"] = p.name  # the kernel's host name in the Pod
        argv = [self.bin, "serve"] + args + ["--check-config"]
        r = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            out.err("%s: `ganglion serve --check-config` exit %d: %s\n      argv: %s\n      env: %s"
                    % (p.name, r.returncode, (r.stderr + r.stdout).strip(), argv[1:],
                       {k: v for k, v in sorted(env.items())
                        if k.startswith(("GANGLION_", "POD_", "LWS_"))}))
            return None
        values, ident = {}, None
        for line in r.stdout.splitlines():
            m = re.match(r"^# identity: node (\d+) of (\d+) from (\S+); coordinator (\S+)$", line)
            if m:
                ident = m
            elif "=" in line and not line.startswith("#"):
                k, v = line.split("=", 1)
                values[k] = v
        if ident is None:
            out.err("%s: check-config printed no identity line:\n%s" % (p.name, r.stdout))
            return None
        node, nnodes, source, coord = int(ident.group(1)), int(ident.group(2)), ident.group(3), \
            ident.group(4)
        rdzv = int(values.get("rdzv-port", "29400"))
        want_coord = "%s:%d" % (p.expect_coordinator_host, rdzv)
        bad = []
        if node != p.index:
            bad.append("node %d, expected %d" % (node, p.index))
        if nnodes != g.nnodes:
            bad.append("%d nodes, but the controller runs %d Pods" % (nnodes, g.nnodes))
        if source != p.expect_source:
            bad.append("identity from %s, expected %s" % (source, p.expect_source))
        if coord != want_coord:
            bad.append("coordinator %s, expected %s" % (coord, want_coord))
        if values.get("advertise-address") != p.ip:
            bad.append("advertise-address %s, expected the Pod IP %s" %
                       (values.get("advertise-address"), p.ip))
        if not values.get("job-name"):
            bad.append("empty job name")
        for b in bad:
            out.err("%s: %s" % (p.name, b))
        self.check_shape(g, p, c, values, objs, out)
        self.check_pod_policy(g, p, c, values, mounts, out)
        if not bad:
            out.ok("%s: check-config accepted; node %d of %d from %s, coordinator %s, tp %s x "
                   "pp %s%s, job %s, model %s"
                   % (p.name, node, nnodes, source, coord, values.get("tp"), values.get("pp"),
                      " (ep %s: stages of ep ranks)" % values["ep"]
                      if int(values.get("ep", "1")) > int(values.get("tp", "1")) else "",
                      values.get("job-name"), values.get("model")))
        return values

    def host_path_of(self, path, mounts):
        # path may already be rewritten onto the temp dir
        if path.startswith(self.tmp):
            for mp, host, v, m in mounts:
                if path == host or path.startswith(host + "/"):
                    return path, (v, m)
            return None, None
        return self.host_path(path, mounts)

    def gpus_per_pod(self, p, c, objs):
        res = c.get("resources") or {}
        n, kinds = 0, []
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        for k in set(limits) | set(requests):
            if GPU_RESOURCE.match(k):
                n += int(limits.get(k, requests.get(k)))
                kinds.append(k)
        rcts = by_kind(objs, "ResourceClaimTemplate")
        claims = {cl["name"] for cl in res.get("claims") or []}
        for rc in p.spec.get("resourceClaims") or []:
            if rc["name"] not in claims:
                continue
            t = rcts.get(rc.get("resourceClaimTemplateName"))
            for req in ((t or {}).get("spec", {}).get("spec", {}).get("devices", {})
                        .get("requests") or []):
                ex = req.get("exactly") or {}
                if ex.get("allocationMode", "ExactCount") == "ExactCount":
                    n += ex.get("count", 1)
                    kinds.append("DRA claim %s" % rc["name"])
        return n, kinds

    def check_shape(self, g, p, c, values, objs, out):
        tp, pp = int(values["tp"]), int(values["pp"])
        nnodes, nproc = int(values["nnodes"]), int(values["nproc-per-node"])
        # A stage is the TP group, or the EP group when --ep is a multiple of --tp above it.
        ep = int(values.get("ep", "1"))
        stage = ep if ep > tp else tp
        if stage * pp != nnodes * nproc:
            out.err("%s: %s %d x pp %d != world %d x %d" % (p.name, "ep" if ep > tp else "tp",
                                                            stage, pp, nnodes, nproc))
        if nproc % tp != 0 and values.get("allow-cross-node-tp") not in ("1", "true"):
            out.err("%s: --tp %d does not fit inside a node of %d ranks" % (p.name, tp, nproc))
        gpus, kinds = self.gpus_per_pod(p, c, objs)
        if gpus != nproc:
            out.err("%s: the Pod gets %d GPUs (%s) but runs --nproc-per-node %d ranks" %
                    (p.name, gpus, ", ".join(kinds) or "none requested", nproc))
        res = c.get("resources") or {}
        for k, v in (res.get("requests") or {}).items():
            if GPU_RESOURCE.match(k) and (res.get("limits") or {}).get(k) != v:
                out.err("%s: extended resource %s needs limits equal to requests" % (p.name, k))

    def check_api_key(self, p, values, mounts, out):
        """--api-key-file: set, a key of a read-only Secret volume, not the rendezvous token.

        The API key goes to every client; the rendezvous token must not (it admits members
        to the gang), so the two must be different files with different contents. The
        probes need no key (ganglion leaves /healthz, /readyz and /metrics open), which is
        why they carry no Authorization header here either."""
        key = values.get("api-key-file", "")
        if not key:
            out.err("%s: no --api-key-file: the inference API would be open to anyone who "
                    "reaches the Service" % p.name)
            return
        _, vm = self.host_path_of(key, mounts)
        if vm is None or "secret" not in vm[0] or vm[1].get("readOnly") is not True:
            out.err("%s: --api-key-file %s is not on a read-only Secret volume" % (p.name, key))
            return
        if not os.path.isfile(key):
            out.err("%s: --api-key-file %s is not a key of its Secret" % (p.name, key))
            return
        tok = values.get("token-file", "")
        if tok and os.path.isfile(tok):
            with open(key, "rb") as f1, open(tok, "rb") as f2:
                same = f1.read().strip() == f2.read().strip()
            if os.path.realpath(key) == os.path.realpath(tok) or same:
                out.err("%s: --api-key-file is the rendezvous token: API clients would hold "
                        "the key that admits members to the gang" % p.name)
        c = ganglion_container(p.spec) or {}
        for name in ("startupProbe", "readinessProbe", "livenessProbe"):
            hdrs = ((c.get(name) or {}).get("httpGet") or {}).get("httpHeaders") or []
            if any(h.get("name", "").lower() == "authorization" for h in hdrs):
                out.err("%s: %s sends an Authorization header: the probes need no key, and "
                        "the key would sit in the Pod spec in clear" % (p.name, name))

    def check_pod_policy(self, g, p, c, values, mounts, out):
        spec = p.spec
        http, rdzv = int(values["http-port"]), int(values["rdzv-port"])
        if named_port(c, "http") != http or named_port(c, "rdzv") != rdzv:
            out.err("%s: container ports http/rdzv %s/%s != ganglion's --http-port %d / "
                    "--rdzv-port %d" % (p.name, named_port(c, "http"), named_port(c, "rdzv"),
                                        http, rdzv))
        probes = {"startupProbe": "/healthz", "readinessProbe": "/readyz",
                  "livenessProbe": "/healthz"}
        for name, path in probes.items():
            pr = c.get(name)
            if not pr:
                out.err("%s: no %s" % (p.name, name))
                continue
            if (pr.get("httpGet") or {}).get("path") != path or probe_port(c, pr) != http:
                out.err("%s: %s must GET %s on the HTTP port %d" % (p.name, name, path, http))
            if pr.get("timeoutSeconds", 1) > pr.get("periodSeconds", 10):
                out.err("%s: %s timeoutSeconds exceeds periodSeconds" % (p.name, name))
        live, start = c.get("livenessProbe") or {}, c.get("startupProbe") or {}
        linger = int(values["give-up-linger-ms"])
        if live and window_s(live) * 1000 <= linger:
            out.err("%s: liveness window %d s must exceed --give-up-linger-ms %d, so that a gang "
                    "that gave up exits 75 with its reason before kubelet kills it" %
                    (p.name, window_s(live), linger))
        if start and window_s(start) * 1000 > int(values["rendezvous-timeout-ms"]):
            out.err("%s: startup probe budget %d s exceeds --rendezvous-timeout-ms: /healthz "
                    "already fails then" % (p.name, window_s(start)))
        grace = spec.get("terminationGracePeriodSeconds", 30)
        if grace * 1000 < int(values["abort-timeout-ms"]) + 10000:
            out.err("%s: terminationGracePeriodSeconds %d leaves no room after --abort-timeout-ms "
                    "%s (+10 s for CUDA teardown)" % (p.name, grace, values["abort-timeout-ms"]))
        if (c.get("terminationMessagePath") or "/dev/termination-log") != values["termination-log"]:
            out.err("%s: terminationMessagePath %s != ganglion's --termination-log %s" %
                    (p.name, c.get("terminationMessagePath"), values["termination-log"]))
        ann = p.template.get("metadata", {}).get("annotations") or {}
        if ann.get("prometheus.io/scrape") != "true" or ann.get("prometheus.io/port") != str(http) \
                or ann.get("prometheus.io/path") != "/metrics":
            out.err("%s: Prometheus annotations must scrape /metrics on port %d" % (p.name, http))
        psc, csc = spec.get("securityContext") or {}, c.get("securityContext") or {}
        if not (csc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True):
            out.err("%s: runAsNonRoot must be true" % p.name)
        if csc.get("readOnlyRootFilesystem") is not True:
            out.err("%s: readOnlyRootFilesystem must be true" % p.name)
        if csc.get("allowPrivilegeEscalation") is not False:
            out.err("%s: allowPrivilegeEscalation must be false" % p.name)
        by_path = {mp: (v, m) for mp, host, v, m in mounts}
        shm = by_path.get("/dev/shm")
        if not shm or (shm[0].get("emptyDir") or {}).get("medium") != "Memory":
            out.err("%s: /dev/shm must be an emptyDir with medium Memory (NCCL)" % p.name)
        if "/tmp" not in by_path:
            out.err("%s: /tmp must be a writable volume (agent sockets; the root is read-only)"
                    % p.name)
        tok = values.get("token-file", "")
        _, vm = self.host_path_of(tok, mounts) if tok else (None, None)
        if not tok:
            out.err("%s: no --token-file: the gang would run unauthenticated" % p.name)
        elif vm is None or "secret" not in vm[0] or vm[1].get("readOnly") is not True:
            out.err("%s: --token-file %s is not on a read-only Secret volume" % (p.name, tok))
        elif not os.path.isfile(tok):
            out.err("%s: --token-file %s is not a key of its Secret" % (p.name, tok))
        self.check_api_key(p, values, mounts, out)
        tol = spec.get("tolerations") or []
        if not any(t.get("key") == "nvidia.com/gpu" for t in tol):
            out.err("%s: no toleration for the nvidia.com/gpu taint" % p.name)
        aff = spec.get("affinity") or {}
        terms = ((aff.get("podAntiAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution") or [])
        own = [t for t in terms if t.get("topologyKey") == "kubernetes.io/hostname"
               and selector_matches(t.get("labelSelector"), p.labels)]
        if not own:
            out.err("%s: no required Pod anti-affinity per node that selects the Pod's own gang"
                    % p.name)
        for t in terms:
            sel_keys = set((t.get("labelSelector") or {}).get("matchLabels") or {}) | \
                {e["key"] for e in (t.get("labelSelector") or {}).get("matchExpressions") or []}
            both = sel_keys & set(t.get("matchLabelKeys") or [])
            if both:
                out.err("%s: %s both in matchLabelKeys and labelSelector (rejected by the API "
                        "server)" % (p.name, sorted(both)))
        na = ((aff.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
              or {}).get("nodeSelectorTerms") or []
        gfd = any(e["key"].startswith("nvidia.com/") for t in na
                  for e in t.get("matchExpressions") or [])
        if not gfd and not spec.get("resourceClaims"):
            out.err("%s: neither node affinity on GPU Feature Discovery labels nor a DRA claim"
                    % p.name)


# --------------------------------------------------------------------------- driver


class Out:
    def __init__(self, target, verbose):
        self.target, self.errors, self.verbose = target, [], verbose
        self.notes = set()

    def err(self, msg):
        self.errors.append(msg)
        say("  FAIL %s" % msg)

    def ok(self, msg):
        if self.verbose:
            say("  ok   %s" % msg)

    def note(self, msg):
        if msg not in self.notes:
            self.notes.add(msg)
            say("  note %s" % msg)


def render(kubectl, path):
    import yaml
    r = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return None, r.stderr.strip()
    return [o for o in yaml.safe_load_all(r.stdout) if o], None


def self_test(checker, schemas, base_objs):
    """Breaks the rendered base in known ways; each must be reported."""
    def sts(objs):
        return next(o for o in objs if o["kind"] == "StatefulSet")

    def ctr(objs):
        return sts(objs)["spec"]["template"]["spec"]["containers"][0]

    def set_env(objs, name, value):
        for e in ctr(objs)["env"]:
            if e["name"] == name:
                e["value"] = value

    def svc(objs, headless):
        return next(o for o in objs if o["kind"] == "Service"
                    and (o["spec"].get("clusterIP") == "None") == headless)

    def service_link_collision(objs):
        sts(objs)["spec"]["template"]["spec"]["enableServiceLinks"] = True
        s = copy.deepcopy(svc(objs, False))
        s["metadata"]["name"] = "ganglion-http"
        objs.append(s)

    def rename_field(objs):
        ctr(objs)["livenessprobe"] = ctr(objs).pop("livenessProbe")

    # (what is broken, how, a phrase the report must contain)
    mutations = [
        ("replicas differ from --nnodes", lambda o: sts(o)["spec"].update(replicas=3),
         "but the controller runs 3 Pods"),
        ("RollingUpdate strategy", lambda o: sts(o)["spec"].update(
            updateStrategy={"type": "RollingUpdate"}), "updateStrategy must be OnDelete"),
        ("wrong GANGLION_SERVICE", lambda o: set_env(o, "GANGLION_SERVICE", "other"),
         "coordinator ganglion-0.other."),
        ("headless Service hides not-ready Pods",
         lambda o: svc(o, True)["spec"].update(publishNotReadyAddresses=False),
         "publishNotReadyAddresses"),
        ("GPUs != --nproc-per-node", lambda o: ctr(o)["resources"].update(
            limits={"nvidia.com/gpu": "4"}, requests={"nvidia.com/gpu": "4"}),
         "the Pod gets 4 GPUs"),
        ("client Service selects only the coordinator", lambda o: svc(o, False)["spec"][
            "selector"].update({"apps.kubernetes.io/pod-index": "0"}), "exactly every gang Pod"),
        ("no /dev/shm", lambda o: ctr(o).update(volumeMounts=[
            m for m in ctr(o)["volumeMounts"] if m["mountPath"] != "/dev/shm"]), "/dev/shm"),
        ("liveness shorter than the give-up linger",
         lambda o: ctr(o)["livenessProbe"].update(periodSeconds=1, failureThreshold=1,
                                                  timeoutSeconds=1),
         "--give-up-linger-ms"),
        ("service links set GANGLION_HTTP_PORT", service_link_collision, "--http-port"),
        ("tp x pp != world", lambda o: ctr(o).update(
            args=[a if not a.startswith("--pp=") else "--pp=1" for a in ctr(o)["args"]]),
         ("!= world", "ranks, but the gang has")),
        ("token not from a Secret", lambda o: ctr(o).update(
            args=[a if not a.startswith("--token-file=") else "--token-file=/tmp/token"
                  for a in ctr(o)["args"]]),
         ("not on a read-only Secret volume", "invalid configuration: token")),
        ("no API key", lambda o: ctr(o).update(
            args=[a for a in ctr(o)["args"] if not a.startswith("--api-key-file=")]),
         "no --api-key-file"),
        ("API key not from a Secret", lambda o: ctr(o).update(
            args=[a if not a.startswith("--api-key-file=") else "--api-key-file=/tmp/api-key"
                  for a in ctr(o)["args"]]),
         # check-config refuses first (the file is not in the Pod: it is on no volume)
         "tmp/api-key: No such file or directory"),
        ("API key is the rendezvous token", lambda o: ctr(o).update(
            args=[a if not a.startswith("--api-key-file=") else
                  "--api-key-file=/etc/ganglion/token/token" for a in ctr(o)["args"]]),
         "--api-key-file is the rendezvous token"),
        ("a probe sends the API key", lambda o: ctr(o)["readinessProbe"]["httpGet"].update(
            httpHeaders=[{"name": "Authorization", "value": "Bearer k"}]),
         "readinessProbe sends an Authorization header"),
        ("misspelt field (schema)", rename_field, "livenessprobe"),
        ("PDB lets a member go", lambda o: next(x for x in o if x["kind"] ==
                                                "PodDisruptionBudget")["spec"].update(
            maxUnavailable=1), "lets a member of a serving gang be evicted"),
        ("anti-affinity selects another gang", lambda o: sts(o)["spec"]["template"]["spec"][
            "affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
            "labelSelector"]["matchLabels"].update({"app.kubernetes.io/instance": "other"}),
         "anti-affinity"),
    ]
    failed = []
    import contextlib
    import io
    for what, mutate, phrase in mutations:
        objs = copy.deepcopy(base_objs)
        mutate(objs)
        out = Out("self-test", False)
        with contextlib.redirect_stdout(io.StringIO()):
            for o in objs:
                for e in schemas.validate(o)[1]:
                    out.err("%s: schema: %s" % (oname(o), e))
            checker.check(objs, out)
        phrases = phrase if isinstance(phrase, tuple) else (phrase,)
        hit = [e for e in out.errors if any(ph in e for ph in phrases)]
        if hit:
            say("  ok   caught: %s: %s" % (what, hit[0].split("\n")[0][:120]))
        else:
            say("  FAIL not caught: %s (errors: %s)" % (what, out.errors or "none"))
            failed.append(what)
    return failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True, help="the ganglion binary")
    ap.add_argument("--k8s", default=os.path.join(REPO, "k8s"), help="the k8s/ directory")
    ap.add_argument("--kube-version", default=None,
                    help="Kubernetes version whose schemas to use (default: newest known)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args()

    ensure_python_tools()
    kubectl = find_kubectl()
    import kubernetes_validate
    if not os.access(a.bin, os.X_OK):
        say("FAIL k8s-validate: ganglion binary %s is not executable" % a.bin)
        return 1
    schemas = Schemas(a.kube_version)
    kver = subprocess.run([kubectl, "version", "--client"], capture_output=True,
                          text=True).stdout.replace("\n", "; ").strip("; ")
    say("k8s-validate: %s (%s); kubernetes-validate %s, schemas of Kubernetes %s; %s" %
        (kubectl, kver, kubernetes_validate.__version__, schemas.mm, a.bin))

    tmp = tempfile.mkdtemp(prefix="ganglion-k8s-")
    try:
        # Work on a copy: the real token (if the operator made one) is never read, and the
        # test token below stands in for it.
        k8s = os.path.join(tmp, "k8s")
        shutil.copytree(a.k8s, k8s)
        tok = os.path.join(k8s, "base", "secrets", "rdzv-token")
        os.makedirs(os.path.dirname(tok), exist_ok=True)
        with open(tok, "w") as f:
            f.write(TEST_TOKEN)
        with open(os.path.join(k8s, "base", "secrets", "api-key"), "w") as f:
            f.write(TEST_API_KEY)
        targets = ["base"]
        od = os.path.join(k8s, "overlays")
        for d in sorted(os.listdir(od)) if os.path.isdir(od) else []:
            if os.path.isfile(os.path.join(od, d, "kustomization.yaml")):
                targets.append("overlays/" + d)
        checker = Checker(os.path.abspath(a.bin), tmp)
        passed, failed, base_objs, router_objs = [], [], None, None
        for t in targets:
            say("== %s" % t)
            out = Out(t.replace("/", "_"), not a.quiet)
            objs, err = render(kubectl, os.path.join(k8s, t))
            if objs is None:
                out.err("kubectl kustomize failed: %s" % err)
                failed.append(t)
                continue
            out.ok("kubectl kustomize: %d objects (%s)" %
                   (len(objs), ", ".join(oname(o) for o in objs)))
            for o in objs:
                how, errs = schemas.validate(o)
                for e in errs:
                    out.err("%s: schema: %s" % (oname(o), e))
                if not errs:
                    out.ok("%s: valid against %s" % (oname(o), how))
            checker.check(objs, out)
            if t == "base":
                base_objs = objs
            if router_objs is None and router_checks.routers_of(objs):
                router_objs = objs
            (failed if out.errors else passed).append(t)
            say("   %s: %s" % (t, "FAILED (%d)" % len(out.errors) if out.errors else "passed"))
        say("== self-test: broken manifests must be caught")
        caught_all = True
        if base_objs is None:
            say("  FAIL base did not render; self-test not run")
            caught_all = False
        else:
            caught_all = not self_test(checker, schemas, base_objs)
        if router_objs is not None:
            caught_all = not router_checks.self_test(
                checker, router_objs, lambda: Out("self-test", False), say) and caught_all
        (passed if caught_all else failed).append("self-test")
        say("k8s-validate: %d passed, %d failed%s" % (len(passed), len(failed),
                                                      (" (" + ", ".join(failed) + ")")
                                                      if failed else ""))
        return 1 if failed else 0
    finally:
        if a.keep:
            say("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
