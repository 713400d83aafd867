# Shared by scripts/setup_vllm.sh and scripts/setup_vllm_adapter.sh (sourced, not run).
#
#   begin_setup NAME    take $CACHE/NAME.lock (two checkouts would race on one venv) and
#                       define run CMD... (output to $CACHE/NAME.log; a failure prints
#                       its tail and exits)
#   stale_venv DIR WANT true when DIR's stamp is not WANT: DIR is then a fresh venv
#                       ($V its python) and the log starts anew; finish with:
#                       echo "$WANT" > "$DIR/$STAMP_NAME"
#   step MESSAGE        say MESSAGE, and add it to the log, before a later build step
#
# The log is the record of the build that made what is there: a run that finds everything
# built writes nothing to it (every `make test` runs these scripts).
STAMP_NAME=".hicache-vllm-env"

begin_setup() {
  mkdir -p "$CACHE"
  exec 9>"$CACHE/$1.lock"
  flock 9
  LOG="$CACHE/$1.log"
}

run() { "$@" >>"$LOG" 2>&1 || { echo "hicache: failed: $* (log: $LOG)" | tee -a "$LOG" >&2; tail -n 5 "$LOG" >&2; exit 1; }; }

step() {
  echo "hicache: $1" >&2
  printf '== %s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$1" >>"$LOG"
}

stale_venv() {
  local dir="$1" want="$2"
  if [ -f "$dir/$STAMP_NAME" ] && [ "$(cat "$dir/$STAMP_NAME")" = "$want" ]; then
    return 1
  fi
  : >"$LOG"
  step "building $dir (a few minutes, once)"
  rm -rf "$dir"
  run "$PY" -m venv "$dir"
  V="$dir/bin/python"
}
