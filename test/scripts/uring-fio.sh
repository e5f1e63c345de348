#!/usr/bin/env bash
# uring-fio.sh: fio side by side over one tmpfs file, through dmfuse mounts
# with different transport settings and through a kernel loop device,
# interleaved in rounds. Prints one line per job: round, variant, job,
# IOPS, daemon CPU (cores) during the job, then for dmfuse variants the
# daemon CPU over IDLE seconds with no I/O after the jobs.
#
#   test/scripts/uring-fio.sh DMFUSE_BINARY ROUNDS RUNTIME IDLE VARIANT...
#
# VARIANT is loop, or dev, or uring, optionally followed by dmfuse mount
# flags joined with commas: uring,--poll=0 or uring,--poll=50us; a word
# DMFUSE_...=VALUE among them goes to the daemon's environment
# (uring,DMFUSE_URING_SETUP=0x100: IORING_SETUP_COOP_TASKRUN), and a word
# BIN=PATH runs another dmfuse binary. $TABLE is the device's table after
# "0 524288 " with IMG for the tmpfs file (default: linear IMG 0). Jobs: 4k
# direct randread and randwrite at QD1 (psync) and 2 x QD32 (io_uring), or
# the jobs named in $JOBS (qd1r qd1w q32r q32w).
set -euo pipefail
bin=$1 rounds=$2 rt=$3 idle=$4
shift 4
jobs=${JOBS:-qd1r qd1w q32r q32w}
work=$(mktemp -d /tmp/uring-fio.XXXXXX)
img=/dev/shm/uring-fio-$$.img
pid= loopdev=
cleanup() {
	[ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
	[ -n "$loopdev" ] && losetup -d "$loopdev" 2>/dev/null || true
	rm -rf "$work" "$img"
}
trap cleanup EXIT
dd if=/dev/urandom of="$img" bs=1M count=256 status=none
hz=$(getconf CLK_TCK)
cputicks() { awk '{print $14+$15}' "/proc/$1/stat"; }

fiojob() { # fiojob FILE JOB
	local a
	case $2 in
	qd1r) a="--rw=randread --ioengine=psync --iodepth=1 --numjobs=1" ;;
	qd1w) a="--rw=randwrite --ioengine=psync --iodepth=1 --numjobs=1" ;;
	q32r) a="--rw=randread --ioengine=io_uring --iodepth=32 --numjobs=2" ;;
	q32w) a="--rw=randwrite --ioengine=io_uring --iodepth=32 --numjobs=2" ;;
	esac
	# shellcheck disable=SC2086
	fio --name=j --filename="$1" --direct=1 --bs=4k --size=256m $a --group_reporting \
		--time_based --runtime="$rt" --output-format=json |
		python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(round(j["read"]["iops"]+j["write"]["iops"]))'
}

for ((r = 1; r <= rounds; r++)); do
	for v in "$@"; do
		file= pid=
		if [ "$v" = loop ]; then
			loopdev=$(losetup --direct-io=on -f --show "$img")
			file=$loopdev
		else
			IFS=, read -r -a va <<<"$v"
			t=${va[0]}
			envs=() flags=() b=$bin
			for w in "${va[@]:1}"; do
				case $w in
				DMFUSE_*=*) envs+=("$w") ;;
				BIN=*) b=${w#BIN=} ;;
				*) flags+=("$w") ;;
				esac
			done
			mnt=$work/mnt
			mkdir -p "$mnt"
			table=${TABLE:-linear IMG 0}
			echo "lin,,,rw,0 524288 ${table//IMG/$img};" >"$work/conf"
			env XDG_STATE_HOME="$work/state" "${envs[@]}" "$b" mount --config "$work/conf" --transport "$t" "${flags[@]}" "$mnt" 2>"$work/log" &
			pid=$!
			for _ in $(seq 100); do [ -e "$mnt/lin" ] && break; sleep 0.1; done
			file=$mnt/lin
		fi
		for j in $jobs; do
			c0=0
			[ -n "$pid" ] && c0=$(cputicks "$pid")
			t0=$(date +%s.%N)
			iops=$(fiojob "$file" "$j")
			t1=$(date +%s.%N)
			cpu=-
			[ -n "$pid" ] && cpu=$(awk -v a="$c0" -v b="$(cputicks "$pid")" -v t0="$t0" -v t1="$t1" -v hz="$hz" 'BEGIN{printf "%.2f", (b-a)/hz/(t1-t0)}')
			echo "$r $v $j $iops $cpu"
		done
		if [ -n "$pid" ]; then
			if [ "$idle" -gt 0 ]; then
				c0=$(cputicks "$pid")
				sleep "$idle"
				echo "$r $v idle ${idle}s $(awk -v a="$c0" -v b="$(cputicks "$pid")" -v hz="$hz" -v s="$idle" 'BEGIN{printf "%.4f", (b-a)/hz/s}')"
			fi
			kill -TERM "$pid"
			wait "$pid" || true
			pid=
		fi
		if [ -n "$loopdev" ]; then
			losetup -d "$loopdev"
			loopdev=
		fi
	done
done
