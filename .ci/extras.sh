#!/usr/bin/env bash
# Each extra on its own: for every README command that names extras, a fresh venv with only
# those extras installed must run the command to a report (exit 0 or 1 and the report's
# "found N findings" / "no findings" line), never to a missing-extra error. The full CI venv
# has every extra at once, so it cannot see a command that needs an extra it does not name.
#
#   .ci/extras.sh                      # every case below
#   .ci/extras.sh jax,tpu-target       # only the cases for these extras (one argument each)
#
# The venvs live in a scratch folder (EXTRAS_VENVS to keep them) and share pip's cache. Each
# command must appear in README.md exactly as written here, so the README and this check
# cannot drift apart.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${PYTHON:-python3}

# extras|command, one case per README section that names extras
cases=(
  "jax|hlo-doctor run --example fsdp-activation-gather"
  "torch-xla|hlo-doctor run --example fsdp-activation-gather --framework torch-xla"
  "jax,gpu-target|hlo-doctor run --example fsdp-activation-gather --target a100:2x8"
  "jax,tpu-target|hlo-doctor run --example fsdp-activation-gather --target v5e:4x4"
)

wanted=("$@")
scratch=${EXTRAS_VENVS:-$(mktemp -d -t hlo-doctor-extras.XXXXXX)}
mkdir -p "$scratch"
[ -n "${EXTRAS_VENVS:-}" ] || trap 'rm -rf "$scratch"' EXIT

failed=0
ran=0
for case in "${cases[@]}"; do
  extras=${case%%|*}
  command=${case#*|}
  if [ ${#wanted[@]} -gt 0 ] && [[ ! " ${wanted[*]} " == *" $extras "* ]]; then
    continue
  fi
  ran=$((ran + 1))
  name=${extras//,/+}
  log="$scratch/$name.log"
  started=$SECONDS
  if ! grep -qF -- "$command" README.md; then
    echo "extras [$extras]: FAIL: README.md does not show \`$command\`"
    failed=1
    continue
  fi
  venv="$scratch/$name-venv"
  rm -rf "$venv"
  # --no-compile: no bytecode for the thousands of files of torch and jax a run never imports
  if ! { "$python" -m venv "$venv" && "$venv/bin/pip" install -q --no-compile -e "$root[$extras]"; } >"$log" 2>&1; then
    echo "extras [$extras]: FAIL: pip install -e '.[$extras]' failed; last lines:"
    tail -n 20 "$log"
    failed=1
    continue
  fi
  installed=$((SECONDS - started))
  work="$scratch/$name-run"
  rm -rf "$work" && mkdir -p "$work"
  # only this venv on PATH, and nothing inherited that could import another install
  (cd "$work" && env -u PYTHONPATH PATH="$venv/bin:/usr/bin:/bin" $command) >>"$log" 2>&1
  code=$?
  took=$((SECONDS - started))
  if grep -q "extra is not installed" "$log"; then
    verdict="FAIL: missing-extra error"
  elif [ "$code" -ne 0 ] && [ "$code" -ne 1 ]; then
    verdict="FAIL: exit $code"
  elif ! grep -Eq '^(found [0-9]+ findings? \(|no findings in )' "$log"; then
    verdict="FAIL: exit $code but no report"
  else
    verdict="ok"
  fi
  echo "extras [$extras]: $verdict: \`$command\` exit $code (install ${installed}s, total ${took}s)"
  if [ "$verdict" != ok ]; then
    tail -n 20 "$log"
    failed=1
  fi
  rm -rf "$venv" "$work"  # a torch-xla venv is ~7 GB
done
if [ "$ran" -eq 0 ]; then
  echo "extras: no case for ${wanted[*]}; the cases are: ${cases[*]%%|*}" >&2
  exit 2
fi
exit $failed
