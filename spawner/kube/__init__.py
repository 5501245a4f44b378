"""gpupool on Kubernetes: the pool read from Nodes and Pods (GPU Feature Discovery labels, allocatable
resources, running pods' requests), the manifests gpupool creates, and how a lease becomes resource limits."""
