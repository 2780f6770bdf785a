#!/bin/bash
# In the VM, testbed profile: the ODP caps, then restart-import (beside this script) with
# NMR extra MRs (default 1000). tests/vm/rxe-vm --profile testbed --share DIR -- DIR/ri-vm.sh
D=$(dirname "$(readlink -f "$0")")
echo "== ODP caps: $ODPD_VM_RDMA_CORE/bin/ibv_devinfo -v"
"${ODPD_VM_RDMA_CORE:-/usr}/bin/ibv_devinfo" -v | grep -i -A12 "odp" | head -30
uname -r
echo "== restart-import NMR=${NMR:-1000}"
NMR=${NMR:-1000} "$D/restart-import"
