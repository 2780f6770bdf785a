#!/bin/bash
# Runs inside the systemd VM (tests/vm/rxe-vm --systemd ROOT): the fd-store probe.
# Put it and the built doc/restart-facts/fdstore.c (named fdstore) in one shared directory.
D=${FDSTORE_DIR:-$(dirname "$(readlink -f "$0")")}   # the directory holding the built fdstore
B=$D/fdstore
set -x
systemctl --version | head -1
cat >/run/systemd/system/fdt.service <<U
[Service]
Type=notify
ExecStart=$B
Environment=FDSTORE_UVERBS=1
FileDescriptorStoreMax=16
Restart=on-failure
RestartSec=100ms
U
cat >/run/systemd/system/fdp.service <<U
[Service]
Type=notify
ExecStart=$B
FileDescriptorStoreMax=16
FileDescriptorStorePreserve=yes
U
systemctl daemon-reload
st() { systemctl show -p MainPID -p NFileDescriptorStore -p ActiveState -p SubState fdt | tr '\n' ' '; echo; }
pds() { rdma resource show pd; rdma resource show mr | wc -l; }
systemctl start fdt; st; pds
journalctl -u fdt -o cat --no-pager | tail -20; systemctl status fdt --no-pager | tail -5
systemctl restart fdt; st; pds
systemctl restart fdt; st
P=$(systemctl show -p MainPID --value fdt); [ "$P" -gt 1 ] && kill -9 "$P"; sleep 2; st; pds
systemctl stop fdt; st; pds
systemctl start fdt; st; pds
systemctl stop fdt
journalctl -u fdt -o cat --no-pager | grep -v '^$'
: ----- the Preserve unit
systemd-analyze verify /run/systemd/system/fdp.service
journalctl -b -o cat --no-pager | grep -i "FileDescriptorStorePreserve"
systemctl show -p FileDescriptorStorePreserve fdp
systemctl start fdp; systemctl stop fdp; systemctl start fdp; systemctl show -p NFileDescriptorStore fdp
journalctl -u fdp -o cat --no-pager | grep fdstore
systemctl stop fdp
: ----- systemd-notify
systemd-notify --help | grep -i -- "--fd\|fdname" || echo "systemd-notify: no --fd option"
man -P cat systemd.service 2>/dev/null | grep -c FileDescriptorStorePreserve
zcat /usr/share/man/man5/systemd.service.5.gz | grep -c "FileDescriptorStorePreserve"
zcat /usr/share/man/man3/sd_notify.3.gz 2>/dev/null | grep -n "FDPOLL" | head -3
exit 0
