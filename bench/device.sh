#!/usr/bin/env bash
# The figures that need more cores than this project's machines have, as one prepared run on a
# 16-core machine (the device machine lent to some tasks; bench/NOTES.md has what it gave):
#   1. the put lock alone, 1/2/4/8/16 processes (`bench.put_lock`);
#   2. the put matrix, ASYNC 128 B `send` and `send_batch` of 100, 1/2/4/8/16 producers, each
#      row beside raw append with as many processes (`bench --scenario put`);
#   3. replication against a plain TCP copy and a copy into a file (`bench.replication`);
#   4. the whole-record CRC's cost on one store, on cores the store's own processes leave free
#      (`bench --scenario crc-same-store`);
#   ab. (STEPS=ab) `bench.scaling` in each variant tree under .dev/trees/ (`git archive` of the
#      packages, one .tgz each), alternating, twice.
# Nothing there is installed: the two compiled dependencies travel as wheels and the store's own
# compiled parts as .so files built for that machine's Python (3.12), both under .dev/:
#   .dev/whl: `pip wheel --no-deps posix_ipc crcmod` with a Python 3.12
#   .dev/so:  `python3.12 setup.py build_ext --build-lib ...`'s three .so files
# Run from the repository root: `OUT=dir bash bench/device.sh`; every step is bounded by
# `timeout`, and the logs and bench/results end in $OUT.
set -u
OUT=${OUT:-/tmp/rmq-device-out}
PY=${PY:-python3}
QUICK=${QUICK:-0}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/rmq-site .dev/whl/*.whl || exit 1
export PYTHONPATH=/tmp/rmq-site:$PWD
cp .dev/so/_core.*.so rmq_mp/put/ && cp .dev/so/_scan.*.so rmq_mp/format/ && cp .dev/so/_index.*.so rmq_mp/store/ || exit 1

step() {  # step NAME SECONDS COMMAND...: one bounded step, its output in $OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date -u +%T), limit ${limit}s)"
    timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "rc=$? $(date -u +%T)"
    tail -n 40 "$OUT/$name.log"
}

{
    nproc
    "$PY" --version
    df -h /dev/shm "$PWD" /tmp | cat
    "$PY" -c "import numpy, psutil, posix_ipc, crcmod; from rmq_mp.put import native; from rmq_mp.format import native as f; print('core', native.core is not None, 'scan', f.scan is not None, numpy.__version__)"
} 2>&1 | tee "$OUT/machine.log"

# STEPS picks steps by name (default: all but ab); QUICK=1 shrinks each, for a check of the script.
STEPS=${STEPS:-put_lock put replication crc}
q() { if [ "$QUICK" = 1 ]; then echo "$1"; else echo "$2"; fi; }
for s in $STEPS; do
    case $s in
    put_lock) step put_lock 60 "$PY" -m bench.put_lock --seconds "$(q 0.5 1.5)" --producers "$(q 1,2 1,2,4,8,16)" ;;
    put) step put 170 "$PY" -m bench --scenario put --mode ASYNC --body 128 --seconds "$(q 0.5 2)" $(q --quick "") ;;
    replication) step replication 150 "$PY" -m bench.replication --mib "$(q 16 256)" --puts "$(q 200 2000)" --rounds "$(q 1 3)" ;;
    crc) step crc 90 "$PY" -m bench --scenario crc-same-store ;;
    ab)  # AB_ARGS (default: bench.scaling) in each tree of .dev/trees/*.tgz, alternating, twice;
        # a tree that carries its own .so files (its C differs) keeps them
        for t in .dev/trees/*.tgz; do
            d=/tmp/rmq-ab/$(basename "$t" .tgz)
            mkdir -p "$d" && tar xzf "$t" -C "$d"
            ls "$d"/rmq_mp/put/_core.*.so >/dev/null 2>&1 ||
                { cp .dev/so/_core.*.so "$d/rmq_mp/put/" && cp .dev/so/_scan.*.so "$d/rmq_mp/format/" && cp .dev/so/_index.*.so "$d/rmq_mp/store/"; }
        done
        for round in $(q 1 "1 2"); do
            for d in /tmp/rmq-ab/*; do
                # shellcheck disable=SC2086  # AB_ARGS is a word list
                (cd "$d" && export PYTHONPATH=/tmp/rmq-site:$d && step "ab-$(basename "$d")-$round" 90 "$PY" \
                    ${AB_ARGS:--m bench.scaling --producers $(q 1,2 1,2,4,8,16) --seconds $(q 0.5 1.5) --tag $(basename "$d")-$round})
            done
        done
        for d in /tmp/rmq-ab/*; do mkdir -p "bench/results/ab-$(basename "$d")" && cp "$d"/bench/results/* "bench/results/ab-$(basename "$d")/"; done ;;
    *) echo "unknown step $s" ;;
    esac
done
tar czf "$OUT/results.tgz" bench/results 2>/dev/null
rm -f /dev/shm/rmq_* /dev/shm/sem.rmq_*
