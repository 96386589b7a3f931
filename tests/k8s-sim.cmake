# Kubernetes simulation: Pods as network namespaces, dnsmasq DNS, a kubelet-like prober.
