#!/usr/bin/env bash
# Exhaustive model check of the Conveyor lease protocol (spec/lease.pml) with Spin.
#
#   bash spec/check.sh            (npm run check:model)
#
# 1. The real model must pass: safety (all assertions, no invalid end state)
#    with unbounded faults, the same with one shared lease_owner, and
#    liveness (LTL `live` under weak fairness, bounded faults).
# 2. Every negative control (the model with one guard removed) must FAIL, and
#    for the reason it was built for: the violated assertion is matched
#    against the property the bug should break. A control that passes, or
#    fails for another reason, proves nothing and fails this script.
#
# Builds happen in a temporary directory; nothing is written to spec/.
# Exit status: 0 iff every run behaved as expected.

set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
model="$here/lease.pml"

if ! command -v spin >/dev/null 2>&1; then
  echo "spin not found (Debian/Ubuntu: apt-get install -y spin)" >&2
  exit 2
fi
CC=${CC:-gcc}
if ! command -v "$CC" >/dev/null 2>&1; then
  echo "$CC not found: a C compiler is needed to build Spin's verifier" >&2
  exit 2
fi

build=$(mktemp -d "${TMPDIR:-/tmp}/conveyor-spin.XXXXXX")
trap 'rm -rf "$build"' EXIT

echo "Spin: $(spin -V | head -1)"
echo "Model: spec/lease.pml — 3 jobs (2 with a transactional effect, 1 plain),"
echo "       3 handler slots in 2 worker processes (A: slots 0,1; B: slot 2), max_attempts 2"
echo

failures=0
summary=()

# run NAME EXPECT KIND PATTERN SPIN-DEFINES...
#   EXPECT  pass | fail
#   KIND    safety   : gcc -DSAFETY, DFS, assertions + invalid end states
#           bfs      : gcc -DSAFETY -DBFS, shortest counterexample (controls)
#           liveness : never claim from `ltl live`, pan -a -f (weak fairness)
#   PATTERN for EXPECT=fail: extended regexp the error line must match
run() {
  local name=$1 expect=$2 kind=$3 pattern=$4
  shift 4
  local dir="$build/$name"
  mkdir -p "$dir"
  cp "$model" "$dir/lease.pml"

  local cflags panflags
  case $kind in
    safety)   cflags="-DSAFETY";       panflags="-m100000 -w24" ;;
    bfs)      cflags="-DSAFETY -DBFS"; panflags="-m100000 -w22" ;;
    liveness) cflags="";               panflags="-m200000 -w24 -a -f" ;;
  esac

  echo "=== $name"
  echo "    config: spin $* -a; $CC -O2 $cflags; pan $panflags; expect: $expect"

  local verdict
  if ! (cd "$dir" && spin "$@" -a lease.pml >spin.out 2>&1); then
    cat "$dir/spin.out"
    verdict="BROKEN (spin -a failed)"
  elif ! (cd "$dir" && $CC -O2 $cflags -o pan pan.c >cc.out 2>&1); then
    cat "$dir/cc.out"
    verdict="BROKEN (compilation failed)"
  else
    local t0 t1
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    (cd "$dir" && ./pan $panflags >pan.out 2>&1)
    t1=$(date +%s.%N)
    local out="$dir/pan.out"

    local errors stored trans elapsed mem
    errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' "$out" | tail -1)
    stored=$(sed -n 's/^ *\([0-9.e+]*\) states, stored\( (.* visited)\)\{0,1\}.*/\1\2/p' "$out" | tail -1)
    trans=$(sed -n 's/^ *\([0-9.e+]*\) transitions.*/\1/p' "$out" | tail -1)
    elapsed=$(sed -n 's/^pan: elapsed time \([0-9.e+]*\) seconds.*/\1/p' "$out" | tail -1)
    mem=$(sed -n 's/^ *\([0-9.]*\).*total actual memory usage.*/\1/p' "$out" | tail -1)
    printf '    states stored: %s   transitions: %s   search time: %ss (wall %.1fs)   memory: %s MB\n' \
      "${stored:-?}" "${trans:-?}" "${elapsed:-0}" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "${mem:-?}"
    grep -E 'depth reached|^\s+\+ Partial|never claim|fairness' "$out" | sed 's/^\s*/    /'

    local toodeep=0
    grep -Eq "max search depth too small|Search not completed" "$out" && toodeep=1
    local errline
    errline=$(grep -E '^pan:[0-9]+: |^pan: ' "$out" | grep -vE 'elapsed time|rate ' | head -1)

    if [ -z "$errors" ]; then
      verdict="BROKEN (no result from pan)"
      tail -20 "$out"
    elif [ "$expect" = pass ]; then
      if [ "$errors" = 0 ] && [ $toodeep = 0 ]; then
        verdict="ok (passed, as required)"
      elif [ $toodeep = 1 ]; then
        verdict="FAILED (search not exhaustive: max search depth too small or search not completed)"
      else
        verdict="FAILED ($errline)"
        (cd "$dir" && spin "$@" -t lease.pml 2>&1 | grep -E 'MSC|START OF CYCLE|assertion' | head -60)
      fi
    else # expect fail
      if [ "$errors" = 0 ]; then
        verdict="FAILED (the control passed: it proves nothing)"
      else
        if ! echo "$errline" | grep -Eq -- "$pattern"; then
          verdict="FAILED (failed for another reason than intended: $errline)"
        else
          verdict="ok (counterexample found, as required)"
        fi
        echo "    $errline"
        if [ "$kind" = bfs ]; then
          echo "    counterexample (spin -t; breadth-first search, so a shortest one):"
        else
          echo "    counterexample (spin -t):"
        fi
        (cd "$dir" && spin "$@" -t lease.pml 2>&1 | grep -E 'MSC|START OF CYCLE' |
          sed -e 's/^ *MSC: /      /' -e 's/^ *<<<<</      <<<<</' | head -40)
      fi
    fi
  fi
  case $verdict in ok*) ;; *) failures=$((failures + 1)) ;; esac
  echo "    => $verdict"
  echo
  summary+=("$(printf '%-44s %s' "$name" "$verdict")")
}

