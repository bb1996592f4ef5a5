# Sourced by the device plans (lab/timing_plan.sh, lab/library_plan.sh).
# step NAME SECONDS COMMAND...: when NAME is one of $STEPS, runs COMMAND into
# $W/NAME (its OUT) under its own time limit, its output in $W/NAME/log.txt,
# and appends the tail and the time it took to $LOG; with $TGZ set, packs $W
# into it after each step.
step() {
  local name=$1 limit=$2; shift 2
  [[ " $STEPS " == *" $name "* ]] || return 0
  mkdir -p "$W/$name"
  local t0=$SECONDS
  OUT="$W/$name" timeout "$limit" "$@" >"$W/$name/log.txt" 2>&1
  local rc=$?
  { echo "== $name: rc $rc in $((SECONDS - t0)) s (limit $limit): $*"
    tail -25 "$W/$name/log.txt"; } | tee -a "$LOG"
  # (the steps' files packed after each step, so a call stopped at its own
  # limit still brings back every step that ended: $TGZ, when set)
  if [[ -n "${TGZ:-}" ]]; then
    tar czf "$TGZ.part" -C "$(dirname "$W")" "$(basename "$W")" && mv "$TGZ.part" "$TGZ"
  fi
}
