# Shared by scripts/setup_vllm.sh and scripts/setup_vllm_adapter.sh (sourced, not run).
#
#   begin_setup NAME    take $CACHE/NAME.lock (two checkouts would race on one venv),
#                       start $CACHE/NAME.log and define run CMD... (output to the log;
#                       a failure prints its tail and exits)
#   stale_venv DIR WANT true when DIR's stamp is not WANT: DIR is then a fresh venv
#                       ($V its python); finish with: echo "$WANT" > "$DIR/$STAMP_NAME"
STAMP_NAME=".hicache-vllm-env"

begin_setup() {
  mkdir -p "$CACHE"
  exec 9>"$CACHE/$1.lock"
  flock 9
  LOG="$CACHE/$1.log"
  : >"$LOG"
}

run() { "$@" >>"$LOG" 2>&1 || { echo "hicache: failed: $* (log: $LOG)" | tee -a "$LOG" >&2; tail -n 5 "$LOG" >&2; exit 1; }; }

stale_venv() {
  local dir="$1" want="$2"
  if [ -f "$dir/$STAMP_NAME" ] && [ "$(cat "$dir/$STAMP_NAME")" = "$want" ]; then
    return 1
  fi
  echo "hicache: building $dir (a few minutes, once)" >&2
  rm -rf "$dir"
  run "$PY" -m venv "$dir"
  V="$dir/bin/python"
}
