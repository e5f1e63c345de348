#!/usr/bin/env bash
# uring-idle.sh DMFUSE_BINARY FLAGS...: mounts a linear device over a 64 MiB tmpfs file on io_uring
# with FLAGS, reads 2000 x 4 KiB (direct), waits 1 s, then prints the daemon CPU (utime + stime
# from /proc/PID/stat, in clock ticks of 10 ms) over 10 s with no I/O.
bin=$1; shift
w=$(mktemp -d /tmp/idle.XXXXXX); img=/dev/shm/idle-$$.img
truncate -s 64M $img
echo "lin,,,rw,0 131072 linear $img 0;" > $w/conf
XDG_STATE_HOME=$w/st $bin mount --config $w/conf --transport uring "$@" $w/mnt 2>$w/log &
pid=$!
for _ in $(seq 100); do [ -e $w/mnt/lin ] && break; sleep 0.1; done
dd if=$w/mnt/lin of=/dev/null bs=4k count=2000 iflag=direct status=none
sleep 1
hz=$(getconf CLK_TCK)
a=$(awk '{print $14+$15}' /proc/$pid/stat); sleep 10; b=$(awk '{print $14+$15}' /proc/$pid/stat)
echo "$* idle 10s: $(( (b-a)*1000/hz )) ms CPU, threads $(ls /proc/$pid/task | wc -l)"
kill -TERM $pid; wait $pid; rm -rf $w $img
