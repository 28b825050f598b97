"""Deployment: Kubernetes manifests and the image (``deploy/kubernetes``,
``deploy/Containerfile``), and a local cluster of real processes (``deploy.cluster``,
driven by ``scripts/cluster``)."""
