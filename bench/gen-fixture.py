#!/usr/bin/env python3
"""Writes an emulator fixture with VMS running KubeVirt VMs (each with its VMI) spread over
NAMESPACES namespaces, shaped like tests/fixtures/kubevirt.yaml's `web`.

Usage: bench/gen-fixture.py [VMS] [NAMESPACES] > fixture.yaml   (default 1000 10)
"""
import sys

vms = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
namespaces = int(sys.argv[2]) if len(sys.argv) > 2 else 10
out = sys.stdout
for n in range(namespaces):
    out.write(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: bench-{n}}}\n---\n")
for i in range(vms):
    ns = f"bench-{i % namespaces}"
    name = f"vm-{i:05d}"
    uid = f"6f0e7c1a-2222-4a3b-9c1d-{i:012d}"
    node = f"node-{1 + i % 2}"
    ip = f"10.244.{i // 250}.{i % 250 + 2}"
    out.write(f"""apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {name}
  namespace: {ns}
  uid: {uid}
  labels: {{app: bench, index: "{i}"}}
  creationTimestamp: "2026-01-10T09:00:00Z"
spec:
  runStrategy: Always
  template:
    metadata:
      labels: {{kubevirt.io/vm: {name}, app: bench}}
    spec:
      domain:
        cpu: {{cores: 2}}
        memory: {{guest: 2Gi}}
        devices:
          disks:
          - {{name: rootdisk, disk: {{bus: virtio}}}}
          - {{name: cloudinitdisk, disk: {{bus: virtio}}}}
          interfaces:
          - {{name: default, masquerade: {{}}}}
      networks:
      - {{name: default, pod: {{}}}}
      volumes:
      - name: rootdisk
        containerDisk: {{image: quay.io/containerdisks/fedora:42}}
      - name: cloudinitdisk
        cloudInitNoCloud:
          userData: |
            #cloud-config
            user: fedora
            ssh_authorized_keys: []
status:
  printableStatus: Running
  created: true
  ready: true
  runStrategy: Always
  conditions:
  - {{type: Ready, status: "True", lastTransitionTime: "2026-01-10T09:01:00Z"}}
  - {{type: AgentConnected, status: "True", lastTransitionTime: "2026-01-10T09:01:30Z"}}
  - {{type: LiveMigratable, status: "True", lastTransitionTime: "2026-01-10T09:01:00Z"}}
---
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: {name}
  namespace: {ns}
  labels: {{kubevirt.io/vm: {name}, app: bench, kubevirt.io/nodeName: {node}}}
  creationTimestamp: "2026-01-10T09:00:05Z"
  ownerReferences:
  - {{apiVersion: kubevirt.io/v1, kind: VirtualMachine, name: {name}, uid: {uid}, controller: true, blockOwnerDeletion: true}}
spec:
  domain:
    cpu: {{cores: 2}}
    memory: {{guest: 2Gi}}
    devices:
      disks:
      - {{name: rootdisk, disk: {{bus: virtio}}}}
      interfaces:
      - {{name: default, masquerade: {{}}}}
  networks:
  - {{name: default, pod: {{}}}}
  volumes:
  - name: rootdisk
    containerDisk: {{image: quay.io/containerdisks/fedora:42}}
status:
  phase: Running
  nodeName: {node}
  qosClass: Burstable
  launcherContainerImageVersion: quay.io/kubevirt/virt-launcher:v1.9.0
  interfaces:
  - {{name: default, ipAddress: {ip}, ipAddresses: [{ip}], mac: "02:42:ac:11:00:0a", interfaceName: eth0, infoSource: "domain, guest-agent"}}
  guestOSInfo: {{id: fedora, name: Fedora Linux, prettyName: Fedora Linux 42 (Cloud Edition), version: "42", versionId: "42", kernelRelease: 6.14.0-63.fc42.x86_64}}
  conditions:
  - {{type: Ready, status: "True", lastTransitionTime: "2026-01-10T09:01:00Z"}}
  - {{type: LiveMigratable, status: "True", lastTransitionTime: "2026-01-10T09:01:00Z"}}
  - {{type: AgentConnected, status: "True", lastTransitionTime: "2026-01-10T09:01:30Z"}}
---
""")
