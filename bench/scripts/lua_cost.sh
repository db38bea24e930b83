#!/usr/bin/env bash
# What the rate scripts cost Redis per decision when calls are pipelined,
# beside INCRBY + PEXPIRE sent the same way (BENCHMARKS.md §3, "Redis CPU
# per decision"). Starts a private redis-server on a free port, loads each
# algorithm's batch script as the backend builds it, and runs
# redis-benchmark (-P 16 -c 8) with batches of N requests over 10,000 keys.
# Each row ends with its breakdown per decision from INFO commandstats:
# the wrapper (the call's way in and out: parsing, the event loop, the
# reply), TIME, reads, writes, and Lua (the script's own work and each
# redis.call's way in and out). REDIS_SERVER_BIN picks another server
# (valkey-server); redis-benchmark and redis-cli speak to either.
# Usage: bench/scripts/lua_cost.sh [N=8] [CALLS=20000]
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-8}; calls=${2:-20000}
lua=src/backend/redis/lua
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
${REDIS_SERVER_BIN:-redis-server} --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --daemonize yes --logfile "$dir/log"
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
cli() { redis-cli -p "$port" "$@"; }
cpu() { cli INFO cpu | awk -F: '/used_cpu_sys:|used_cpu_user:/{s+=$2} END{printf "%.6f", s}'; }
per() { python3 -c "print('%-16s %6.2f us Redis CPU per decision' % ('$1', ($3 - $2) * 1e6 / $4))"; }
keys=(); items=()
for i in $(seq 1 "$n"); do keys+=("p:{k:__rand_int__}:s$i"); done
for alg in gcra token_bucket fixed_window sliding_window; do
  case $alg in
    gcra|token_bucket) prelude=("$lua/one_number.lua");;
    fixed_window) prelude=("$lua/window_end.lua");;
    *) prelude=();;
  esac
  case $alg in
    gcra|token_bucket) moves=("$lua/whole_at.lua" "$lua/one_key.lua");;
    fixed_window) moves=("$lua/fixed_window_moves.lua" "$lua/one_key.lua");;
    *) moves=("$lua/sliding_window_moves.lua");;
  esac
  # As script/sources.rs builds it: the moves inside `moves()`, made on first use.
  sha=$(cli SCRIPT LOAD "$(cat $lua/clock.lua $lua/quota_change.lua "${prelude[@]}" $lua/$alg.lua
    printf 'moves = function()\nif made then return made end\nmade = {}\nlocal m = made\n'
    cat "${moves[@]}" $lua/moved.lua; printf 'return m\nend\n'
    echo 'local wide = false'; cat $lua/batch.lua)")
  cli FLUSHALL >/dev/null; cli CONFIG RESETSTAT >/dev/null; a=$(cpu)
  # limit, window_us, burst: 1,000,000 per second, never reached; no
  # lock read, no lockout; no quota change (one key per key, no previous
  # quota, mode 1, at 0); each key once for one unit (no item pairs).
  redis-benchmark -p "$port" -P 16 -c 8 -n "$calls" -r 10000 EVALSHA "$sha" "$n" "${keys[@]}" \
    1000000 1000000 1000000 0 0 1 1 1 0 1 0 >/dev/null
  b=$(cpu)
  per "$alg" "$a" "$b" $((calls * n))
  cli INFO commandstats | python3 -c '
import re, sys
total, n = float(sys.argv[1]) * 1e6, int(sys.argv[2])
usec = {m[1]: float(m[2]) for m in re.finditer(r"cmdstat_(\w+):calls=\d+,usec=(\d+)", sys.stdin.read())}
reads = sum(usec.get(c, 0) for c in ("get", "mget", "hmget", "pttl"))
writes = sum(usec.get(c, 0) for c in ("set", "incrby", "decrby", "pexpire", "pexpireat", "hset", "hincrby", "del"))
rest = sum(v for c, v in usec.items() if c not in ("evalsha", "time", "get", "mget", "hmget", "pttl", "set", "incrby", "decrby", "pexpire", "pexpireat", "hset", "hincrby", "del"))
ev = usec.get("evalsha", 0)
parts = [("wrapper", total - ev), ("TIME", usec.get("time", 0)), ("reads", reads), ("writes", writes), ("other", rest), ("Lua", ev - usec.get("time", 0) - reads - writes - rest)]
print("    per decision: " + ", ".join("%s %.2f" % (k, v / n) for k, v in parts) + " us")
' "$(python3 -c "print($b - $a)")" $((calls * n))
done
cli FLUSHALL >/dev/null; a=$(cpu)
redis-benchmark -p "$port" -P 16 -c 8 -n $((calls * n)) -r 10000 INCRBY 'b:__rand_int__' 1 >/dev/null
redis-benchmark -p "$port" -P 16 -c 8 -n $((calls * n)) -r 10000 PEXPIRE 'b:__rand_int__' 1000 >/dev/null
per "INCRBY+PEXPIRE" "$a" "$(cpu)" $((calls * n))
