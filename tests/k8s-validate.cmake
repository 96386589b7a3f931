# Kubernetes manifests: kustomize render + schema validation + serve --check-config.
