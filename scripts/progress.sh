# Sourced by scripts/demo.sh and scripts/test.sh: `step WHAT` prints which
# step starts and how long the script has run, so a long build says what
# it is doing.
orbite_progress_start=$SECONDS
step() {
  local t=$((SECONDS - orbite_progress_start))
  printf '== [%d:%02d] %s ==\n' $((t / 60)) $((t % 60)) "$*"
}
