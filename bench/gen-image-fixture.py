#!/usr/bin/env python3
"""Writes an emulator fixture with IMAGES golden images spread over NAMESPACES namespaces:
for `kubevirt`, a CDI DataSource per image naming its DataVolume's PVC (the DataVolume
Succeeded, the DataSource Ready); for `deckhouse`, a VirtualImage per image (Ready, in DVCR).

Usage: bench/gen-image-fixture.py kubevirt|deckhouse [IMAGES] [NAMESPACES] > fixture.yaml
       (default 500 10)
"""
import sys

flavor = sys.argv[1]
images = int(sys.argv[2]) if len(sys.argv) > 2 else 500
namespaces = int(sys.argv[3]) if len(sys.argv) > 3 else 10
out = sys.stdout
for n in range(namespaces):
    out.write(f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: img-{n}}}\n---\n")
for i in range(images):
    ns = f"img-{i % namespaces}"
    name = f"image-{i:05d}"
    url = f"https://images.example/os/{name}.qcow2"
    meta = f"""metadata:
  name: {name}
  namespace: {ns}
  labels: {{app.kubernetes.io/managed-by: kubectl-vm, index: "{i}"}}
  creationTimestamp: "2026-01-10T09:00:00Z"
"""
    if flavor == "kubevirt":
        out.write(f"""apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
{meta}spec:
  source: {{http: {{url: "{url}"}}}}
  storage: {{resources: {{requests: {{storage: 10Gi}}}}}}
status: {{phase: Succeeded, progress: "100.0%", claimName: {name}}}
---
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataSource
{meta}spec:
  source: {{pvc: {{name: {name}, namespace: {ns}}}}}
status:
  source: {{pvc: {{name: {name}, namespace: {ns}}}}}
  conditions:
  - {{type: Ready, status: "True", reason: Ready, message: DataSource is ready to be consumed}}
---
""")
    else:
        out.write(f"""apiVersion: virtualization.deckhouse.io/v1alpha2
kind: VirtualImage
{meta}spec:
  storage: ContainerRegistry
  dataSource: {{type: HTTP, http: {{url: "{url}"}}}}
status:
  phase: Ready
  progress: 100%
  format: qcow2
  cdrom: false
  size: {{stored: 256Mi, storedBytes: "268435456", unpacked: 2Gi, unpackedBytes: "2147483648"}}
  target: {{registryURL: "dvcr.d8-virtualization.svc/vi/{ns}/{name}:latest"}}
  conditions:
  - {{type: Ready, status: "True", reason: Ready, message: "", lastTransitionTime: "2026-01-10T09:02:00Z"}}
---
""")
