#!/bin/bash
# Fourth fd-store probe (systemd VM, see fdstore-vm.sh): can the stopping service tell a
# restart from a stop? Its ExecStop= (run while the job is pending) lists the jobs.
D=${FDSTORE_DIR:-$(dirname "$(readlink -f "$0")")}
printf '%s\n' '[Service]' 'Type=notify' "ExecStart=$D/fdstore" 'FileDescriptorStoreMax=16' \
  "ExecStop=/bin/sh -c 'echo ExecStop sees: \$(systemctl list-jobs --no-legend --no-pager j.service)'" \
  'Restart=on-failure' 'RestartSec=100ms' >/run/systemd/system/j.service
systemctl daemon-reload
systemctl start j
systemctl restart j
systemctl stop j
systemctl start j
kill -9 "$(systemctl show -p MainPID --value j)"; sleep 2
systemctl stop j
journalctl -u j -o cat --no-pager | grep -v '^$' | grep -v '^fdstore: store'
exit 0
