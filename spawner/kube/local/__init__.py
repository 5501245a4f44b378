"""A real Kubernetes control plane on one machine, with simulated GPU nodes: for trying gpupool's Kubernetes path
on a laptop (``make kube-up``) and for its tests.

- :mod:`.build` builds etcd, kube-apiserver, kube-scheduler and kube-controller-manager from their own Go
  modules at pinned versions, once, into a cache folder outside the repository.
- :mod:`.pki` makes the certificates and keys the components trust each other with.
- :mod:`.control_plane` starts the four components with the settings a real cluster has (RBAC and Node
  authorization, service-account tokens, the default admission chain) and stops them.
- :mod:`.nodes` turns a pool file into the Node objects GPU Feature Discovery and the NVIDIA device plugin
  would publish.
- :mod:`.kubelet` plays the kubelet of those nodes: keeps them Ready, runs each bound pod's command as a local
  process (no image is pulled), reports its status back and serves its log.
- :mod:`.cluster` puts it together (what ``gpupool kube up`` runs).
"""