# Patterns: the assertion each control must violate.
P_FENCE='glease==sl\[s\]\.gl'                 # stale write changed a row
P_UNIQUE='sl\[[0-9]\]\.tok==job\[[0-9a-z]\]\.version' # two live holders of one token
P_OUTCOME='doneby==sl\[s\]\.gl\)\)'           # commit outcome misattributed
P_ROWS='rows<=1'
P_ONCE='ledger<=1\)'                          # an effect committed twice
P_EFFECT_DONE='ledger==0\)\|\|'               # an effect row on a job that is not completed
P_CYCLE='acceptance cycle'

# ---- the real protocol -----------------------------------------------------
run real-safety                 pass safety   ''
run real-safety-same-owner      pass safety   ''  -DSAME_OWNER
run real-liveness               pass liveness ''  -DLIVENESS

# ---- negative controls: each MUST produce a counterexample --------------------
run bug-complete-no-version     fail bfs "$P_FENCE"   -DBUG_COMPLETE_NO_VERSION
run bug-heartbeat-no-version    fail bfs "$P_FENCE"   -DBUG_HEARTBEAT_NO_VERSION
run bug-dequeue-no-bump         fail bfs "$P_UNIQUE"  -DBUG_DEQUEUE_NO_BUMP
run bug-reaper-reuses-version   fail bfs "$P_UNIQUE"  -DBUG_REAPER_REUSES_VERSION
run bug-enqueue-no-conflict     fail bfs "$P_ROWS"    -DBUG_ENQUEUE_NO_CONFLICT
run bug-handoff-on-conflict     fail bfs "$P_UNIQUE"  -DBUG_HANDOFF_ON_CONFLICT
# The same bugs without the two direct fencing assertions: what a worker can
# observe (a commit outcome attributed to the wrong lease).
run bug-complete-no-version/consequence   fail bfs "$P_OUTCOME" -DBUG_COMPLETE_NO_VERSION -DCONSEQUENCES_ONLY
run bug-dequeue-no-bump/consequence       fail bfs "$P_OUTCOME" -DBUG_DEQUEUE_NO_BUMP -DCONSEQUENCES_ONLY
run bug-reaper-reuses-version/consequence fail bfs "$P_OUTCOME" -DBUG_REAPER_REUSES_VERSION -DCONSEQUENCES_ONLY
run bug-handoff-on-conflict/consequence   fail bfs "$P_EFFECT_DONE" -DBUG_HANDOFF_ON_CONFLICT -DCONSEQUENCES_ONLY
# The effect-once assertions can fail too: what at-most-once effect rests on.
run bug-complete-no-state-check  fail bfs "$P_ONCE"    -DBUG_COMPLETE_NO_STATE -DCONSEQUENCES_ONLY
run bug-effect-separate-txn      fail bfs "$P_ONCE"    -DBUG_EFFECT_SEPARATE_TXN
# Only the plain completion may commit without its flush: a fetch that did
# would, after a Postgres crash, hand its token out again.
run bug-lazy-fetch               fail bfs "$P_UNIQUE"  -DBUG_LAZY_FETCH
# Liveness must be able to fail: without the reaper a crashed worker's job stays running.
run no-reaper-liveness          fail liveness "$P_CYCLE" -DLIVENESS -DNO_REAPER

echo "=== summary"
printf '  %s\n' "${summary[@]}"
if [ $failures -ne 0 ]; then
  echo "model check FAILED: $failures run(s) did not behave as required"
  exit 1
fi
echo "model check passed: real model verified, every negative control refuted"
