# The deploy tools' versions and where scripts/setup puts them (sourced by deploy/kubernetes/render, scripts/setup
# and tests/integration/deploy/helm_chart_test.sh). Helm from the Go module proxy (go install), the schema validator
# kubernetes-validate from PyPI (in a virtualenv: it carries the JSON schemas of Kubernetes' API, no download at
# run time).
SLUICE_HELM_VERSION=v3.22.0
SLUICE_K8S_VALIDATE_VERSION=1.37.0
SLUICE_TOOLS_DIR="${SLUICE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice}/tools"

# Prints the helm to use: $HELM, the one scripts/setup installed, or helm on the PATH; fails when none.
sluice_find_helm() {
  if [ -n "${HELM:-}" ]; then echo "$HELM"; return 0; fi
  local own="$SLUICE_TOOLS_DIR/helm-$SLUICE_HELM_VERSION/helm"
  if [ -x "$own" ]; then echo "$own"; return 0; fi
  command -v helm
}

# Prints the kubernetes-validate to use, or fails.
sluice_find_k8s_validate() {
  if [ -n "${KUBERNETES_VALIDATE:-}" ]; then echo "$KUBERNETES_VALIDATE"; return 0; fi
  local own="$SLUICE_TOOLS_DIR/kubernetes-validate-$SLUICE_K8S_VALIDATE_VERSION/bin/kubernetes-validate"
  if [ -x "$own" ]; then echo "$own"; return 0; fi
  command -v kubernetes-validate
}
