#!/bin/bash
# Third fd-store probe (systemd VM, see fdstore-vm.sh): a uverbs context whose only fd is
# in systemd's fd store, and `rdma link delete` of its device.
D=${FDSTORE_DIR:-$(dirname "$(readlink -f "$0")")}
printf '%s\n' '[Service]' 'Type=notify' "ExecStart=$D/fdstore" 'FileDescriptorStoreMax=16' \
  'Environment=FDSTORE_UVERBS=1 FDSTORE_CLOSE=1' >/run/systemd/system/u.service
systemctl daemon-reload
systemctl start u; systemctl restart u
journalctl -u u -o cat --no-pager | grep fdstore
P=$(systemctl show -p MainPID --value u)
echo "new instance $P holds uverbs fds: $(ls -l /proc/$P/fd | grep -c uverbs); systemd (PID 1): $(ls -l /proc/1/fd | grep -c uverbs); NFileDescriptorStore=$(systemctl show -p NFileDescriptorStore --value u)"
rdma resource show pd
rdma link delete rxe0 & RP=$!
sleep 10
if kill -0 $RP 2>/dev/null; then
  echo "rdma link delete blocked after 10 s: state $(awk '{print $3}' /proc/$RP/stat), wchan $(cat /proc/$RP/wchan)"
  t0=$(date +%s.%N)
  systemctl stop u
  wait $RP; echo "rdma link delete exited $? $(echo "$(date +%s.%N) - $t0" | bc 2>/dev/null || true) s after systemctl stop u"
else
  wait $RP; echo "rdma link delete finished within 10 s ($?)"
fi
rdma link show; rdma resource show pd
exit 0
