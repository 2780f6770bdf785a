#!/bin/bash
# Second fd-store probe (systemd VM, see fdstore-vm.sh): daemon-reload and daemon-reexec,
# a crash loop that hits the start limit, FDSTOREREMOVE, the same name stored twice, a
# forked child storing under NotifyAccess=main, and a unit that Requires= a socket.
D=${FDSTORE_DIR:-$(dirname "$(readlink -f "$0")")}
B=$D/fdstore
unit() { local n=$1; shift; { echo '[Service]'; echo 'Type=notify'; echo "ExecStart=$B";
  echo 'FileDescriptorStoreMax=16'; echo 'Restart=on-failure'; echo 'RestartSec=100ms';
  printf '%s\n' "$@"; } >/run/systemd/system/$n.service; }
st() { echo "[$1] $(systemctl show -p MainPID -p NFileDescriptorStore -p ActiveState -p SubState -p NRestarts $2 | tr '\n' ' ')"; }
unit a 'Environment=FDSTORE_AGAIN=1'
unit r 'Environment=FDSTORE_REMOVE=1'
unit c 'Environment=FDSTORE_CHILD=1'
unit l 'Environment=FDSTORE_EXIT=0' 'StartLimitIntervalSec=60' 'StartLimitBurst=3'
printf '%s\n' '[Socket]' 'ListenSequentialPacket=/run/s.sock' >/run/systemd/system/s.socket
unit s; sed -i '1i [Unit]\nRequires=s.socket\nAfter=s.socket' /run/systemd/system/s.service
systemctl daemon-reload
echo "== a: same name stored again at each start"
systemctl start a; st start a; systemctl restart a; st restart1 a; systemctl restart a; st restart2 a
journalctl -u a -o cat --no-pager | grep 'name\|generation'
echo "== a: daemon-reload, daemon-reexec"
systemctl daemon-reload; st after-daemon-reload a
systemctl daemon-reexec; sleep 2; st after-daemon-reexec a
systemctl restart a; st restart-after-reexec a
journalctl -u a -o cat --no-pager | grep 'generation' | tail -1
echo "== r: FDSTOREREMOVE"
systemctl start r; st start r; systemctl restart r; st restart1 r; systemctl restart r; st restart2 r
journalctl -u r -o cat --no-pager | grep 'name\|FDSTOREREMOVE'
echo "== c: a forked child stores (NotifyAccess default)"
systemctl start c; st start c; journalctl -u c -o cat --no-pager | grep -i 'fromchild\|notify\|reject\|ignor'
journalctl -b -o cat --no-pager | grep -i 'c.service.*notif' | head -3
echo "== l: exits 0 before READY=1 (not a failure for Restart=on-failure?) then exit 1 crash loop to the start limit"
systemctl start l; st start-exit0 l
mkdir -p /run/systemd/system/l.service.d
printf '%s\n' '[Service]' 'Environment=FDSTORE_EXIT=1' >/run/systemd/system/l.service.d/x.conf
printf '%s\n' '[Service]' 'Environment=FDSTORE_EXIT=' >/run/systemd/system/l.service.d/a.conf
systemctl daemon-reload
systemctl start l; st ok-start l
rm /run/systemd/system/l.service.d/a.conf; systemctl daemon-reload
systemctl restart l; sleep 3; st crash-loop l
journalctl -u l -o cat --no-pager | grep -v '^$' | tail -12
echo "== s: service Requires= a socket; restart the socket, then stop the socket"
systemctl start s; st start s
systemctl restart s.socket; sleep 1; st socket-restarted s
systemctl stop s.socket; sleep 1; st socket-stopped s
journalctl -u s -o cat --no-pager | grep 'started\|name'
exit 0
